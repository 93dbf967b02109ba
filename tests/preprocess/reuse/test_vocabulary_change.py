"""A label vocabulary that near-duplicate grouping changes after the shards to reference were picked (issue 32):
the run stops before publishing and asks for --rebuild (docs/preprocessing.md, "Re-runs"). Two real Beam runs
of a tiny corpus listed in a CSV manifest."""

import os

import pytest

from preprocess import errors
from tests.preprocess.reuse.manifest_rows import corpus_rows, near_jpeg_copy, write_manifest
from tests.stage1 import read_manifest, run_stage1, write_corpus

IMAGE_SIZE = 24
ARGS = ("--near-duplicate-max-moved", "0.5")


def _altered_copy_in_train(original, path) -> str:
    """A JPEG re-encoding of `original` written to `path`, near it by the audit's signature, whose own content
    would put it in the train split."""
    if near_jpeg_copy(original, path, IMAGE_SIZE, lambda split: split == "train"):
        return path
    raise AssertionError(f"no near-duplicate JPEG re-encoding of {original} falls in train")


def test_a_class_that_grouping_takes_out_of_train_stops_the_run_and_asks_for_rebuild(tmp_path):
    corpus, output = tmp_path / "corpus", tmp_path / "dataset"
    write_corpus(corpus, images_per_class=3, include_broken=False)
    rows = corpus_rows(corpus)
    # One class has a single train image (named), the rest of it named validation: version 1.
    label = rows[0][1]
    own = [row for row in rows if row[1] == label]
    only_train, published_validation = own[0][0], own[1][0]
    named = {only_train: "train", **{row[0]: "validation" for row in own[1:]}}
    rows = [[uri, name, named.get(uri, "")] for uri, name, _ in rows]
    write_manifest(tmp_path / "v1.csv", rows)
    first = run_stage1(
        tmp_path / "v1.csv", output, *ARGS, image_size=IMAGE_SIZE, encoding="uint8", min_shards=1
    )
    assert label in first["labels"]
    # Version 2: the class's train image is gone; a new image of the class, whose content says train, is an
    # altered copy of its published validation image, so grouping puts it in validation: the class has no
    # train image any more, which only grouping finds out.
    altered = _altered_copy_in_train(published_validation, str(tmp_path / "altered.jpg"))
    rows = [row for row in rows if row[0] != only_train] + [[altered, label, ""]]
    write_manifest(tmp_path / "v2.csv", rows)
    with pytest.raises(errors.RebuildNeededError, match="--rebuild"):
        run_stage1(tmp_path / "v2.csv", output, *ARGS, image_size=IMAGE_SIZE, encoding="uint8", min_shards=1)
    # Nothing was published: the directory still holds version 1.
    assert read_manifest(output)["run"]["id"] == first["run"]["id"]
    assert os.path.isdir(output / first["run"]["dir"])
