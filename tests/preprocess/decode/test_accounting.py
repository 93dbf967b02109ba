"""The counts stage 1 gathers in one combine each: what became of the inputs, and what the unique ones are."""

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from preprocess import errors
from preprocess.decode import outcomes
from preprocess.inputs.content import UniqueInput
from preprocess.inputs.rules import SkippedFile
from preprocess.pipeline import SummarizeUniqueInputsFn, estimated_split_bytes


def _failure(reason: str) -> errors.ErrorRecord:
    return errors.ErrorRecord(uri="/x.jpg", reason=reason, detail="")


def test_every_outcome_counted_in_one_combine_becomes_the_manifests_figures():
    events = (
        [outcomes.FOUND] * 8
        + [outcomes.DUPLICATE] * 2
        # A near-duplicate left out by --near-duplicates drop: counted apart from the exact copies.
        + [outcomes.NEAR_DUPLICATE]
        # An incremental run: unique inputs decoded, and carried over without decoding (preprocess/reuse/).
        + [outcomes.DECODED] * 3
        + [outcomes.REUSED] * 2
        + [outcomes.failed(_failure("not_an_image")), outcomes.failed(_failure("not_an_image"))]
        + [outcomes.failed(_failure("too_many_pixels"))]
        + [
            outcomes.written("train", "cat"),
            outcomes.written("train", "cat"),
            outcomes.written("test", "dog"),
        ]
        # A tree's files that are not inputs: counted apart, not in num_found.
        + [outcomes.skipped(SkippedFile("/r/cat/meta.json", ".json"))] * 2
        + [
            outcomes.skipped(SkippedFile("/r/cat/README", "")),
            outcomes.skipped(SkippedFile("/r/a.jpg", ".jpg", True)),
        ]
    )
    with TestPipeline() as pipeline:
        tallied = (
            pipeline
            | beam.Create(events)
            | beam.combiners.Count.PerElement()
            | beam.combiners.ToList()
            | beam.Map(outcomes.tally)
            | beam.Map(lambda tally: {**tally, "class_counts": sorted(tally["class_counts"])})
        )
        assert_that(
            tallied,
            equal_to(
                [
                    {
                        "num_found": 8,
                        "num_duplicates": 2,
                        "num_near_duplicates": 1,
                        "num_decoded": 3,
                        "num_reused": 2,
                        "failures": {"not_an_image": 2, "too_many_pixels": 1},
                        "class_counts": [(("test", "dog"), 1), (("train", "cat"), 2)],
                        "skipped_by_extension": {".json": 2, "": 1},
                        "skipped_at_root": 1,
                    }
                ]
            ),
        )


def test_an_outcome_nothing_had_counts_zero():
    assert outcomes.tally([]) == {
        "num_found": 0,
        "num_duplicates": 0,
        "num_near_duplicates": 0,
        "num_decoded": 0,
        "num_reused": 0,
        "failures": {},
        "class_counts": [],
        "skipped_by_extension": {},
        "skipped_at_root": 0,
    }


def test_an_unknown_outcome_is_refused_not_dropped():
    with pytest.raises(ValueError, match="unknown outcome"):
        outcomes.tally([(("lost",), 1)])


def _assert_summary(items, expected):
    with TestPipeline() as pipeline:
        summary = pipeline | beam.Create(items) | beam.CombineGlobally(SummarizeUniqueInputsFn())
        assert_that(summary, equal_to([expected]))


def test_the_vocabulary_is_the_sorted_train_classes_and_the_split_sizes_count_every_split():
    items = [
        UniqueInput(uri=f"/{i}.jpg", label=label, split=split)
        for i, (label, split) in enumerate(
            [("zebra", "train"), ("ant", "train"), ("ant", "train"), ("cow", "validation"), ("ant", "test")]
        )
    ]
    expected = {"labels": ["ant", "zebra"], "per_split": {"train": 3, "validation": 1, "test": 1}}
    _assert_summary(items, expected)
    # As the runner does it over several bundles: partial accumulators, merged.
    combine = SummarizeUniqueInputsFn()
    halves = [combine.create_accumulator(), combine.create_accumulator()]
    for index, item in enumerate(items):
        combine.add_input(halves[index % 2], item)
    assert combine.extract_output(combine.merge_accumulators(halves)) == expected


def test_no_unique_input_gives_an_empty_vocabulary_and_zero_sized_splits():
    empty = {"labels": [], "per_split": {}}
    _assert_summary([], empty)
    assert estimated_split_bytes(empty, record_bytes=1000) == {"train": 0, "validation": 0, "test": 0}
    assert estimated_split_bytes({"labels": [], "per_split": {"train": 3}}, 1000)["train"] == 3000
