"""Stage 1's overhead and scaling: the Beam job vs. a hand-written multiprocessing script, same images.

    python -m benchmarks.stage1_vs_handwritten --cache /tmp/bench-cache --num-images 3000 --unique 600 \\
        --repeats 3 --workdir /tmp/bench-stage1

Contenders, each run as its own process from launch to exit (start-up
included, as a user sees it), on the same corpus, to the same image size and
encoding:

  handwritten x2  benchmarks.handwritten_stage1, a Pool of 2 processes (see that module for
                  why it is the fair baseline and what it leaves out)
  beam x2         python -m preprocess, DirectRunner --direct_running_mode=multi_processing
                  --direct_num_workers=2
  beam x1         the same with --direct_num_workers=1
  handwritten x1  (only if named in --contenders) the script with 1 process: how much a plain
                  Pool gains from a second process on this machine, to read target 2 against

The machines these run on are shared, so the contenders run in turns (the
order rotates every repetition) and every ratio is taken within one
repetition, then the median over repetitions is reported:

  target 1: images/s of beam x2 / handwritten x2   >= 0.75 (>= 0.9 from 7,500 photos)
  target 2: images/s of beam x2 / beam x1          >= 1.7

Where the time goes is read from outside, by watching the output directory:
stage 1 writes its decoded spill (staging/<run id>/decoded/) during decode + analysis,
its shard files (runs/<run id>/) during transform + encode, then packs the small ones and
writes the manifest. `--fixed-cost` also runs beam x2 on an 8-image corpus: what the
job costs whatever the corpus (imports, graph construction, stage scheduling). It runs
twice: as the product runs it (in process: `--in-process-below`), and with the two
worker processes forced (`--in-process-below 0`), which then add their start-up and
shutdown.

The beam contenders run as the product does by default, with the near-duplicate audit
(`--near-duplicates keep`). `--near-duplicate-audit` measures what the audit costs
instead: beam x2 with it and beam x2 with `--near-duplicates off` ("beam x2 off") on the
same corpus, in turns, and prints the CPU per image of both and their ratio (issue 24's
target: the audit adds at most 10%):

    python -m benchmarks.stage1_vs_handwritten --near-duplicate-audit --num-images 600 \
        --unique 600 --repeats 2 --workdir /tmp/bench-audit

It also runs both on half the corpus (the pool's first photos), in the whole corpus's
running mode (`--in-process-below 0` when the whole corpus is at or above stage 1's
in-process threshold), and prints the margin: the CPU ms one more image costs, the
difference of the two sizes' CPU over the difference of their images, with and without
the audit. Half, not a quarter: the margin is then read between the half and the whole
size, not from 400 photos of 1,600, where a worker-mode job is mostly its fixed ~20 CPU s;
the price: a job's spread (about 1 CPU s at 800 and at 1,600 photos alike, RESULTS.md,
issue 30's tenth pass) is divided by half the images instead of three quarters, so read
the margin over several runs.

(`--unique` below `--num-images` makes every further file a variant of a pool photo with
the same pixels: a near-duplicate the audit groups.)
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
    python_module,
    run_measured,
)
from preprocess import options

HANDWRITTEN_2 = "handwritten x2"
HANDWRITTEN_1 = "handwritten x1"
BEAM_2 = "beam x2"
BEAM_1 = "beam x1"
# beam x2 without the near-duplicate audit (--near-duplicates off): what the audit costs.
BEAM_2_OFF = "beam x2 off"
CONTENDERS = (HANDWRITTEN_2, BEAM_2, BEAM_1)
# Not run by default: the scaling the machine allows a plain Pool, to read target 2 against; beam x2
# without the audit (--near-duplicate-audit runs it against beam x2).
OPTIONAL_CONTENDERS = (HANDWRITTEN_1, BEAM_2_OFF)
AUDIT_CONTENDERS = (BEAM_2, BEAM_2_OFF)
# Issue 24: the near-duplicate audit adds at most 10% CPU per image.
AUDIT_CPU_TARGET = 1.10
HANDWRITTEN = (HANDWRITTEN_2, HANDWRITTEN_1)

# Stage 1's files, as paths relative to its output directory.
BEAM_PHASE_FILES = {
    "spill": r"/decoded/",
    # Written in place, in runs/<run id>/ (preprocess/write/shards.py).
    "shards": r"^runs/[^/]+/(train|validation|test)-[^/]+\.tfrecord$",
}
HANDWRITTEN_PHASE_FILES = {
    "spill": r"^\.spill/",
    "shards": r"^(train|validation|test)-[^/]*\.tfrecord$",
}


def contender_argv(name: str, corpus: str, output: str, args, extra_args=()) -> list[str]:
    common = ["--input", corpus, "--output", output, "--image-size", str(args.image_size)]
    common += ["--encoding", args.encoding]
    if name in HANDWRITTEN:
        processes = "2" if name == HANDWRITTEN_2 else "1"
        return python_module("benchmarks.handwritten_stage1", *common, "--processes", processes)
    workers = {BEAM_2: 2, BEAM_1: 1, BEAM_2_OFF: 2}[name]
    if name == BEAM_2_OFF:
        extra_args = ("--near-duplicates", "off", *extra_args)
    extra_args = (*getattr(args, "stage1_args", ()), *extra_args)
    return python_module(
        "preprocess",
        *common,
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={workers}",
        # A benchmark measures speed, not the corpus: its tiny sizes may leave a class out of train.
        "--max-failed-fraction",
        "1",
        *extra_args,
    )


def images_written(name: str, output: str) -> int:
    if name in HANDWRITTEN:
        with open(os.path.join(output, "handwritten.json")) as handle:
            return json.load(handle)["num_written"]
    with open(os.path.join(output, "dataset.json")) as handle:
        return json.load(handle)["inputs"]["num_written"]


def phases(name: str, result) -> dict[str, float]:
    """Seconds in each phase of a run, from the watched files (see the module docstring)."""
    first, last, wall = result.first_seen, result.last_growth, result.wall_seconds
    if "spill" not in first:
        # One pass (uint8, jpeg): records are written as the images are decoded.
        start = first.get("shards", wall)
        write_end = last.get("shards", wall)
        return {"start-up": start, "decode+encode+write": write_end - start, "end": wall - write_end}
    if name in HANDWRITTEN:
        start = first.get("spill", wall)
        decode_end = first.get("shards", wall)
        write_end = last.get("shards", wall)
        return {
            "start-up": start,
            "decode": decode_end - start,
            "encode+write": write_end - decode_end,
            "end": wall - write_end,
        }
    start = first["spill"]
    decode_end = last.get("spill", start)
    write_end = last.get("shards", 0.0) or wall
    return {
        "start-up": start,
        "decode+analyze": decode_end - start,
        "transform+encode+write": write_end - decode_end,
        "end": wall - write_end,
    }


def run_one(name: str, corpus: str, args, tag: str, extra_args=()) -> dict:
    output = os.path.join(args.workdir, f"out-{tag}")
    shutil.rmtree(output, ignore_errors=True)
    result = run_measured(
        contender_argv(name, corpus, output, args, extra_args),
        watch_dir=output,
        watch=HANDWRITTEN_PHASE_FILES if name in HANDWRITTEN else BEAM_PHASE_FILES,
        log_path=os.path.join(args.workdir, f"log-{tag}.txt"),
    )
    images = images_written(name, output)
    shard_bytes = sum(
        os.path.getsize(os.path.join(directory, file_name))
        for directory, _, file_names in os.walk(output)
        for file_name in file_names
        if file_name.endswith(".tfrecord")
    )
    shutil.rmtree(output, ignore_errors=True)
    source_bytes = corpus_lib.corpus_bytes(corpus)
    io = result.tree_io
    return {
        "contender": name,
        "images": images,
        "seconds": result.wall_seconds,
        "images_per_second": images / result.wall_seconds,
        "peak_rss_bytes": result.peak_rss_bytes,
        "peak_pss_bytes": result.peak_pss_bytes,
        "phases": phases(name, result),
        # Exact, from the kernel's accounting of the whole (reaped) process tree: what Dataflow bills.
        "tree_cpu_seconds": result.tree_cpu_seconds,
        "cpu_ms_per_image": 1000 * result.tree_cpu_seconds / max(images, 1),
        "shard_bytes": shard_bytes,
        # Every write()/read() syscall (files, pipes, sockets): written besides the shards, per record
        # byte; read, per byte of the source files.
        "written_besides_shards_per_record_byte": (io["wchar"] - shard_bytes) / max(shard_bytes, 1),
        "read_per_source_byte": io["rchar"] / max(source_bytes, 1),
        "cpu_seconds": result.cpu_seconds_by_role(),
        # Per worker process: are the workers sharing the work?
        "worker_cpu_seconds": [
            seconds for _, role, seconds in result.cpu_seconds if role in ("sdk worker", "pool worker")
        ],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stage1_vs_handwritten", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Where the photo corpus is cached.")
    parser.add_argument("--corpus", default=None, help="Use this ROOT/<class>/<image> tree instead.")
    parser.add_argument("--num-images", type=int, default=3000)
    parser.add_argument(
        "--unique", type=int, default=600, help="Distinct renders (see benchmarks/corpus.py)."
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--encoding", default="uint8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="Comma-separated subset.")
    parser.add_argument("--fixed-cost", action="store_true", help="Also time beam x2 on an 8-image corpus.")
    parser.add_argument("--workdir", default="/tmp/bench-stage1")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument("--tiny", action="store_true", help="Smoke test: 12 tiny photos, 32 px, 1 repeat.")
    parser.add_argument(
        "--near-duplicate-audit",
        action="store_true",
        help=f"Run only {BEAM_2!r} (with the audit) and {BEAM_2_OFF!r} (--near-duplicates off), and report "
        "the audit's CPU cost per image.",
    )
    add_stage1_arg_option(parser)
    return parser


def audit_cpu_ratios(runs: list[dict]) -> list[float]:
    """CPU ms per image with the near-duplicate audit / without it, per repetition (whole process tree)."""
    ratios = []
    for repeat in sorted({run["repeat"] for run in runs}):
        by_name = {run["contender"]: run for run in runs if run["repeat"] == repeat}
        if BEAM_2 in by_name and BEAM_2_OFF in by_name:
            ratios.append(by_name[BEAM_2]["cpu_ms_per_image"] / by_name[BEAM_2_OFF]["cpu_ms_per_image"])
    return ratios


def audit_marginal_ratios(runs: list[dict], small_runs: list[dict]) -> list[tuple[float, float, float]]:
    """Per repetition: (with, without, with / without) of the CPU ms one more image costs, from the runs on
    the half corpus to those on the whole one (both in the same running mode: `small_corpus_args`)."""
    margins = []
    for repeat in sorted({run["repeat"] for run in small_runs}):
        per_image = {}
        for name in AUDIT_CONTENDERS:
            whole = [run for run in runs if run["repeat"] == repeat and run["contender"] == name]
            half = [run for run in small_runs if run["repeat"] == repeat and run["contender"] == name]
            if not whole or not half or whole[0]["images"] <= half[0]["images"]:
                break
            extra_cpu = whole[0]["tree_cpu_seconds"] - half[0]["tree_cpu_seconds"]
            per_image[name] = 1000 * extra_cpu / (whole[0]["images"] - half[0]["images"])
        if len(per_image) == len(AUDIT_CONTENDERS):
            with_ms, without_ms = per_image[BEAM_2], per_image[BEAM_2_OFF]
            margins.append((with_ms, without_ms, with_ms / without_ms))
    return margins


def in_process_threshold(stage1_args) -> int:
    """Stage 1's --in-process-below as the beam contenders run it, read by stage 1's own parser from
    `stage1_args` (else its default): a corpus of fewer inputs runs in one process, at or above it in worker
    processes; 0: workers."""
    known, _ = options.build_parser().parse_known_args(["--input", "-", "--output", "-", *stage1_args])
    return known.in_process_below


def small_corpus_args(whole_images: int, stage1_args) -> tuple:
    """The extra stage 1 words of the half corpus's runs: its whole corpus's running mode. A whole corpus in
    worker processes has its half in them too (`--in-process-below 0`), so that the margin holds no
    difference of the two modes' fixed costs; a whole corpus in process has its half in process anyway."""
    threshold = in_process_threshold(stage1_args)
    return ("--in-process-below", "0") if 0 < threshold <= whole_images else ()


