"""Incremental versions (issue 32): a full build of N photos, then 1% more photos and a re-run.

    python -m benchmarks.incremental --cache /tmp/bench-cache --num-images 400 1200 --json incremental.json

For each N: a full build of N photos (benchmarks/corpus.py: 1-3 MP JPEGs) into a fresh directory; then
N/100 more photos join the tree and stage 1 runs again into the same directory, which carries over the
records of the N unchanged photos (preprocess/reuse/). The fixed cost of a job, apart: a full build of 8
photos (start-up, graph, tf.Transform's analysis, publishing). Per run: wall and CPU seconds of the
whole process tree, bytes it wrote (the kernel's write_bytes of the process tree, /proc/self/io of the
reaped children), the manifest's num_decoded and num_reused. Every run is `python -m preprocess`, in
process (--in-process-below above the corpus), so CPU is one process's, comparable between runs.

Each re-run (the fixed cost's and each N's) runs --repeats times, each into a copy of the same published
version (made of hard links: a version's files are never modified), and the run of median CPU is reported:
between runs on a shared machine the CPU of one job moves by about a second, the size of what is measured.
Beside them, the same re-runs with --checksum: every local input read and hashed for its key, as before the
quick check (size and mtime against the ledger) existed.
"""

import argparse
import json
import os
import shutil

from benchmarks.corpus import photo_pool
from benchmarks.measure import (
    finish_report,
    format_table,
    machine_line,
    run_measured,
    stage1_command,
)


def _published(output: str) -> dict:
    with open(os.path.join(output, "dataset.json")) as handle:
        return json.load(handle)


def _link_tree(pool: str, files: list[dict], root: str) -> None:
    for entry in files:
        destination = os.path.join(root, *entry["path"].split("/"))
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        if not os.path.exists(destination):
            os.link(os.path.join(pool, *entry["path"].split("/")), destination)


def _run(corpus: str, output: str, args, log_path: str, *extra: str) -> dict:
    argv = stage1_command(
        corpus,
        output,
        args.image_size,
        "uint8",
        "--in-process-below",
        "1000000",
        "--max-failed-fraction",
        "1",
        *extra,
    )
    result = run_measured(argv, interval=0.5, log_path=log_path)
    manifest = _published(output)
    return {
        "wall_s": round(result.wall_seconds, 1),
        "cpu_s": round(result.tree_cpu_seconds, 1),
        "bytes_written": result.tree_io["write_bytes"],
        "shard_bytes": sum(
            shard["num_bytes"] for info in manifest["splits"].values() for shard in info["shards"]
        ),
        "num_decoded": manifest["inputs"]["num_decoded"],
        "num_reused": manifest["inputs"]["num_reused"],
        "num_written": manifest["inputs"]["num_written"],
    }


