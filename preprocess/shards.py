"""Writing a split as TFRecord shards sized by bytes (and the error log), with bounded memory.

Two steps, so that neither the data nor a writer per shard has to sit in one
place:

1. `WritePartsFn`: each bundle appends its records to one part file in the
   run's staging (`staging/<run id>/parts/`), rolling over to a new part at
   `part_bytes`. Parts are small next to a shard, so there are always enough
   of them to make `min_shards` shards.
2. `plan_shards` packs the finished parts of a split into shards (largest
   part first onto the lightest shard), and `ConcatenatePartsFn` writes each
   shard by concatenating its parts (TFRecord files concatenate into a valid
   TFRecord file), computing its sha256 as it goes. The shard is written
   once, at its final place `runs/<run id>/<split>-NNNNN-of-MMMMM.tfrecord`,
   atomically (filesystem.write_atomically).

Retry-safe: a retried or duplicated bundle of step 1 writes parts under new
names, and only the parts of the attempt the runner committed are planned;
step 2 derives the shard's name and bytes from its plan alone, so running it
again rewrites the same bytes under the same name. Parts are never deleted
here: a retry of step 2 needs them. They go with the run's staging, after
the run has published (preprocess/publish.py).

Only part metadata (path, records, bytes) goes through a group-by; the
records themselves stream from the encoder to disk. The run id is a side
input: paths are chosen when the job runs, not when the graph is built.
"""

import dataclasses
import hashlib
import heapq
import math
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.transforms.window import GlobalWindows

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.runs import RunPaths

_COPY_CHUNK_BYTES = 8 << 20

# How records are framed in a part file: TFRecord for shards, one line each for the error log.
TFRECORD = "tfrecord"
LINES = "lines"
ERRORS = "errors"  # the `split` of the error log's parts


@dataclasses.dataclass(frozen=True)
class Part:
    split: str  # a split name, or ERRORS
    path: str
    num_examples: int
    num_bytes: int


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    split: str
    name: str  # the file name in the run's directory
    parts: tuple[Part, ...]


