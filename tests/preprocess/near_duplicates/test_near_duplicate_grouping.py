"""Near-duplicate groups (preprocess/near_duplicates/grouping.py) on Beam's DirectRunner, fed with beam.Create.

Where a result is not small enough to write out by hand, it is compared with
a plain-Python model of the documented rules (every pair compared, no
buckets; components cut into groups around centres), computed without Beam.
Signatures here are grey hashes alone (their colour layouts and thumbnails
are zero, so they agree): `near` is then the grey Hamming distance.
"""

import collections
import hashlib
import itertools
import json
import random

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.worker import bundle_processor
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from preprocess.near_duplicates.grouping import (
    NEAR_MISSES,
    STATS_KEYS,
    FindNearDuplicateGroups,
    SignedImage,
    VerifyBucketFn,
    _BandTables,
    band_detection_probability,
    band_masks,
    band_value,
    cut_into_groups,
    signature_bytes,
)
from preprocess.near_duplicates.signature import grey_distance, near

BITS = 64


def _key(name) -> str:
    return hashlib.sha256(str(name).encode()).hexdigest()


def _mirror_of(grey: int) -> int:
    """A stand-in for the mirrored grey hash of a signature made of a grey hash alone: far from any other."""
    return int.from_bytes(hashlib.sha256(grey.to_bytes(8, "little")).digest()[:8], "little")


def _signature(grey: int) -> int:
    """A signature of grey hash `grey` (colour layout and thumbnail all zero: they agree with any other's)."""
    return grey | _mirror_of(grey) << BITS


def _image(name, grey, *, label="cat", split="train", given=False, pixels=0, num_bytes=0, published=None):
    return SignedImage(
        key=_key(name),
        signature=_signature(grey),
        uri=f"gs://bucket/{label}/{name}.jpg",
        label=label,
        split=split,
        split_given=given,
        source_pixels=pixels,
        num_bytes=num_bytes,
        locator=(f"part-{name}", 0),
        published_split=published,
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


def _clique(rng, names, **fields):
    """Images pairwise 2 bits apart (each one bit from a common centre)."""
    base = rng.getrandbits(BITS)
    return [_image(name, _flip(base, [index]), **fields) for index, name in enumerate(names)]


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


def _model(images, max_distance):
    """Plain Python, every pair compared (no buckets): {key: (group id, split)} of the images in groups, by the
    documented rules: components of the near pairs, cut around centres (cut_into_groups), the smallest key's
    split."""
    parent = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for a, b in itertools.combinations(images, 2):
        if near(a.signature, b.signature, max_distance) is not None:
            ra, rb = root(a.key), root(b.key)
            parent[max(ra, rb)] = min(ra, rb)
    components = collections.defaultdict(list)
    for image in images:
        if image.key in parent:
            components[root(image.key)].append(image)
    result = {}
    for members in components.values():
        members.sort(key=lambda image: image.key)
        keys = [image.key for image in members]
        for _, indexes, _ in cut_into_groups(keys, [image.signature for image in members], max_distance):
            first = members[indexes[0]]
            for index in indexes:
                result[members[index].key] = (first.key, first.split)
    return result


def _rows(images, model):
    return [(image.key, *model[image.key], True) for image in images if image.key in model]


def test_a_chain_is_cut_into_groups_around_centres_and_cliques_stay_whole():
    """Also: a pair just over the threshold is no group, a group of two labels is counted, a group's line."""
    rng = random.Random(1)
    chain = _chain(rng, [f"chain{i}" for i in range(40)], step_bits=3)
    clique = _clique(rng, [f"clique{i}" for i in range(4)])
    far_base = rng.getrandbits(BITS)
    # 4 bits, all in band 0: a candidate, a near miss.
    over = [_image("over0", far_base), _image("over1", _flip(far_base, [0, 4, 8, 12]))]
    at_base = rng.getrandbits(BITS)
    at = [
        _image("at0", at_base, label="dog", split="test", pixels=10),
        _image("at1", _flip(at_base, [1, 2, 3]), label="bird", split="validation", pixels=20),
    ]
    lone = [_image(f"lone{i}", rng.getrandbits(BITS)) for i in range(30)]
    images = chain + clique + over + at + lone
    model = _model(images, max_distance=3)
    by_key = {image.key: image for image in images}
    first, second = sorted(at, key=lambda image: image.key)
    at_line = {
        "group": first.key,
        "split": first.split,
        "max_distance": 3,
        "centre": first.key,
        "flags": ["kept_whole"],  # two labels, no majority: drop mode would keep both
        "uris": [first.uri, second.uri],
        "labels": [first.label, second.label],
        "splits": [first.split, first.split],
        "splits_before": [first.split, second.split],
        "sha256": [first.key, second.key],
        "kept": [True, True],
    }

    def groups_hold(groups):
        sizes = sorted(len(group.members) for group in groups)
        # No group spans the chain: each member is within 3 bits of its centre, so at most 3 chain links.
        assert max(sizes) <= 4 and len(groups) > 10, sizes
        for group in groups:
            centre = by_key[group.centre].signature
            assert all(grey_distance(centre, m.image.signature)[0] <= 3 for m in group.members)
        assert {m.image.key for g in groups for m in g.members} >= {image.key for image in clique + at}
        assert not {m.image.key for g in groups for m in g.members} & {image.key for image in over + lone}

    over_a, over_b = sorted(over, key=lambda image: image.key)
    over_miss = {
        "distance": 4,
        "uris": [over_a.uri, over_b.uri],
        "labels": ["cat"] * 2,
        "splits": ["train"] * 2,
    }

    def near_misses_listed(elements):
        # The report's near misses: the closest pairs just over the distance, with their members.
        (stats,) = elements
        listed = stats["near_misses"]
        assert over_miss in listed and len(listed) <= NEAR_MISSES, listed
        assert [pair["distance"] for pair in listed] == sorted(pair["distance"] for pair in listed)

    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(images) | FindNearDuplicateGroups(3)
        assert_that(result["stats"], near_misses_listed, label="near misses")
        assert_that(_member_rows(result), equal_to(_rows(images, model)), label="members")
        assert_that(result["groups"], groups_hold, label="groups")
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
                "groups_with_several_labels": 1,
                "groups_across_splits": 0,
                "dropped": 0,
                "hot_buckets": 0,
                "images_not_converged": 0,
                "largest_group": 4,
                "images_in_groups": len(model),
            },
        )


