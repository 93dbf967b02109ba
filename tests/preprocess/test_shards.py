"""Packing shard parts into shards sized by bytes; writing parts and shards retry-safely on real files."""

import hashlib
import json
import os

import pytest
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems

from preprocess.decoded_cache import WriteBatchPartsFn, read_batch_part
from preprocess.shards import (
    ERRORS,
    LINES,
    TFRECORD,
    ConcatenatePartsFn,
    Part,
    WritePartsFn,
    part_size_bytes,
    plan_error_log,
    plan_shards,
)
from preprocess.transform import to_record_batch


def _parts(sizes):
    return [
        Part("train", f"/staging/parts/p{i}.part", num_examples=max(size // 10, 1), num_bytes=size)
        for i, size in enumerate(sizes)
    ]


def test_plan_makes_at_least_min_shards_and_names_them_of_the_total():
    plans = plan_shards("train", _parts([100] * 20), shard_size_bytes=10_000, min_shards=8)
    assert [plan.name for plan in plans] == [f"train-{i:05d}-of-00008.tfrecord" for i in range(8)]
    assert sorted(part.path for plan in plans for part in plan.parts) == sorted(
        p.path for p in _parts([100] * 20)
    )


def test_plan_sizes_shards_by_bytes_when_the_split_is_large():
    plans = plan_shards("train", _parts([40] * 100), shard_size_bytes=400, min_shards=2)
    assert len(plans) == 10
    assert {sum(part.num_bytes for part in plan.parts) for plan in plans} == {400}


def test_plan_never_makes_an_empty_shard():
    plans = plan_shards("validation", _parts([100, 100, 100]), shard_size_bytes=10_000, min_shards=8)
    assert len(plans) == 3
    assert all(plan.parts for plan in plans)
    assert plan_shards("test", [], shard_size_bytes=10_000, min_shards=8) == []


@pytest.mark.parametrize("split_bytes,min_shards", [(10**6, 8), (10**9, 8), (10**12, 8), (5_000, 16)])
def test_parts_are_small_enough_to_fill_min_shards(split_bytes, min_shards):
    shard_size = 150_000_000
    size = part_size_bytes(split_bytes, shard_size, min_shards)
    assert size <= shard_size // 4
    assert split_bytes / size >= min(2 * min_shards, split_bytes)


# ------------------------------------------------- retry safety, on real files


RUN_ID = "20260101T000000000000Z-0123abcd"


def _records(count, size=100):
    return [bytes([index % 256]) * size for index in range(count)]


def _write_parts(output_dir, records, part_bytes=1_000, split="train", framing=TFRECORD):
    """One bundle of WritePartsFn, called as the runner calls it."""
    fn = WritePartsFn(split, str(output_dir), framing)
    fn.start_bundle()
    parts = [part for record in records for part in fn.process(record, part_bytes, RUN_ID)]
    parts += [windowed.value for windowed in fn.finish_bundle()]
    return parts


def _concatenate(output_dir, plan):
    fn = ConcatenatePartsFn(str(output_dir))
    (entry,) = list(fn.process(plan, RUN_ID))
    return entry


def _read_tfrecords(path):
    return [record.numpy() for record in tf.data.TFRecordDataset(str(path))]


def test_a_bundle_written_twice_gives_two_complete_part_sets_that_do_not_overlap(tmp_path):
    records = _records(25)
    first = _write_parts(tmp_path, records)
    second = _write_parts(tmp_path, records)
    assert not {part.path for part in first} & {part.path for part in second}
    for parts in (first, second):
        assert sum(part.num_examples for part in parts) == 25
        assert [record for part in parts for record in _read_tfrecords(part.path)] == records
        assert all(part.path.startswith(str(tmp_path / "staging" / RUN_ID / "parts")) for part in parts)


def test_concatenating_a_shard_twice_writes_the_same_bytes_and_keeps_its_parts(tmp_path):
    parts = _write_parts(tmp_path, _records(40))
    (plan,) = plan_shards("train", parts, shard_size_bytes=10**9, min_shards=1)
    first = _concatenate(tmp_path, plan)
    shard = tmp_path / first["path"]
    first_bytes = shard.read_bytes()
    assert _concatenate(tmp_path, plan) == first
    assert shard.read_bytes() == first_bytes
    assert first["path"] == f"runs/{RUN_ID}/train-00000-of-00001.tfrecord"
    assert first["sha256"] == hashlib.sha256(first_bytes).hexdigest()
    assert first["num_bytes"] == len(first_bytes)
    assert len(_read_tfrecords(shard)) == first["num_examples"] == 40
    # The parts are still there: a third attempt (a retry after a crash) can run.
    assert all(os.path.exists(part.path) for part in parts)


def test_a_concatenation_that_crashes_midway_leaves_no_partial_shard_and_its_retry_completes(
    tmp_path, monkeypatch
):
    parts = _write_parts(tmp_path, _records(40))
    (plan,) = plan_shards("train", parts, shard_size_bytes=10**9, min_shards=1)
    reads = []
    real_open = FileSystems.open

    def open_then_fail_on_the_third_part(path, *args, **kwargs):
        reads.append(path)
        if len(reads) == 3:
            raise ConnectionResetError("the worker lost its connection")
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(FileSystems, "open", open_then_fail_on_the_third_part)
        with pytest.raises(ConnectionResetError):
            _concatenate(tmp_path, plan)
    run_dir = tmp_path / "runs" / RUN_ID
    assert not run_dir.exists() or not os.listdir(run_dir)
    entry = _concatenate(tmp_path, plan)
    assert len(_read_tfrecords(tmp_path / entry["path"])) == 40


def test_the_error_log_is_one_file_of_every_line_even_when_empty(tmp_path):
    lines = [json.dumps({"uri": f"/in/{index}.jpg", "reason": "truncated"}).encode() for index in range(30)]
    parts = _write_parts(tmp_path, lines[:10], part_bytes=200, split=ERRORS, framing=LINES)
    parts += _write_parts(tmp_path, lines[10:], part_bytes=200, split=ERRORS, framing=LINES)
    entry = _concatenate(tmp_path, plan_error_log(parts))
    assert entry["path"] == f"runs/{RUN_ID}/errors.jsonl"
    written = (tmp_path / entry["path"]).read_bytes().splitlines()
    assert sorted(written) == sorted(lines)
    assert entry["num_examples"] == 30
    empty = _concatenate(tmp_path / "none", plan_error_log([]))
    assert (tmp_path / "none" / empty["path"]).read_bytes() == b""


def test_a_decoded_spill_bundle_written_twice_gives_two_readable_copies(tmp_path):
    batch = to_record_batch(
        [
            {"image_raw": bytes(12), "label": "a", "sha256": "0" * 64, "uri": f"/in/{index}.png"}
            for index in range(5)
        ]
    )

    def write_bundle():
        fn = WriteBatchPartsFn("train", str(tmp_path))
        fn.start_bundle()
        paths = list(fn.process(batch, RUN_ID)) + [windowed.value for windowed in fn.finish_bundle()]
        return paths

    first, second = write_bundle(), write_bundle()
    assert len(first) == len(second) == 1 and first != second
    for path in first + second:
        assert path.startswith(str(tmp_path / "staging" / RUN_ID / "decoded"))
        (read,) = list(read_batch_part(path))
        assert read.equals(batch)
