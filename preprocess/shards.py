"""Writing TFRecord shards sized by bytes, each record written once (and the error log).

Records go to disk once, at their final place, and only when a bundle ends
with a small remainder is a little copied:

1. `WriteShardFilesFn`: each bundle attempt writes the records of every split
   straight into the run's directory (`runs/<run id>/`), one file per split,
   rolling over to a new file before the record that would take it past the
   split's target size (`file_target_bytes`: the shard size, or less so that
   a small split still gets about `min_shards` files). It computes each file's sha256 and size from the
   framed bytes as it writes them, and emits a small `WrittenFile` entry.
2. `plan_shards` runs once all entries of the job are known (a list of these
   small entries, never records): a file of at least half the target size is
   a shard as it is, no copy; the small files that end bundles (at most one
   per bundle and split) are packed into shards of about the target size, at
   least `min_shards` shards in all when there are files enough. A packed
   shard is the concatenation of its files (TFRecord files concatenate into
   a valid TFRecord file), written by `WriteShardFn` atomically under a name
   derived from its sources (`filesystem.write_atomically`).

So per record the job writes its bytes once, plus at most half a target
per bundle and split for the packed remainders.

Retry-safe under Dataflow's semantics: every bundle attempt writes files of
its own (a fresh id in their names), so a retried, duplicated or dead attempt
never touches the files of the one the runner commits; only the committed
attempts' entries are planned. A packed shard's name and bytes follow from
its plan alone, so writing it again gives the same file, and its sources are
never deleted here (a retry needs them). Files no manifest names (a
discarded attempt's, a packed shard's sources) go when the run publishes:
preprocess/publish.py removes every file of the run's directory its manifest
does not name.

File names say the split first, then the bundle attempt and the file's
number within it (`train-3f9c0a1b2c4d-0002.tfrecord`), or for a packed shard
a digest of its sources (`train-packed-9e107d9d372b.tfrecord`). Readers do
not parse them: they read the shards the manifest lists.
"""

import dataclasses
import hashlib
import heapq
import math
import posixpath
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.transforms.window import GlobalWindows

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.runs import RunPaths

_COPY_CHUNK_BYTES = 8 << 20

# How records are framed in a written file: TFRecord for shards, one line each for the error log.
TFRECORD = "tfrecord"
LINES = "lines"
_SUFFIX = {TFRECORD: manifest_lib.SHARD_SUFFIX, LINES: ".jsonl"}
ERRORS = "errors"  # the `split` of the error log's files
# The error log's files are written to the run's staging (they are small, and concatenated into one).
_ERROR_PARTS_DIR = "parts"


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


