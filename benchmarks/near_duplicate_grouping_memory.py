"""The near-duplicate grouping's memory per worker: peak RSS on 4x the images vs. 1x.

    python -m benchmarks.near_duplicate_grouping_memory --images 20000 --factor 4 --repeats 2

Runs `FindNearDuplicateGroups` (preprocess/near_duplicates/grouping.py) alone
in a fresh process per run, on the local runner with 2 SDK worker processes
(`--direct_running_mode=multi_processing`, the workers of
preprocess/launch/local_worker.py, as `python -m preprocess` runs them), over
synthetic SignedImages made inside the workers (never held by the runner
before the first stage): random 64-bit signatures, planted near-duplicate
groups (chains of 2-6 images, 1-4 bits apart per step, 5% of the images) and
a hot band (15% of the images: one near-blank signature with 0-2 bits
flipped, so every band has a bucket over the cap at both sizes, 3,000 and
12,000 images at the default sizes). The Nx and
factor*N corpora are runs in turns, and the process tree is sampled every
0.25 s (benchmarks/measure.py).

The figure is the largest peak RSS of one SDK worker process: what each SDK
process of a Dataflow worker needs for the same work. The local runner keeps
every PCollection that crosses a stage in its own (main) process, so the
main process grows with the corpus where a Dataflow worker does not (its
shuffle is a service): its peak is printed for information. The runner also
gives each worker one bundle per stage, its share of the stage's whole input,
so a worker's bundles grow with the corpus too: `--scale-workers` runs the
factor x corpus on factor x the workers, so that each worker's bundle is the
same at both sizes, as a Dataflow worker's are. `--bundle-heap` reports the
largest worker's Python heap (tracemalloc, bundle_heap_worker.py). The target
(issues 24, 30): peak RSS of a worker (factor x corpus) / (1x corpus) <= 1.1.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile

from benchmarks.measure import (
    finish_report,
    format_table,
    machine_line,
    median,
    mib,
    python_module,
    run_measured,
)

TARGET_RATIO = 1.1
# Images made per element of the generating step: small enough that making them is no peak.
CHUNK = 1000
PLANTED_SHARE = 0.05
# The hot band's share: 3,000 near-blank images at the default 1x (20,000), 12,000 at 4x, so that its buckets
# are over the cap (grouping.DEFAULT_MAX_BUCKET_SIZE, 2,000) at both sizes and grow with the corpus.
HOT_SHARE = 0.15


def synthetic_images(chunk: int, size: int, seed: int = 0, hot_share: float = HOT_SHARE):
    """The SignedImages of one chunk: random signatures, planted chains and near-blank ones (the hot band)."""
    from preprocess.near_duplicates.grouping import SignedImage

    rng = random.Random(f"{seed}-{chunk}")
    blank = random.Random(f"{seed}-blank").getrandbits(64)
    made = 0

    def image(signature):
        nonlocal made
        name = f"{seed}-{chunk}-{made}"
        made += 1
        key = hashlib.sha256(name.encode()).hexdigest()
        return SignedImage(
            key=key,
            # The mirrored hash (bits 64-127): random, so that it meets no other image's.
            signature=signature | rng.getrandbits(64) << 64,
            uri=f"gs://bench/images/{name}.jpg",
            label=f"class{rng.randrange(10)}",
            split=rng.choice(("train", "train", "train", "validation", "test")),
            split_given=False,
            source_pixels=rng.randrange(10_000, 4_000_000),
            num_bytes=rng.randrange(5_000, 2_000_000),
            locator=(f"staging/decoded/part-{chunk}.arrow", made),
        )

    while made < size:
        draw = rng.random()
        if draw < hot_share:
            yield image(blank ^ sum(1 << bit for bit in rng.sample(range(64), rng.randint(0, 2))))
        elif draw < hot_share + PLANTED_SHARE:
            signature = rng.getrandbits(64)
            for _ in range(min(rng.randint(2, 6), size - made)):
                yield image(signature)
                for bit in rng.sample(range(64), rng.randint(1, 4)):
                    signature ^= 1 << bit
        else:
            yield image(rng.getrandbits(64))


GROUPING = "grouping"
BARE_SHUFFLE = "bare shuffle"
CONTENDERS = (GROUPING, BARE_SHUFFLE)


def _bare_shuffle(images):
    """The least a bucketing transform does: each image's band entries through one GroupByKey, counted."""
    import apache_beam as beam

    from preprocess.near_duplicates.grouping import _band_entries, _BandTables, band_masks, default_bands

    sizes = (
        images
        | "Bands" >> beam.FlatMap(_band_entries, _BandTables(band_masks(default_bands())))
        | "Buckets" >> beam.GroupByKey()
        | "Sizes" >> beam.MapTuple(lambda bucket, points: sum(1 for _ in points))
    )
    stats = sizes | "Stats" >> beam.combiners.Count.Globally()
    return stats | "AsStats" >> beam.Map(
        lambda buckets: {
            "groups": 0,
            "images_in_groups": 0,
            "hot_buckets": 0,
            "hot_bucket_entries": 0,
            "buckets": buckets,
        }
    )


