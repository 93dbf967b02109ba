"""Deduplicating N copies of one file vs. N distinct files of the same size: the hot content key.

    python -m benchmarks.hot_key --workdir /tmp/bench-hot-key --copies 4000 --file-kb 2048 --repeats 2

Times stage 1's content step (`preprocess.inputs.content.DeduplicateByContent`:
content keys, then full hashes where keys are shared, then the decision per
hash) on the local runner with 2 worker processes, as `python -m preprocess`
runs it, in a fresh process per run, over three inputs of N files of the same
size:

- `distinct`: N files that differ in their first bytes (sparse past them:
  only those are read). Every content key is seen once: each file's first
  16 KiB are read, nothing is hashed in full;
- `copies`: N copies of one file (hard links: the same bytes, N names), as a
  scraped corpus holds a "photo unavailable" placeholder. They share one
  content key, so all N are hashed in full; stage 1 spreads them over the
  workers (a reshuffle) before hashing;
- `copies, one element`: the same copies through the step as it was before
  issue 20, without the reshuffle: every copy is hashed inside the one
  call that received the key's group, one after another, by one worker.

The figures are the pipeline's wall time (median over the repetitions, the
order rotating), which includes the local runner's fixed cost (starting its
worker processes: the `--tiny` run shows it), and the ratios. The target: N copies cost
no more than the hashing they need, spread over the workers; the serial
variant's time grows with N on one worker whatever the number of workers.
"""

import argparse
import os
import subprocess
import sys

from benchmarks.measure import finish_report, format_table, machine_description, machine_load, median, timed

DISTINCT = "distinct"
COPIES = "copies"
SERIAL = "copies, one element"
VARIANTS = (DISTINCT, COPIES, SERIAL)


# Bytes of random data at the start of each distinct file of the benchmark.
_UNIQUE_HEAD_BYTES = 32 * 1024


def make_inputs(workdir: str, copies: int, file_bytes: int) -> dict[str, str]:
    """{variant: folder} of `copies` files each; reused when complete. Copies are hard links."""
    folders = {DISTINCT: os.path.join(workdir, f"distinct-{copies}-{file_bytes}")}
    folders[COPIES] = folders[SERIAL] = os.path.join(workdir, f"copies-{copies}-{file_bytes}")
    for variant in (DISTINCT, COPIES):
        folder = folders[variant]
        stamp = os.path.join(folder, ".complete")
        if os.path.exists(stamp):
            continue
        os.makedirs(folder, exist_ok=True)
        original = os.path.join(folder, "original.bin")
        if variant == COPIES:
            with open(original, "wb") as handle:
                handle.write(os.urandom(file_bytes))
        for index in range(copies):
            path = os.path.join(folder, f"{index:07d}.jpg")
            if os.path.exists(path):
                continue
            if variant == COPIES:
                os.link(original, path)
            else:
                # Random bytes up front make each file's content (so its MD5 key) its own; the rest can
                # be a hole (a sparse file of the full size, read as zeros).
                with open(path, "wb") as handle:
                    handle.write(os.urandom(min(file_bytes, _UNIQUE_HEAD_BYTES)))
                    handle.truncate(file_bytes)
        if variant == COPIES:
            os.remove(original)
        open(stamp, "w").close()
    return folders


def _one_element_dedup(records, fractions):
    """DeduplicateByContent as it was before issue 20: the shared copies hashed where their group arrived."""
    import apache_beam as beam

    from preprocess.inputs import content

    keyed = records | "KeyContent" >> beam.ParDo(content.KeyContentFn(fractions)).with_outputs(
        "errors", main="keyed"
    )
    counts = keyed.keyed | "CountPerKey" >> beam.combiners.Count.PerKey()
    separated = content._with_decisions(keyed.keyed, counts) | "SeparateSharedKeys" >> beam.ParDo(
        content.SeparateSharedKeysFn()
    ).with_outputs("shared", main="unique")
    hashed = separated.shared | "HashInFull" >> beam.ParDo(content.HashContentFn()).with_outputs(
        "errors", main="hashed"
    )
    resolved = hashed.hashed | "ResolveDuplicates" >> content.ResolveDuplicates()
    return {"unique": (separated.unique, resolved.unique) | "AllUnique" >> beam.Flatten()}


