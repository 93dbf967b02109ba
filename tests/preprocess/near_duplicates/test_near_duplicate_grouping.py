"""Near-duplicate groups (preprocess/near_duplicates/grouping.py) on Beam's DirectRunner, fed with beam.Create.

Where a result is not small enough to write out by hand, it is compared with
a plain-Python model of the documented rules (bands, hot buckets skipped,
components of the verified edges), computed here without Beam.
"""

import collections
import hashlib
import itertools
import json
import random

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from preprocess.near_duplicates.grouping import (
    DEFAULT_MAX_BUCKET_SIZE,
    STATS_KEYS,
    FindHotImagesFn,
    FindNearDuplicateGroups,
    SignedImage,
    band_detection_probability,
    band_ranges,
)

BITS = 64


def _key(name) -> str:
    return hashlib.sha256(str(name).encode()).hexdigest()


def _image(name, signature, *, label="cat", split="train", given=False, pixels=0, num_bytes=0):
    return SignedImage(
        key=_key(name),
        signature=signature,
        uri=f"gs://bucket/{label}/{name}.jpg",
        label=label,
        split=split,
        split_given=given,
        source_pixels=pixels,
        num_bytes=num_bytes,
        locator=(f"part-{name}", 0),
    )


def _flip(signature: int, bits) -> int:
    for bit in bits:
        signature ^= 1 << bit
    return signature


def _chain(rng, names, step_bits=3, **fields):
    """Images each `step_bits` bits from the previous one and 2 * step_bits from the one before: a chain."""
    signature, used, images = rng.getrandbits(BITS), set(), []
    for name in names:
        images.append(_image(name, signature, **fields))
        bits = rng.sample(sorted(set(range(BITS)) - used), step_bits)
        used.update(bits)
        if len(used) > BITS - step_bits:
            used = set(bits)
        signature = _flip(signature, bits)
    return images


def _stats(result, expected: dict):
    """assert_that the stats element holds `expected` (and zeros or anything for the other keys)."""

    def check(elements):
        assert len(elements) == 1, elements
        (stats,) = elements
        assert set(stats) >= set(STATS_KEYS)
        assert {name: stats[name] for name in expected} == expected, stats

    assert_that(result["stats"], check, label="stats")


def _member_rows(result, label="members"):
    return result["members"] | f"{label}Rows" >> beam.Map(
        lambda member: (member.image.key, member.group, member.split, member.kept)
    )


def _group_lines(result, label="groups"):
    return result["groups"] | f"{label}Lines" >> beam.Map(lambda group: group.to_json())


def _model(images, max_distance, bands=4, max_bucket_size=DEFAULT_MAX_BUCKET_SIZE):
    """Plain Python: {key: group id} of the images in groups, edges, hot buckets, images in hot buckets.

    The images of a hot bucket are left out: no edge touches them.
    """
    buckets = collections.defaultdict(list)
    for image in images:
        for band, (shift, width) in enumerate(band_ranges(bands, BITS)):
            buckets[band, (image.signature >> shift) & ((1 << width) - 1)].append(image)
    edges, hot, hot_images = {}, 0, set()
    for bucket in buckets.values():
        if len(bucket) > max_bucket_size:
            hot += 1
            hot_images.update(image.key for image in bucket)
            continue
        for a, b in itertools.combinations(bucket, 2):
            distance = (a.signature ^ b.signature).bit_count()
            if distance <= max_distance:
                edges[min(a.key, b.key), max(a.key, b.key)] = distance
    edges = {pair: d for pair, d in edges.items() if not hot_images.intersection(pair)}
    parent = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for a, b in edges:
        ra, rb = root(a), root(b)
        parent[max(ra, rb)] = min(ra, rb)
    groups = {key: root(key) for key in parent}
    return groups, edges, hot, len(hot_images)


def _expected_members(images, groups, drop=False):
    """(key, group, split, kept) per member, by the documented split and drop rules."""
    by_group = collections.defaultdict(list)
    for image in images:
        if image.key in groups:
            by_group[groups[image.key]].append(image)
    rows = []
    for group, members in by_group.items():
        smallest = min(members, key=lambda image: image.key)
        given = any(image.split_given for image in members)
        kept = min(members, key=lambda image: (-image.source_pixels, -image.num_bytes, image.key))
        for image in members:
            split = image.split if given else smallest.split
            rows.append((image.key, group, split, not drop or image is kept))
    return rows


