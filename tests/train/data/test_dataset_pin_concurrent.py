"""Training reads run A of a dataset while a re-run of stage 1 publishes run B into the same directory.

Real processes: a `python -m train` subprocess trains on run A (a copy of the
session's `stage1_dataset("uint8")`, 5 classes); once it has run a few steps,
the real stage 1 job publishes run B (the same corpus without one class: 4
labels) into that directory, with a retention period for A's files. The
training process is stopped (SIGSTOP) while stage 1 runs, so that most of its
reading, every shard re-opened, comes after the switch. Then it must finish
on A, and each resume in its model dir must either keep A (while A's files
are there) or stop with a message naming both runs (once they are gone);
never train on a mix of the two.
"""

import hashlib
import json
import shutil
import signal
import subprocess

import pytest

from dataset_contract import manifest as manifest_lib
from tests.stage1 import run_stage1
from tests.train.conftest import IMAGE_SIZE, MIN_SHARDS, SPLIT
from tests.train.loop.test_preemption import ENV, RunningTraining, train_command

# train_command trains EPOCHS x STEPS_PER_EPOCH steps; a resume with more epochs trains on.
DROPPED_CLASS = "star"
SETUP_ERROR_EXIT_CODE = 2  # train/__main__.py: a problem the user can fix, printed without a traceback


def metrics_of(model_dir) -> dict:
    return json.loads((model_dir / "metrics.json").read_text())


def resume_with_epochs(data_dir, model_dir, epochs: int) -> subprocess.CompletedProcess:
    command = train_command(str(data_dir), model_dir)
    command[command.index("--epochs") + 1] = str(epochs)
    return subprocess.run(command, cwd=model_dir.parent, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_training_on_run_a_finishes_on_a_while_stage1_publishes_run_b_and_resumes_never_mix_them(
    stage1_dataset, sample_corpus, tmp_path
):
    data_dir = tmp_path / "dataset"
    shutil.copytree(stage1_dataset("uint8"), data_dir)
    manifest_a = (data_dir / manifest_lib.MANIFEST_FILE).read_bytes()
    run_a = json.loads(manifest_a)["run"]["id"]
    labels_a = json.loads(manifest_a)["labels"]
    corpus_b = tmp_path / "corpus_b"
    shutil.copytree(sample_corpus.root, corpus_b)
    shutil.rmtree(corpus_b / DROPPED_CLASS)
    model_dir = tmp_path / "model"

    training = RunningTraining(
        train_command(str(data_dir), model_dir, "--checkpoint-every", "epoch"), tmp_path
    )
    training.wait_for_step(2)
    training.process.send_signal(signal.SIGSTOP)
    try:
        manifest_b = run_stage1(
            corpus_b,
            data_dir,
            "--split",
            SPLIT,
            "--retention-days",
            "7",
            image_size=IMAGE_SIZE,
            encoding="uint8",
            min_shards=MIN_SHARDS,
        )
    finally:
        training.process.send_signal(signal.SIGCONT)
    run_b = manifest_b["run"]["id"]
    assert run_b != run_a and len(manifest_b["labels"]) == len(labels_a) - 1
    assert json.loads((data_dir / manifest_lib.MANIFEST_FILE).read_text())["run"]["id"] == run_b
    code, stderr = training.finish()

    # The running training finished on A (A's labels).
    assert code == 0, stderr[-3000:]
    first = metrics_of(model_dir)
    assert len(first["validation"]["confusion_matrix"]) == len(labels_a)

    # A resume while A's files are retained keeps reading A. (The same command: the run is finished, so it
    # trains nothing and evaluates its final weights again; a longer plan is refused, train/loop/resume_check.py.)
    resumed = resume_with_epochs(data_dir, model_dir, first["epochs"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = metrics_of(model_dir)
    assert second["resumed_from_step"] == first["global_step"] == second["global_step"]
    assert len(second["validation"]["confusion_matrix"]) == len(labels_a)

    # Once A's files are gone (its retention period over), a resume stops and says why; it does not take B.
    shutil.rmtree(data_dir / manifest_lib.RUNS_DIR / run_a)
    stopped = resume_with_epochs(data_dir, model_dir, first["epochs"])
    assert stopped.returncode == SETUP_ERROR_EXIT_CODE, stopped.stderr[-3000:]
    assert f"run {run_a}" in stopped.stderr and f"run {run_b}" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert metrics_of(model_dir) == second

    # Both runs recorded the manifest they read: A's, byte for byte.
    for metrics in (first, second):
        assert metrics["dataset"]["run_id"] == run_a
        assert metrics["dataset"]["manifest_sha256"] == hashlib.sha256(manifest_a).hexdigest()


@pytest.mark.slow
def test_training_whose_run_is_removed_while_it_reads_it_stops_with_a_message_naming_the_run(
    stage1_dataset, tmp_path
):
    data_dir = tmp_path / "dataset"
    shutil.copytree(stage1_dataset("uint8"), data_dir)
    run_a = json.loads((data_dir / manifest_lib.MANIFEST_FILE).read_text())["run"]["id"]
    model_dir = tmp_path / "model"

    training = RunningTraining(
        train_command(str(data_dir), model_dir, "--checkpoint-every", "epoch"), tmp_path
    )
    training.wait_for_step(2)
    # What a cleanup does to a superseded run past its retention period (or a person, by hand).
    shutil.rmtree(data_dir / manifest_lib.RUNS_DIR / run_a)
    code, stderr = training.finish()

    assert code == SETUP_ERROR_EXIT_CODE, stderr[-3000:]
    assert f"the files of dataset run {run_a} vanished from {data_dir}" in stderr
    assert "Traceback" not in stderr
