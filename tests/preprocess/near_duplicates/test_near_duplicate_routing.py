"""The near-duplicate audit's own steps: the spill with locators, the routing by part, the counts, the sizes."""

import os

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from preprocess.decode.source_sizes import SourceImageSizesFn, longest_side_bin
from preprocess.near_duplicates import routing, split_counts
from preprocess.near_duplicates.grouping import GroupMember, SignedImage


def _example(index: int, split: str = "train", label: str = "cat") -> dict:
    return {
        "image_raw": bytes([index % 256]) * 12,
        "label": label,
        "sha256": f"{index:064x}",
        "uri": f"/corpus/{label}/{index}.jpg",
        "split": split,
        "key": f"{index:064x}",
        "moments": bytes(48),
        "source_width": 40 + index,
        "source_height": 30,
        "signature": index,
        "num_bytes": 1000 + index,
        "split_given": False,
        "input": "{}",
    }


def _spill(examples, output_dir, run_id="run", part_bytes=routing.DEFAULT_PART_BYTES):
    """Runs SpillDecodedFn as one bundle: (SignedImages, committed part paths)."""
    spill = routing.SpillDecodedFn(str(output_dir), part_bytes=part_bytes)
    spill.start_bundle()
    signed, parts = [], []
    for example in examples:
        for output in spill.process(example, run_id):
            (parts if isinstance(output, beam.pvalue.TaggedOutput) else signed).append(output)
    parts = [output.value for output in parts]
    parts += [output.value.value for output in spill.finish_bundle()]
    return signed, parts


def test_each_spilled_row_is_found_at_its_locator_with_its_example(tmp_path):
    examples = [_example(index) for index in range(70)]
    signed, parts = _spill(examples, tmp_path)
    assert len(parts) == 1 and os.path.exists(parts[0]) and "/staging/run/decoded/near-" in parts[0]
    rows = dict(routing.read_part(parts[0]))
    for image, example in zip(signed, examples, strict=True):
        path, row = image.locator
        assert path == parts[0]
        # The signature is kept as text (the ledger's, preprocess/reuse/).
        assert rows[row] == {
            name: str(example[name]) if name == "signature" else example[name]
            for name in routing.PART_SCHEMA.names
        }
        assert (image.key, image.signature, image.source_pixels, image.num_bytes) == (
            example["sha256"],
            example["signature"],
            example["source_width"] * 30,
            example["num_bytes"],
        )


def test_a_part_rolls_over_and_the_locators_follow(tmp_path):
    signed, parts = _spill([_example(index) for index in range(100)], tmp_path, part_bytes=1)
    assert len(parts) == 4  # a part per batch of 32 rows, and the remainder
    assert {image.locator[0] for image in signed} == set(parts)
    for image in signed:
        assert dict(routing.read_part(image.locator[0]))[image.locator[1]]["sha256"] == image.key


def test_a_failed_bundle_commits_no_part(tmp_path):
    spill = routing.SpillDecodedFn(str(tmp_path))
    spill.start_bundle()
    list(spill.process(_example(1), "run"))
    spill.start_bundle()  # the runner retries the bundle on this instance: the first attempt's part goes
    assert not [name for _, _, names in os.walk(tmp_path) for name in names if name.endswith(".arrow")]


def _member(image: SignedImage, split: str, kept: bool = True) -> GroupMember:
    return GroupMember(image=image, group=image.key, split=split, kept=kept)


def test_each_part_is_routed_with_its_overrides(tmp_path):
    examples = [_example(index) for index in range(5)]
    signed, (part,) = _spill(examples, tmp_path)
    members = [
        _member(signed[1], "validation"),  # moved
        _member(signed[2], "train", kept=False),  # dropped
        _member(signed[3], "train"),  # unchanged: no override
    ]
    overrides = [override for member in members for override in routing.override_of(member)]
    assert overrides == [(part, (1, "validation")), (part, (2, None))]
    with TestPipeline() as pipeline:
        routed = (
            {
                routing.PARTS: pipeline | "Parts" >> beam.Create([(part, None)]),
                routing.OVERRIDES: pipeline | "Overrides" >> beam.Create(overrides),
            }
            | beam.CoGroupByKey()
            | beam.ParDo(routing.RoutePartFn())
            | beam.Map(lambda example: (example["uri"], example["split"]))
        )
        assert_that(
            routed,
            equal_to(
                [
                    ("/corpus/cat/0.jpg", "train"),
                    ("/corpus/cat/1.jpg", "validation"),
                    ("/corpus/cat/3.jpg", "train"),
                    ("/corpus/cat/4.jpg", "train"),
                ]
            ),
        )


def test_overrides_for_a_part_no_attempt_committed_fail_the_step():
    with pytest.raises(ValueError, match="not a committed part"):
        list(
            routing.RoutePartFn().process(
                ("/gone.arrow", {routing.PARTS: [], routing.OVERRIDES: [(0, None)]})
            )
        )


def test_the_vocabulary_and_split_sizes_follow_the_moves_and_drops():
    images = [
        routing.signed_image(_example(0, "train", "cat"), ()),
        routing.signed_image(_example(1, "validation", "dog"), ()),
        routing.signed_image(_example(2, "train", "dog"), ()),
        routing.signed_image(_example(3, "test", "bird"), ()),
    ]
    members = [
        _member(images[1], "train"),  # dog moves into train
        _member(images[2], "train", kept=False),  # the train dog is dropped
        _member(images[3], "validation"),  # the only bird leaves test
    ]
    counts = [split_counts.image_count(image) for image in images]
    counts += [delta for member in members for delta in split_counts.member_deltas(member)]
    combine = split_counts.SplitLabelCountsFn()
    accumulator = combine.merge_accumulators(
        [combine.add_input(combine.create_accumulator(), count) for count in counts]
    )
    assert combine.extract_output(accumulator) == {
        "labels": ["cat", "dog"],
        "per_split": {"train": 2, "validation": 1, "test": 0},
    }


def test_source_image_sizes_bin_the_longest_side_in_powers_of_two():
    assert [longest_side_bin(side, 1) for side in (1, 64, 65, 8192, 8193)] == [0, 0, 1, 7, 8]
    combine = SourceImageSizesFn()
    halves = [combine.create_accumulator(), combine.create_accumulator()]
    halves[0] = combine.add_input(combine.add_input(halves[0], (640, 480)), (64, 64))
    halves[1] = combine.add_input(halves[1], (9000, 100))
    sizes = combine.extract_output(combine.merge_accumulators(halves))
    assert sizes["count"] == 3
    assert sizes["smallest"] == [64, 64] and sizes["largest"] == [9000, 100]
    assert [entry["count"] for entry in sizes["longest_side"]] == [1, 0, 0, 0, 1, 0, 0, 0, 1]
    assert sizes["longest_side"][-1]["upto"] is None
