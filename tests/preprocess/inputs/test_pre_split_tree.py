"""A pre-split tree (ROOT/train/<class>/..., ROOT/val/<class>/..., ROOT/test/<class>/...), as many public
datasets ship and TFDS' ImageFolder reads: its folders name the splits of the inner classes, through stage
1, training and `train.evaluate`, as real processes; a tree mixing split and class folders is refused."""

import hashlib
import json
import os
import shutil

import pytest
from PIL import Image

from tests.stage1 import write_corpus
from tests.user_mistakes import assert_refused, run_command, write_image

# The split of the i-th image of a class, by folder: most in train, some in val and test.
_FOLDERS = ("train", "train", "val", "test")
FOLDER_SPLIT = {"train": "train", "val": "validation", "test": "test"}


def _pre_split_tree(base):
    """ROOT/<train|val|test>/<class>/... from the shape corpus (exact duplicates left out, so that each
    folder's count is what its split must hold), with an altered copy of a train image under val/."""
    corpus = base / "corpus"
    write_corpus(corpus, images_per_class=12, include_broken=False)
    root, counts, seen = base / "photos", {}, set()
    for class_name in sorted(os.listdir(corpus)):
        for index, name in enumerate(sorted(os.listdir(corpus / class_name))):
            digest = hashlib.sha256((corpus / class_name / name).read_bytes()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            folder = _FOLDERS[index % len(_FOLDERS)]
            (root / folder / class_name).mkdir(parents=True, exist_ok=True)
            shutil.copy(corpus / class_name / name, root / folder / class_name / name)
            counts[(folder, class_name)] = counts.get((folder, class_name), 0) + 1
    # The near-duplicate audit would put this copy in its original's split; the folder says validation.
    first_cat = sorted(os.listdir(root / "train" / "circle"))[0]
    original = Image.open(root / "train" / "circle" / first_cat).convert("RGB")
    original.resize((original.width * 3 // 4, original.height * 3 // 4)).save(
        root / "val" / "circle" / "copy_of_train.jpg", quality=80
    )
    counts[("val", "circle")] += 1
    return root, counts


@pytest.fixture(scope="module")
def pre_split_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("pre_split")
    root, counts = _pre_split_tree(base)
    dataset, model = base / "dataset", base / "model"
    stage1 = run_command(
        "preprocess",
        ["--input", root, "--output", dataset, "--image-size", "32", "--min-shards", "1"],
        base,
    )
    assert stage1.returncode == 0, stage1.stdout[-3000:] + stage1.stderr[-3000:]
    training = run_command(
        "train",
        ["--data", dataset, "--model-dir", model, "--steps", "3", "--global-batch-size", "8"],
        base,
    )
    assert training.returncode == 0, training.stdout[-3000:] + training.stderr[-3000:]
    return counts, dataset, model, base, stage1


def test_the_split_folders_name_the_splits_of_the_inner_classes(pre_split_run):
    counts, dataset, _, _, stage1 = pre_split_run
    manifest = json.loads((dataset / "dataset.json").read_text())
    classes = sorted({class_name for _, class_name in counts})
    assert manifest["labels"] == classes  # not ["test", "train", "val"]
    for folder, split in FOLDER_SPLIT.items():
        expected = {name: counts.get((folder, name), 0) for name in classes}
        got = manifest["splits"][split]["num_examples_per_class"]
        # Every image in its folder's split: over the content rule (--split 0.8,0.1,0.1) and over the
        # near-duplicate audit (the altered copy of a train image stays in validation).
        assert {name: got.get(name, 0) for name in classes} == expected, (split, stage1.stderr[-2000:])
    assert manifest["inputs"]["num_written"] == sum(counts.values())
    assert "1 group across splits" in stage1.stdout  # the audit saw the copy, and left it where it was


def test_training_and_evaluate_read_the_folders_splits(pre_split_run):
    counts, _, model, base, _ = pre_split_run
    result = run_command("train.evaluate", ["--model-dir", model, "--split", "test", "--json"], base)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["num_examples"] == sum(count for (folder, _), count in counts.items() if folder == "test")
    assert report["labels"] == sorted({class_name for _, class_name in counts})


def test_a_tree_mixing_split_folders_and_class_folders_is_refused_with_what_to_do(tmp_path):
    root = tmp_path / "photos"
    for index in range(3):
        write_image(root / "train" / "cat" / f"{index}.jpg", index)
        write_image(root / "train" / "dog" / f"{index}.jpg", 10 + index)
        write_image(root / "bird" / f"{index}.jpg", 20 + index)
    result = run_command("preprocess", ["--input", root, "--output", tmp_path / "out"], tmp_path)
    assert_refused(result, "mix split folders (train) and other folders (bird)", "move the class folders")
    assert not (tmp_path / "out").exists()
