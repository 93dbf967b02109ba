"""Peak memory of listing a class-per-folder tree: the streamed listing vs. the one-element listing it replaced.

    python -m benchmarks.listing_memory --workdir /tmp/bench-listing --num-files 50000 --factor 4 --repeats 2

Generates trees of N and factor*N tiny files (3 bytes each, 10 class folders:
only listing matters) and lists each, in a fresh process per run, the way one
worker runs the listing step of stage 1:

- `streamed` (preprocess/inputs/listing.py): the class folders (one element), then
  each folder's files streamed from `os.scandir` (one element per class;
  here one after the other in one process, more than a worker ever does);
- `one element` (the listing before issue 10): `FileSystems.match(root/*/*)`
  into a list of records, sorted by a hash of the URI to mix the classes, in
  one FlatMap element.

Each record is consumed and dropped, as a DoFn emits it downstream. The
figures are the process's peak RSS during the listing (the kernel's high-water
mark, reset after the imports: exact, no sampling) and its growth over the
RSS after the imports (Beam's, about 200 MiB). The target: the streamed listing's
peak does not grow with the number of files,

  peak RSS (factor x files) / peak RSS (1x files) <= 1.1 for `streamed`,

where the one-element listing grows with the files (it holds them all). On
GCS the streamed listing holds one page of 1,000 names (the storage client's
paged listing); the emulator the tests use answers a listing in one page, so
it is not measured here.
"""

import argparse
import hashlib
import json
import os
import posixpath
import subprocess
import sys

from benchmarks.measure import (
    finish_report,
    format_table,
    machine_line,
    median,
    mib,
    reset_peak_rss,
    status_bytes,
    timed,
)

NUM_CLASSES = 10
_STREAMED = "streamed"
_ONE_ELEMENT = "one element"
APPROACHES = (_STREAMED, _ONE_ELEMENT)


def _mib_tenths(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f}"


def make_tree(workdir: str, num_files: int, num_classes: int = NUM_CLASSES) -> str:
    """workdir/tree-N/class{k}/{i}.jpg, N tiny files; reused when it is already complete."""
    root = os.path.join(workdir, f"tree-{num_files}")
    stamp = os.path.join(root, ".complete")
    if os.path.exists(stamp):
        return root
    for i in range(num_files):
        folder = os.path.join(root, f"class{i % num_classes:02d}")
        if i < num_classes:
            os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i:08d}.jpg"), "wb") as handle:
            handle.write(b"jpg")
    with open(stamp, "w") as handle:
        handle.write(str(num_files))
    return root


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _list_in_one_element(root: str):
    """The listing as it was before issue 10 (preprocess/inputs/listing.py at 1c70835), for comparison."""
    from apache_beam.io.filesystems import FileSystems

    from preprocess.inputs.listing import InputRecord

    root = root.rstrip("/")
    records = []
    for metadata in FileSystems.match([posixpath.join(root, "*", "*")])[0].metadata_list:
        parts = metadata.path[len(root) + 1 :].split("/")
        if len(parts) != 2 or parts[1].startswith("."):
            continue
        records.append(InputRecord(uri=metadata.path, label=parts[0]))
    yield from sorted(records, key=lambda item: hashlib.sha256(item.uri.encode("utf-8")).digest())


def _list_streamed(root: str):
    from preprocess.inputs.listing import list_class_files, list_class_folders

    for class_folder in list(list_class_folders(root)):  # one element's output: the classes
        yield from list_class_files(class_folder)


def measure_listing(approach: str, root: str) -> dict:
    """Run in the child process: list `root` one way, consuming each record; the memory figures."""
    import apache_beam  # noqa: F401 - imported before the baseline, as on a worker

    import preprocess.inputs.listing  # noqa: F401

    # The imports' own peak would hide a listing that stays below it: the peak is measured from here.
    peak_since_imports = reset_peak_rss()
    baseline = _rss_bytes()
    listing = _list_streamed if approach == _STREAMED else _list_in_one_element
    with timed() as timing:
        count = sum(1 for _ in listing(root))
    return {
        "files": count,
        "seconds": timing.wall_seconds,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": status_bytes("VmHWM"),
        "peak_since_imports": peak_since_imports,
    }


def run_child(approach: str, root: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.listing_memory", "--child", approach, "--root", root],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.listing_memory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--workdir", default="/tmp/bench-listing", help="Where the trees are made (and kept)."
    )
    parser.add_argument("--num-files", type=int, default=50_000, help="The 1x tree.")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument("--tiny", action="store_true", help="Smoke test: 200 and 800 files, 1 repeat.")
    parser.add_argument("--child", choices=APPROACHES, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> dict | None:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(measure_listing(args.child, args.root)))
        return None
    if args.tiny:
        args.num_files, args.factor, args.repeats = 200, 4, 1
    os.makedirs(args.workdir, exist_ok=True)
    sizes = [args.num_files, args.num_files * args.factor]
    trees = {size: make_tree(args.workdir, size) for size in sizes}
    print(machine_line())
    print(f"trees: {', '.join(f'{size:,} files in {NUM_CLASSES} folders' for size in sizes)}", flush=True)

    runs = []
    for repeat in range(args.repeats):
        order = [(approach, size) for approach in APPROACHES for size in sizes]
        for approach, size in order if repeat % 2 == 0 else reversed(order):
            run = {"repeat": repeat, "approach": approach, "size": size, **run_child(approach, trees[size])}
            assert run["files"] == size, run
            runs.append(run)
            print(
                f"  repeat {repeat} {approach:>11} {size:>9,} files: peak RSS {mib(run['peak_rss_bytes'])} MiB "
                f"(+{_mib_tenths(max(0, run['peak_rss_bytes'] - run['baseline_rss_bytes']))} over the imports), "
                f"{run['seconds']:.1f} s",
                flush=True,
            )

    def figure(approach, size, value):
        return median(value(run) for run in runs if (run["approach"], run["size"]) == (approach, size))

    def peak(run):
        return run["peak_rss_bytes"]

    def growth(run):
        return max(0, run["peak_rss_bytes"] - run["baseline_rss_bytes"])

    rows = [
        [
            approach,
            f"{size:,}",
            mib(figure(approach, size, peak)),
            _mib_tenths(figure(approach, size, growth)),
            f"{figure(approach, size, lambda run: run['seconds']):.1f}",
        ]
        for approach in APPROACHES
        for size in sizes
    ]
    print()
    print(format_table(["listing", "files", "peak RSS MiB", "growth over imports MiB", "seconds"], rows))
    small, large = sizes
    ratios = {
        approach: figure(approach, large, peak) / figure(approach, small, peak) for approach in APPROACHES
    }
    old_vs_new = figure(_ONE_ELEMENT, large, peak) / figure(_STREAMED, large, peak)
    verdict = "met" if ratios[_STREAMED] <= 1.1 else "NOT met"
    print(
        f"\npeak RSS {args.factor}x / 1x files: streamed {ratios[_STREAMED]:.2f}, one element "
        f"{ratios[_ONE_ELEMENT]:.2f}; target <= 1.1 for streamed: {verdict}. "
        f"At {large:,} files, one element / streamed: {old_vs_new:.2f}"
    )
    figures = {"sizes": sizes, "runs": runs, "ratios": ratios, "one_element_over_streamed": old_vs_new}
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
