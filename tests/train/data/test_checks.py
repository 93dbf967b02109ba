"""Dataset and setup checks: each problem stops before the first step with a message that names it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dataset_contract import manifest as manifest_lib
from dataset_contract import verification
from tests.stage1 import published_manifest_path, remove_published_manifest, write_published_manifest
from train.config import TrainConfig
from train.data import checks, dataset
from train.device import strategy
from train.errors import DatasetError, StrategyError
from train.trainer import train_and_evaluate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def dataset_copy(stage1_dataset, tmp_path):
    """A private copy of a stage 1 dataset that a test may break."""
    copy = tmp_path / "dataset"
    shutil.copytree(stage1_dataset("uint8"), copy)
    return copy


def edit_manifest(data_dir, edit):
    manifest = json.loads(published_manifest_path(data_dir).read_text())
    edit(manifest)
    write_published_manifest(data_dir, manifest)
    return manifest


def first_shard(data_dir, split=manifest_lib.TRAIN):
    manifest = json.loads((data_dir / manifest_lib.MANIFEST_FILE).read_text())
    return data_dir / manifest["splits"][split]["shards"][0]["path"]


def assert_stops_before_training(data_dir, tmp_path, match, **config):
    model_dir = tmp_path / "model"
    with pytest.raises(DatasetError, match=match):
        train_and_evaluate(TrainConfig(data_dir=str(data_dir), model_dir=str(model_dir), **config))
    assert not model_dir.exists(), "nothing may be written before the checks pass"


def test_missing_manifest(dataset_copy, tmp_path):
    remove_published_manifest(dataset_copy)
    assert_stops_before_training(dataset_copy, tmp_path, r"dataset\.json: not found")


def test_listed_shard_that_is_absent(dataset_copy, tmp_path):
    shard = first_shard(dataset_copy)
    shard.unlink()
    assert_stops_before_training(
        dataset_copy, tmp_path, rf"{shard.name}: listed in the published dataset but absent"
    )


def test_shard_whose_size_differs_from_the_manifest(dataset_copy, tmp_path):
    shard = first_shard(dataset_copy, manifest_lib.VALIDATION)
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.truncate(size - 10)
    assert_stops_before_training(
        dataset_copy, tmp_path, rf"{shard.name}: {size - 10} bytes, but the published dataset says {size}"
    )


def test_unknown_format_version(dataset_copy, tmp_path):
    edit_manifest(dataset_copy, lambda m: m.update(format_version=99))
    assert_stops_before_training(dataset_copy, tmp_path, r"format_version 99 is not supported")


def test_model_that_cannot_take_the_image_shape(dataset_copy, tmp_path):
    edit_manifest(dataset_copy, lambda m: m["image"].update(height=16, width=16, crop_size=16))
    assert_stops_before_training(
        dataset_copy, tmp_path, r"'resnet50' needs images of at least 32x32.*16x16", model="resnet50"
    )


def test_verify_data_finds_a_shard_whose_content_changed(dataset_copy, tmp_path):
    shard = first_shard(dataset_copy)
    content = bytearray(shard.read_bytes())
    content[len(content) // 2] ^= 0xFF  # same size: only the sha256 can tell
    shard.write_bytes(bytes(content))
    manifest = checks.read_manifest(str(dataset_copy))
    checks.check_dataset(str(dataset_copy), manifest)  # the cheap checks pass
    assert_stops_before_training(
        dataset_copy, tmp_path, rf"{shard.name}: sha256 [0-9a-f]+, but", verify_data=True
    )


def test_a_stale_shard_next_to_the_listed_ones_is_never_read(dataset_copy):
    # A leftover of an earlier run with another shard count; not in the manifest.
    (dataset_copy / "train-00000-of-00032.tfrecord").write_bytes(b"not a TFRecord file")
    manifest = checks.read_manifest(str(dataset_copy))
    checks.check_dataset(str(dataset_copy), manifest)
    evaluation = dataset.make_eval_dataset(str(dataset_copy), manifest, manifest_lib.TRAIN, 8)
    seen = sum(float(weights.numpy().sum()) for _, _, weights in evaluation)
    assert seen == manifest["splits"][manifest_lib.TRAIN]["num_examples"]


def test_verify_shards_reports_every_problem_not_just_the_first(dataset_copy):
    manifest = checks.read_manifest(str(dataset_copy))
    missing = first_shard(dataset_copy, manifest_lib.TRAIN)
    grown = first_shard(dataset_copy, manifest_lib.VALIDATION)
    missing.unlink()
    with open(grown, "ab") as handle:
        handle.write(b"stale")
    problems = verification.verify_shards(str(dataset_copy), manifest, check_sha256=True)
    assert {(os.path.basename(p.path), p.kind) for p in problems} == {
        (missing.name, verification.MISSING),
        (grown.name, verification.WRONG_SIZE),
    }


def test_asking_for_a_tpu_where_there_is_none(monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    with pytest.raises(StrategyError, match="no TPU found"):
        strategy.resolve_strategy("tpu")


def test_multiworker_without_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="needs TF_CONFIG"):
        strategy.resolve_strategy("multiworker")


def run_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TPU_NAME", None)
    return subprocess.run(
        [sys.executable, "-m", "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_prints_a_dataset_error_without_traceback_and_exits_2(tmp_path):
    result = run_cli(
        "--data", str(tmp_path / "nothing"), "--model-dir", str(tmp_path / "model"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert "error: " in result.stderr and "dataset.json: not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_prints_a_missing_tpu_without_traceback_and_exits_2(stage1_dataset, tmp_path):
    result = run_cli(
        "--data",
        stage1_dataset("uint8"),
        "--model-dir",
        str(tmp_path / "model"),
        "--tpu",
        "local",
        # Local paths on a TPU need a filesystem that outlives the VM (train.config.check_paths_for_tpu).
        "--shared-filesystem",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "no TPU could be initialized for --tpu 'local'" in result.stderr
    assert "Traceback" not in result.stderr
