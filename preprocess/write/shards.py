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
from preprocess import errors, filesystem
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
    """One file of the run: `name` in runs/<run id>/, made of `sources` in order (one source already at that
    name: a shard kept as it was written)."""

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
    """(split, record bytes[, ledger entry]) -> WrittenFile entries of files in the run's directory holding
    them (TFRecord, or LINES: JSON lines), one open file per split; with an entry, (the file's path, the
    entry) on PLACED, so the ledger can say which shard holds it."""

    def __init__(self, output_dir: str, framing: str = TFRECORD):
        self._output_dir = output_dir
        self._framing = framing

    def start_bundle(self):
        # The files of a bundle that failed on this instance (an exception elsewhere in the fused stage
        # skips finish_bundle) are discarded, not committed.
        self._abort_open()
        # Fresh per attempt, a whole uuid4 (122 random bits): a file is never overwritten, so an attempt the
        # runner discarded (or one still running) cannot spoil the committed one, among millions of attempts.
        self._attempt = uuid.uuid4().hex
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
            index = self._count[split] = self._count.get(split, -1) + 1
            name = f"{split}-{self._attempt}-{index:04d}{_SUFFIX[self._framing]}"
            handle = self._open[split] = _HashingFile(split, RunPaths(self._output_dir, run_id).final(name))
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


def plan_split(
    split: str,
    files: list[WrittenFile],
    target_bytes: int,
    min_shards: int,
    max_sources: int | None = None,
    suffix: str = manifest_lib.SHARD_SUFFIX,
) -> list[ShardPlan]:
    """The shards of one split: a file of at least half `target_bytes` kept as it is, the others packed (largest
    first onto the lightest) into at least `min_shards` in all if there are files enough, none of more than
    `max_sources` files; never an empty shard; the same plans for the same files in any order."""
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
    plans = []
    for group in (sorted(group, key=lambda file: file.path) for group in groups):
        names = [posixpath.basename(file.path) for file in group]
        packed = f"{split}-packed-{hashlib.sha256(chr(10).join(names).encode()).hexdigest()[:12]}{suffix}"
        plans.append(ShardPlan(split, names[0] if len(group) == 1 else packed, tuple(group)))
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
    """The files of a JSON-line log (plan_split; none when it has no line); `prefix`: their `split`."""
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
            # Skipped when a retried bundle finds the same bytes there (filesystem.write_concatenation).
            num_bytes, sha256 = filesystem.write_concatenation(
                [source.path for source in plan.sources],
                destination,
                paths.tmp_dir,
                expected_bytes=sum(source.num_bytes for source in plan.sources),
            )
        yield {
            "split": plan.split,
            "path": paths.relative(plan.name),
            "num_examples": sum(source.num_examples for source in plan.sources),
            "num_bytes": num_bytes,
            "sha256": sha256,
        }


