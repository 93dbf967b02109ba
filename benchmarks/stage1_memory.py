"""Stage 1's memory on the local runner: peak RSS on a corpus 4x larger vs. the 1x corpus.

    python -m benchmarks.stage1_memory --cache /tmp/bench-cache --num-images 600 --factor 4 --repeats 2

Runs `python -m preprocess` (DirectRunner, multi_processing, 2 workers) on
an Nx and a factor*N corpus of the same photos (benchmarks/corpus.py: the
larger one adds COM-segment variants, distinct files with the same decode
cost), in turns, and samples the whole process tree every 0.25 s: the main
process (the runner) and Beam's SDK worker subprocesses, RSS summed (PSS
too: the workers share TensorFlow's and Beam's libraries). The target:

  target 3: peak RSS (factor x corpus) / peak RSS (1x corpus) <= 1.3 (issue 11; 1.5 before)

i.e. memory must not grow with the corpus. The main process's own peak is
reported separately: the local runner keeps every PCollection that crosses a
stage boundary in the main process, so that is where growth shows. So is the
largest peak of one SDK worker process: what each SDK process of a Dataflow
worker (one per vCPU) needs for the same work (README, the cloud workflow).
"""

import argparse
import json
import os
import shutil
import sys

from benchmarks import corpus as corpus_lib
from benchmarks.measure import (
    add_stage1_arg_option,
    finish_report,
    format_table,
    machine_line,
    median,
    mib,
    run_measured,
    scaling_ratios,
    stage1_command,
)


def run_stage1(corpus: str, output: str, args, log_path: str):
    shutil.rmtree(output, ignore_errors=True)
    argv = stage1_command(
        corpus,
        output,
        args.image_size,
        args.encoding,
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={args.workers}",
        # Both corpus sizes with the same worker processes, however small the smaller one is.
        "--in-process-below",
        "0",
        # A benchmark measures speed, not the corpus: its tiny sizes may leave a class out of train.
        "--max-failed-fraction",
        "1",
        *args.stage1_args,
    )
    result = run_measured(argv, interval=args.interval, log_path=log_path)
    with open(os.path.join(output, "dataset.json")) as handle:
        accounting = json.load(handle)["inputs"]
    shutil.rmtree(output, ignore_errors=True)
    return result, accounting


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stage1_memory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Where the photo corpora are cached.")
    parser.add_argument("--num-images", type=int, default=600, help="The 1x corpus.")
    parser.add_argument("--unique", type=int, default=None, help="Distinct renders (default: --num-images).")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--encoding", default="uint8")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.25, help="Seconds between memory samples.")
    parser.add_argument("--workdir", default="/tmp/bench-memory")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument(
        "--tiny", action="store_true", help="Smoke test: 6 and 12 tiny photos, 32 px, 1 repeat."
    )
    add_stage1_arg_option(parser)
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    megapixels = corpus_lib.PHOTO_MEGAPIXELS
    if args.tiny:
        args.num_images, args.unique, args.factor, args.image_size, args.repeats = 6, 6, 2, 32, 1
        megapixels = corpus_lib.TINY_MEGAPIXELS
    os.makedirs(args.workdir, exist_ok=True)
    unique = args.unique or args.num_images
    corpora = {
        1: corpus_lib.photo_corpus(args.cache, args.num_images, unique=unique, megapixels=megapixels),
        args.factor: corpus_lib.photo_corpus(
            args.cache, args.num_images * args.factor, unique=unique, megapixels=megapixels
        ),
    }
    print(machine_line())
    for factor, corpus in corpora.items():
        files = corpus_lib.corpus_files(corpus)
        print(
            f"corpus {factor}x: {corpus}: {len(files)} JPEGs, {corpus_lib.corpus_bytes(corpus) / 1e6:,.0f} MB"
        )
    print(f"{args.image_size}x{args.image_size} {args.encoding}, {args.workers} workers", flush=True)

    runs = []
    for repeat in range(args.repeats):
        order = list(corpora) if repeat % 2 == 0 else list(reversed(corpora))
        for factor in order:
            log_path = os.path.join(args.workdir, f"log-{repeat}-{factor}x.txt")
            result, accounting = run_stage1(
                corpora[factor], os.path.join(args.workdir, "out"), args, log_path
            )
            written = accounting["num_written"]
            run = {
                "repeat": repeat,
                "factor": factor,
                "inputs": accounting["num_found"],
                "images": written,
                "seconds": result.wall_seconds,
                "peak_rss_bytes": result.peak_rss_bytes,
                "peak_pss_bytes": result.peak_pss_bytes,
                "peak_rss_main_bytes": result.peak_rss_main_bytes,
                "peak_rss_sdk_worker_bytes": result.peak_rss_sdk_worker_bytes,
                "peak_processes": result.peak_processes,
                "cpu_seconds": result.cpu_seconds_by_role(),
            }
            runs.append(run)
            print(
                f"  repeat {repeat} {factor}x: {written} images in {result.wall_seconds:.0f} s, peak RSS "
                f"{mib(result.peak_rss_bytes)} MiB (PSS {mib(result.peak_pss_bytes)}, main process "
                f"{mib(result.peak_rss_main_bytes)}, largest SDK worker "
                f"{mib(result.peak_rss_sdk_worker_bytes)}, {result.peak_processes} processes)",
                flush=True,
            )

    rows = []
    for factor in corpora:
        mine = [run for run in runs if run["factor"] == factor]
        rows.append(
            [
                f"{factor}x",
                mine[0]["images"],
                f"{median(r['seconds'] for r in mine):.0f}",
                mib(median(r["peak_rss_bytes"] for r in mine)),
                mib(median(r["peak_pss_bytes"] for r in mine)),
                mib(median(r["peak_rss_main_bytes"] for r in mine)),
                mib(median(r["peak_rss_sdk_worker_bytes"] for r in mine)),
            ]
        )
    print()
    print(
        format_table(
            [
                "corpus",
                "images",
                "seconds",
                "peak RSS MiB (tree)",
                "peak PSS MiB (tree)",
                "peak RSS MiB (main)",
                "peak RSS MiB (one SDK worker)",
            ],
            rows,
        )
    )
    ratios = scaling_ratios(runs, "peak_rss_bytes", args.factor)
    main_ratio = median(r["peak_rss_main_bytes"] for r in runs if r["factor"] == args.factor) / median(
        r["peak_rss_main_bytes"] for r in runs if r["factor"] == 1
    )
    verdict = "met" if median(ratios) <= 1.3 else "NOT met"
    print(
        f"\npeak RSS {args.factor}x / 1x: median {median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}); "
        f"target <= 1.3: {verdict}. Main process alone: {main_ratio:.2f}"
    )
    figures = {
        "corpora": {str(k): v for k, v in corpora.items()},
        "runs": runs,
        "ratio": {"values": ratios, "median": median(ratios)},
        "main_process_ratio": main_ratio,
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
