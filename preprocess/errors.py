"""Why an input was not written: stable reason codes and the error record.

Every input that is found but not written ends up as exactly one line of
the error log ({"uri", "reason", "detail"}; the `errors-*.jsonl` files the
manifest's `error_files` lists) or as a counted duplicate, so the
manifest's accounting (found = written + failed + duplicates) always holds.
The codes are part of the dataset format: users grep for them, so they never
change meaning.
"""

import dataclasses
import json

# What is wrong with an image's bytes: shared with the serving signature, which reports the same codes.
from dataset_contract.image_errors import (  # noqa: F401 - re-exported: every stage 1 reason is here
    DECODE_ERROR,
    EMPTY_FILE,
    NOT_AN_IMAGE,
    TOO_LARGE,
    TOO_MANY_PIXELS,
    TRUNCATED,
)

UNREADABLE = "unreadable"  # not found or access denied (transient read failures are raised: reading.py)
MISSING_LABEL = "missing_label"  # a manifest row with an empty label
UNKNOWN_LABEL = "unknown_label"  # a label not among --labels
BAD_MANIFEST_ROW = "bad_manifest_row"  # a manifest row that cannot be parsed
UNKNOWN_SPLIT = "unknown_split"  # a manifest row naming a split other than train/validation/test
CONFLICTING_LABELS = "conflicting_labels"  # identical content listed under different labels
LABEL_NOT_IN_TRAIN = "label_not_in_train"  # a class with no training example: the model cannot learn it

REASONS = (
    EMPTY_FILE,
    UNREADABLE,
    NOT_AN_IMAGE,
    TRUNCATED,
    DECODE_ERROR,
    TOO_MANY_PIXELS,
    TOO_LARGE,
    MISSING_LABEL,
    UNKNOWN_LABEL,
    BAD_MANIFEST_ROW,
    UNKNOWN_SPLIT,
    CONFLICTING_LABELS,
    LABEL_NOT_IN_TRAIN,
)


class ImageError(Exception):
    """An image that cannot be used; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    uri: str
    reason: str
    detail: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)