def run_once(folder: str, variant: str, workers: int) -> tuple[float, int, int]:
    """Runs the content step over `folder` in this process.

    Returns (wall time in seconds, bundles that hashed files in full, the most files one bundle hashed).
    """
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    from preprocess.inputs.content import DeduplicateByContent
    from preprocess.inputs.listing import InputRecord

    fractions = {"train": 1.0}
    names = sorted(name for name in os.listdir(folder) if name.endswith(".jpg"))
    options = PipelineOptions(direct_num_workers=workers, direct_running_mode="multi_processing")
    with timed() as timing:
        pipeline = beam.Pipeline(options=options)
        # The records are made in the pipeline (a Create of N records would be pickled into the job).
        records = (
            pipeline
            | "Folder" >> beam.Create([folder])
            | "Records"
            >> beam.FlatMap(
                lambda folder: (
                    InputRecord(
                        os.path.join(folder, name), "a", size=os.path.getsize(os.path.join(folder, name))
                    )
                    for name in names
                )
            )
            | "Spread" >> beam.Reshuffle()
        )
        if variant == SERIAL:
            result = _one_element_dedup(records, fractions)
        else:
            result = records | "Deduplicate" >> DeduplicateByContent(fractions)
        _ = result["unique"] | "Count" >> beam.combiners.Count.Globally()
        run = pipeline.run()
        run.wait_until_finish()
    seconds = timing.wall_seconds
    query = run.metrics().query(MetricsFilter().with_name("hashed_in_full_per_bundle"))
    per_bundle = [distribution.committed for distribution in query["distributions"]]
    bundles = sum(distribution.count for distribution in per_bundle)
    largest = max((distribution.max for distribution in per_bundle), default=0)
    return seconds, bundles, largest


def measure(folders: dict[str, str], repeats: int, workers: int) -> tuple[dict, dict]:
    """({variant: [seconds per run]}, {variant: (bundles that hashed, most hashed by one bundle)})."""
    seconds = {variant: [] for variant in VARIANTS}
    spread = {}
    for repeat in range(repeats):
        order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
        for variant in order:
            command = [
                sys.executable, "-m", "benchmarks.hot_key", "--run-one", variant,
                "--folder", folders[variant], "--workers", str(workers),
            ]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            run_seconds, bundles, largest = output.strip().splitlines()[-1].split()
            seconds[variant].append(float(run_seconds))
            spread[variant] = (int(bundles), int(largest))
            print(f"  {variant}: {seconds[variant][-1]:.1f} s", file=sys.stderr)
    return seconds, spread


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/bench-hot-key")
    parser.add_argument("--copies", type=int, default=4000, help="N: files per input (default 4000)")
    parser.add_argument("--file-kb", type=int, default=2048, help="size of each file in KiB (default 2048)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="local runner worker processes (default 2)")
    parser.add_argument("--tiny", action="store_true", help="a few small files, one repeat (smoke test)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--run-one", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        print(*run_once(args.folder, args.run_one, args.workers))
        return None
    if args.tiny:
        args.copies, args.file_kb, args.repeats = 20, 4, 1
    folders = make_inputs(args.workdir, args.copies, args.file_kb * 1024)
    print(f"machine: {machine_description()}; load before: {machine_load()}", file=sys.stderr)
    seconds, spread = measure(folders, args.repeats, args.workers)
    medians = {variant: median(values) for variant, values in seconds.items()}
    rows = [
        [
            variant,
            f"{medians[variant]:.1f}",
            f"{medians[variant] / medians[DISTINCT]:.2f}x",
            spread[variant][0],
            spread[variant][1],
        ]
        for variant in VARIANTS
    ]
    print(
        f"{args.copies} files of {args.file_kb} KiB, local runner with {args.workers} worker processes, "
        f"median of {args.repeats}"
    )
    print(
        format_table(
            ["input", "content step (s)", "vs. distinct", "bundles hashing", "most hashed in one bundle"],
            rows,
        )
    )
    print(f"copies, one element / copies spread: {medians[SERIAL] / medians[COPIES]:.2f}x")
    return finish_report(
        {
            "copies": args.copies,
            "file_kb": args.file_kb,
            "workers": args.workers,
            "seconds": seconds,
            "bundles_hashing_and_most_in_one": spread,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