def test_a_chain_longer_than_the_rounds_is_counted_as_not_converged_and_its_groups_still_hold():
    # Keys ascending along the chain: the slowest order for label propagation (2 rounds cannot converge 60).
    names = sorted(range(60), key=_key)
    chain = _chain(random.Random(2), names, step_bits=2)
    by_key = {image.key: image for image in chain}

    def near_their_centres(groups):
        for group in groups:
            centre = by_key[group.centre].signature
            assert all(near(centre, m.image.signature, 2) is not None for m in group.members)

    def not_converged(elements):
        (stats,) = elements
        assert stats["images_not_converged"] > 0, stats

    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(chain) | FindNearDuplicateGroups(2, rounds=2)
        assert_that(result["groups"], near_their_centres, label="groups")
        assert_that(result["stats"], not_converged, label="stats")


def _with(images, **fields):
    return [SignedImage(**{**vars(image), **fields}) for image in images]


def test_a_named_or_published_split_wins_for_its_group_and_the_others_follow_it():
    rng = random.Random(4)
    # No split held: the smallest key's split.
    free = [
        SignedImage(**{**vars(image), "split": split})
        for image, split in zip(
            _clique(rng, ["f0", "f1", "f2"]), ["train", "validation", "test"], strict=True
        )
    ]
    # One member named test by the manifest: the unnamed ones follow it.
    named = _clique(rng, ["n0", "n1", "n2"])
    named = [named[0]] + _with(named[1:2], split="test", split_given=True) + named[2:]
    # A member published in validation by the previous version: the others (a new copy) follow it.
    published = _clique(rng, ["p0", "p1"])
    published = _with(published[:1], split="test", published_split="validation") + published[1:]
    # Members named in two splits: the group crosses splits, and no one moves.
    crossing = _clique(rng, ["c0", "c1", "c2"])
    crossing = (
        _with(crossing[:1], split="test", split_given=True)
        + _with(crossing[1:2], split="validation", split_given=True)
        + _with(crossing[2:], split="train")
    )
    images = free + named + published + crossing
    smallest_free = min(free, key=lambda image: image.key)

    def group_of(members):
        return min(image.key for image in members)

    expected = (
        [(image.key, group_of(free), smallest_free.split, True) for image in free]
        + [(image.key, group_of(named), "test", True) for image in named]
        + [(image.key, group_of(published), "validation", True) for image in published]
        + [(image.key, group_of(crossing), image.split, True) for image in crossing]
    )
    with TestPipeline() as pipeline:
        # No limit on the share of moves: most of these images move (the guard has its own test).
        result = pipeline | beam.Create(images) | FindNearDuplicateGroups(2, max_moved_share=1)
        assert_that(_member_rows(result), equal_to(expected), label="members")
        assert_that(
            result["groups"] | beam.Map(lambda group: (group.group, group.flags)),
            equal_to(
                [
                    (group_of(free), ()),
                    (group_of(named), ()),
                    (group_of(published), ()),
                    (group_of(crossing), ("across_splits",)),
                ]
            ),
            label="flags",
        )
        moved = sum(image.split != smallest_free.split for image in free) + 2 + 2
        _stats(result, {"groups": 4, "groups_across_splits": 1, "split_changes": moved})


