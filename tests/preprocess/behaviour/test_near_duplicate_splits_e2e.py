"""Splits that never move, through the real stage 1 job (DirectRunner): the same splits at every image size,
a published image keeps its split in the next version, and a manifest-named split wins for its group.
"""

import hashlib
import io
import json
import os

import pytest
from PIL import Image

from dataset_contract import manifest as manifest_lib
from preprocess.inputs.content import assign_split
from preprocess.inputs.reading import content_key
from tests.preprocess.behaviour.test_near_duplicates_e2e import (
    _group_lines,
    _split_of_uri,
    write_near_duplicate_corpus,
)
from tests.stage1 import run_stage1

pytestmark = pytest.mark.slow

FRACTIONS = {"train": 0.5, "validation": 0.25, "test": 0.25}
SPLIT = ("--split", "0.5,0.25,0.25", "--near-duplicate-max-moved", "1")


def _run(input_spec, output, size=32, *extra):
    return run_stage1(input_spec, output, *SPLIT, *extra, image_size=size, encoding="uint8", min_shards=1)


@pytest.fixture(scope="module")
def large_corpus(tmp_path_factory):
    """800x600 sources (a JPEG is decoded at 1/8 scale for 64 px and at 1/4 for 96 px: PIL's draft), and
    graded copies of some: crops of 2% to 9% per side, so that some pairs sit at the distance's edge, where
    a signature that changed with the size would group them at one size and not at the other."""
    corpus = write_near_duplicate_corpus(
        str(tmp_path_factory.mktemp("large_corpus")), seed=30, size=(800, 600)
    )
    for label in ("birds", "cats"):
        for index in (0, 1, 4):
            path = os.path.join(corpus.root, label, f"{index}.jpg")
            with Image.open(path) as original:
                image = original.convert("RGB")
            for percent in range(2, 10):
                cut_x, cut_y = image.width * percent // 100, image.height * percent // 100
                cropped = image.crop((cut_x, cut_y, image.width - cut_x, image.height - cut_y))
                cropped.save(os.path.join(corpus.root, label, f"{index}-crop{percent}.jpg"), quality=90)
    return corpus


def test_the_same_corpus_gets_the_same_groups_and_splits_at_64_and_96_px_cropped_or_padded(
    large_corpus, tmp_path
):
    at_64 = _run(large_corpus.root, tmp_path / "64", 64)
    at_96 = _run(large_corpus.root, tmp_path / "96", 96, "--resize-method", "pad")
    groups_64 = [sorted(line["uris"]) for line in _group_lines(str(tmp_path / "64"), at_64)]
    groups_96 = [sorted(line["uris"]) for line in _group_lines(str(tmp_path / "96"), at_96)]
    assert groups_64 == groups_96 and len(groups_64) >= 3
    assert _split_of_uri(str(tmp_path / "64"), at_64) == _split_of_uri(str(tmp_path / "96"), at_96)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _copy_that_would_move_the_original(original_path: str) -> bytes:
    """A re-encoded copy whose sha256 is smaller than the original's and whose own split is not train: by
    the smallest-key rule alone, the original would move to the copy's split."""
    with open(original_path, "rb") as handle:
        original = handle.read()
    image = Image.open(io.BytesIO(original)).convert("RGB")
    for quality in range(60, 100):
        for subsampling in (0, 1, 2):
            buffer = io.BytesIO()
            image.save(buffer, "JPEG", quality=quality, subsampling=subsampling)
            data = buffer.getvalue()
            key = content_key("", len(data), hashlib.md5(data).hexdigest())[0]  # noqa: S324 - the content key
            if _sha256(data) < _sha256(original) and assign_split(key, FRACTIONS) != manifest_lib.TRAIN:
                return data
    raise AssertionError(f"no copy of {original_path} would move it")


def test_new_copies_of_published_train_images_move_no_published_image(tmp_path):
    corpus = write_near_duplicate_corpus(str(tmp_path / "corpus"), seed=31)
    output = tmp_path / "dataset"
    first = _run(corpus.root, output)
    published = _split_of_uri(str(output), first)
    train = sorted(uri for uri, split in published.items() if split == manifest_lib.TRAIN)[:4]
    copies = {}
    for uri in train:
        path = os.path.join(os.path.dirname(uri), "copy-of-" + os.path.basename(uri))
        with open(path, "wb") as handle:
            handle.write(_copy_that_would_move_the_original(uri))
        copies[path] = uri
    second = _run(corpus.root, output)
    again = _split_of_uri(str(output), second)
    assert {uri: again[uri] for uri in published} == published
    assert all(again[copy] == manifest_lib.TRAIN for copy in copies)
    lines = _group_lines(str(output), second)
    for copy, original in copies.items():
        (line,) = [line for line in lines if copy in line["uris"]]
        assert original in line["uris"] and line["split"] == manifest_lib.TRAIN


def test_unnamed_members_follow_the_split_a_manifest_names_for_their_group(tmp_path):
    corpus = write_near_duplicate_corpus(str(tmp_path / "corpus"))  # every planted group is found
    named = {}
    for group in corpus.groups:
        # One member named validation, or test, the others unnamed.
        named[group[-1]] = manifest_lib.SPLITS[1 + len(named) % 2]
    rows = ["uri,label,split"]
    for label in sorted(os.listdir(corpus.root)):
        for name in sorted(os.listdir(os.path.join(corpus.root, label))):
            path = os.path.join(corpus.root, label, name)
            rows.append(f"{path},{label},{named.get(path, '')}")
    manifest_path = tmp_path / "images.csv"
    manifest_path.write_text("\n".join(rows) + "\n")
    manifest = _run(str(manifest_path), tmp_path / "dataset")
    split_of = _split_of_uri(str(tmp_path / "dataset"), manifest)
    for group in corpus.groups:
        expected = named[group[-1]]
        assert {path: split_of[path] for path in group} == dict.fromkeys(group, expected)
    assert manifest["near_duplicates"]["groups_across_splits"] == 0
    assert json.dumps(manifest["near_duplicates"])  # the counts are plain JSON