def part_size_bytes(estimated_split_bytes: int, shard_size_bytes: int, min_shards: int) -> int:
    """Roll parts over small enough that packing can fill `min_shards` evenly."""
    return max(1, min(shard_size_bytes // 4, estimated_split_bytes // (2 * max(min_shards, 1))))


class WritePartsFn(beam.DoFn):
    """Serialized records of one split (or error lines) -> Part files in the run's staging."""

    def __init__(self, split: str, output_dir: str, framing: str = TFRECORD):
        self._split = split
        self._output_dir = output_dir
        self._framing = framing

    def start_bundle(self):
        self._handle = None

    def _close(self):
        if self._handle is None:
            return None
        self._handle.close()
        part = Part(self._split, self._path, self._count, self._bytes)
        self._handle = None
        return GlobalWindows.windowed_value(part)

    def process(self, record: bytes, part_bytes: int, run_id: str):
        if self._handle is None:
            # A fresh name per attempt: a part is never overwritten, so an
            # attempt the runner discarded cannot spoil the committed one.
            name = f"{self._split}-{uuid.uuid4().hex}.part"
            self._path = RunPaths(self._output_dir, run_id).staging("parts", name)
            self._handle = FileSystems.create(self._path)
            self._count = 0
            self._bytes = 0
        if self._framing == TFRECORD:
            _TFRecordUtil.write_record(self._handle, record)
            self._bytes += _TFRecordUtil.encoded_num_bytes(record)
        else:
            self._handle.write(record + b"\n")
            self._bytes += len(record) + 1
        self._count += 1
        if self._bytes >= part_bytes:
            yield self._close().value

    def finish_bundle(self):
        closed = self._close()
        if closed is not None:
            yield closed


def plan_shards(split: str, parts: list[Part], shard_size_bytes: int, min_shards: int) -> list[ShardPlan]:
    """Pack a split's parts into shards of about `shard_size_bytes`, at least `min_shards`.

    Fewer shards than `min_shards` only when there are fewer parts (a split of
    a handful of examples); never an empty shard. Deterministic: the same
    parts in any order give the same plans.
    """
    parts = [part for part in parts if part.num_examples > 0]
    if not parts:
        return []
    total_bytes = sum(part.num_bytes for part in parts)
    wanted = max(min_shards, math.ceil(total_bytes / shard_size_bytes))
    num_shards = min(wanted, len(parts))
    loads = [(0, index, []) for index in range(num_shards)]
    heapq.heapify(loads)
    for part in sorted(parts, key=lambda part: (-part.num_bytes, part.path)):
        load, index, assigned = heapq.heappop(loads)
        assigned.append(part)
        heapq.heappush(loads, (load + part.num_bytes, index, assigned))
    plans = sorted(loads, key=lambda entry: entry[1])
    return [
        ShardPlan(split, manifest_lib.shard_file_name(split, index, num_shards), tuple(assigned))
        for _, index, assigned in plans
    ]


def plan_error_log(parts: list[Part]) -> ShardPlan:
    """All error parts into the one error log (an empty file when nothing failed)."""
    return ShardPlan(ERRORS, manifest_lib.ERRORS_FILE, tuple(sorted(parts, key=lambda part: part.path)))


class ConcatenatePartsFn(beam.DoFn):
    """ShardPlan -> the file written in runs/<run id>/, and its manifest entry (path relative to the output)."""

    def __init__(self, output_dir: str):
        self._output_dir = output_dir

    def process(self, plan: ShardPlan, run_id: str):
        paths = RunPaths(self._output_dir, run_id)
        digest = hashlib.sha256()
        num_bytes = 0
        with filesystem.write_atomically(paths.final(plan.name), tmp_dir=paths.tmp_dir) as out:
            for part in plan.parts:
                with FileSystems.open(part.path) as handle:
                    while chunk := handle.read(_COPY_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                        num_bytes += len(chunk)
        yield {
            "split": plan.split,
            "path": paths.relative(plan.name),
            "num_examples": sum(part.num_examples for part in plan.parts),
            "num_bytes": num_bytes,
            "sha256": digest.hexdigest(),
        }


class WriteShards(beam.PTransform):
    """Serialized examples of one split -> shard manifest entries (dicts).

    `estimated_bytes` is a singleton side input (the split's record count times
    the bytes a record takes, or an estimate for jpeg) that sets the part size;
    `run_id` is the singleton of preprocess.runs.MakeRunId.
    """

    def __init__(self, split, output_dir, shard_size_bytes, min_shards, estimated_bytes, run_id):
        super().__init__()
        self._split = split
        self._output_dir = output_dir
        self._shard_size_bytes = shard_size_bytes
        self._min_shards = min_shards
        self._estimated_bytes = estimated_bytes
        self._run_id = run_id

    def expand(self, records):
        split, shard_size_bytes, min_shards = self._split, self._shard_size_bytes, self._min_shards
        part_bytes = self._estimated_bytes | "PartSize" >> beam.Map(
            part_size_bytes, shard_size_bytes=shard_size_bytes, min_shards=min_shards
        )
        run_id = beam.pvalue.AsSingleton(self._run_id)
        return (
            records
            | "WriteParts"
            >> beam.ParDo(WritePartsFn(split, self._output_dir), beam.pvalue.AsSingleton(part_bytes), run_id)
            | "AllParts" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(lambda parts: plan_shards(split, parts, shard_size_bytes, min_shards))
            | "Spread" >> beam.Reshuffle()
            | "Concatenate" >> beam.ParDo(ConcatenatePartsFn(self._output_dir), run_id)
        )


# Error lines are small; parts of this size keep the part count low.
_ERROR_PART_BYTES = 16 << 20


class WriteErrorLog(beam.PTransform):
    """JSON lines (bytes) -> runs/<run id>/errors.jsonl, written once; outputs its manifest entry."""

    def __init__(self, output_dir, run_id):
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id

    def expand(self, lines):
        run_id = beam.pvalue.AsSingleton(self._run_id)
        return (
            lines
            | "WriteParts"
            >> beam.ParDo(WritePartsFn(ERRORS, self._output_dir, framing=LINES), _ERROR_PART_BYTES, run_id)
            | "AllParts" >> beam.combiners.ToList()
            | "Plan" >> beam.Map(plan_error_log)
            | "Concatenate" >> beam.ParDo(ConcatenatePartsFn(self._output_dir), run_id)
        )