def test_drop_mode_keeps_the_majority_label_then_a_held_split_then_the_largest_source():
    rng = random.Random(5)
    # The largest source is mislabelled: the majority's label wins.
    majority = _clique(rng, ["m0", "m1", "m2"])
    majority = _with(majority[:1], label="dog", source_pixels=900) + _with(majority[1:], source_pixels=100)
    # Same label: a manifest-named member first, then the largest source, then the largest file.
    named = _clique(rng, ["n0", "n1", "n2"], pixels=100)
    named = _with(named[:1], split_given=True) + _with(named[1:2], source_pixels=400) + named[2:]
    by_pixels = _clique(rng, ["p0", "p1", "p2"])
    by_pixels = [
        SignedImage(**{**vars(image), "source_pixels": pixels, "num_bytes": num_bytes})
        for image, pixels, num_bytes in zip(by_pixels, [100, 400, 200], [900, 1, 900], strict=True)
    ]
    # Two labels, one member each: no majority, kept whole.
    split_vote = _clique(rng, ["s0", "s1"])
    split_vote = _with(split_vote[:1], label="dog") + split_vote[1:]
    # Named by the manifest in two splits: the group crosses splits, so no one is dropped.
    crossing = _clique(rng, ["c0", "c1"])
    crossing = _with(crossing[:1], split="test", split_given=True) + _with(crossing[1:], split_given=True)
    images = majority + named + by_pixels + split_vote + crossing
    kept = {majority[1].key if majority[1].key < majority[2].key else majority[2].key, named[0].key}
    kept |= {by_pixels[1].key} | {image.key for image in split_vote + crossing}
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(images) | FindNearDuplicateGroups(2, drop=True)
        assert_that(
            result["members"] | beam.Filter(lambda member: member.kept) | beam.Map(lambda m: m.image.key),
            equal_to(sorted(kept)),
            label="kept",
        )
        _stats(result, {"groups": 5, "images_in_groups": 13, "dropped": 6, "groups_kept_whole": 1})


def test_a_group_over_the_size_limit_is_listed_and_flagged_but_moves_no_one():
    rng = random.Random(6)
    clique = [
        SignedImage(**{**vars(image), "split": split})
        for image, split in zip(
            _clique(rng, [f"q{i}" for i in range(5)]), ["train", "test"] * 2 + ["train"], strict=True
        )
    ]
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(clique) | FindNearDuplicateGroups(2, drop=True, max_group_size=4)
        assert_that(
            _member_rows(result),
            equal_to([(image.key, min(i.key for i in clique), image.split, True) for image in clique]),
            label="members",
        )
        assert_that(result["groups"] | beam.Map(lambda g: g.flags), equal_to([("oversized",)]), label="flags")
        _stats(
            result, {"oversized_groups": 1, "images_in_oversized_groups": 5, "split_changes": 0, "dropped": 0}
        )


@pytest.mark.parametrize("with_run_id", [False, True])
def test_stats_is_one_element_of_zeros_when_there_is_no_image(with_run_id):
    """With the run id (stage 1's way) the stats' combine has no default: the run id's element stands in."""
    with TestPipeline() as pipeline:
        run_id = pipeline | "RunId" >> beam.Create(["run"]) if with_run_id else None
        result = pipeline | beam.Create([]) | FindNearDuplicateGroups(4, run_id=run_id)
        assert_that(result["stats"], equal_to([dict.fromkeys(STATS_KEYS, 0)]))
        assert_that(result["members"], equal_to([]), label="no members")


