"""Content hashing, exact-duplicate removal and the deterministic split.

The hash of a file's bytes is its identity: duplicates are found by it and the
split is a function of it, so the same corpus gives the same split on every
run and every runner, and two copies of one image can never land in two
splits. Only (hash, uri, label) travels through the shuffles here, never the
image bytes, so they stay small whatever the corpus size; and the copies of
one hash are counted by a combiner and then streamed past its decision, never
gathered, so a million copies of one placeholder image cost O(N), not O(N^2).
"""

import dataclasses
import heapq

import apache_beam as beam
from apache_beam.metrics import Metrics

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.inputs import InputRecord
from preprocess.progress import ProgressCounter
from preprocess.reading import hash_file


@dataclasses.dataclass(frozen=True)
class UniqueInput:
    """One distinct image: where to read it, its class, its split and its hash."""

    uri: str
    label: str
    split: str
    sha256: str


class HashContentFn(beam.DoFn):
    """InputRecord -> (sha256, InputRecord); empty or unreadable files -> 'errors'.

    Only a deterministic read failure (reading.py) is this input's error;
    anything else is raised, so that the runner retries the bundle.
    """

    def __init__(self):
        self._hashed = Metrics.counter("preprocess", "hashed")
        self._progress = ProgressCounter("hashed")
        self._progress_failed = ProgressCounter("failed")

    def process(self, record: InputRecord):
        try:
            sha256, size = hash_file(record.uri)
        except errors.ImageError as exc:
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput("errors", errors.ErrorRecord(record.uri, exc.reason, exc.detail))
            return
        if size == 0:
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput(
                "errors", errors.ErrorRecord(record.uri, errors.EMPTY_FILE, "the file is empty")
            )
            return
        self._hashed.inc()
        self._progress.inc()
        yield sha256, record


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


# How many copies an error record names, and how many conflicting labels a
# decision keeps: enough to find the copies, bounded however many there are.
NAMED_COPIES = 5
NAMED_LABELS = 20


@dataclasses.dataclass(frozen=True)
class ContentCopies:
    """What is known about all copies of one content hash, in space bounded whatever their number.

    `first` holds the NAMED_COPIES + 1 copies with the smallest URIs (sorted),
    so that any copy can name NAMED_COPIES others; `labels` the smallest
    NAMED_LABELS distinct labels, `more_labels` whether there were others.
    """

    count: int
    first: tuple[InputRecord, ...]
    labels: tuple[str, ...]
    more_labels: bool = False

    @property
    def kept(self) -> InputRecord:
        """The copy written: the one with the smallest URI (stable across runs and runners)."""
        return self.first[0]

    @property
    def conflicting(self) -> bool:
        return len(self.labels) > 1

    def others(self, uri: str) -> list[str]:
        """Up to NAMED_COPIES URIs of copies other than `uri`, smallest first."""
        return [record.uri for record in self.first if record.uri != uri][:NAMED_COPIES]

    def describe_labels(self) -> str:
        return f"{list(self.labels)}" + (" and more" if self.more_labels else "")


def _copy_order(record: InputRecord) -> tuple[str, str, str]:
    # By URI; label and split only break ties between two listings of one URI, so that the kept
    # copy is the same on every runner whatever order the copies arrive in.
    return record.uri, record.label, record.split or ""


class CountCopiesFn(beam.CombineFn):
    """InputRecords of one hash -> ContentCopies: O(1) per copy, an accumulator of bounded size.

    A scraped corpus can hold a million copies of one placeholder image; the
    combiner is lifted, so they are counted where they are hashed, and no
    worker ever holds more than a few of them.
    """

    def create_accumulator(self):
        return ContentCopies(0, (), ())

    def add_input(self, accumulator, record):
        first = accumulator.first
        if len(first) <= NAMED_COPIES or _copy_order(record) < _copy_order(first[-1]):
            first = tuple(heapq.nsmallest(NAMED_COPIES + 1, (*first, record), key=_copy_order))
        labels, more_labels = accumulator.labels, accumulator.more_labels
        if record.label not in labels:
            labels = tuple(sorted((*labels, record.label)))
            more_labels = more_labels or len(labels) > NAMED_LABELS
            labels = labels[:NAMED_LABELS]
        return ContentCopies(accumulator.count + 1, first, labels, more_labels)

    def merge_accumulators(self, accumulators):
        count, first, labels, more_labels = 0, [], set(), False
        for accumulator in accumulators:
            count += accumulator.count
            first.extend(accumulator.first)
            labels.update(accumulator.labels)
            more_labels = more_labels or accumulator.more_labels
        first = heapq.nsmallest(NAMED_COPIES + 1, first, key=_copy_order)
        kept_labels = sorted(labels)[:NAMED_LABELS]
        more_labels = more_labels or len(labels) > NAMED_LABELS
        return ContentCopies(count, tuple(first), tuple(kept_labels), more_labels)

    def extract_output(self, accumulator):
        return accumulator


