"""The pair check's speed: `signature.near` over the candidate pairs the grouping checks, and the whole
check of a bucket's pairs.

    python -m benchmarks.near_check_speed --images 20000

The corpus is benchmarks/near_duplicate_grouping_memory.py's synthetic one
(random signatures, planted chains, a hot band), cut into buckets as the
grouping cuts it (buckets over the cap, `DEFAULT_MAX_BUCKET_SIZE`, left out).
Two figures, each the CPU time of one process (no Beam), the best of
`--repeats` runs:

- `near`: `near` alone over the candidate pairs (every pair of a bucket whose
  grey distance is within the reach, `DEFAULT_MAX_DISTANCE + NEAR_MISS_BITS`);
- `bucket`: what `grouping.VerifyBucketFn` does with a bucket's pairs: every
  pair's grey distance (for the histogram and the reach), then `near` for
  those within reach (`grouping.bucket_near_pairs`).

`--before COMMIT` times that commit's signature.py too (read with `git show`),
in turns with the current one, its bucket check as VerifyBucketFn did it then
(`grey_distance`, then `near`, which took the grey distance again), and
checks that both give the same answers.

    python -m benchmarks.near_check_speed --images 5000 --before 2f440fe

`--signature-cost` times `source_signature` instead (with `--before`, that commit's too, in turns): CPU
milliseconds per image over the 21 photographs at their own size and over 300 product-style images (256 px,
benchmarks/near_duplicate_bands.py), the best and the median of `--repeats` runs.

    python -m benchmarks.near_check_speed --signature-cost --repeats 7 --before a5b3142~1
"""

import argparse
import importlib.util
import itertools
import json
import os
import subprocess
import tempfile
import time

from benchmarks.near_duplicate_grouping_memory import synthetic_images
from preprocess.near_duplicates import grouping
from preprocess.near_duplicates import signature as signature_lib

REACH = signature_lib.DEFAULT_MAX_DISTANCE + grouping.NEAR_MISS_BITS


def buckets(num_images: int) -> list[list[tuple[str, int]]]:
    """The buckets VerifyBucketFn compares on the synthetic corpus: [(key, signature), ...] sorted, distinct."""
    found = {}
    tables = grouping._BandTables(grouping.band_masks(grouping.default_bands()))
    for image in synthetic_images(0, num_images):
        for bucket, (key, data) in grouping._band_entries(image, tables):
            found.setdefault(bucket, []).append((key, grouping.signature_of(data)))
    return [
        sorted(set(points))
        for points in found.values()
        if 2 <= len(points) <= grouping.DEFAULT_MAX_BUCKET_SIZE
    ]


def candidate_pairs(held_buckets) -> list[tuple[int, int]]:
    """The (signature, signature) pairs that VerifyBucketFn passes to `near`."""
    pairs = []
    for held in held_buckets:
        for (key_a, a), (key_b, b) in itertools.combinations(held, 2):
            if key_a != key_b and signature_lib.grey_distance(a, b)[0] <= REACH:
                pairs.append((a, b))
    return pairs


def check_buckets_before(module, held_buckets) -> list:
    """VerifyBucketFn's pair loop as it was before `grouping.bucket_near_pairs`: `grey_distance` for the
    histogram and the reach, then `module.near`, which takes the grey distance again."""
    answers = []
    for held in held_buckets:
        histogram = [0] * (grouping.HISTOGRAM_BITS + 1)
        for (key_a, a), (key_b, b) in itertools.combinations(held, 2):
            if key_a == key_b:
                continue
            grey, _ = module.grey_distance(a, b)
            if grey <= grouping.HISTOGRAM_BITS:
                histogram[grey] += 1
            if grey > REACH:
                continue
            found = module.near(a, b, REACH)
            if found is not None:
                answers.append((found, key_a, key_b))
        answers.append(tuple(histogram))
    return answers


def check_buckets_now(held_buckets) -> list:
    answers = []
    for held in held_buckets:
        histogram = [0] * (grouping.HISTOGRAM_BITS + 1)
        answers.extend(grouping.bucket_near_pairs(held, REACH, histogram))
        answers.append(tuple(histogram))
    return answers


