"""The near-duplicate grouping's CPU: what a job pays whatever its size, what one more image costs, and
what each image carries across the grouping's shuffles.

    python -m benchmarks.near_duplicate_grouping_cpu --small 200 --large 4000 --repeats 2

Runs `FindNearDuplicateGroups` (preprocess/near_duplicates/grouping.py)
alone, in a fresh process per run, in process (the in-memory runner, one
worker: how `python -m preprocess` runs a job below `--in-process-below`,
800 photos included), over `near_duplicate_grouping_memory`'s synthetic
SignedImages without its hot band, each signature widened to the real
signature's size (the fields above the two grey hashes taken from one real
image), and beside a bare run that only makes the images. Per repetition,
in turns:

- fixed: the grouping's CPU seconds on `--small` images, less the bare run's;
- margin: the grouping's CPU ms per image from `--small` to `--large` images, less the bare run's;
- rounds: the grouping's CPU seconds on `--small` images with its default rounds of label propagation,
  less with none (components.py: one shuffle each).

And, counted without Beam on the same images: the elements and bytes
(Beam's default coder for them) that cross each of the grouping's shuffles
per image when no image has a near-duplicate (every other shuffle carries
only grouped images, or one value per bundle).
"""

import argparse
import dataclasses
import json
import subprocess
import sys
import time

from benchmarks.measure import finish_report, format_table, median

SEED = 0


def full_size_images(num_images: int):
    """The synthetic SignedImages (no hot band), each signature with the real signature's upper fields."""
    import numpy as np
    from PIL import Image

    from benchmarks import near_duplicate_grouping_memory as synthetic
    from preprocess.near_duplicates import signature as signature_lib

    rows, columns = np.mgrid[0:256, 0:256]
    pixels = np.stack([columns, rows, (columns * rows) % 256], axis=-1).astype("uint8")
    real = signature_lib.source_signature(Image.fromarray(pixels))
    upper = (real >> (2 * signature_lib.CANDIDATE_BITS)) << (2 * signature_lib.CANDIDATE_BITS)
    for image in synthetic.synthetic_images(0, num_images, SEED, hot_share=0.0):
        yield dataclasses.replace(image, signature=image.signature | upper)


def one_run(num_images: int, grouping: bool, rounds: int | None) -> float:
    """The CPU seconds of this process to build and run the pipeline (in process, one worker)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from preprocess.near_duplicates.grouping import DEFAULT_ROUNDS, FindNearDuplicateGroups
    from preprocess.near_duplicates.signature import DEFAULT_MAX_DISTANCE

    started = time.process_time()
    options = PipelineOptions(["--direct_running_mode=in_memory", "--direct_num_workers=1"])
    with beam.Pipeline(options=options) as pipeline:
        images = (
            pipeline
            | "Count" >> beam.Create([num_images])
            | "Make" >> beam.FlatMap(lambda count: full_size_images(count))
        )
        if grouping:
            found = images | "Group" >> FindNearDuplicateGroups(
                DEFAULT_MAX_DISTANCE, rounds=DEFAULT_ROUNDS if rounds is None else rounds
            )
            found["stats"] | "Stats" >> beam.Map(lambda stats: None)
        else:
            images | "Bare" >> beam.Map(lambda image: None)
    return time.process_time() - started


def measured(num_images: int, grouping: bool, rounds: int | None = None) -> float:
    """`one_run` in a fresh process."""
    command = [sys.executable, "-m", "benchmarks.near_duplicate_grouping_cpu", "--one", str(num_images)]
    command += ["--grouping"] if grouping else []
    command += ["--rounds", str(rounds)] if rounds is not None else []
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(output.strip().splitlines()[-1])


def shuffle_census(num_images: int) -> list[dict]:
    """Per image: the elements and coded bytes each shuffle carries when no image has a near-duplicate."""
    from apache_beam.coders import coders

    from preprocess.near_duplicates import components, grouping

    coder = coders.FastPrimitivesCoder()
    tables = grouping._BandTables(grouping.band_masks(grouping.default_bands()))
    images = list(full_size_images(num_images))
    crossings = {
        "Floods (by signature: the SignedImage)": lambda image: [
            (grouping.signature_bytes(image.signature), image)
        ],
        "Buckets (per band and hash: key, signature)": lambda image: list(
            grouping._band_entries(image, tables)
        ),
        "Components' LastRound (key: the SignedImage and its Flood)": lambda image: [
            (image.key, (components._ENTRY, (image, grouping.Flood.of(image))))
        ],
    }
    census = []
    for name, elements_of in crossings.items():
        elements = [element for image in images for element in elements_of(image)]
        coded = sum(len(coder.encode(element)) for element in elements)
        census.append(
            {"shuffle": name, "elements": len(elements) / len(images), "bytes": round(coded / len(images))}
        )
    return census


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--grouping", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(one_run(args.one, args.grouping, args.rounds))
        return {}

    runs = []
    for repeat in range(args.repeats):
        run = {"repeat": repeat}
        for size in (args.small, args.large):
            run[f"bare_{size}"] = measured(size, grouping=False)
            run[f"grouping_{size}"] = measured(size, grouping=True)
        run["grouping_no_rounds"] = measured(args.small, grouping=True, rounds=0)
        run["fixed_s"] = run[f"grouping_{args.small}"] - run[f"bare_{args.small}"]
        extra_large = run[f"grouping_{args.large}"] - run[f"bare_{args.large}"]
        run["margin_ms"] = 1000 * (extra_large - run["fixed_s"]) / (args.large - args.small)
        run["rounds_s"] = run[f"grouping_{args.small}"] - run["grouping_no_rounds"]
        runs.append(run)
        print(json.dumps(run), file=sys.stderr)
    census = shuffle_census(args.large)
    print(
        format_table(
            ["repeat", "fixed (CPU s)", "margin (CPU ms per image)", "rounds of propagation (CPU s)"],
            [
                [r["repeat"], f"{r['fixed_s']:.2f}", f"{r['margin_ms']:.3f}", f"{r['rounds_s']:.2f}"]
                for r in runs
            ],
        )
    )
    print()
    print(
        format_table(
            ["shuffle", "elements per image", "coded bytes per image"],
            [[c["shuffle"], f"{c['elements']:.2f}", c["bytes"]] for c in census],
        )
    )
    figures = {
        "small": args.small,
        "large": args.large,
        "fixed_cpu_seconds": median(r["fixed_s"] for r in runs),
        "margin_cpu_ms_per_image": median(r["margin_ms"] for r in runs),
        "rounds_cpu_seconds": median(r["rounds_s"] for r in runs),
        "runs": runs,
        "shuffles_per_image_unique": census,
    }
    report = finish_report(figures, args.json)
    print(json.dumps({key: report[key] for key in report if key != "runs"}))
    return report


if __name__ == "__main__":
    main()
