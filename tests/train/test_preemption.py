"""Preemption: a run killed with SIGKILL resumes from its last checkpoint and stops at the plan."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPOCHS = 3
STEPS_PER_EPOCH = 40  # long enough (a few seconds per epoch) to kill the run between two checkpoints


def checkpoint_numbers(model_dir) -> list[int]:
    state = tf.train.get_checkpoint_state(str(model_dir / "checkpoints"))
    return sorted(int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths) if state else []


@pytest.mark.slow
def test_killed_run_resumes_at_the_next_epoch_and_stops_at_the_planned_one(stage1_dataset, tmp_path):
    model_dir = tmp_path / "model"
    command = [
        sys.executable, "-m", "train",
        "--data", stage1_dataset("uint8"),
        "--model-dir", str(model_dir),
        "--epochs", str(EPOCHS),
        "--steps-per-epoch", str(STEPS_PER_EPOCH),
        "--global-batch-size", "8",
        "--steps-per-execution", "4",  # several steps per call must not overshoot the plan either
        "--no-export",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}

    first = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    index = (
        model_dir / "checkpoints" / "checkpoint"
    )  # written (atomically) once the first checkpoint is complete
    deadline = time.monotonic() + 300
    while not index.exists():
        assert first.poll() is None, (
            "the run ended before its first checkpoint: " + first.stderr.read().decode()[-2000:]
        )
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    done_when_killed = max(checkpoint_numbers(model_dir))
    assert 1 <= done_when_killed < EPOCHS, "the kill must land between the first and the last epoch"
    assert not (model_dir / "metrics.json").exists()

    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{done_when_killed} of {EPOCHS} epochs already done" in second.stderr
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["initial_epoch"] == done_when_killed  # resumed, not restarted
    assert metrics["epochs_this_run"] == EPOCHS - done_when_killed
    # The optimizer's step counter came back with the checkpoint and ends exactly at the plan.
    assert metrics["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert max(checkpoint_numbers(model_dir)) == EPOCHS

    # The same command once more: nothing left to train, so it trains nothing.
    third = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert (metrics["initial_epoch"], metrics["epochs_this_run"]) == (EPOCHS, 0)
    assert metrics["global_step"] == EPOCHS * STEPS_PER_EPOCH