def test_no_stage_of_the_grouping_only_copies_a_flatten_and_its_stats_have_no_default_step():
    """Each fused stage costs up to about 0.1 CPU s per job in worker processes (benchmarks/RESULTS.md, issue 30's
    tenth pass). A Flatten whose inputs come from several stages is a stage of its own in the local runner,
    a copy: only the two joins' (a GroupByKey of several inputs) are left."""
    pipeline = beam.Pipeline()
    run_id = pipeline | "RunId" >> beam.Create(["run"])
    _ = pipeline | beam.Create([]) | "Group" >> FindNearDuplicateGroups(2, run_id=run_id)
    _, stages = fn_runner.FnApiRunner().create_stages(pipeline.to_runner_api())
    copying = (bundle_processor.DATA_INPUT_URN, bundle_processor.DATA_OUTPUT_URN)
    copies = sorted(
        stage.transforms[0].unique_name
        for stage in stages
        if all(transform.spec.urn in copying for transform in stage.transforms)
    )
    assert copies == ["Group/Components/MessagesAndEntries/Read", "Group/FollowersFlatten/Read"]
    names = [transform.unique_name for stage in stages for transform in stage.transforms]
    assert not [name for name in names if "DoOnce" in name]


def test_a_flood_of_one_signature_collapses_to_one_representative_and_is_one_group():
    flood = [_image(f"blank{i}", 12345, split=["train", "test"][i % 2]) for i in range(3000)]
    others = _clique(random.Random(9), ["o0", "o1"])
    first = min(flood, key=lambda image: image.key)
    with TestPipeline() as pipeline:
        result = (
            pipeline
            | beam.Create(flood + others)
            | FindNearDuplicateGroups(2, max_group_size=5000, max_moved_share=1)
        )
        assert_that(
            result["groups"] | beam.Map(lambda group: (group.group, len(group.members), group.split)),
            equal_to([(first.key, 3000, first.split), (min(o.key for o in others), 2, "train")]),
            label="groups",
        )
        _stats(result, {"flood_followers": 2999, "hot_buckets": 0, "groups": 2, "largest_group": 3000})


@pytest.mark.parametrize("seed", [11, 12])
def test_an_image_in_a_hot_bucket_is_grouped_through_its_other_buckets_whatever_the_order(seed):
    rng = random.Random(7)
    masks = band_masks(4)
    shared = rng.getrandbits(BITS)
    band0 = sum(1 << position for position in masks[0])

    def sharing_band0(value):
        return (value & ~band0) | (shared & band0)

    crowd = [_image(f"crowd{i}", sharing_band0(rng.getrandbits(BITS))) for i in range(150)]
    base = sharing_band0(rng.getrandbits(BITS))
    pair = [_image("a", base), _image("b", _flip(base, [masks[1][0]]))]
    planted = [image for g in range(20) for image in _clique(rng, [f"g{g}-{i}" for i in range(3)])]
    images = crowd + pair + planted
    model = _model(images, max_distance=2)
    assert _key("a") in model  # the pair is a group when every pair is compared
    shuffled = list(images)
    random.Random(seed).shuffle(shuffled)
    with TestPipeline() as pipeline:
        result = (
            pipeline
            | beam.Create(shuffled)
            | beam.Reshuffle()  # spreads the images over bundles, in another order per run
            | FindNearDuplicateGroups(2, max_bucket_size=100)
        )
        assert_that(_member_rows(result), equal_to(_rows(images, model)), label="members")
        _stats(result, {"hot_buckets": 1, "hot_bucket_entries": 152, "images_not_converged": 0})


def test_bands_interleave_the_bits_and_guarantee_pairs_within_bands_minus_one_bits():
    masks = band_masks(4, 64)
    assert masks[0][:3] == [0, 4, 8] and masks[3][-1] == 63 and [len(m) for m in masks] == [16] * 4
    assert [len(m) for m in band_masks(5, 64)] == [13, 13, 13, 13, 12]
    assert band_value(0b10001, masks[0]) == 0b11
    assert all(band_detection_probability(d, 4) == 1.0 for d in range(4))
    assert 0.0 < band_detection_probability(4, 4) < 1.0
    # Monte Carlo agrees with the formula beyond the guarantee.
    rng = random.Random(8)
    found = 0
    for _ in range(4000):
        differing = rng.sample(range(64), 8)
        found += any(all(bit % 4 != band for bit in differing) for band in range(4))
    assert abs(found / 4000 - band_detection_probability(8, 4)) < 0.03
    with pytest.raises(ValueError, match="bands must be between 1 and 64"):
        band_masks(65, 64)