def _ratio(runs: list[dict], numerator: str, denominator: str, per_cpu_second: bool = False) -> list[float]:
    """images/s (or images per CPU second) of `numerator` / the same of `denominator`, per repetition."""

    def rate(run):
        if per_cpu_second:
            return run["images"] / max(sum(run["cpu_seconds"].values()), 1e-9)
        return run["images_per_second"]

    ratios = []
    for repeat in sorted({run["repeat"] for run in runs}):
        by_name = {run["contender"]: run for run in runs if run["repeat"] == repeat}
        if numerator in by_name and denominator in by_name:
            ratios.append(rate(by_name[numerator]) / rate(by_name[denominator]))
    return ratios


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.num_images, args.unique, args.image_size, args.repeats = 12, 12, 32, 1
    os.makedirs(args.workdir, exist_ok=True)
    megapixels = corpus_lib.TINY_MEGAPIXELS if args.tiny else corpus_lib.PHOTO_MEGAPIXELS
    corpus = args.corpus or corpus_lib.photo_corpus(
        args.cache, args.num_images, unique=args.unique, megapixels=megapixels
    )
    contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    if args.near_duplicate_audit:
        contenders = list(AUDIT_CONTENDERS)
    unknown = set(contenders) - set(CONTENDERS + OPTIONAL_CONTENDERS)
    if unknown:
        raise SystemExit(
            f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS + OPTIONAL_CONTENDERS}"
        )
    num_files = len(corpus_lib.corpus_files(corpus))
    print(machine_line())
    print(
        f"corpus: {corpus}: {num_files} JPEGs, {corpus_lib.corpus_bytes(corpus) / 1e6:,.0f} MB; "
        f"{args.image_size}x{args.image_size} {args.encoding}",
        flush=True,
    )

    # With --near-duplicate-audit, both contenders also run on half the corpus (the pool's first photos), in
    # the whole corpus's running mode, so that what one more image costs (the margin) is told from what a
    # job costs whatever its size (stages, start-up): the audit's target is per image.
    small_corpus, small_args = None, ()
    if args.near_duplicate_audit and args.num_images >= 8:
        small_corpus = corpus_lib.photo_corpus(
            args.cache,
            args.num_images // 2,
            unique=min(args.unique or args.num_images, args.num_images) // 2,
            megapixels=megapixels,
        )
        small_args = small_corpus_args(num_files, args.stage1_args)
        mode = "worker processes forced (--in-process-below 0)" if small_args else "the same running mode"
        print(f"margin: half corpus {small_corpus}, {mode}", flush=True)
    runs, small_runs = [], []
    for repeat in range(args.repeats):
        order = contenders[repeat % len(contenders) :] + contenders[: repeat % len(contenders)]
        for name in order:
            run = run_one(name, corpus, args, f"{repeat}-{name.replace(' ', '')}")
            run["repeat"] = repeat
            runs.append(run)
            if small_corpus is not None:
                small = run_one(
                    name, small_corpus, args, f"{repeat}-{name.replace(' ', '')}-half", small_args
                )
                small["repeat"] = repeat
                small_runs.append(small)
            phase_text = ", ".join(f"{k} {v:.0f}s" for k, v in run["phases"].items())
            cpu_text = f"CPU s: main {run['cpu_seconds'].get('main', 0):.0f}, workers " + "+".join(
                f"{v:.0f}" for v in run["worker_cpu_seconds"]
            )
            print(
                f"  repeat {repeat} {name:15s} {run['seconds']:7.1f} s  {run['images_per_second']:6.1f} img/s  "
                f"peak RSS {mib(run['peak_rss_bytes'])} MiB  ({phase_text}; {cpu_text})",
                flush=True,
            )

    fixed = fixed_workers = None
    if args.fixed_cost:
        small = corpus_lib.photo_corpus(args.cache, 8, unique=8, megapixels=corpus_lib.TINY_MEGAPIXELS)
        fixed = run_one(BEAM_2, small, args, "fixed-cost")
        print(f"  fixed cost: beam x2 on 8 tiny images: {fixed['seconds']:.1f} s", flush=True)
        fixed_workers = run_one(BEAM_2, small, args, "fixed-cost-workers", ("--in-process-below", "0"))
        print(f"  the same, worker processes forced: {fixed_workers['seconds']:.1f} s", flush=True)

    rows = []
    for name in contenders:
        mine = [run for run in runs if run["contender"] == name]
        phase_names = list(mine[0]["phases"])
        cpu = [sum(r["cpu_seconds"].values()) for r in mine]
        rows.append(
            [
                name,
                mine[0]["images"],
                f"{median(r['seconds'] for r in mine):.1f}",
                f"{median(r['images_per_second'] for r in mine):.1f}",
                f"{median(cpu):.0f}",
                f"{median(c / r['seconds'] for c, r in zip(cpu, mine, strict=True)):.2f}",
                mib(median(r["peak_rss_bytes"] for r in mine)),
                ", ".join(f"{p} {median(r['phases'][p] for r in mine):.0f}" for p in phase_names),
            ]
        )
    print()
    print(
        format_table(
            [
                "contender",
                "images",
                "seconds",
                "images/s",
                "CPU s",
                "cores busy",
                "peak RSS MiB",
                "phases, s",
            ],
            rows,
        )
    )
    print(
        "(medians over repetitions; CPU s: user+system of the whole process tree; cores busy: CPU s / seconds)"
    )
    ratios = {
        "beam x2 / handwritten x2": _ratio(runs, BEAM_2, HANDWRITTEN_2),
        "beam x2 / beam x1": _ratio(runs, BEAM_2, BEAM_1),
        "handwritten x2 / handwritten x1": _ratio(runs, HANDWRITTEN_2, HANDWRITTEN_1),
    }
    targets = {
        "beam x2 / handwritten x2": 0.9 if args.num_images >= 7500 else 0.75,  # issue 11
        "beam x2 / beam x1": 1.7,
        "handwritten x2 / handwritten x1": None,
    }
    print()
    for label, values in ratios.items():
        if values:
            target = targets[label]
            verdict = (
                ""
                if target is None
                else f"; target >= {target}: " + ("met" if median(values) >= target else "NOT met")
            )
            print(
                f"{label}: median {median(values):.2f} over {len(values)} repetitions "
                f"({', '.join(f'{v:.2f}' for v in values)}){verdict}"
            )
    io_rows = []
    for name in contenders:
        mine = [run for run in runs if run["contender"] == name]
        io_rows.append(
            [
                name,
                f"{median(r['cpu_ms_per_image'] for r in mine):.1f}",
                f"{median(r['written_besides_shards_per_record_byte'] for r in mine):.2f}",
                f"{median(r['read_per_source_byte'] for r in mine):.2f}",
            ]
        )
    print()
    print(
        format_table(
            ["contender", "CPU ms/image", "written besides shards / shard bytes", "read / source bytes"],
            io_rows,
        )
    )
    print(
        "(whole process tree, exact: getrusage and /proc/self/io of the reaped children; targets for beam: "
        "written <= 0.2, read <= 1.3)"
    )
    cpu_per_image = []
    for repeat in sorted({run["repeat"] for run in runs}):
        by_name = {run["contender"]: run for run in runs if run["repeat"] == repeat}
        if BEAM_2 in by_name and HANDWRITTEN_2 in by_name:
            cpu_per_image.append(
                by_name[BEAM_2]["cpu_ms_per_image"] / by_name[HANDWRITTEN_2]["cpu_ms_per_image"]
            )
    if cpu_per_image:
        print(
            f"CPU-seconds per image, beam x2 / handwritten x2 (whole tree): median {median(cpu_per_image):.2f} "
            f"({', '.join(f'{v:.2f}' for v in cpu_per_image)}); target <= 1.15"
        )
    cpu_ratio = _ratio(runs, BEAM_2, HANDWRITTEN_2, per_cpu_second=True)
    if cpu_ratio:
        print(
            f"images per CPU-second, beam x2 / handwritten x2: median {median(cpu_ratio):.2f} "
            "(what the job costs in CPU, whatever share of the machine it got)"
        )
    audit_ratios = audit_cpu_ratios(runs)
    if audit_ratios:
        per_image = {
            name: median(run["cpu_ms_per_image"] for run in runs if run["contender"] == name)
            for name in AUDIT_CONTENDERS
        }
        verdict = "met" if median(audit_ratios) <= AUDIT_CPU_TARGET else "NOT met"
        print(
            f"near-duplicate audit, CPU ms per image (whole tree, medians): with it ({BEAM_2}) "
            f"{per_image[BEAM_2]:.1f}, without it ({BEAM_2_OFF}) {per_image[BEAM_2_OFF]:.1f}; "
            f"with / without: median {median(audit_ratios):.3f} "
            f"({', '.join(f'{v:.3f}' for v in audit_ratios)}); target <= {AUDIT_CPU_TARGET}: {verdict}"
        )
    margins = audit_marginal_ratios(runs, small_runs)
    if margins:
        print(
            "near-duplicate audit, CPU ms per image at the margin (from the half corpus to the whole one, both "
            "in the whole one's running mode, whole tree, per repetition): "
            + "; ".join(
                f"with {with_ms:.2f}, without {without_ms:.2f}, ratio {ratio:.3f}"
                for with_ms, without_ms, ratio in margins
            )
            + f"; median ratio {median(r for _, _, r in margins):.3f}; target <= {AUDIT_CPU_TARGET}: "
            + ("met" if median(r for _, _, r in margins) <= AUDIT_CPU_TARGET else "NOT met")
        )
    if fixed is not None:
        print(
            f"beam x2 fixed cost (8 tiny images, in process): {fixed['seconds']:.1f} s, "
            f"{sum(fixed['cpu_seconds'].values()):.0f} CPU s; with the 2 worker processes forced: "
            f"{fixed_workers['seconds']:.1f} s, {sum(fixed_workers['cpu_seconds'].values()):.0f} CPU s "
            f"(in process / forced: {fixed['seconds'] / fixed_workers['seconds']:.2f}); target <= 10 s"
        )
    figures = {
        "corpus": corpus,
        "num_files": num_files,
        "runs": runs,
        "ratios": {label: {"values": v, "median": median(v)} for label, v in ratios.items()},
        "images_per_cpu_second_ratio": {"values": cpu_ratio, "median": median(cpu_ratio)},
        "cpu_per_image_ratio": {"values": cpu_per_image, "median": median(cpu_per_image)},
        "fixed_cost": fixed,
        "fixed_cost_with_workers": fixed_workers,
        "near_duplicate_audit_cpu_ratio": {"values": audit_ratios, "median": median(audit_ratios)},
        # The runs on half the corpus (before the fixed margin: a quarter, "near_duplicate_audit_quarter_runs").
        "near_duplicate_audit_half_runs": small_runs,
        "near_duplicate_audit_half_args": list(small_args),
        "near_duplicate_audit_marginal": [
            {"with_ms": with_ms, "without_ms": without_ms, "ratio": ratio}
            for with_ms, without_ms, ratio in margins
        ],
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
