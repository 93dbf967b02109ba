"""Exact-duplicate removal and the deterministic split, reading each file about once."""

import dataclasses
import heapq
import os
import time

import apache_beam as beam
from apache_beam.metrics import Metrics

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.inputs.listing import InputRecord
from preprocess.inputs.reading import content_key, hash_file, size_and_md5, too_large_detail
from preprocess.launch.progress import ProgressCounter
from preprocess.reuse.ledger import known_keys


@dataclasses.dataclass(frozen=True)
class UniqueInput:
    """One distinct image: where to read it, its class and its split (its sha256: taken by the decode's read)."""

    uri: str
    label: str
    split: str
    # Bytes, as keyed: the decode's read allocates the file's buffer once, at this size (reading.py).
    size: int | None = dataclasses.field(default=None, compare=False)
    # Whether the input named the split, a manifest's split column or a pre-split tree's folder
    # (near-duplicate grouping never changes it then).
    split_given: bool = dataclasses.field(default=False, compare=False)
    # The content key (the MD5's, reading.content_key): what the previous version's ledger is keyed by.
    key: str | None = dataclasses.field(default=None, compare=False)
    # The file's modification time (ns) when its key was taken (local files; None if too recent to trust):
    # the version's ledger records it beside the key, for the next re-run's quick check.
    mtime_ns: int | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def of(cls, copy) -> "UniqueInput":
        """The UniqueInput of one keyed copy of an image (an InputRecord whose content key is known)."""
        return cls(**{field.name: getattr(copy, field.name) for field in dataclasses.fields(cls)})


def _digest_or_error(read, record: InputRecord):
    """((digest, size), None) from `read(record)` -> (digest, size); (None, ErrorRecord) for a deterministic
    read failure (unreadable, too large, empty); anything else is raised, for the runner to retry."""
    try:
        digest, size = read(record)
    except errors.ImageError as exc:
        return None, errors.ErrorRecord(record.uri, exc.reason, exc.detail)
    if size == 0:
        return None, errors.ErrorRecord(record.uri, errors.EMPTY_FILE, "the file is empty")
    return (digest, size), None


class KeyContentFn(beam.DoFn):
    """InputRecord -> (content key, InputRecord with its split and size); empty, unreadable or too large
    files -> 'errors'. A record whose split the manifest does not name gets its key's."""

    def __init__(self, fractions: dict[str, float], max_file_bytes: int | None = None, known_keys=()):
        self._fractions = fractions
        self._max_file_bytes = max_file_bytes
        # The previous version's ledger files, or the job's index of them (shared_index.SharedIndex): their
        # (uri -> size, mtime, key) index, opened (or built) once per process, copied once per machine.
        self._known_keys = known_keys if hasattr(known_keys, "copy_to") else tuple(known_keys)
        self._trusted = Metrics.counter("preprocess", "keys_trusted_by_stat")
        self._keyed = Metrics.counter("preprocess", "keyed")
        self._progress = ProgressCounter("hashed")
        self._progress_failed = ProgressCounter("failed")

    def _key(self, record: InputRecord):
        size, md5 = record.size, record.md5
        if record.key is not None:
            return record.key, size  # the previous version's, trusted by the quick check (trusted_key)
        if size is None:
            size, md5 = size_and_md5(record.uri)
        if self._max_file_bytes is not None and size > self._max_file_bytes:
            raise errors.ImageError(errors.TOO_LARGE, too_large_detail(size, self._max_file_bytes))
        if size == 0:
            return None, 0
        return content_key(record.uri, size, md5, self._max_file_bytes)

    def process(self, record: InputRecord):
        if record.key is None and record.md5 is None and _is_local_path(record.uri):
            record = with_mtime(record)
            if self._known_keys:
                record = trusted_key(record, known_keys(self._known_keys))
                if record.key is not None:
                    self._trusted.inc()
        keyed, error = _digest_or_error(self._key, record)
        if error is not None:
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput("errors", error)
            return
        key, size = keyed
        self._keyed.inc()
        self._progress.inc()
        record = dataclasses.replace(
            record,
            size=size,
            mtime_ns=trustworthy_mtime(record.mtime_ns),
            split=record.split or assign_split(key, self._fractions),
            split_given=bool(record.split),
            key=key,
        )
        yield key, record