def timed(function, *args) -> tuple[float, list]:
    """(CPU seconds of this process, answers): on a shared machine the CPU time moves less than the wall."""
    start = time.process_time()
    answers = function(*args)
    return time.process_time() - start, answers


def near_over(module, pairs) -> list:
    """`module.near` over `pairs`, at the reach."""
    near = module.near
    return [near(a, b, REACH) for a, b in pairs]


def signature_module_at(commit: str):
    """preprocess/near_duplicates/signature.py as it was at `commit`, imported under another name."""
    source = subprocess.run(
        ["git", "show", f"{commit}:preprocess/near_duplicates/signature.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "signature_before.py")
        with open(path, "w") as handle:
            handle.write(source)
        spec = importlib.util.spec_from_file_location("signature_before", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def signature_cost(contenders: dict, repeats: int) -> dict:
    """{corpus: {name: (best, median) CPU ms per image of `source_signature`}}, the contenders in turns (the
    order flipped every run)."""
    import random  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    from benchmarks import near_duplicate_bands, near_duplicate_quality  # noqa: PLC0415

    photos = [
        Image.open(path).convert("RGB") for _, path in sorted(near_duplicate_quality.photo_paths().items())
    ]
    rng = random.Random(3)
    products = [
        near_duplicate_bands.product_image(rng, photos, rng.randrange(len(photos))) for _ in range(300)
    ]
    result = {}
    for corpus, images in (("photos at their own size", photos * 5), ("product-style images", products)):
        runs = {name: [] for name in contenders}
        for repeat in range(repeats):
            for name in sorted(contenders, reverse=bool(repeat % 2)):
                started = time.process_time()
                for image in images:
                    contenders[name].source_signature(image)
                runs[name].append(1000 * (time.process_time() - started) / len(images))
        result[corpus] = {
            name: (round(min(values), 3), round(sorted(values)[len(values) // 2], 3))
            for name, values in runs.items()
        }
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="a commit whose signature.py is timed too, in turns with this one")
    parser.add_argument(
        "--signature-cost", action="store_true", help="time source_signature instead of the pair check"
    )
    args = parser.parse_args(argv)
    if args.signature_cost:
        contenders = {"now": signature_lib}
        if args.before:
            contenders["before"] = signature_module_at(args.before)
        result = {
            "ms_per_image_best_median": signature_cost(contenders, args.repeats),
            "load_average": [round(value, 2) for value in os.getloadavg()],
        }
        print(json.dumps(result))
        return result
    held_buckets = buckets(args.images)
    pairs = candidate_pairs(held_buckets)
    contenders = {"now": signature_lib}
    if args.before:
        contenders["before"] = signature_module_at(args.before)
    seconds = {(figure, name): [] for figure in ("near", "bucket") for name in contenders}
    answers = {}
    for _ in range(args.repeats):
        for name, module in contenders.items():
            taken, answers["near", name] = timed(near_over, module, pairs)
            seconds["near", name].append(taken)
            if name == "now":
                taken, answers["bucket", name] = timed(check_buckets_now, held_buckets)
            else:
                taken, answers["bucket", name] = timed(check_buckets_before, module, held_buckets)
            seconds["bucket", name].append(taken)
    result = {
        "images": args.images,
        "buckets": len(held_buckets),
        "bucket_pairs": sum(len(held) * (len(held) - 1) // 2 for held in held_buckets),
        "candidate_pairs": len(pairs),
        "distinct_signatures": len({value for pair in pairs for value in pair}),
        "seconds": {
            f"{figure}/{name}": [round(value, 3) for value in values]
            for (figure, name), values in seconds.items()
        },
        "microseconds_per_candidate_pair": {
            f"{figure}/{name}": round(1e6 * min(values) / max(1, len(pairs)), 2)
            for (figure, name), values in seconds.items()
        },
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }
    if args.before:
        for figure in ("near", "bucket"):
            result[f"{figure}_speedup_best_of_runs"] = round(
                min(seconds[figure, "before"]) / min(seconds[figure, "now"]), 2
            )
            result[f"{figure}_same_answers"] = answers[figure, "before"] == answers[figure, "now"]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