def test_the_band_tables_give_band_value_of_every_band():
    # The Bands step's tables (8 look-ups per hash) against the plain bit-by-bit band_value, for every band
    # count the grouping takes and for signatures narrower than 64 bits (bits past the masks in no band).
    rng = random.Random(12)
    values = [rng.getrandbits(64) for _ in range(300)] + [0, (1 << 64) - 1]
    for bands, bits in [(1, 64), (3, 64), (4, 64), (5, 64), (16, 64), (64, 64), (4, 40), (3, 12)]:
        masks = band_masks(bands, bits)
        tables = _BandTables(masks)
        assert [tables.values(value) for value in values] == [
            [band_value(value, positions) for positions in masks] for value in values
        ], (bands, bits)


def _verify(points, max_bucket_size):
    verify = VerifyBucketFn(2, max_bucket_size)
    verify.start_bundle()
    entries = iter([(key, signature_bytes(_signature(grey))) for key, grey in points])  # read once only
    return list(verify.process((0, entries)))


def test_a_bucket_is_read_once():
    # A bucket's entries as a one-shot iterator: what is verified, and a hot bucket's count, come from one
    # pass (a second pass over such an iterable saw nothing: no edges, and a hot bucket's count short).
    near_pair = [(_key("a"), 0b1), (_key("b"), 0b11), (_key("c"), 0xFFFF << 40)]
    edges = [output for output in _verify(near_pair, 10) if not hasattr(output, "tag")]
    assert edges == [(max(_key("a"), _key("b")), min(_key("a"), _key("b")))]
    hot = _verify([(_key(index), index) for index in range(25)], 10)
    assert sorted(output.value for output in hot) == [("hot_bucket_entries", 25), ("hot_buckets", 1)]


def test_past_the_share_of_moves_allowed_no_member_moves_and_none_is_dropped():
    rng = random.Random(10)
    pairs = [
        _with(_clique(rng, [f"m{i}a", f"m{i}b"]), split=split)
        for i, split in enumerate(["train", "test"] * 3)
    ]
    # Each pair's members in two splits: one of each pair would move, 6 of 32 images.
    pairs = [[pair[0], SignedImage(**{**vars(pair[1]), "split": "validation"})] for pair in pairs]
    images = [image for pair in pairs for image in pair]
    images += [_image(f"lone{i}", rng.getrandbits(BITS)) for i in range(20)]
    with TestPipeline() as pipeline:
        created = pipeline | beam.Create(images)
        withheld = created | "Tight" >> FindNearDuplicateGroups(2, drop=True, max_moved_share=0.1)
        allowed = created | "Loose" >> FindNearDuplicateGroups(2, drop=True, max_moved_share=0.25)
        assert_that(
            _member_rows(withheld, "withheld"),
            equal_to(
                [(image.key, min(i.key for i in pair), image.split, True) for pair in pairs for image in pair]
            ),
            label="withheld members",
        )
        assert_that(
            withheld["groups"] | beam.Map(lambda group: len({m.split for m in group.members})),
            equal_to([2] * 6),
            label="withheld groups",
        )
        assert_that(
            withheld["stats"]
            | beam.Map(
                lambda s: (
                    s["images"],
                    s["would_move"],
                    s["changes_withheld"],
                    s["split_changes"],
                    s["dropped"],
                )
            ),
            equal_to([(32, 6, 1, 0, 0)]),
            label="withheld stats",
        )
        # The split sizes and vocabulary stage 1 writes with: unchanged when withheld, less the dropped ones.
        before = collections.Counter((image.split, image.label) for image in images)
        dropped = collections.Counter((max(p, key=lambda i: i.key).split, "cat") for p in pairs)
        assert_that(withheld["split_counts"], equal_to([dict(before)]), label="withheld counts")
        assert_that(allowed["split_counts"], equal_to([dict(before - dropped)]), label="allowed counts")
        assert_that(
            allowed["stats"]
            | beam.Map(lambda s: (s["would_move"], s["changes_withheld"], s["split_changes"], s["dropped"])),
            # Drop mode keeps the smallest key (nothing else differs), whose split is the group's: no move.
            equal_to([(6, 0, 0, 6)]),
            label="allowed stats",
        )
