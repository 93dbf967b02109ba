"""Writing a split as TFRecord shards sized by bytes, with bounded memory.

Two steps, so that neither the data nor a writer per shard has to sit in one
place:

1. `WriteShardPartsFn`: each bundle appends its records to one part file per
   split, rolling over to a new part at `part_bytes`. Parts are small next to
   a shard, so there are always enough of them to make `min_shards` shards.
2. `plan_shards` packs the finished parts of a split into shards (largest
   part first onto the lightest shard), and `ConcatenatePartsFn` writes each
   shard by concatenating its parts (TFRecord files concatenate into a valid
   TFRecord file), computing its sha256 as it goes, then deletes the parts.

Only part metadata (path, records, bytes) goes through a group-by; the
records themselves stream from the encoder to disk. Everything is written in
the run's staging directory; the finalize step moves shards into place.
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

_COPY_CHUNK_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class Part:
    split: str
    path: str
    num_examples: int
    num_bytes: int


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    split: str
    name: str
    parts: tuple[Part, ...]


def part_size_bytes(estimated_split_bytes: int, shard_size_bytes: int, min_shards: int) -> int:
    """Roll parts over small enough that packing can fill `min_shards` evenly."""
    return max(1, min(shard_size_bytes // 4, estimated_split_bytes // (2 * max(min_shards, 1))))


class WriteShardPartsFn(beam.DoFn):
    """Serialized records of one split -> Part files in the staging directory."""

    def __init__(self, split: str, parts_dir: str):
        self._split = split
        self._parts_dir = parts_dir

    def start_bundle(self):
        self._handle = None
        self._part = None

    def _close(self):
        if self._handle is None:
            return None
        self._handle.close()
        part = Part(self._split, self._path, self._count, self._bytes)
        self._handle = None
        return GlobalWindows.windowed_value(part)

    def process(self, record: bytes, part_bytes: int):
        if self._handle is None:
            self._path = manifest_lib.join(self._parts_dir, f"{self._split}-{uuid.uuid4().hex}.part")
            self._handle = FileSystems.create(self._path)
            self._count = 0
            self._bytes = 0
        _TFRecordUtil.write_record(self._handle, record)
        self._count += 1
        self._bytes += _TFRecordUtil.encoded_num_bytes(record)
        if self._bytes >= part_bytes:
            yield self._close().value

    def finish_bundle(self):
        closed = self._close()
        if closed is not None:
            yield closed


def plan_shards(split: str, parts: list[Part], shard_size_bytes: int, min_shards: int) -> list[ShardPlan]:
    """Pack a split's parts into shards of about `shard_size_bytes`, at least `min_shards`.

    Fewer shards than `min_shards` only when there are fewer parts (a split of
    a handful of examples); never an empty shard.
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


class ConcatenatePartsFn(beam.DoFn):
    """ShardPlan -> the shard written in `staging_dir`, and its manifest entry."""

    def __init__(self, staging_dir: str):
        self._staging_dir = staging_dir

    def process(self, plan: ShardPlan):
        path = manifest_lib.join(self._staging_dir, plan.name)
        digest = hashlib.sha256()
        num_bytes = 0
        with FileSystems.create(path) as out:
            for part in plan.parts:
                with FileSystems.open(part.path) as handle:
                    while chunk := handle.read(_COPY_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
                        num_bytes += len(chunk)
        FileSystems.delete([part.path for part in plan.parts])
        yield {
            "split": plan.split,
            "path": plan.name,
            "num_examples": sum(part.num_examples for part in plan.parts),
            "num_bytes": num_bytes,
            "sha256": digest.hexdigest(),
        }


class WriteShards(beam.PTransform):
    """Serialized examples of one split -> shard manifest entries (dicts).

    `estimated_bytes` is a singleton side input (the split's record count times
    the bytes a record takes, or an estimate for jpeg) that sets the part size.
    """

    def __init__(self, split, staging_dir, shard_size_bytes, min_shards, estimated_bytes):
        super().__init__()
        self._split = split
        self._staging_dir = staging_dir
        self._shard_size_bytes = shard_size_bytes
        self._min_shards = min_shards
        self._estimated_bytes = estimated_bytes

    def expand(self, records):
        split, shard_size_bytes, min_shards = self._split, self._shard_size_bytes, self._min_shards
        part_bytes = self._estimated_bytes | "PartSize" >> beam.Map(
            part_size_bytes, shard_size_bytes=shard_size_bytes, min_shards=min_shards
        )
        parts_dir = manifest_lib.join(self._staging_dir, "parts")
        return (
            records
            | "WriteParts"
            >> beam.ParDo(WriteShardPartsFn(split, parts_dir), beam.pvalue.AsSingleton(part_bytes))
            | "AllParts" >> beam.combiners.ToList()
            | "Plan" >> beam.FlatMap(lambda parts: plan_shards(split, parts, shard_size_bytes, min_shards))
            | "Spread" >> beam.Reshuffle()
            | "Concatenate" >> beam.ParDo(ConcatenatePartsFn(self._staging_dir))
        )