def file_target_bytes(estimated_split_bytes: int, shard_size_bytes: int, min_shards: int) -> int:
    """The size a writer's files stay within: a shard, or 1/min_shards of a small split."""
    return max(1, min(shard_size_bytes, estimated_split_bytes // max(min_shards, 1)))


def file_targets(estimated_bytes: dict, shard_size_bytes: int, min_shards: int) -> dict:
    """{split: estimated bytes} -> {split: file target bytes}."""
    return {
        split: file_target_bytes(estimate, shard_size_bytes, min_shards)
        for split, estimate in estimated_bytes.items()
    }


class _HashingFile:
    """A file being written, with the sha256, size and record count of what went into it."""

    def __init__(self, split: str, path: str):
        self.split = split
        self.path = path
        self._handle = FileSystems.create(path)
        self._digest = hashlib.sha256()
        self.num_bytes = 0
        self.num_examples = 0

    def write(self, data: bytes):
        self._handle.write(data)
        self._digest.update(data)
        self.num_bytes += len(data)

    def close(self) -> WrittenFile:
        self._handle.close()
        return WrittenFile(self.split, self.path, self.num_examples, self.num_bytes, self._digest.hexdigest())


class WriteShardFilesFn(beam.DoFn):
    """(split, record bytes) -> WrittenFile entries of files holding them, one open file per split.

    Shard files go into the run's directory; with `staging_subdir`, into that
    directory of the run's staging instead (the error log's parts).
    """

    def __init__(self, output_dir: str, framing: str = TFRECORD, staging_subdir: str | None = None):
        self._output_dir = output_dir
        self._framing = framing
        self._staging_subdir = staging_subdir

    def start_bundle(self):
        # Fresh per attempt: a file is never overwritten, so an attempt the
        # runner discarded (or one still running) cannot spoil the committed one.
        self._attempt = uuid.uuid4().hex[:12]
        self._open: dict[str, _HashingFile] = {}
        self._count: dict[str, int] = {}

    def _new_file(self, split: str, run_id: str) -> _HashingFile:
        index = self._count.get(split, 0)
        self._count[split] = index + 1
        name = f"{split}-{self._attempt}-{index:04d}{_SUFFIX[self._framing]}"
        paths = RunPaths(self._output_dir, run_id)
        path = paths.staging(self._staging_subdir, name) if self._staging_subdir else paths.final(name)
        return _HashingFile(split, path)

    def process(self, element, target_bytes: dict, run_id: str):
        split, record = element
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

    def finish_bundle(self):
        for split in sorted(self._open):
            yield GlobalWindows.windowed_value(self._open.pop(split).close())


def _packed_name(split: str, sources: list[WrittenFile]) -> str:
    digest = hashlib.sha256("\n".join(posixpath.basename(source.path) for source in sources).encode())
    return f"{split}-packed-{digest.hexdigest()[:12]}{manifest_lib.SHARD_SUFFIX}"


def plan_split(split: str, files: list[WrittenFile], target_bytes: int, min_shards: int) -> list[ShardPlan]:
    """The shards of one split: full files kept as they are, the small ones packed.

    A file of at least half `target_bytes` is a shard. The others are packed
    (largest first onto the lightest shard) into shards of about
    `target_bytes`, as many as it takes to make `min_shards` in all if there
    are files enough; a packed shard of one file is that file, kept. Never an
    empty shard. Deterministic: the same files in any order give the same plans.
    """
    files = sorted((file for file in files if file.num_examples > 0), key=lambda file: file.path)
    full = [file for file in files if 2 * file.num_bytes >= target_bytes]
    small = [file for file in files if 2 * file.num_bytes < target_bytes]
    groups = [[file] for file in full]
    if small:
        small_bytes = sum(file.num_bytes for file in small)
        num_packed = min(len(small), max(math.ceil(small_bytes / target_bytes), min_shards - len(full), 1))
        loads = [(0, index, []) for index in range(num_packed)]
        heapq.heapify(loads)
        for file in sorted(small, key=lambda file: (-file.num_bytes, file.path)):
            load, index, assigned = heapq.heappop(loads)
            assigned.append(file)
            heapq.heappush(loads, (load + file.num_bytes, index, assigned))
        groups += [sorted(assigned, key=lambda file: file.path) for _, _, assigned in loads]
    plans = [
        ShardPlan(
            split,
            posixpath.basename(group[0].path) if len(group) == 1 else _packed_name(split, group),
            tuple(group),
        )
        for group in groups
    ]
    return sorted(plans, key=lambda plan: plan.name)


def plan_shards(files: list[WrittenFile], target_bytes: dict, min_shards: int) -> list[ShardPlan]:
    """The shards of every split (plan_split), from the WrittenFile entries of the whole job."""
    by_split: dict[str, list[WrittenFile]] = {}
    for file in files:
        by_split.setdefault(file.split, []).append(file)
    return [
        plan
        for split in sorted(by_split)
        for plan in plan_split(split, by_split[split], target_bytes[split], min_shards)
    ]


def plan_error_log(parts: list[WrittenFile]) -> ShardPlan:
    """All error parts into the one error log (an empty file when nothing failed)."""
    return ShardPlan(ERRORS, manifest_lib.ERRORS_FILE, tuple(sorted(parts, key=lambda part: part.path)))


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
        digest = hashlib.sha256()
        num_bytes = 0
        with filesystem.write_atomically(destination, tmp_dir=tmp_dir) as out:
            for source in sources:
                with FileSystems.open(source.path) as handle:
                    while chunk := handle.read(_COPY_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                        num_bytes += len(chunk)
        return num_bytes, digest.hexdigest()


class WriteShards(beam.PTransform):
    """(split, serialized example) pairs of every split -> shard manifest entries (dicts).

    `estimated_bytes` is a singleton PCollection of {split: estimated bytes of
    its records} (record count times the bytes a record takes, or an estimate
    for jpeg): it sets the size at which writers roll over, not the shards'
    sizes, which come from the bytes written. `run_id` is the singleton of
    preprocess.runs.MakeRunId.
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
        return (
            records
            | "WriteFiles" >> beam.ParDo(WriteShardFilesFn(self._output_dir), targets, run_id)
            | "AllFiles" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(plan_shards, targets, min_shards=self._min_shards)
            | "Spread" >> beam.Reshuffle()
            | "WriteShard" >> beam.ParDo(WriteShardFn(self._output_dir), run_id)
        )


# Error lines are small; parts of this size keep the part count low.
_ERROR_PART_BYTES = 16 << 20


class WriteErrorLog(beam.PTransform):
    """JSON lines (bytes) -> runs/<run id>/errors.jsonl, written once; outputs its manifest entry.

    The lines go to parts in the run's staging first (one per bundle attempt,
    as shard files do), then into the one file: a second write, of a few bytes per failed input.
    """

    def __init__(self, output_dir, run_id):
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id

    def expand(self, lines):
        run_id = beam.pvalue.AsSingleton(self._run_id)
        writer = WriteShardFilesFn(self._output_dir, framing=LINES, staging_subdir=_ERROR_PARTS_DIR)
        return (
            lines
            | "KeyErrors" >> beam.Map(lambda line: (ERRORS, line))
            | "WriteParts" >> beam.ParDo(writer, {ERRORS: _ERROR_PART_BYTES}, run_id)
            | "AllParts" >> beam.combiners.ToList()
            | "Plan" >> beam.Map(plan_error_log)
            | "Concatenate" >> beam.ParDo(WriteShardFn(self._output_dir), run_id)
        )
