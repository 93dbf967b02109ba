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


def tally(outcome_counts) -> dict:
    """(outcome, count) pairs -> finalize.build_manifest's counts (num_found, num_duplicates, failures,
    class_counts, skipped_by_extension, ...); an outcome nothing had counts 0."""
    num_found = num_duplicates = num_near_duplicates = skipped_at_root = num_decoded = num_reused = 0
    failures, class_counts, skipped_by_extension = {}, [], {}
    for outcome, count in outcome_counts:
        if outcome == FOUND:
            num_found += count
        elif outcome == DUPLICATE:
            num_duplicates += count
        elif outcome == NEAR_DUPLICATE:
            num_near_duplicates += count
        elif outcome == DECODED:
            num_decoded += count
        elif outcome == REUSED:
            num_reused += count
        elif outcome[0] == _FAILED:
            failures[outcome[1]] = failures.get(outcome[1], 0) + count
        elif outcome[0] == _WRITTEN:
            class_counts.append(((outcome[1], outcome[2]), count))
        elif outcome[0] == _SKIPPED:
            if outcome[2]:
                skipped_at_root += count
            else:
                skipped_by_extension[outcome[1]] = skipped_by_extension.get(outcome[1], 0) + count
        else:
            raise ValueError(f"unknown outcome {outcome!r}")
    return {
        "num_found": num_found,
        "num_duplicates": num_duplicates,
        "num_near_duplicates": num_near_duplicates,
        "num_decoded": num_decoded,
        "num_reused": num_reused,
        "failures": failures,
        "class_counts": class_counts,
        "skipped_by_extension": skipped_by_extension,
        "skipped_at_root": skipped_at_root,
    }
