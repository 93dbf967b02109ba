"""What became of the inputs, as the keys of one count (pipeline.py, "CountOutcomes")."""

FOUND = ("found",)
DUPLICATE = ("duplicate",)
NEAR_DUPLICATE = ("near_duplicate",)
# An incremental run (preprocess/reuse/): a unique input read and decoded, or carried over without either.
DECODED = ("decoded",)
REUSED = ("reused",)
_FAILED = "failed"
_WRITTEN = "written"
_SKIPPED = "skipped"


def failed(error) -> tuple:
    """The outcome of an input that failed with `error` (an errors.ErrorRecord)."""
    return (_FAILED, error.reason)


def written(split: str, class_name: str) -> tuple:
    """The outcome of an example written to `split` under `class_name`."""
    return (_WRITTEN, split, class_name)


def skipped(item) -> tuple:
    """The outcome of a file of a tree that is not an input (an inputs.SkippedFile)."""
    return (_SKIPPED, item.extension, bool(item.at_root))


# The outcomes counted as they are, by the count's key.
_COUNT_KEYS = {
    FOUND: "num_found",
    DUPLICATE: "num_duplicates",
    NEAR_DUPLICATE: "num_near_duplicates",
    DECODED: "num_decoded",
    REUSED: "num_reused",
}


def tally(outcome_counts) -> dict:
    """(outcome, count) pairs -> finalize.build_manifest's counts (num_found, num_duplicates, failures,
    class_counts, skipped_by_extension, ...); an outcome nothing had counts 0."""
    counts = dict.fromkeys(_COUNT_KEYS.values(), 0)
    counts.update(failures={}, class_counts=[], skipped_by_extension={}, skipped_at_root=0)
    for outcome, count in outcome_counts:
        if outcome in _COUNT_KEYS:
            counts[_COUNT_KEYS[outcome]] += count
        elif outcome[0] == _FAILED:
            counts["failures"][outcome[1]] = counts["failures"].get(outcome[1], 0) + count
        elif outcome[0] == _WRITTEN:
            counts["class_counts"].append(((outcome[1], outcome[2]), count))
        elif outcome[0] == _SKIPPED and outcome[2]:
            counts["skipped_at_root"] += count
        elif outcome[0] == _SKIPPED:
            by_extension = counts["skipped_by_extension"]
            by_extension[outcome[1]] = by_extension.get(outcome[1], 0) + count
        else:
            raise ValueError(f"unknown outcome {outcome!r}")
    return counts
