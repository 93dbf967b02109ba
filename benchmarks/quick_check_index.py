"""The quick check's index of the previous ledger (preprocess/reuse/ledger.py, `known_keys`): its memory per
entry, the time to build it and to look a file up, from a synthetic ledger of `--entries` image lines.

    python -m benchmarks.quick_check_index --entries 100000

Each form is built in a fresh process (so RSS deltas are its own), from the same ledger file:

- `dict`: the map of commit e31bc69, {uri: (size, mtime_ns, hex key)} in memory (reproduced here);
- `sqlite`: `ledger.KnownKeys`, the current one: a SQLite table on disk, read by key.

Figures: the process's RSS growth over the build (VmRSS, after a gc) and its peak growth (VmHWM), the
Python heap the index keeps (tracemalloc, in a second build: it does not see SQLite's own allocations, which
RSS does), build seconds, microseconds per lookup (every URI, shuffled), and the index's bytes on disk.

With `--workers N`, the index of a job of N worker processes (started together, as a runner starts them):

- `each builds` (before branch i32-scale): every worker builds it from the ledger (`ledger.KnownKeys`);
- `launcher builds, workers copy`: the launcher builds it once (`shared_index.HeldIndex`), each worker
  copies it (`ledger.known_keys` of its `SharedIndex`).

Figures: per worker, the wall and CPU seconds until its index is open; in total, the CPU seconds of the
launcher's build and every worker's.
"""

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc

from preprocess.reuse import ledger, shared_index

FORMS = ("dict", "sqlite")


def synthetic_line(index: int) -> bytes:
    """An image's ledger line as a version writes it (a local file, the audit on)."""
    digest = hashlib.sha256(str(index).encode()).hexdigest()
    return ledger.entry_bytes(
        {
            "key": digest,
            "sha256": hashlib.sha256(digest.encode()).hexdigest(),
            "uri": f"/data/photos/class_{index % 1000:04d}/IMG_{index:08d}.jpg",
            "label": f"class_{index % 1000:04d}",
            "split": "train",
            "moments": [index * 0.1, 2.5, 3.25, 1e3, 1e4, 12345.678],
            "signature": (index * 2654435761) % (1 << 63),
            "shard": f"runs/20261127T000000000000Z-00000000/train-{index % 64:05d}-of-00064.tfrecord",
            "size": 1_000_000 + index,
            "mtime_ns": 1_600_000_000 * 10**9 + index,
            "source_size": [3000, 2000],
        }
    )


def dict_index(paths):
    """The map as e31bc69 built it (ledger.known_keys then)."""
    known = {}
    for path in paths:
        for entry in ledger.read_all_entries(path):
            if entry.get("mtime_ns") is not None and entry.get("size") is not None:
                known[entry["uri"]] = (entry["size"], entry["mtime_ns"], entry["key"])
    return known


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure_form(form: str, path: str, entries: int) -> dict:
    """Builds one form in this process; its figures."""
    build = dict_index if form == "dict" else ledger.KnownKeys
    gc.collect()
    rss, hwm = _status("VmRSS"), _status("VmHWM")
    start = time.perf_counter()
    index = build([path])
    seconds = time.perf_counter() - start
    gc.collect()
    rss_after, hwm_after = _status("VmRSS"), _status("VmHWM")
    uris = [f"/data/photos/class_{i % 1000:04d}/IMG_{i:08d}.jpg" for i in range(entries)]
    random.Random(0).shuffle(uris)
    start = time.perf_counter()
    found = sum(index.get(uri) is not None for uri in uris)
    lookup = time.perf_counter() - start
    assert found == entries, (found, entries)
    on_disk = index.bytes_on_disk if form == "sqlite" else 0
    if form == "sqlite":
        index.remove()
    del index
    gc.collect()
    tracemalloc.start()
    again = build([path])
    heap = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    if form == "sqlite":
        again.remove()
    return {
        "form": form,
        "entries": entries,
        "build_s": round(seconds, 2),
        "rss_growth_bytes": rss_after - rss,
        "peak_growth_bytes": max(0, hwm_after - hwm),
        "heap_bytes": heap,
        "lookup_us": round(lookup / entries * 1e6, 2),
        "on_disk_bytes": on_disk,
    }


