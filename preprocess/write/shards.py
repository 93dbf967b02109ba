"""Writing TFRecord shards sized by bytes, each record written once (and the error log's files, alike)."""

import dataclasses
import hashlib
import heapq
import logging
import math
import posixpath
import uuid

import apache_beam as beam
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.transforms.window import GlobalWindows

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.publish.runs import RunPaths

_COPY_CHUNK_BYTES = 8 << 20

# How records are framed in a written file: TFRecord for shards, one line each for the error log.
TFRECORD = "tfrecord"
LINES = "lines"
_SUFFIX = {TFRECORD: manifest_lib.SHARD_SUFFIX, LINES: ".jsonl"}
ERRORS = "errors"  # the `split` of the error log's files
NEAR_DUPLICATES = "near-duplicates"  # the `split` of the near-duplicate groups' files (written alike)


@dataclasses.dataclass(frozen=True)
class WrittenFile:
    """One closed file of a bundle attempt: where it is and what it holds."""

    split: str  # a split name, or ERRORS
    path: str  # the full path (local or gs://)
    num_examples: int
    num_bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """One file of the run: `name` in runs/<run id>/, made of `sources` in order.

    A plan of one source already at that name is a shard kept as it was written.
    """

    split: str
    name: str
    sources: tuple[WrittenFile, ...]


# --min-shards when not given: 8 shards per split, so that several hosts each read their own, but one per
# AUTO_BYTES_PER_SHARD of a smaller split: a split of a few MB is one read for any host, and 37 images in 10
# shards look broken. Hosts with fewer shards than they are still read every record once (train's
# record-level sharding).
AUTO_MIN_SHARDS = 8
AUTO_BYTES_PER_SHARD = 4_000_000


def split_min_shards(split_bytes: int, min_shards: int | None) -> int:
    """The least number of shards of a split of `split_bytes`: `min_shards` if given, else the automatic one."""
    if min_shards is not None:
        return min_shards
    return max(1, min(AUTO_MIN_SHARDS, math.ceil(split_bytes / AUTO_BYTES_PER_SHARD)))


