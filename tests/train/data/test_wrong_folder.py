"""A dataset command pointed at the wrong folder says which folder it meant: a workflow's workdir (its
dataset is WORKDIR/dataset), or a folder of images (stage 1 has not run on it). Real processes, real
folders: the workdir holds a dataset stage 1 wrote."""

import shutil

import pytest

import train
from tests.user_mistakes import assert_refused, run_command, write_image
from train.errors import DatasetError


@pytest.fixture(scope="module")
def workdir(stage1_dataset, tmp_path_factory):
    base = tmp_path_factory.mktemp("workdir")
    shutil.copytree(stage1_dataset("uint8"), base / "dataset")
    return base


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    for index in range(2):
        write_image(root / "cat" / f"{index}.jpg", index)
        write_image(root / "dog" / f"{index}.png", 10 + index)
    return root


def test_train_pointed_at_a_workdir_asks_for_its_dataset(workdir, tmp_path):
    result = run_command("train", ["--data", workdir, "--model-dir", tmp_path / "model"], tmp_path)
    assert_refused(result, f"{workdir}/dataset.json: not found. Did you mean {workdir}/dataset?")
    assert not (tmp_path / "model").exists()


def test_verify_pointed_at_a_workdir_asks_for_its_dataset(workdir, tmp_path):
    result = run_command("preprocess.verify", [workdir], tmp_path)
    assert_refused(result, f"Did you mean {workdir}/dataset?")


def test_inspect_pointed_at_images_says_to_run_stage_1_first(images, tmp_path):
    result = run_command("preprocess.inspect", [images], tmp_path)
    assert_refused(
        result, f"{images} holds images, not a dataset: run `python -m preprocess --input {images} --output"
    )


def test_load_dataset_on_images_says_to_run_stage_1_first(images):
    with pytest.raises(DatasetError, match="holds images, not a dataset: run `python -m preprocess"):
        train.load_dataset(str(images), "validation")


def test_a_folder_that_does_not_exist_is_named_as_such(tmp_path):
    with pytest.raises(DatasetError, match=f"{tmp_path}/nowhere does not exist"):
        train.load_dataset(str(tmp_path / "nowhere"), "validation")
