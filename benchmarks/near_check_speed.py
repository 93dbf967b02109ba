"""The pair check's speed: `signature.near` over the candidate pairs the grouping checks.

    python -m benchmarks.near_check_speed --images 20000

The corpus is benchmarks/near_duplicate_grouping_memory.py's synthetic one
(random signatures, planted chains, a hot band). Its candidate pairs are made
as `grouping.VerifyBucketFn` makes them: every pair of a bucket under the cap
(`DEFAULT_MAX_BUCKET_SIZE`) whose grey distance is within the reach
(`DEFAULT_MAX_DISTANCE + NEAR_MISS_BITS`). The figure is the wall time of
`near` over them, in one process (no Beam: the check alone), the best of
`--repeats` runs. `--before COMMIT` times that commit's signature.py too (read
with `git show`), in turns with the current one, and checks that both give the
same answers.

    python -m benchmarks.near_check_speed --images 5000 --before 2f440fe
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


def candidate_pairs(num_images: int) -> list[tuple[int, int]]:
    """The (signature, signature) pairs that VerifyBucketFn passes to `near` on the synthetic corpus."""
    buckets = {}
    masks = grouping.band_masks(grouping.default_bands())
    for image in synthetic_images(0, num_images):
        for bucket, point in grouping._band_entries(image, masks):
            buckets.setdefault(bucket, []).append(point)
    reach = signature_lib.DEFAULT_MAX_DISTANCE + grouping.NEAR_MISS_BITS
    pairs = []
    for points in buckets.values():
        if len(points) > grouping.DEFAULT_MAX_BUCKET_SIZE:
            continue
        for (key_a, a), (key_b, b) in itertools.combinations(sorted(set(points)), 2):
            if key_a != key_b and signature_lib.grey_distance(a, b)[0] <= reach:
                pairs.append((a, b))
    return pairs


def time_near(module, pairs) -> tuple[float, list]:
    """(seconds, answers) of `module.near` over `pairs`."""
    reach = signature_lib.DEFAULT_MAX_DISTANCE + grouping.NEAR_MISS_BITS
    near = module.near
    start = time.perf_counter()
    answers = [near(a, b, reach) for a, b in pairs]
    return time.perf_counter() - start, answers


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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="a commit whose signature.py is timed too, in turns with this one")
    args = parser.parse_args(argv)
    pairs = candidate_pairs(args.images)
    contenders = {"now": signature_lib}
    if args.before:
        contenders["before"] = signature_module_at(args.before)
    seconds = {name: [] for name in contenders}
    answers = {}
    for _ in range(args.repeats):
        for name, module in contenders.items():
            taken, answers[name] = time_near(module, pairs)
            seconds[name].append(taken)
    result = {
        "images": args.images,
        "candidate_pairs": len(pairs),
        "distinct_signatures": len({value for pair in pairs for value in pair}),
        "near_seconds": {name: [round(value, 3) for value in values] for name, values in seconds.items()},
        "microseconds_per_pair": {
            name: round(1e6 * min(values) / max(1, len(pairs)), 2) for name, values in seconds.items()
        },
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }
    if args.before:
        result["speedup_best_of_runs"] = round(min(seconds["before"]) / min(seconds["now"]), 2)
        result["same_answers"] = answers["before"] == answers["now"]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