def file_target_bytes(estimated_split_bytes: int, shard_size_bytes: int, min_shards: int | None) -> int:
    """The size a writer's files stay within: a shard, or 1/min_shards of a small split."""
    least = split_min_shards(estimated_split_bytes, min_shards)
    return max(1, min(shard_size_bytes, estimated_split_bytes // max(least, 1)))


def file_targets(estimated_bytes: dict, shard_size_bytes: int, min_shards: int | None) -> dict:
    """{split: estimated bytes} -> {split: file target bytes}."""
    return {
        split: file_target_bytes(estimate, shard_size_bytes, min_shards)
        for split, estimate in estimated_bytes.items()
    }


def new_attempt_id() -> str:
    """A bundle attempt's id in its files' names: a full uuid4, 32 hex digits (122 random bits)."""
    return uuid.uuid4().hex


class _HashingFile:
    """A file being written, with the sha256, size and record count of what went into it."""

    def __init__(self, split: str, path: str):
        self.split = split
        self.path = path
        # Kept only by close(): a file of a failed bundle, aborted or just dropped, never becomes a GCS object.
        self._handle = filesystem.UncommittedFile(path)
        self._digest = hashlib.sha256()
        self.num_bytes = 0
        self.num_examples = 0

    def write(self, data: bytes):
        self._handle.write(data)
        self._digest.update(data)
        self.num_bytes += len(data)

    def close(self) -> WrittenFile:
        self._handle.commit()
        return WrittenFile(self.split, self.path, self.num_examples, self.num_bytes, self._digest.hexdigest())

    def abort(self):
        self._handle.abort()


# WriteShardFilesFn's output of (file path, ledger entry): where each record that came with an entry went.
PLACED = "placed"


class WriteShardFilesFn(beam.DoFn):
    """(split, record bytes[, ledger entry]) -> WrittenFile entries of files holding them, one open file per
    split; with an entry, (the file's path, the entry) on PLACED, so the ledger can say which shard holds it.

    The files go into the run's directory (TFRecord shards, or with framing
    LINES the error log's JSON lines).
    """

    def __init__(self, output_dir: str, framing: str = TFRECORD):
        self._output_dir = output_dir
        self._framing = framing

    def start_bundle(self):
        # The files of a bundle that failed on this instance (an exception elsewhere in the fused stage
        # skips finish_bundle) are discarded, not committed.
        self._abort_open()
        # Fresh per attempt, a whole uuid4 (122 random bits): a file is never overwritten, so an attempt the
        # runner discarded (or one still running) cannot spoil the committed one, among millions of attempts.
        self._attempt = new_attempt_id()
        self._open: dict[str, _HashingFile] = {}
        self._count: dict[str, int] = {}

    def _abort_open(self):
        for handle in getattr(self, "_open", {}).values():
            try:
                handle.abort()
            except Exception as exc:  # noqa: BLE001 - best effort: publishing removes files no manifest names
                logging.warning("could not discard %s of a failed bundle: %s", handle.path, exc)
        self._open = {}

    def teardown(self):
        self._abort_open()

    def _new_file(self, split: str, run_id: str) -> _HashingFile:
        index = self._count.get(split, 0)
        self._count[split] = index + 1
        name = f"{split}-{self._attempt}-{index:04d}{_SUFFIX[self._framing]}"
        return _HashingFile(split, RunPaths(self._output_dir, run_id).final(name))

    def process(self, element, target_bytes: dict, run_id: str):
        try:
            yield from self._process(element, target_bytes, run_id)
        except BaseException:
            # This bundle fails: its open files must not be committed (a retry writes its own).
            self._abort_open()
            raise

    def _process(self, element, target_bytes: dict, run_id: str):
        split, record = element[0], element[1]
        if split not in target_bytes:
            raise ValueError(
                f"no target file size for split {split!r} (sizes given for {sorted(target_bytes)})"
            )
        framed_bytes = (
            _TFRecordUtil.encoded_num_bytes(record) if self._framing == TFRECORD else len(record) + 1
        )
        handle = self._open.get(split)
        # Roll over before the record that would take the file past its target, not after it:
        # files stay within the target, so a split of N targets' worth makes at least N files.
        if handle is not None and handle.num_bytes + framed_bytes > target_bytes[split]:
            yield self._open.pop(split).close()
            handle = None
        if handle is None:
            handle = self._open[split] = self._new_file(split, run_id)
        if self._framing == TFRECORD:
            # write_record makes one write() of the framed record: the hash sees the bytes on disk.
            _TFRecordUtil.write_record(handle, record)
        else:
            handle.write(record + b"\n")
        handle.num_examples += 1
        if len(element) > 2:
            yield beam.pvalue.TaggedOutput(PLACED, (handle.path, element[2]))

    def finish_bundle(self):
        for split in sorted(self._open):
            yield GlobalWindows.windowed_value(self._open.pop(split).close())


def _packed_name(split: str, sources: list[WrittenFile], suffix: str) -> str:
    digest = hashlib.sha256("\n".join(posixpath.basename(source.path) for source in sources).encode())
    return f"{split}-packed-{digest.hexdigest()[:12]}{suffix}"


def plan_split(
    split: str,
    files: list[WrittenFile],
    target_bytes: int,
    min_shards: int,
    max_sources: int | None = None,
    suffix: str = manifest_lib.SHARD_SUFFIX,
) -> list[ShardPlan]:
    """The shards of one split: full files kept as they are, the small ones packed.

    A file of at least half `target_bytes` is a shard. The others are packed
    (largest first onto the lightest shard) into shards of about
    `target_bytes`, as many as it takes to make `min_shards` in all if there
    are files enough, and with `max_sources`, enough that none packs more
    files than that (each packed shard is one element's copy: this bounds its
    work); a packed shard of one file is that file, kept. Never an empty
    shard. Deterministic: the same files in any order give the same plans.
    """
    files = sorted((file for file in files if file.num_examples > 0), key=lambda file: file.path)
    full = [file for file in files if 2 * file.num_bytes >= target_bytes]
    small = [file for file in files if 2 * file.num_bytes < target_bytes]
    groups = [[file] for file in full]
    if small:
        small_bytes = sum(file.num_bytes for file in small)
        num_packed = max(math.ceil(small_bytes / target_bytes), min_shards - len(full), 1)
        if max_sources:
            num_packed = max(num_packed, math.ceil(len(small) / max_sources))
        num_packed = min(len(small), num_packed)
        loads = [(0, index, []) for index in range(num_packed)]
        heapq.heapify(loads)
        for file in sorted(small, key=lambda file: (-file.num_bytes, file.path)):
            load, index, assigned = heapq.heappop(loads)
            while max_sources and len(assigned) >= max_sources:  # full: out of the heap for good
                groups.append(assigned)
                load, index, assigned = heapq.heappop(loads)
            assigned.append(file)
            heapq.heappush(loads, (load + file.num_bytes, index, assigned))
        groups += [assigned for _, _, assigned in loads]
    groups = [sorted(group, key=lambda file: file.path) for group in groups]
    plans = [
        ShardPlan(
            split,
            posixpath.basename(group[0].path) if len(group) == 1 else _packed_name(split, group, suffix),
            tuple(group),
        )
        for group in groups
    ]
    return sorted(plans, key=lambda plan: plan.name)


def plan_shards(files: list[WrittenFile], target_bytes: dict, min_shards: int | None) -> list[ShardPlan]:
    """The shards of every split (plan_split), from the WrittenFile entries of the whole job; `min_shards`
    None: split_min_shards of the bytes each split wrote."""
    by_split: dict[str, list[WrittenFile]] = {}
    for file in files:
        by_split.setdefault(file.split, []).append(file)
    return [
        plan
        for split in sorted(by_split)
        for plan in plan_split(
            split,
            by_split[split],
            target_bytes[split],
            split_min_shards(sum(file.num_bytes for file in by_split[split]), min_shards),
        )
    ]


# The error log's files: each at most this size (error lines are small, so files are few) ...
ERROR_FILE_BYTES = 16 << 20
# ... and a packed one made of at most this many bundle attempts' files: one element copies them, so its work
# is bounded whatever the number of errors (and 32 is what one GCS compose request takes, were it used).
MAX_SOURCES_PER_ERROR_FILE = 32


def plan_error_files(files: list[WrittenFile], prefix: str = ERRORS) -> list[ShardPlan]:
    """The error log's files (plan_split): the bundle attempts' error files, the small ones packed by up to 32.

    No file when nothing failed. `prefix`: the files' name prefix (their `split`), ERRORS or NEAR_DUPLICATES.
    """
    return plan_split(
        prefix,
        files,
        ERROR_FILE_BYTES,
        min_shards=1,
        max_sources=MAX_SOURCES_PER_ERROR_FILE,
        suffix=_SUFFIX[LINES],
    )


def error_file_entry(entry: dict, count_key: str = "num_errors") -> dict:
    """WriteShardFn's entry of an error file -> its manifest entry (`error_files` in dataset.json; with
    `count_key` "num_groups", `near_duplicate_files`)."""
    return {
        "path": entry["path"],
        count_key: entry["num_examples"],
        "num_bytes": entry["num_bytes"],
        "sha256": entry["sha256"],
    }


class WriteShardFn(beam.DoFn):
    """ShardPlan -> its manifest entry (path relative to the output), concatenating its sources if need be."""

    def __init__(self, output_dir: str):
        self._output_dir = output_dir

    def process(self, plan: ShardPlan, run_id: str):
        paths = RunPaths(self._output_dir, run_id)
        destination = paths.final(plan.name)
        if len(plan.sources) == 1 and plan.sources[0].path == destination:
            (kept,) = plan.sources
            num_bytes, sha256 = kept.num_bytes, kept.sha256
        else:
            num_bytes, sha256 = self._concatenate(plan.sources, destination, paths.tmp_dir)
        yield {
            "split": plan.split,
            "path": paths.relative(plan.name),
            "num_examples": sum(source.num_examples for source in plan.sources),
            "num_bytes": num_bytes,
            "sha256": sha256,
        }

    @staticmethod
    def _concatenate(sources, destination: str, tmp_dir: str) -> tuple[int, str]:
        # Skipped when a retried bundle finds the same bytes there (filesystem.write_concatenation).
        return filesystem.write_concatenation(
            [source.path for source in sources],
            destination,
            tmp_dir,
            expected_bytes=sum(source.num_bytes for source in sources),
        )


def shards_of_files(plan: ShardPlan, output_dir: str, run_id: str) -> list[tuple[str, str]]:
    """(a written file's path, the shard that holds its records, relative to the output) of one plan."""
    shard = RunPaths(output_dir, run_id).relative(plan.name)
    return [(source.path, shard) for source in plan.sources]


def with_shard(placed: tuple, shards: dict) -> dict:
    """(file path, ledger entry) -> the entry with the `shard` that holds its record."""
    path, entry = placed
    return {**entry, "shard": shards[path]}


class WriteShards(beam.PTransform):
    """(split, serialized example[, ledger entry]) of every split -> {"shards": shard manifest entries
    (dicts), "ledger": the ledger entries given, each with its `shard` (preprocess/reuse/ledger.py)};
    several PCollections of them (a tuple) are written as one.

    `estimated_bytes` is a singleton PCollection of {split: estimated bytes of
    its records} (record count times the bytes a record takes, or an estimate
    for jpeg): it sets the size at which writers roll over, not the shards'
    sizes, which come from the bytes written. `run_id` is the singleton of
    preprocess.publish.runs.MakeRunId.
    """

    def __init__(self, output_dir, shard_size_bytes, min_shards, estimated_bytes, run_id):
        super().__init__()
        self._output_dir = output_dir
        self._shard_size_bytes = shard_size_bytes
        self._min_shards = min_shards
        self._estimated_bytes = estimated_bytes
        self._run_id = run_id

    def expand(self, records):
        targets = beam.pvalue.AsSingleton(
            self._estimated_bytes
            | "FileTargets"
            >> beam.Map(file_targets, shard_size_bytes=self._shard_size_bytes, min_shards=self._min_shards)
        )
        run_id = beam.pvalue.AsSingleton(self._run_id)
        # Several inputs (an incremental run's decoded records and carried ones) are written each by a
        # writer of its own and meet as file entries: a Flatten of the records would end the stage that
        # decodes them, and every decoded record would cross a stage boundary.
        inputs = records if isinstance(records, (tuple, list)) else (records,)
        written = [
            collection
            | ("WriteFiles" if index == 0 else f"WriteFiles[{index}]")
            >> beam.ParDo(WriteShardFilesFn(self._output_dir), targets, run_id).with_outputs(
                PLACED, main="files"
            )
            for index, collection in enumerate(inputs)
        ]
        files = [out.files for out in written] | "FilesOfAllInputs" >> beam.Flatten()
        placed = [out[PLACED] for out in written] | "PlacedOfAllInputs" >> beam.Flatten()
        plans = (
            files
            | "AllFiles" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(plan_shards, targets, min_shards=self._min_shards)
        )
        shard_of_file = plans | "ShardOfFile" >> beam.FlatMap(
            shards_of_files, output_dir=self._output_dir, run_id=run_id
        )
        return {
            "shards": plans
            | "Spread" >> beam.Reshuffle()
            | "WriteShard" >> beam.ParDo(WriteShardFn(self._output_dir), run_id),
            "ledger": placed | "LedgerShard" >> beam.Map(with_shard, beam.pvalue.AsDict(shard_of_file)),
        }


def plan_log_files(files: list[WrittenFile], prefixes) -> list[ShardPlan]:
    """plan_error_files for each log of `prefixes` (a file's `split` is its log's prefix)."""
    by_prefix = {prefix: [] for prefix in prefixes}
    for file in files:
        by_prefix[file.split].append(file)
    return [
        plan for prefix in sorted(by_prefix) for plan in plan_error_files(by_prefix[prefix], prefix=prefix)
    ]


def entries_by_log(entries: list[tuple[str, dict]], prefixes) -> dict[str, list[dict]]:
    """(prefix, manifest entry) of every packed file -> {prefix: its entries sorted by path} for each prefix."""
    by_prefix = {prefix: [] for prefix in prefixes}
    for prefix, entry in entries:
        by_prefix[prefix].append(entry)
    return {prefix: sorted(found, key=lambda entry: entry["path"]) for prefix, found in by_prefix.items()}


class WriteJsonLogs(beam.PTransform):
    """(prefix, JSON line bytes) -> the files of each log in runs/<run id>/; outputs a singleton
    {prefix: the list of that log's manifest entries (sorted by path; empty when it has no line)}.

    `count_keys`: {prefix: the manifest entries' count key}, one per log: the error log (ERRORS,
    "num_errors"), the near-duplicate groups (NEAR_DUPLICATES, "num_groups"), the ledger. Written as
    shards are (WriteShardFilesFn, then plan_error_files): each bundle attempt writes each log's lines to
    files of its own in the run's directory, and the small ones are packed, up to 32 a file, in parallel
    (one element per packed file). The manifest lists the files; nothing is concatenated into one file, so
    no step does work proportional to the number of lines. Several logs share one writer: its three
    shuffles (the files listed, spread, the entries listed) and their stages are paid once per job, not
    once per log (benchmarks/RESULTS.md, issue 30's cost).
    """

    def __init__(self, output_dir, run_id, count_keys: dict[str, str]):
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id
        self._count_keys = dict(count_keys)

    def expand(self, keyed_lines):
        run_id = beam.pvalue.AsSingleton(self._run_id)
        writer = WriteShardFilesFn(self._output_dir, framing=LINES)
        count_keys = self._count_keys
        return (
            keyed_lines
            | "WriteFiles" >> beam.ParDo(writer, dict.fromkeys(count_keys, ERROR_FILE_BYTES), run_id)
            | "AllFiles" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(plan_log_files, prefixes=sorted(count_keys))
            | "Spread" >> beam.Reshuffle()
            | "Pack" >> beam.ParDo(WriteShardFn(self._output_dir), run_id)
            | "ManifestEntry"
            >> beam.Map(lambda entry: (entry["split"], error_file_entry(entry, count_keys[entry["split"]])))
            | "AllEntries" >> beam.combiners.ToList()
            | "ByLog" >> beam.Map(entries_by_log, prefixes=sorted(count_keys))
        )


class WriteErrorLog(beam.PTransform):
    """JSON lines (bytes) -> one log's files in runs/<run id>/ (WriteJsonLogs); outputs the singleton list of
    their manifest entries (sorted by path; empty when nothing failed).

    The error log by default; other JSON-line logs are written the same way under another file `prefix`
    and manifest `count_key` (the ledger: preprocess/reuse/ledger.py). Logs that a job writes anyway should
    share one WriteJsonLogs instead (pipeline.py writes the errors and the near-duplicate groups so).
    """

    def __init__(self, output_dir, run_id, prefix: str = ERRORS, count_key: str = "num_errors"):
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id
        self._prefix = prefix
        self._count_key = count_key

    def expand(self, lines):
        prefix = self._prefix
        return (
            lines
            | "KeyErrors" >> beam.Map(lambda line: (prefix, line))
            | "Write" >> WriteJsonLogs(self._output_dir, self._run_id, {prefix: self._count_key})
            | "Entries" >> beam.Map(lambda logs: logs[prefix])
        )