def test_chains_and_cliques_are_groups_and_a_pair_just_over_the_threshold_is_not():
    """Also: a group of two labels is counted, and a group's line lists its members by key."""
    rng = random.Random(1)
    chain = _chain(rng, [f"chain{i}" for i in range(40)], step_bits=3)
    clique_base = rng.getrandbits(BITS)
    clique = [_image(f"clique{i}", _flip(clique_base, [i])) for i in range(4)]  # pairwise 2 bits apart
    far_base = rng.getrandbits(BITS)
    over = [_image("over0", far_base), _image("over1", _flip(far_base, range(4)))]  # 4 bits, in band 0
    at_base = rng.getrandbits(BITS)
    at = [
        _image("at0", at_base, label="dog", split="test", pixels=10),
        _image("at1", _flip(at_base, [1, 2, 3]), label="bird", split="validation", pixels=20),
    ]
    lone = [_image(f"lone{i}", rng.getrandbits(BITS)) for i in range(30)]
    images = chain + clique + over + at + lone
    groups, edges, _, _ = _model(images, max_distance=3)
    assert (
        len(set(groups.values())) == 3 and _key("over0") not in groups
    )  # the model agrees with the scenario
    first, second = sorted(at, key=lambda image: image.key)
    at_line = {
        "group": first.key,
        "split": first.split,
        "max_distance": 3,
        "uris": [first.uri, second.uri],
        "labels": [first.label, second.label],
        "splits": [first.split, first.split],
        "sha256": [first.key, second.key],
        "kept": [True, True],
    }

    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(images) | FindNearDuplicateGroups(3)
        assert_that(_member_rows(result), equal_to(_expected_members(images, groups)), label="members")
        assert_that(
            result["groups"] | beam.Map(lambda group: (group.group, len(group.members), group.max_distance)),
            equal_to(
                [
                    (min(image.key for image in chain), 40, 3),
                    (min(image.key for image in clique), 4, 2),
                    (min(image.key for image in at), 2, 3),
                ]
            ),
            label="groups",
        )
        assert_that(
            _group_lines(result)
            | beam.Map(json.loads)
            | beam.Filter(lambda line: line["group"] == first.key),
            equal_to([at_line]),
            label="line",
        )
        _stats(
            result,
            {
                "groups": 3,
                "images_in_groups": 46,
                "groups_with_several_labels": 1,
                "groups_across_splits": 0,
                "dropped": 0,
                "verified_pairs": len(edges),
                "hot_buckets": 0,
                "images_in_hot_buckets": 0,
                "images_not_converged": 0,
            },
        )


def test_a_chain_longer_than_the_rounds_is_counted_as_not_converged_and_never_merged_wrongly():
    # Keys ascending along the chain: the slowest order for label propagation (2 rounds cannot converge 60).
    names = sorted(range(60), key=_key)
    chain = _chain(random.Random(2), names, step_bits=2)
    position = {image.key: index for index, image in enumerate(chain)}
    others = _chain(random.Random(3), ["x0", "x1"], step_bits=2)

    def connected_parts(groups):
        assert len(groups) > 1  # not converged: the chain is in several parts
        in_chain = [g for g in groups if g.group in position]
        for group in in_chain:
            indexes = sorted(position[member.image.key] for member in group.members)
            assert indexes == list(range(indexes[0], indexes[-1] + 1))  # each part is connected
            assert group.group == chain[indexes[0]].key
        assert sum(len(g.members) for g in groups) <= 62

    def not_converged(elements):
        (stats,) = elements
        assert stats["images_not_converged"] > 0, stats

    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(chain + others) | FindNearDuplicateGroups(2, rounds=2)
        assert_that(result["groups"], connected_parts, label="parts")
        assert_that(result["stats"], not_converged, label="stats")


def test_a_group_takes_its_smallest_keys_split_unless_a_split_was_given():
    rng = random.Random(4)
    free = _chain(rng, ["f0", "f1", "f2"], step_bits=1)
    free = [
        SignedImage(**{**vars(image), "split": split})
        for image, split in zip(free, ["train", "validation", "test"], strict=True)
    ]
    given = _chain(rng, ["g0", "g1", "g2"], step_bits=1)
    given = [
        SignedImage(**{**vars(image), "split": split, "split_given": is_given})
        for image, split, is_given in zip(given, ["train", "test", "test"], [True, False, False], strict=True)
    ]
    same = _chain(rng, ["s0", "s1"], step_bits=1, split="validation", given=True)
    images = free + given + same
    smallest_free = min(free, key=lambda image: image.key)
    expected = (
        [(image.key, smallest_free.key, smallest_free.split, True) for image in free]
        + [(image.key, min(i.key for i in given), image.split, True) for image in given]
        + [(image.key, min(i.key for i in same), "validation", True) for image in same]
    )
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(images) | FindNearDuplicateGroups(1)
        assert_that(_member_rows(result), equal_to(expected), label="members")
        split_changes = sum(image.split != smallest_free.split for image in free)
        _stats(result, {"groups": 3, "groups_across_splits": 1, "split_changes": split_changes})