# Tags of the two kinds of value grouped under a hash for the second pass.
_COPY = 0
_DECISION = 1


class ResolveDuplicatesFn(beam.DoFn):
    """(sha256, [(tag, copy or decision), ...]) -> one UniqueInput, duplicates, or errors.

    Copies under one label are one image: the copy with the smallest URI is
    kept and the rest are counted as duplicates. Copies under different
    labels are a labelling mistake that no rule can settle: every copy
    becomes a CONFLICTING_LABELS error. Each copy's fate follows from the
    per-hash decision (a ContentCopies) alone, so the group is read twice,
    for the decision and then copy by copy, and never held: O(N) for N copies.
    A group-by's values may be iterated again; on Dataflow they are read from
    the shuffle as they are consumed.
    """

    def __init__(self, fractions: dict[str, float]):
        self._fractions = fractions
        self._duplicates = Metrics.counter("preprocess", "duplicates")
        self._progress_duplicates = ProgressCounter("duplicates")
        self._progress_failed = ProgressCounter("failed")

    def process(self, element):
        sha256, tagged = element
        copies = next(value for tag, value in tagged if tag == _DECISION)
        records = (value for tag, value in tagged if tag == _COPY)
        if copies.conflicting:
            for record in records:
                self._progress_failed.inc()
                yield beam.pvalue.TaggedOutput(
                    "errors",
                    errors.ErrorRecord(
                        record.uri,
                        errors.CONFLICTING_LABELS,
                        f"identical content is labelled {copies.describe_labels()}; "
                        f"other copies: {copies.others(record.uri)}",
                    ),
                )
            return
        kept = copies.kept
        yield UniqueInput(
            uri=kept.uri,
            label=kept.label,
            split=kept.split or assign_split(sha256, self._fractions),
            sha256=sha256,
        )
        # The same URI may be listed twice (two manifest rows): one of them is the kept copy.
        kept_seen = False
        for record in records:
            if record == kept and not kept_seen:
                kept_seen = True
                continue
            self._duplicates.inc()
            self._progress_duplicates.inc()
            yield beam.pvalue.TaggedOutput("duplicates", {"uri": record.uri, "duplicate_of": kept.uri})


class ResolveDuplicates(beam.PTransform):
    """(sha256, InputRecord) pairs -> UniqueInputs (main), plus 'errors' and 'duplicates' outputs.

    Two passes instead of one group of all copies: a lifted combine decides
    per hash (which copy is kept, whether labels conflict), then the decision
    and the copies are grouped under the hash and each copy goes past the
    decision. (Not a CoGroupByKey: Beam's Python one copies each side of a
    group into a list, which for a hot hash is every copy at once.)
    """

    def __init__(self, fractions: dict[str, float]):
        super().__init__()
        self._fractions = fractions

    def expand(self, hashed):
        copies = hashed | "CountCopies" >> beam.CombinePerKey(CountCopiesFn())
        tagged_copies = hashed | "TagCopies" >> beam.MapTuple(
            lambda sha256, record: (sha256, (_COPY, record))
        )
        tagged_decisions = copies | "TagDecisions" >> beam.MapTuple(
            lambda sha256, decision: (sha256, (_DECISION, decision))
        )
        return (
            (tagged_copies, tagged_decisions)
            | "CopiesWithDecisions" >> beam.Flatten()
            | "GroupByHash" >> beam.GroupByKey()
            | "Resolve"
            >> beam.ParDo(ResolveDuplicatesFn(self._fractions)).with_outputs(
                "errors", "duplicates", main="unique"
            )
        )


class DeduplicateByContent(beam.PTransform):
    """InputRecords -> UniqueInputs (main), plus 'errors' and 'duplicates' outputs."""

    def __init__(self, fractions: dict[str, float]):
        super().__init__()
        self._fractions = fractions

    def expand(self, records):
        hashed = records | "HashContent" >> beam.ParDo(HashContentFn()).with_outputs("errors", main="hashed")
        resolved = hashed.hashed | "ResolveDuplicates" >> ResolveDuplicates(self._fractions)
        all_errors = (hashed.errors, resolved.errors) | "MergeHashErrors" >> beam.Flatten()
        return {"unique": resolved.unique, "errors": all_errors, "duplicates": resolved.duplicates}