def open_index(how: str, spec: str) -> dict:
    """In a worker process: its index, built from the ledger (`build`, spec: the ledger's path) or copied
    from the launcher's (`copy`, spec: the SharedIndex as JSON); its wall and CPU seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    if how == "build":
        index = ledger.KnownKeys([spec])
    else:
        fields = json.loads(spec)
        index = ledger.known_keys(
            shared_index.SharedIndex(**{**fields, "ledger_files": tuple(fields["ledger_files"])})
        )
        assert not index.built, "the worker could not copy the launcher's index"
    figures = {"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}
    index.remove()
    return figures


def _workers(how: str, spec: str, workers: int) -> list[dict]:
    """`workers` processes started together, each opening the index `how`; their figures."""
    command = [sys.executable, "-m", "benchmarks.quick_check_index", "--worker", f"{how}:{spec}"]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(workers)]
    figures = []
    for child in children:
        out, _ = child.communicate()
        assert child.returncode == 0, child.returncode
        figures.append(json.loads(out.splitlines()[-1]))
    return figures


def measure_workers(path: str, entries: int, workers: int) -> list[dict]:
    """The index of a job of `workers` worker processes, each building it, then the launcher building it
    once and each copying it."""
    each = _workers("build", path, workers)
    start, cpu = time.perf_counter(), time.process_time()
    held = shared_index.HeldIndex([path])
    launcher = {"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}
    try:
        copied = _workers("copy", json.dumps(dataclasses.asdict(held.shared)), workers)
    finally:
        held.close()
    results = []
    for form, launcher_figures, per_worker in (
        ("each builds", None, each),
        ("launcher builds, workers copy", launcher, copied),
    ):
        total = sum(worker["cpu_s"] for worker in per_worker) + (launcher_figures or {}).get("cpu_s", 0)
        result = {
            "form": form,
            "entries": entries,
            "workers": workers,
            "launcher": launcher_figures,
            "per_worker": per_worker,
            "total_cpu_s": round(total, 2),
        }
        print(
            f"{form}, {entries:,} entries, {workers} workers: "
            + (
                f"launcher {launcher_figures['wall_s']:.2f} s wall, {launcher_figures['cpu_s']:.2f} CPU s; "
                if launcher_figures
                else ""
            )
            + "per worker "
            + ", ".join(
                f"{worker['wall_s']:.2f} s wall / {worker['cpu_s']:.2f} CPU s" for worker in per_worker
            )
            + f"; in total {total:.2f} CPU s"
        )
        results.append(result)
    return results


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    parser.add_argument(
        "--workers", type=int, help="Measure instead the index of a job of this many worker processes."
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # FORM:LEDGER, run by main in a fresh process
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # build:LEDGER or copy:SPEC, a job's worker
    args = parser.parse_args(argv)
    if args.worker:
        how, spec = args.worker.split(":", 1)
        print(json.dumps(open_index(how, spec)))
        return []
    if args.child:
        form, path = args.child.split(":", 1)
        print(json.dumps(measure_form(form, path, args.entries)))
        return []
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "ledger-00000-of-00001.jsonl")
        with open(path, "wb") as handle:
            for index in range(args.entries):
                handle.write(synthetic_line(index) + b"\n")
        if args.workers:
            return measure_workers(path, args.entries, args.workers)
        for form in args.forms:
            command = [sys.executable, "-m", "benchmarks.quick_check_index", "--entries", str(args.entries)]
            out = subprocess.run(
                [*command, "--child", f"{form}:{path}"], capture_output=True, text=True, check=True
            )
            result = json.loads(out.stdout.splitlines()[-1])
            result["ledger_bytes"] = os.path.getsize(path)
            per_entry = {
                key: result[key] / args.entries for key in ("rss_growth_bytes", "heap_bytes", "on_disk_bytes")
            }
            print(
                f"{form:6} {args.entries:,} entries: build {result['build_s']} s, lookup {result['lookup_us']} us, "
                f"RSS +{result['rss_growth_bytes'] / 2**20:.1f} MiB ({per_entry['rss_growth_bytes']:.0f} B/entry), "
                f"peak +{result['peak_growth_bytes'] / 2**20:.1f} MiB, Python heap kept "
                f"{per_entry['heap_bytes']:.0f} B/entry, on disk {per_entry['on_disk_bytes']:.0f} B/entry"
            )
            results.append(result)
    return results


if __name__ == "__main__":
    main()