def run_grouping(
    num_images: int, output: str, workers: int, contender: str = GROUPING, bundle_heap_dir: str | None = None
) -> None:
    """In this process: `contender` over `num_images` synthetic images, on the local runner's worker processes
    (under tracemalloc, writing each bundle's heap to `bundle_heap_dir`, if given: bundle_heap_worker.py)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from benchmarks import bundle_heap_worker
    from preprocess.launch.local_runner import LOCAL_WORKER, fn_api_runner
    from preprocess.near_duplicates.grouping import FindNearDuplicateGroups
    from preprocess.near_duplicates.signature import DEFAULT_MAX_DISTANCE

    options = PipelineOptions(["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"])
    sizes = [min(CHUNK, num_images - start) for start in range(0, num_images, CHUNK)]
    worker = LOCAL_WORKER
    if bundle_heap_dir is not None:
        os.environ[bundle_heap_worker.DIR_ENV_VAR] = bundle_heap_dir
        worker = "benchmarks.bundle_heap_worker"
    with beam.Pipeline(runner=fn_api_runner(options, worker_module=worker), options=options) as pipeline:
        images = (
            pipeline
            | "Chunks" >> beam.Create(list(enumerate(sizes)))
            | "Spread" >> beam.Reshuffle()
            | "Make" >> beam.FlatMapTuple(synthetic_images)
        )
        if contender == BARE_SHUFFLE:
            stats, members = _bare_shuffle(images), pipeline | "NoMembers" >> beam.Create([0])
        else:
            result = images | "Group" >> FindNearDuplicateGroups(DEFAULT_MAX_DISTANCE)
            stats = result["stats"]
            members = result["members"] | "CountMembers" >> beam.combiners.Count.Globally()
        _ = (
            stats
            | "WithMembers"
            >> beam.Map(
                lambda stats, members: {**stats, "members": members}, beam.pvalue.AsSingleton(members)
            )
            | "Json" >> beam.Map(json.dumps, sort_keys=True)
            | "Write" >> beam.io.WriteToText(output, shard_name_template="")
        )


def measure(num_images: int, contender: str, args, workdir: str, log_name: str, workers: int) -> dict:
    output = os.path.join(workdir, f"stats-{num_images}.json")
    argv = python_module(
        "benchmarks.near_duplicate_grouping_memory",
        "--run-grouping",
        str(num_images),
        "--contender",
        contender,
        "--output",
        output,
        "--workers",
        str(workers),
    )
    heap_dir = None
    if args.bundle_heap:
        heap_dir = os.path.join(workdir, log_name + ".heap")
        os.makedirs(heap_dir)
        argv += ["--bundle-heap-dir", heap_dir]
    # The benchmarks package is not installed: the child and its workers find it in this checkout.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pythonpath = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "TPU_LOAD_LIBRARY": "0"}
    result = run_measured(argv, interval=args.interval, log_path=os.path.join(workdir, log_name), env=env)
    with open(output) as handle:
        stats = json.loads(handle.read())
    return {
        "images": num_images,
        "workers": workers,
        "seconds": result.wall_seconds,
        "peak_rss_sdk_worker_bytes": result.peak_rss_sdk_worker_bytes,
        "peak_rss_main_bytes": result.peak_rss_main_bytes,
        "peak_rss_bytes": result.peak_rss_bytes,
        "stats": stats,
        **({} if heap_dir is None else bundle_heaps(heap_dir)),
    }


def bundle_heaps(heap_dir: str) -> dict:
    """The largest worker's Python heap from bundle_heap_worker.py's lines: its peak in any bundle (and that
    bundle's transforms), the most it held between bundles, and the least (its imports)."""
    workers = []
    for name in sorted(os.listdir(heap_dir)):
        with open(os.path.join(heap_dir, name)) as handle:
            bundles = [json.loads(line) for line in handle]
        top = max(bundles, key=lambda bundle: bundle["heap_at_start"] + bundle["peak_over_start"])
        workers.append(
            {
                "heap_peak_bytes": top["heap_at_start"] + top["peak_over_start"],
                "heap_peak_transforms": top["transforms"],
                "heap_between_bundles_bytes": max(bundle["heap_at_start"] for bundle in bundles),
                "heap_imports_bytes": min(bundle["heap_at_start"] for bundle in bundles),
            }
        )
    return max(workers, key=lambda worker: worker["heap_peak_bytes"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.near_duplicate_grouping_memory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--images", type=int, default=20_000, help="The 1x corpus.")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--scale-workers",
        action="store_true",
        help="Run the factor x corpus on factor x the workers: each worker's bundle of a stage (this runner "
        "gives each worker one bundle, its share of the stage's input) is then the same at both sizes, as "
        "on Dataflow, where bundles are streamed; what still grows is what the grouping holds.",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.25, help="Seconds between memory samples.")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument("--tiny", action="store_true", help="Smoke test: 300 and 600 images, 1 repeat.")
    parser.add_argument(
        "--run-grouping", type=int, default=None, help=argparse.SUPPRESS
    )  # the measured child
    parser.add_argument("--output", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bundle-heap-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--bundle-heap",
        action="store_true",
        help="Run the workers under tracemalloc (benchmarks/bundle_heap_worker.py) and report the largest "
        "worker's Python heap: its peak in a bundle, and the most it held between bundles (what the grouping "
        "keeps across elements). 2-4x slower; the RSS figures of such a run are not the ones to report.",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="Comma-separated, of: "
        + ", ".join(CONTENDERS)
        + " (the bare shuffle: the same images' band entries "
        "through one GroupByKey, what the local runner's own plumbing costs a worker).",
    )
    parser.add_argument("--contender", default=GROUPING, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> dict | None:
    args = build_parser().parse_args(argv)
    if args.run_grouping is not None:
        run_grouping(args.run_grouping, args.output, args.workers, args.contender, args.bundle_heap_dir)
        return None
    if args.tiny:
        args.images, args.factor, args.repeats = 300, 2, 1
    sizes = {1: args.images, args.factor: args.images * args.factor}
    contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    print(machine_line())
    workers = {factor: args.workers * (factor if args.scale_workers else 1) for factor in sizes}
    print(
        f"synthetic SignedImages: {sizes[1]:,} and {sizes[args.factor]:,}; "
        f"{' and '.join(str(count) for count in workers.values())} SDK workers",
        flush=True,
    )
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            order = list(sizes) if repeat % 2 == 0 else list(reversed(sizes))
            for factor, contender in [(f, c) for f in order for c in contenders]:
                log = f"log-{repeat}-{factor}x-{contender.replace(' ', '-')}.txt"
                run = {
                    "repeat": repeat,
                    "factor": factor,
                    "contender": contender,
                    **measure(sizes[factor], contender, args, workdir, log, workers[factor]),
                }
                runs.append(run)
                stats = run["stats"]
                print(
                    f"  repeat {repeat} {factor}x {contender}: {run['images']:,} images, {run['workers']} workers, "
                    f"in {run['seconds']:.0f} s; largest SDK "
                    f"worker {mib(run['peak_rss_sdk_worker_bytes'])} MiB, main process "
                    f"{mib(run['peak_rss_main_bytes'])} MiB; {stats['groups']:,} groups, "
                    f"{stats['hot_bucket_entries']:,} entries in {stats['hot_buckets']} hot buckets",
                    flush=True,
                )
                if "heap_peak_bytes" in run:
                    print(
                        f"    the largest worker's Python heap: peak {mib(run['heap_peak_bytes'])} MiB (in "
                        f"{', '.join(run['heap_peak_transforms'])}), at most {mib(run['heap_between_bundles_bytes'])} "
                        f"MiB between bundles, {mib(run['heap_imports_bytes'])} MiB at its least (the imports)",
                        flush=True,
                    )

    def figure(contender, factor, name):
        return median(run[name] for run in runs if run["factor"] == factor and run["contender"] == contender)

    rows = [
        [
            contender,
            f"{factor}x",
            f"{sizes[factor]:,}",
            f"{figure(contender, factor, 'seconds'):.0f}",
            mib(figure(contender, factor, "peak_rss_sdk_worker_bytes")),
            mib(figure(contender, factor, "peak_rss_main_bytes")),
        ]
        for contender in contenders
        for factor in sizes
    ]
    print()
    print(
        format_table(
            [
                "contender",
                "corpus",
                "images",
                "seconds",
                "peak RSS MiB (largest SDK worker)",
                "peak RSS MiB (main: the runner)",
            ],
            rows,
        )
    )
    ratios = {}
    for contender in contenders:
        ratios[contender] = []
        for repeat in range(args.repeats):
            peaks = {
                r["factor"]: r["peak_rss_sdk_worker_bytes"]
                for r in runs
                if r["repeat"] == repeat and r["contender"] == contender
            }
            ratios[contender].append(peaks[args.factor] / peaks[1])
        main_ratio = figure(contender, args.factor, "peak_rss_main_bytes") / figure(
            contender, 1, "peak_rss_main_bytes"
        )
        mine = ratios[contender]
        verdict = "met" if median(mine) <= TARGET_RATIO else "NOT met"
        print(
            f"\n{contender}: largest SDK worker's peak RSS, {args.factor}x / 1x: median {median(mine):.3f} "
            f"({', '.join(f'{r:.3f}' for r in mine)})"
            + (f"; target <= {TARGET_RATIO}: {verdict}" if contender == GROUPING else "")
            + f". The runner's main process (holds PCollections between stages; not a Dataflow worker): {main_ratio:.2f}"
        )
    return finish_report(
        {
            "sizes": {str(k): v for k, v in sizes.items()},
            "runs": runs,
            "ratios": {name: {"values": values, "median": median(values)} for name, values in ratios.items()},
        },
        args.json,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
