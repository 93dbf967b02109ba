"""Content hashing, exact-duplicate removal and the deterministic split.

The hash of a file's bytes is its identity: duplicates are found by it and the
split is a function of it, so the same corpus gives the same split on every
run and every runner, and two copies of one image can never land in two
splits. Only (hash, uri, label) travels through the group-by here, never the
image bytes, so the shuffle stays small whatever the corpus size.
"""

import dataclasses
import hashlib

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.inputs import InputRecord
from preprocess.progress import ProgressCounter

_READ_CHUNK_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class UniqueInput:
    """One distinct image: where to read it, its class, its split and its hash."""

    uri: str
    label: str
    split: str
    sha256: str


def read_file_bytes(uri: str) -> bytes:
    with FileSystems.open(uri) as handle:
        return handle.read()


class HashContentFn(beam.DoFn):
    """InputRecord -> (sha256, InputRecord); empty or unreadable files -> 'errors'."""

    def __init__(self):
        self._hashed = Metrics.counter("preprocess", "hashed")
        self._progress = ProgressCounter("hashed")
        self._progress_failed = ProgressCounter("failed")

    def process(self, record: InputRecord):
        digest = hashlib.sha256()
        size = 0
        try:
            with FileSystems.open(record.uri) as handle:
                while chunk := handle.read(_READ_CHUNK_BYTES):
                    digest.update(chunk)
                    size += len(chunk)
        except Exception as exc:  # noqa: BLE001 - any I/O failure is this input's problem, not the job's
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput(
                "errors", errors.ErrorRecord(record.uri, errors.UNREADABLE, f"{type(exc).__name__}: {exc}")
            )
            return
        if size == 0:
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput(
                "errors", errors.ErrorRecord(record.uri, errors.EMPTY_FILE, "the file is empty")
            )
            return
        self._hashed.inc()
        self._progress.inc()
        yield digest.hexdigest(), record


def assign_split(sha256: str, fractions: dict[str, float]) -> str:
    """The split of an image, from its content hash alone.

    The first 64 bits of the hash are a uniform number in [0, 1); the split is
    the bucket of the cumulative fractions it falls in, in SPLITS order.
    """
    point = int(sha256[:16], 16) / float(1 << 64)
    cumulative = 0.0
    last = None
    for split in manifest_lib.SPLITS:
        fraction = fractions.get(split, 0.0)
        if fraction <= 0:
            continue
        cumulative += fraction
        last = split
        if point < cumulative:
            return split
    return last  # rounding at the top end of the last bucket


class ResolveDuplicatesFn(beam.DoFn):
    """(sha256, [InputRecord, ...]) -> one UniqueInput, duplicates, or errors.

    Copies under one label are one image: the lexicographically first URI is
    kept (stable across runs) and the rest are counted as duplicates. Copies
    under different labels are a labelling mistake that no rule can settle:
    every copy becomes a CONFLICTING_LABELS error.
    """

    def __init__(self, fractions: dict[str, float]):
        self._fractions = fractions
        self._duplicates = Metrics.counter("preprocess", "duplicates")
        self._progress_duplicates = ProgressCounter("duplicates")
        self._progress_failed = ProgressCounter("failed")

    def process(self, element):
        sha256, records = element
        records = sorted(records, key=lambda record: record.uri)
        labels = sorted({record.label for record in records})
        if len(labels) > 1:
            uris = [record.uri for record in records]
            self._progress_failed.inc(len(records))
            for record in records:
                others = [uri for uri in uris if uri != record.uri]
                yield beam.pvalue.TaggedOutput(
                    "errors",
                    errors.ErrorRecord(
                        record.uri,
                        errors.CONFLICTING_LABELS,
                        f"identical content is labelled {labels}; other copies: {others[:5]}",
                    ),
                )
            return
        kept = records[0]
        for duplicate in records[1:]:
            self._duplicates.inc()
            self._progress_duplicates.inc()
            yield beam.pvalue.TaggedOutput("duplicates", {"uri": duplicate.uri, "duplicate_of": kept.uri})
        split = kept.split or assign_split(sha256, self._fractions)
        yield UniqueInput(uri=kept.uri, label=kept.label, split=split, sha256=sha256)


class DeduplicateByContent(beam.PTransform):
    """InputRecords -> UniqueInputs (main), plus 'errors' and 'duplicates' outputs."""

    def __init__(self, fractions: dict[str, float]):
        super().__init__()
        self._fractions = fractions

    def expand(self, records):
        hashed = records | "HashContent" >> beam.ParDo(HashContentFn()).with_outputs("errors", main="hashed")
        resolved = (
            hashed.hashed
            | "GroupByHash" >> beam.GroupByKey()
            | "ResolveDuplicates"
            >> beam.ParDo(ResolveDuplicatesFn(self._fractions)).with_outputs(
                "errors", "duplicates", main="unique"
            )
        )
        all_errors = (hashed.errors, resolved.errors) | "MergeHashErrors" >> beam.Flatten()
        return {"unique": resolved.unique, "errors": all_errors, "duplicates": resolved.duplicates}