def test_drop_mode_keeps_the_largest_source_then_the_largest_file_then_the_smallest_key():
    rng = random.Random(5)
    by_pixels = _chain(rng, ["p0", "p1", "p2"], step_bits=1)
    by_pixels = [
        SignedImage(**{**vars(image), "source_pixels": pixels, "num_bytes": num_bytes})
        for image, pixels, num_bytes in zip(by_pixels, [100, 400, 200], [900, 1, 900], strict=True)
    ]
    by_bytes = [
        SignedImage(**{**vars(image), "source_pixels": 100, "num_bytes": num_bytes})
        for image, num_bytes in zip(_chain(rng, ["b0", "b1"], step_bits=1), [5, 50], strict=True)
    ]
    by_key = _chain(rng, ["k0", "k1", "k2"], step_bits=1, pixels=7, num_bytes=7)
    images = by_pixels + by_bytes + by_key
    kept = {by_pixels[1].key, by_bytes[1].key, min(image.key for image in by_key)}
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(images) | FindNearDuplicateGroups(1, drop=True)
        assert_that(
            result["members"] | beam.Filter(lambda member: member.kept) | beam.Map(lambda m: m.image.key),
            equal_to(sorted(kept)),
            label="kept",
        )
        _stats(result, {"groups": 3, "images_in_groups": 8, "dropped": 5})


def test_stats_is_one_element_of_zeros_when_there_is_no_image():
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create([]) | FindNearDuplicateGroups(4)
        assert_that(result["stats"], equal_to([dict.fromkeys(STATS_KEYS, 0)]))
        assert_that(result["members"], equal_to([]), label="no members")


def _planted_corpus(seed, lone, groups, hot):
    """Random signatures, planted groups (chains and cliques), and `hot` near-identical signatures."""
    rng = random.Random(seed)
    images = [
        _image(f"lone{i}", rng.getrandbits(BITS), split=rng.choice(["train", "test"])) for i in range(lone)
    ]
    for group in range(groups):
        names = [f"g{group}-{i}" for i in range(rng.randint(2, 6))]
        label = rng.choice(["cat", "dog"])
        images += [
            SignedImage(**{**vars(image), "split": rng.choice(["train", "validation"]), "label": label})
            for image in _chain(rng, names, step_bits=rng.randint(1, 4))
        ]
    blank = rng.getrandbits(BITS)
    images += [
        _image(f"blank{i}", _flip(blank, rng.sample(range(BITS), rng.randint(0, 2)))) for i in range(hot)
    ]
    return images


@pytest.mark.parametrize("seed", [11, 12])
def test_a_hot_band_is_skipped_and_counted_and_the_result_does_not_depend_on_order(seed):
    # 3000 near-identical signatures: their common band values make buckets of ~2000-3000 images.
    images = _planted_corpus(seed=7, lone=400, groups=40, hot=3000)
    cap = 1000
    groups, edges, hot, hot_images = _model(images, max_distance=4, max_bucket_size=cap)
    assert hot >= 4 and hot_images >= 2500  # the scenario has hot buckets in every band
    shuffled = list(images)
    random.Random(seed).shuffle(shuffled)
    with TestPipeline() as pipeline:
        result = (
            pipeline
            | beam.Create(shuffled)
            | beam.Reshuffle()  # spreads the images over bundles, in another order per run
            | FindNearDuplicateGroups(4, max_bucket_size=cap)
        )
        assert_that(_member_rows(result), equal_to(_expected_members(images, groups)), label="members")
        _stats(
            result,
            {
                "hot_buckets": hot,
                "images_in_hot_buckets": hot_images,
                "verified_pairs": len(edges),
                "groups": len(set(groups.values())),
                "images_not_converged": 0,
            },
        )


def test_a_hot_bucket_is_streamed_past_and_never_held():
    """Its keys are counted up to the cap, then streamed out one by one: no pass holds them."""

    class Bucket:
        def __init__(self, size):
            self.size, self.passes, self.pulled = size, 0, 0

        def __iter__(self):
            self.passes += 1
            self.pulled = 0
            for index in range(self.size):
                self.pulled += 1
                yield _key(index)

    cap = 10
    bucket = Bucket(5000)
    keys = 0
    for output in FindHotImagesFn(cap).process(((0, 0), bucket)):
        if isinstance(output, str):
            keys += 1
            assert bucket.pulled == keys  # each key out as it is read
    assert keys == 5000 and bucket.passes == 2
    small = Bucket(cap)
    assert list(FindHotImagesFn(cap).process(((0, 0), small))) == [] and small.pulled == cap


def test_bands_guarantee_pairs_within_bands_minus_one_bits():
    assert [width for _, width in band_ranges(4, 64)] == [16] * 4
    assert [width for _, width in band_ranges(5, 64)] == [13, 13, 13, 13, 12]
    assert all(band_detection_probability(d, 4) == 1.0 for d in range(4))
    assert 0.0 < band_detection_probability(4, 4) < 1.0
    # Monte Carlo agrees with the formula beyond the guarantee.
    rng = random.Random(8)
    found = 0
    for _ in range(4000):
        differing = rng.sample(range(64), 8)
        found += any(all(not shift <= bit < shift + 16 for bit in differing) for shift in (0, 16, 32, 48))
    assert abs(found / 4000 - band_detection_probability(8, 4)) < 0.03
    with pytest.raises(ValueError, match="bands must be between 1 and 64"):
        band_ranges(65, 64)
