"""A model dir keeps the dataset run it started on (train/data/dataset_pin.py), with real stage 1 runs.

Two real runs of stage 1 in one dataset directory, as a re-run leaves them
while the superseded run's retention period lasts: run A (uint8, from the
session's `stage1_dataset("uint8")`) and run B (jpeg, `stage1_dataset("jpeg")`),
each under `runs/<its id>/`, and the newest commit of `manifests/` naming one of them. The
encoding tells in metrics.json which run a training read.
"""

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from dataset_contract import commit_log, leases
from dataset_contract import manifest as manifest_lib
from tests.train.checkpoint_files import rewind_checkpoints
from train.config import TrainConfig
from train.errors import DatasetError
from train.trainer import train_and_evaluate

# Every test here runs stage 1 twice (session-cached) and most train.
# Slow; and in the Python 3.10 leg's subset: `python -m train` crashed on 3.10 pinning a dataset (datetime.UTC).
pytestmark = [pytest.mark.slow, pytest.mark.py310]

# The files the model dir and the export hold (the README's model-directory paragraph).
PIN_FILE = "dataset_pin.json"
PINNED_MANIFEST_FILE = "dataset_pin.manifest.json"
LINEAGE_FILE = "export/assets.extra/dataset_lineage.json"


def _top_level(name: str):
    """shutil.copytree's `ignore` that leaves out the folder `name` at the top of the copied tree."""
    top = []

    def ignore(directory, names):
        if not top:
            top.append(directory)
        return [name] if directory == top[0] and name in names else []

    return ignore


class TwoRuns:
    """A dataset directory holding runs A and B of stage 1, and the manifest of each."""

    def __init__(self, root, run_a_dir, run_b_dir):
        self.root = root
        # A copy of the session's shared dataset, without the leases that other tests' jobs took on it.
        shutil.copytree(run_a_dir, root, ignore=_top_level(leases.LEASES_DIR))
        self.manifest_a = (root / manifest_lib.MANIFEST_FILE).read_bytes()
        self.manifest_b = (run_b_dir / manifest_lib.MANIFEST_FILE).read_bytes()
        self.run_a = json.loads(self.manifest_a)["run"]["id"]
        self.run_b = json.loads(self.manifest_b)["run"]["id"]
        shutil.copytree(
            run_b_dir / manifest_lib.RUNS_DIR / self.run_b, root / manifest_lib.RUNS_DIR / self.run_b
        )

    def publish_b(self):
        """What stage 1's commit does: the next commit of `manifests/` holds run B's manifest, created only
        if absent (dataset_contract/commit_log.py); then dataset.json becomes a copy of it."""
        manifests = self.root / manifest_lib.MANIFESTS_DIR
        head = commit_log.head_of(os.listdir(manifests)) if manifests.is_dir() else None
        commit = self.root / commit_log.commit_name((head[0] if head else 0) + 1)
        commit.parent.mkdir(exist_ok=True)
        temporary = self.root / "commit.new"
        temporary.write_bytes(self.manifest_b)
        os.link(temporary, commit)  # fails if the name exists: one winner per sequence
        temporary.replace(self.root / manifest_lib.MANIFEST_FILE)

    def remove_a(self):
        """What stage 1's cleanup does once run A's retention period has passed."""
        shutil.rmtree(self.root / manifest_lib.RUNS_DIR / self.run_a)


@pytest.fixture
def two_runs(stage1_dataset, tmp_path):
    return TwoRuns(tmp_path / "dataset", Path(stage1_dataset("uint8")), Path(stage1_dataset("jpeg")))


