"""Why an input was not written: the reason codes, the error record and the one reader of the error log; the
errors that are the input's fault (a run's, not one image's)."""

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
    # The input that failed (a content.UniqueInput), where a re-run may carry the failure over without
    # decoding it again (preprocess/reuse/ledger.py); never in the error log.
    input: object = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> str:
        return json.dumps({"uri": self.uri, "reason": self.reason, "detail": self.detail}, sort_keys=True)


def first_line(error, limit: int = 300) -> str:
    """An error's (or a text's) first line, for a one-line message; its class name if it has no text."""
    text = str(error).strip().splitlines()
    return text[0][:limit] if text else type(error).__name__


class TooManyFailuresError(ValueError):
    """More of the run's inputs failed than --max-failed-fraction allows: nothing is published."""


class EmptyTrainSplitError(ValueError):
    """No image reached the train split (every input failed, or none was assigned to train): tf.Transform
    has nothing to analyze, and nothing is published. The launcher tells the failures by reason."""


class RebuildNeededError(ValueError):
    """An incremental run found, after it had picked the previous shards to reference as they are, that they
    no longer fit (near-duplicate grouping changed the label vocabulary): nothing is published, and the
    message asks for --rebuild (preprocess/reuse/stage.py)."""


# The errors of a run that are its inputs' fault, not the code's: the launcher says them without a traceback.
INPUT_FAULTS = (TooManyFailuresError, EmptyTrainSplitError, RebuildNeededError)


@dataclasses.dataclass
class ErrorLogSample:
    """What read_error_log read: the first records of each reason, the records read by reason, the bytes."""

    examples: dict[str, list[ErrorRecord]] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes_read: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    def uris(self) -> dict[str, list[str]]:
        """The examples' URIs, by reason."""
        return {reason: [record.uri for record in records] for reason, records in self.examples.items()}


def read_error_log(
    paths: list[str], per_reason: int = 3, wanted: dict | None = None, max_bytes: int | None = None
) -> ErrorLogSample:
    """The one reader of the error log: its files in order, the first `per_reason` records of each reason,
    stopping once each of the `wanted` reasons ({reason: count}) has its examples, or after `max_bytes`."""
    from preprocess import filesystem  # noqa: PLC0415 - Beam's filesystems; workers never read the log

    sample = ErrorLogSample()

    def complete() -> bool:
        return wanted is not None and all(
            len(sample.examples.get(reason, [])) >= min(per_reason, count) for reason, count in wanted.items()
        )

    for path in paths:
        if complete():
            break
        if not filesystem.FileSystems.exists(path):
            sample.notes.append(f"error file {path} is missing")
            continue
        with filesystem.FileSystems.open(path, compression_type="uncompressed") as handle:
            for line in handle:
                sample.bytes_read += len(line)
                try:
                    error = json.loads(line)
                except ValueError:
                    error = None
                if isinstance(error, dict):
                    record = ErrorRecord(
                        str(error.get("uri", "?")),
                        str(error.get("reason", "?")),
                        str(error.get("detail", "")),
                    )
                    sample.counts[record.reason] = sample.counts.get(record.reason, 0) + 1
                    examples = sample.examples.setdefault(record.reason, [])
                    if len(examples) < per_reason:
                        examples.append(record)
                if complete():
                    return sample
                if max_bytes is not None and sample.bytes_read >= max_bytes:
                    sample.notes.append(
                        f"stopped reading the error log after {max_bytes >> 20} MB; some reasons have fewer examples"
                    )
                    return sample
    return sample