def _is_local_path(uri: str) -> bool:
    """A path on this machine's disk (no scheme): the files whose mtime the quick check can trust."""
    return "://" not in uri


# A file modified this close to the listing may be modified again within its mtime's granularity (2 s on
# FAT, 1 s on ext3 and HFS+) without its mtime changing: its mtime is not recorded, so the next re-run hashes
# it (git's "racy clean" rule).
RACY_MTIME_NS = 3_000_000_000


def trustworthy_mtime(mtime_ns: int | None, now_ns: int | None = None) -> int | None:
    """`mtime_ns` if it is old enough for a later stat of the same mtime to mean an unchanged file, else None."""
    if mtime_ns is None:
        return None
    now_ns = time.time_ns() if now_ns is None else now_ns
    return mtime_ns if mtime_ns < now_ns - RACY_MTIME_NS else None


def with_mtime(record: InputRecord) -> InputRecord:
    """A local file's record with its mtime (and, for a manifest's row, its size), taken before the file is
    read: the ledger records them beside its key (the next re-run's quick check). A file that cannot be
    stat'ed, or whose size is not the listing's any more, comes as it was (KeyContentFn says the rest)."""
    if record.mtime_ns is not None:
        return record
    try:
        stat = os.stat(record.uri)
    except OSError:
        return record
    if record.size is not None and record.size != stat.st_size:
        return record
    return dataclasses.replace(record, size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def trusted_key(record: InputRecord, known) -> InputRecord:
    """`record` with the previous version's content key where its local file's size and mtime are those
    recorded beside that key (rsync's and make's quick check: the file is then not read to be keyed); else
    as it came, to be hashed. `known`: uri -> (size, mtime_ns, content key) by `.get` (ledger.known_keys, an
    index on disk; a dict will do)."""
    recorded = known.get(record.uri)
    if recorded is None or record.md5 is not None or not _is_local_path(record.uri):
        return record
    size, mtime_ns = record.size, record.mtime_ns
    if mtime_ns is None:  # a manifest's row: the listing did not stat it
        try:
            stat = os.stat(record.uri)
        except OSError:
            return record  # KeyContentFn says what is wrong with it
        size, mtime_ns = stat.st_size, stat.st_mtime_ns
    if (size, mtime_ns) != tuple(recorded[:2]):
        return record
    return dataclasses.replace(record, size=size, mtime_ns=mtime_ns, key=recorded[2])


class HashContentFn(beam.DoFn):
    """InputRecord -> (sha256, InputRecord) of the whole file, for the files whose content key is shared;
    empty, unreadable or too large files -> 'errors'."""

    def __init__(self, max_file_bytes: int | None = None):
        self._max_file_bytes = max_file_bytes
        self._hashed = Metrics.counter("preprocess", "hashed_in_full")
        self._per_bundle = Metrics.distribution("preprocess", "hashed_in_full_per_bundle")
        self._progress_failed = ProgressCounter("failed")
        self._in_bundle = 0

    def start_bundle(self):
        self._in_bundle = 0

    def process(self, record: InputRecord):
        self._in_bundle += 1
        hashed, error = _digest_or_error(lambda record: hash_file(record.uri, self._max_file_bytes), record)
        if error is not None:
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput("errors", error)
            return
        sha256, _ = hashed
        self._hashed.inc()
        yield sha256, record

    def finish_bundle(self):
        if self._in_bundle:
            self._per_bundle.update(self._in_bundle)


def assign_split(key: str, fractions: dict[str, float]) -> str:
    """The split of an image from its content key alone: the first 64 bits as a uniform number in [0, 1),
    bucketed by the cumulative fractions in SPLITS order."""
    point = int(key[:16], 16) / float(1 << 64)
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
    """What is known about all copies of one content hash, in bounded space: the NAMED_COPIES + 1 smallest
    URIs (`first`), the NAMED_LABELS smallest labels, and whether there were more (`more_labels`)."""

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
    """InputRecords of one hash -> ContentCopies: O(1) per copy, an accumulator of bounded size (a lifted
    combiner: copies are counted where they are hashed)."""

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


# Tags of the two kinds of value grouped under a key or hash: a copy, and the decision on all copies.
_COPY = 0
_DECISION = 1


class ResolveDuplicatesFn(beam.DoFn):
    """(sha256, [(tag, copy or decision), ...]) -> one UniqueInput, duplicates, or CONFLICTING_LABELS errors;
    the group is read twice (decision, then copy by copy) and never held."""

    def __init__(self):
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
        yield UniqueInput.of(kept)
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
    """(sha256, InputRecord) pairs -> UniqueInputs (main), plus 'errors' and 'duplicates' outputs: a lifted
    combine decides per hash, then each copy goes past the decision."""

    def expand(self, hashed):
        copies = hashed | "CountCopies" >> beam.CombinePerKey(CountCopiesFn())
        return _with_decisions(hashed, copies) | "Resolve" >> beam.ParDo(ResolveDuplicatesFn()).with_outputs(
            "errors", "duplicates", main="unique"
        )


def _with_decisions(keyed, decisions):
    """(key, value) and (key, decision) -> (key, [(tag, value or decision), ...]), grouped by key."""
    tagged_values = keyed | "TagCopies" >> beam.MapTuple(lambda key, value: (key, (_COPY, value)))
    tagged_decisions = decisions | "TagDecisions" >> beam.MapTuple(
        lambda key, decision: (key, (_DECISION, decision))
    )
    return (
        (tagged_values, tagged_decisions)
        | "WithDecisions" >> beam.Flatten()
        | "GroupByKey" >> beam.GroupByKey()
    )


class SeparateSharedKeysFn(beam.DoFn):
    """(content key, [(tag, copy or count), ...]) -> a UniqueInput for a key seen once, else every copy on
    'shared' (streamed past the count, never held)."""

    def process(self, element):
        _, tagged = element
        count = next(value for tag, value in tagged if tag == _DECISION)
        records = (value for tag, value in tagged if tag == _COPY)
        if count == 1:
            record = next(records)
            yield UniqueInput.of(record)
            return
        for record in records:
            yield beam.pvalue.TaggedOutput("shared", record)


class DeduplicateByContent(beam.PTransform):
    """InputRecords -> {"unique": UniqueInputs, "errors", "duplicates"}. `max_file_bytes`: larger files are
    `too_large` errors, never read (None: no limit). `known_keys`: the previous version's ledger files or
    their index (shared_index.share), whose keys a local file of the recorded size and mtime takes unread."""

    def __init__(self, fractions: dict[str, float], max_file_bytes: int | None = None, known_keys=()):
        super().__init__()
        self._fractions = fractions
        self._max_file_bytes = max_file_bytes
        self._known_keys = known_keys if hasattr(known_keys, "copy_to") else list(known_keys)

    def expand(self, records):
        keyed = records | "KeyContent" >> beam.ParDo(
            KeyContentFn(self._fractions, self._max_file_bytes, self._known_keys)
        ).with_outputs("errors", main="keyed")
        counts = keyed.keyed | "CountPerKey" >> beam.combiners.Count.PerKey()
        separated = _with_decisions(keyed.keyed, counts) | "SeparateSharedKeys" >> beam.ParDo(
            SeparateSharedKeysFn()
        ).with_outputs("shared", main="unique")
        # All copies of a key come out of one call of SeparateSharedKeysFn; hashed in the same fused
        # stage, they would be read one after another by one worker (hours for 100K copies of a
        # placeholder, with decoding waiting for them). The reshuffle makes each copy an element that
        # any worker may hash; what crosses it is (uri, label, split, size), never bytes.
        hashed = (
            separated.shared
            | "SpreadSharedCopies" >> beam.Reshuffle()
            | "HashInFull"
            >> beam.ParDo(HashContentFn(self._max_file_bytes)).with_outputs("errors", main="hashed")
        )
        resolved = hashed.hashed | "ResolveDuplicates" >> ResolveDuplicates()
        unique = (separated.unique, resolved.unique) | "AllUnique" >> beam.Flatten()
        all_errors = (keyed.errors, hashed.errors, resolved.errors) | "MergeHashErrors" >> beam.Flatten()
        return {"unique": unique, "errors": all_errors, "duplicates": resolved.duplicates}
