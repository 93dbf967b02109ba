"""Incremental versions (issue 32), on real Beam runs: version 1 of a tiny corpus, then version 2 with images
added, removed, relabelled, an exact copy and an altered copy of published train images; then the
same inputs again with --rebuild, the full recompute that version 2 must equal."""

import os
import shutil

import numpy as np
import pytest
from PIL import Image

from tests.stage1 import read_split, run_stage1, write_corpus

IMAGE_SIZE = 24


def _images(root):
    return sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".png")
    )


def _by_uri(rows):
    return {row["uri"]: row for row in rows}


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """(manifest 1, manifest 2, manifest of the full rebuild of version 2's inputs, what changed, dirs)."""
    base = tmp_path_factory.mktemp("incremental")
    corpus, output, rebuilt = base / "corpus", base / "dataset", base / "rebuilt"
    write_corpus(corpus, images_per_class=6, include_broken=False)
    first = run_stage1(corpus, output, image_size=IMAGE_SIZE, encoding="uint8")
    train_v1 = _by_uri(read_split(output, "train", first))
    classes = sorted(os.listdir(corpus))
    images = _images(corpus)
    removed = images[:2]
    for path in removed:
        os.remove(path)
    # Relabelled: the same bytes moved to another class's folder.
    relabel_source = images[2]
    relabelled = os.path.join(corpus, next(c for c in classes if c not in relabel_source), "relabelled.png")
    shutil.move(relabel_source, relabelled)
    # New images: fresh noise, one per class.
    rng = np.random.default_rng(7)
    added = []
    for name in classes:
        path = os.path.join(corpus, name, "added.png")
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(path)
        added.append(path)
    # An exact copy and an altered copy (brightened) of a published train image.
    original = next(uri for uri in sorted(train_v1) if os.path.exists(uri))
    exact_copy = os.path.join(os.path.dirname(original), "exact-copy.png")
    shutil.copyfile(original, exact_copy)
    with Image.open(original) as image:
        brighter = Image.eval(image.convert("RGB"), lambda value: min(255, value + 12))
    altered_copy = os.path.join(os.path.dirname(original), "altered-copy.png")
    brighter.save(altered_copy)
    second = run_stage1(corpus, output, image_size=IMAGE_SIZE, encoding="uint8")
    full = run_stage1(corpus, rebuilt, image_size=IMAGE_SIZE, encoding="uint8")
    changes = {
        "removed": removed,
        "relabelled": relabelled,
        "added": added,
        "original": original,
        "exact_copy": exact_copy,
        "altered_copy": altered_copy,
    }
    return first, second, full, changes, output, rebuilt


def test_version_2_decodes_only_new_and_changed_inputs(versions):
    first, second, _, changes, _, _ = versions
    inputs = second["inputs"]
    # Decoded: the added images, the relabelled one, the altered copy. The exact copy of a published image
    # is a duplicate; every other input is carried over.
    assert inputs["num_decoded"] == len(changes["added"]) + 2
    assert inputs["num_reused"] == first["inputs"]["num_written"] - len(changes["removed"]) - 1
    assert inputs["num_written"] == inputs["num_reused"] + inputs["num_decoded"] - inputs["num_failed"]
    assert inputs["num_found"] == (
        inputs["num_written"]
        + inputs["num_failed"]
        + inputs["num_duplicates"]
        + inputs["num_near_duplicates"]
    )
    assert second["run"]["built_from"] == first["run"]["id"]
    assert second["run"]["full_rebuild"] is None
    assert first["inputs"]["num_reused"] == 0


def test_version_2_holds_the_same_records_as_a_full_rebuild(versions):
    _, second, full, changes, output, rebuilt = versions
    for split in ("train", "validation", "test"):
        incremental = {row["sha256"]: row for row in read_split(output, split, second)}
        recomputed = {row["sha256"]: row for row in read_split(rebuilt, split, full)}
        assert sorted(incremental) == sorted(recomputed), split
        for sha256, row in incremental.items():
            assert row["class_name"] == recomputed[sha256]["class_name"]
            assert row["label"] == recomputed[sha256]["label"]
            assert row["uri"] == recomputed[sha256]["uri"]
            np.testing.assert_array_equal(row["image"], recomputed[sha256]["image"])
    uris = {
        row["uri"] for split in ("train", "validation", "test") for row in read_split(output, split, second)
    }
    assert not set(changes["removed"]) & uris
    assert changes["relabelled"] in uris and set(changes["added"]) <= uris


def test_statistics_equal_a_full_recompute(versions):
    _, second, full, _, _, _ = versions
    for key in ("mean", "std"):
        np.testing.assert_allclose(second["normalization"][key], full["normalization"][key], rtol=1e-6)
    assert second["labels"] == full["labels"]


def test_no_published_image_moves(versions):
    first, second, _, _, output, _ = versions
    splits_v1 = {}
    for split in ("train", "validation", "test"):
        for row in read_split(output, split, first):
            splits_v1[row["sha256"]] = split
    for split in ("train", "validation", "test"):
        for row in read_split(output, split, second):
            if row["sha256"] in splits_v1:
                assert splits_v1[row["sha256"]] == split, row["uri"]
    assert second["inputs"]["num_moved_by_named_split"] == 0


def test_a_change_of_image_size_is_a_full_rebuild_said_in_one_line(versions, capsys):
    _, second, _, _, output, _ = versions
    capsys.readouterr()
    manifest = run_stage1(output.parent / "corpus", output, image_size=IMAGE_SIZE + 8, encoding="uint8")
    said = [line for line in capsys.readouterr().out.splitlines() if "full rebuild" in line]
    assert said == [
        f"preprocess: full rebuild, every input decoded again: --image-size (the stored square) is "
        f"{IMAGE_SIZE + 8}, the published version's is {IMAGE_SIZE}"
    ]
    assert manifest["inputs"]["num_reused"] == 0
    assert manifest["run"]["built_from"] == second["run"]["id"]
    assert manifest["run"]["full_rebuild"].startswith("--image-size")
