"""What became of the inputs, as the keys of one count (pipeline.py, "CountOutcomes").

Stage 1 accounts for every input: found (a listed file or a listing error),
dropped as a copy of another, failed (with its reason), or written (to a
split, under a class). The job counts all of them in one combine, keyed by
these tuples, instead of one combine per figure (each would add its own
stages), and `tally` turns the counts into the manifest's figures.
"""

FOUND = ("found",)
DUPLICATE = ("duplicate",)
_FAILED = "failed"
_WRITTEN = "written"


def failed(error) -> tuple:
    """The outcome of an input that failed with `error` (an errors.ErrorRecord)."""
    return (_FAILED, error.reason)


def written(split: str, class_name: str) -> tuple:
    """The outcome of an example written to `split` under `class_name`."""
    return (_WRITTEN, split, class_name)


def tally(outcome_counts) -> dict:
    """(outcome, count) pairs -> finalize.build_manifest's num_found, num_duplicates, failures, class_counts.

    An outcome nothing had is absent from the counts, and counts 0.
    """
    num_found = num_duplicates = 0
    failures, class_counts = {}, []
    for outcome, count in outcome_counts:
        if outcome == FOUND:
            num_found += count
        elif outcome == DUPLICATE:
            num_duplicates += count
        elif outcome[0] == _FAILED:
            failures[outcome[1]] = failures.get(outcome[1], 0) + count
        elif outcome[0] == _WRITTEN:
            class_counts.append(((outcome[1], outcome[2]), count))
        else:
            raise ValueError(f"unknown outcome {outcome!r}")
    return {
        "num_found": num_found,
        "num_duplicates": num_duplicates,
        "failures": failures,
        "class_counts": class_counts,
    }