class WriteShards(beam.PTransform):
    """(split, serialized example[, ledger entry]) of every split (one PCollection or a tuple of them) ->
    {"shards": shard manifest entries, "ledger": the ledger entries given, each with its `shard`}.
    `estimated_bytes`: a singleton {split: estimated bytes}, where writers roll over; `run_id`: a singleton."""

    def __init__(self, output_dir, shard_size_bytes, min_shards, estimated_bytes, run_id):
        super().__init__()
        self._output_dir = output_dir
        self._shard_size_bytes = shard_size_bytes
        self._min_shards = min_shards
        self._estimated_bytes = estimated_bytes
        self._run_id = run_id

    def expand(self, records):
        size, least = self._shard_size_bytes, self._min_shards
        targets = beam.pvalue.AsSingleton(
            self._estimated_bytes
            | "FileTargets"
            >> beam.Map(
                lambda estimated: {k: file_target_bytes(v, size, least) for k, v in estimated.items()}
            )
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
        output_dir = self._output_dir
        shard_of_file = plans | "ShardOfFile" >> beam.FlatMap(
            lambda plan, run_id: [
                (file.path, RunPaths(output_dir, run_id).relative(plan.name)) for file in plan.sources
            ],
            run_id=run_id,
        )
        return {
            "shards": plans
            | "Spread" >> beam.Reshuffle()
            | "WriteShard" >> beam.ParDo(WriteShardFn(output_dir), run_id),
            "ledger": placed
            | "LedgerShard"
            >> beam.Map(
                lambda placed, shards: {**placed[1], "shard": shards[placed[0]]},
                beam.pvalue.AsDict(shard_of_file),
            ),
        }


class WriteJsonLogs(beam.PTransform):
    """(prefix, JSON line bytes) -> the files of each log in runs/<run id>/, written as shards are; outputs a
    singleton {prefix: that log's manifest entries, sorted by path}. `count_keys`: {prefix: the entries'
    count key}, one per log. Why several logs share one writer: docs/internals.md."""

    def __init__(self, output_dir, run_id, count_keys: dict[str, str]):
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id
        self._count_keys = dict(count_keys)

    def expand(self, keyed_lines):
        run_id = beam.pvalue.AsSingleton(self._run_id)
        writer = WriteShardFilesFn(self._output_dir, framing=LINES)
        count_keys = self._count_keys

        def by_log(items, key):  # {prefix: the `key(item)` == prefix items}, for every log
            return {prefix: [item for item in items if key(item) == prefix] for prefix in sorted(count_keys)}

        return (
            keyed_lines
            | "WriteFiles" >> beam.ParDo(writer, dict.fromkeys(count_keys, ERROR_FILE_BYTES), run_id)
            | "AllFiles" >> beam.combiners.ToList()
            | "Plan"
            >> beam.FlatMap(
                lambda files: [
                    plan
                    for prefix, found in by_log(files, lambda file: file.split).items()
                    for plan in plan_error_files(found, prefix)
                ]
            )
            | "Spread" >> beam.Reshuffle()
            | "Pack" >> beam.ParDo(WriteShardFn(self._output_dir), run_id)
            | "ManifestEntry"
            >> beam.Map(lambda entry: (entry["split"], error_file_entry(entry, count_keys[entry["split"]])))
            | "AllEntries" >> beam.combiners.ToList()
            | "ByLog"
            >> beam.Map(
                lambda entries: {
                    prefix: sorted((entry for _, entry in found), key=lambda entry: entry["path"])
                    for prefix, found in by_log(entries, lambda item: item[0]).items()
                }
            )
        )


class WriteErrorLog(beam.PTransform):
    """JSON lines (bytes) -> one log's files (WriteJsonLogs, the error log by default; the ledger with its own
    `prefix` and `count_key`); outputs the singleton list of their manifest entries, sorted by path."""

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


def write_logs(all_errors, group_lines, output_dir, run_id):
    """The error log (ErrorRecords) and the near-duplicate groups ((NEAR_DUPLICATES, JSON line); None without
    the audit) -> (the error log's manifest entries, the groups' or None), singletons. One writer for both:
    each log of its own would cost its three shuffles and their stages again (benchmarks/RESULTS.md, issue
    30's cost)."""
    log_lines = [
        all_errors
        | "ErrorsToJson"
        >> beam.Map(lambda error: (ERRORS, errors.ErrorRecord.to_json(error).encode("utf-8")))
    ]
    count_keys = {ERRORS: "num_errors"}
    if group_lines is not None:
        log_lines.append(group_lines)
        count_keys[NEAR_DUPLICATES] = "num_groups"
    logs = (
        log_lines
        | "AllLogLines" >> beam.Flatten()
        | "WriteLogs" >> WriteJsonLogs(output_dir, run_id, count_keys)
    )
    errors_log = logs | "ErrorFiles" >> beam.Map(lambda logs: logs[ERRORS])
    if group_lines is None:
        return errors_log, None
    return errors_log, logs | "NearDuplicateFiles" >> beam.Map(lambda logs: logs[NEAR_DUPLICATES])