def train(data_dir, model_dir, epochs, export=False) -> dict:
    config = TrainConfig(
        data_dir=str(data_dir),
        model_dir=str(model_dir),
        epochs=epochs,
        steps_per_epoch=2,
        global_batch_size=8,
        export=export,
    )
    return train_and_evaluate(config)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_first_start_pins_the_run_and_metrics_and_the_export_name_it(two_runs, tmp_path):
    model_dir = tmp_path / "model"
    metrics = train(two_runs.root, model_dir, epochs=1, export=True)

    pin = json.loads((model_dir / PIN_FILE).read_text())
    assert pin["run_id"] == two_runs.run_a
    assert pin["manifest_sha256"] == sha256(two_runs.manifest_a)
    assert pin["data_dir"] == str(two_runs.root)
    assert (model_dir / PINNED_MANIFEST_FILE).read_bytes() == two_runs.manifest_a
    recorded = json.loads((model_dir / "metrics.json").read_text())["dataset"]
    assert recorded == metrics["dataset"] == pin
    lineage = json.loads((model_dir / LINEAGE_FILE).read_text())
    assert lineage["run_id"] == two_runs.run_a and lineage["manifest_sha256"] == pin["manifest_sha256"]
    assert lineage["created_at"] == json.loads(two_runs.manifest_a)["created_at"]


def rewind_to_first_epoch(model_dir) -> None:
    """Leave the model dir as an interruption after the first epoch would: its checkpoint the latest.

    (A resume must keep its run's plan, train/loop/resume_check.py: a finished run is not trained further.)
    """
    rewind_checkpoints(model_dir, 2)


def test_a_resume_after_another_run_is_published_keeps_training_on_the_pinned_run(two_runs, tmp_path, caplog):
    model_dir = tmp_path / "model"
    train(two_runs.root, model_dir, epochs=2)
    rewind_to_first_epoch(model_dir)
    two_runs.publish_b()

    with caplog.at_level(logging.WARNING, logger="train"):
        metrics = train(two_runs.root, model_dir, epochs=2)

    assert metrics["resumed_from_step"] == 2 and metrics["global_step"] == 4
    assert metrics["encoding"] == "uint8", "the resume read run B (jpeg)"
    assert metrics["dataset"]["run_id"] == two_runs.run_a
    assert metrics["dataset"]["manifest_sha256"] == sha256(two_runs.manifest_a)
    assert (two_runs.root / manifest_lib.MANIFEST_FILE).read_bytes() == two_runs.manifest_b
    # Not silently: the log names both runs.
    assert any(
        f"run {two_runs.run_b}" in record.getMessage() and f"run {two_runs.run_a}" in record.getMessage()
        for record in caplog.records
    )


def test_a_resume_whose_pinned_run_is_gone_stops_naming_both_runs(two_runs, tmp_path):
    model_dir = tmp_path / "model"
    train(two_runs.root, model_dir, epochs=1)
    checkpoints = sorted(path.name for path in (model_dir / "checkpoints").iterdir())
    two_runs.publish_b()
    two_runs.remove_a()

    with pytest.raises(DatasetError) as stopped:
        train(two_runs.root, model_dir, epochs=2)

    message = str(stopped.value)
    assert f"run {two_runs.run_a}" in message and f"run {two_runs.run_b}" in message
    assert "start a new --model-dir" in message and f"restore run {two_runs.run_a}'s files" in message
    assert sorted(path.name for path in (model_dir / "checkpoints").iterdir()) == checkpoints
    assert json.loads((model_dir / PIN_FILE).read_text())["run_id"] == two_runs.run_a


def test_a_gcs_model_dir_holds_the_pin_and_a_resume_reads_the_pinned_manifest_from_it(two_runs, gcs_dir):
    import tensorflow as tf

    from train.data import dataset_pin

    model_dir = f"{gcs_dir}/model"
    dataset_pin.record_pin(model_dir, dataset_pin.resolve_dataset(str(two_runs.root), model_dir))
    two_runs.publish_b()

    resumed = dataset_pin.resolve_dataset(str(two_runs.root), model_dir)

    assert resumed.recorded and resumed.run_id == two_runs.run_a
    assert resumed.manifest_bytes == two_runs.manifest_a
    with tf.io.gfile.GFile(f"{model_dir}/{PIN_FILE}", "rb") as handle:
        assert json.loads(handle.read())["manifest_sha256"] == sha256(two_runs.manifest_a)