def _reruns(corpus: str, published: str, args, log_prefix: str, *extra: str) -> dict:
    """`args.repeats` re-runs of stage 1 over `corpus`, each into a copy of the directory `published` (hard
    links: a version's files never change); the run of median CPU, with every run's CPU (`cpu_s_runs`)."""
    runs = []
    for attempt in range(args.repeats):
        output = f"{published}-rerun-{attempt}"
        shutil.copytree(published, output, copy_function=os.link)
        runs.append(_run(corpus, output, args, f"{log_prefix}-{attempt}.log", *extra))
        shutil.rmtree(output, ignore_errors=True)
    median = sorted(runs, key=lambda run: run["cpu_s"])[len(runs) // 2]
    return {**median, "cpu_s_runs": [run["cpu_s"] for run in runs]}


def measure(args) -> dict:
    work = os.path.join(args.cache, "incremental")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    largest = max(args.num_images)
    pool = photo_pool(args.cache, largest + largest // 100)
    with open(os.path.join(pool, ".complete.json")) as handle:
        pool_files = json.load(handle)["files"]
    fixed_corpus = os.path.join(work, "fixed-corpus")
    _link_tree(pool, pool_files[:8], fixed_corpus)
    fixed_out = os.path.join(work, "fixed-out")
    fixed = _run(fixed_corpus, fixed_out, args, os.path.join(work, "fixed.log"))
    # An incremental job's own fixed cost: the same 8 photos and one more, into the same directory (its
    # extra stages: the ledger, the previous shards, the joins).
    _link_tree(pool, pool_files[largest : largest + 1], fixed_corpus)
    fixed_incremental = _reruns(fixed_corpus, fixed_out, args, os.path.join(work, "fixed-incremental"))
    sizes = []
    for num_images in args.num_images:
        added = max(1, num_images // 100)
        corpus, output = os.path.join(work, f"corpus-{num_images}"), os.path.join(work, f"out-{num_images}")
        _link_tree(pool, pool_files[:num_images], corpus)
        full = _run(corpus, output, args, os.path.join(work, f"full-{num_images}.log"))
        _link_tree(pool, pool_files[largest : largest + added], corpus)
        log_prefix = os.path.join(work, f"incremental-{num_images}")
        sizes.append(
            {
                "num_images": num_images,
                "added": added,
                "full": full,
                "incremental": _reruns(corpus, output, args, log_prefix),
                # As before the quick check: every local input read and hashed for its key.
                "incremental_checksum": _reruns(corpus, output, args, log_prefix + "-checksum", "--checksum"),
            }
        )
        shutil.rmtree(output, ignore_errors=True)
    return {"fixed": fixed, "fixed_incremental": fixed_incremental, "sizes": sizes}


def _runs(run: dict) -> str:
    """' (a, b, c)': the CPU of each run a median was taken of; '' for one run."""
    runs = run.get("cpu_s_runs", [])
    return f" ({', '.join(map(str, runs))})" if len(runs) > 1 else ""


def report(figures: dict) -> str:
    fixed, fixed_incremental = figures["fixed"], figures["fixed_incremental"]
    rows = []
    for size in figures["sizes"]:
        full, incremental = size["full"], size["incremental"]
        beyond_full = full["cpu_s"] - fixed["cpu_s"]
        beyond_incremental = incremental["cpu_s"] - fixed_incremental["cpu_s"]
        checksum = size.get("incremental_checksum")
        beyond_checksum = checksum["cpu_s"] - fixed_incremental["cpu_s"] if checksum else None
        rows.append(
            [
                f"{size['num_images']:,} + {size['added']}",
                f"{full['num_decoded']} / {incremental['num_decoded']} (reused {incremental['num_reused']})",
                f"{full['wall_s']} / {incremental['wall_s']}",
                f"{full['cpu_s']} / {incremental['cpu_s']}{_runs(incremental)}",
                f"{beyond_full:.1f} / {beyond_incremental:.1f} ({beyond_incremental / beyond_full:.0%})",
                f"{full['bytes_written'] / 1e6:.1f} / {incremental['bytes_written'] / 1e6:.1f} MB "
                f"({incremental['bytes_written'] / full['bytes_written']:.0%})",
                "-"
                if checksum is None
                else f"{checksum['cpu_s']}{_runs(checksum)} / {beyond_checksum:.1f} "
                f"({beyond_checksum / beyond_full:.0%})",
            ]
        )
    header = [
        "photos + added",
        "decoded, full / incremental",
        "wall s",
        "CPU s",
        "CPU s beyond the fixed cost",
        "bytes written",
        "with --checksum: CPU s / beyond the fixed cost",
    ]
    return (
        f"{machine_line()}\n"
        f"fixed cost, a full build of 8 photos: {fixed['wall_s']} s wall, {fixed['cpu_s']} CPU s, "
        f"{fixed['bytes_written'] / 1e6:.1f} MB written; an incremental re-run of them with 1 more: "
        f"{fixed_incremental['wall_s']} s wall, {fixed_incremental['cpu_s']} CPU s{_runs(fixed_incremental)} "
        f"(decoded {fixed_incremental['num_decoded']}, reused {fixed_incremental['num_reused']})\n"
        "CPU beyond the fixed cost: the full build's beyond the full build's, the incremental run's beyond "
        "the incremental re-run's\n" + format_table(header, rows)
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cache", required=True, help="Where the rendered photos and the runs go.")
    parser.add_argument("--num-images", type=int, nargs="+", default=[400, 1200])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3, help="Runs of each re-run; the median is reported.")
    parser.add_argument("--json", help="Write the figures here too.")
    args = parser.parse_args(argv)
    figures = finish_report(measure(args), args.json)
    print(report(figures))
    return figures


if __name__ == "__main__":
    main()
