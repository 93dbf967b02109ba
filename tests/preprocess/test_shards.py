"""Packing shard parts into shards sized by bytes."""

import pytest

from preprocess.shards import Part, part_size_bytes, plan_shards


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
