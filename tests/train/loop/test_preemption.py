"""Preemption with real signals: `python -m train` subprocesses, SIGTERM and SIGKILL mid-epoch, then resume.

Each run prints a progress line after every step (--log-every 1): `step N/TOTAL ...`,
printed once step N is complete (and after its checkpoint, if one is due there).
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from train.loop import checkpoints
from train.loop.checkpoints import PREEMPTED_EXIT_CODE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EPOCHS = 3
STEPS_PER_EPOCH = 40
TOTAL = EPOCHS * STEPS_PER_EPOCH
STEP_LINE = re.compile(r"^step (\d+)/(\d+)")
WORKER_STEP_LINE = re.compile(r"^(?:\[[\w-]+\] )?step (\d+)/(\d+)")  # a non-chief's lines start [worker-N]


def checkpoint_steps(model_dir) -> list[int]:
    return checkpoints.checkpoint_steps(str(model_dir / "checkpoints"))


def train_command(data_dir, model_dir, *extra, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH):
    return [
        sys.executable, "-m", "train",
        "--data", data_dir,
        "--model-dir", str(model_dir),
        "--epochs", str(epochs),
        "--steps-per-epoch", str(steps_per_epoch),
        "--global-batch-size", "8",
        "--log-every", "1",
        "--no-export",
        *extra,
    ]  # fmt: skip


ENV = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}


class RunningTraining:
    """A training subprocess whose completed steps are read as they are printed."""

    def __init__(self, command, cwd, env=None):
        self.process = subprocess.Popen(
            command, cwd=cwd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.steps = []
        self.lines = []
        self._stderr = []
        # One reader per pipe, and nothing else reads them: communicate() would race the stdout reader
        # for the last lines (the step the run stopped at), and an unread stderr could fill its pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._stderr_reader = threading.Thread(target=lambda: self._stderr.append(self.process.stderr.read()))
        self._reader.start()
        self._stderr_reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)
            match = WORKER_STEP_LINE.match(line)
            if match:
                self.steps.append(int(match.group(1)))

    def wait_for_step(self, step: int, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while not self.steps or self.steps[-1] < step:
            assert self.process.poll() is None, "the run ended early: " + self.finish()[1][-3000:]
            assert time.monotonic() < deadline, f"no step {step} after {timeout} s"
            time.sleep(0.02)
        return self.steps[-1]

    def finish(self) -> tuple[int, str]:
        self.process.wait(timeout=300)
        self._reader.join(timeout=30)
        self._stderr_reader.join(timeout=30)
        return self.process.returncode, "".join(self._stderr)


def resume(command, cwd) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads((cwd / "model" / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.jax
def test_sigterm_mid_epoch_saves_the_last_completed_step_exits_143_and_resumes_there(
    stage1_dataset, tmp_path
):
    model_dir = tmp_path / "model"
    # No interval checkpoint: the only mid-epoch checkpoint can come from the signal.
    # A schedule with a known formula (no warmup, a fixed peak), to check it resumes at the right step.
    schedule = ("--learning-rate", "1e-3", "--warmup-steps", "0")
    command = train_command(stage1_dataset("uint8"), model_dir, "--checkpoint-every", "epoch", *schedule)
    run = RunningTraining(command, tmp_path)
    completed = run.wait_for_step(STEPS_PER_EPOCH + 5)  # mid-way through the second epoch
    run.process.send_signal(signal.SIGTERM)
    code, stderr = run.finish()

    assert code == PREEMPTED_EXIT_CODE, stderr[-3000:]
    # The one-line stop message (issue 33): what stopped, the checkpoint, the resume command.
    assert (
        "Traceback" not in stderr
        and "stopped by SIGTERM at step" in stderr
        and "resume with: python -m train" in stderr
    )
    saved = max(checkpoint_steps(model_dir))
    # Nothing completed is lost: the checkpoint is at or after every step done when the signal was sent,
    # and it is the last step the run completed (it stopped right there).
    assert saved >= completed
    # ... and it stopped at the next step boundary, not later (the last printed step may trail it by one:
    # seen once after the issue 13 merge, not yet explained, see the closing note of that session).
    assert saved - completed <= 2 and saved >= run.steps[-1]
    assert saved % STEPS_PER_EPOCH != 0, "the checkpoint must be mid-epoch"
    assert not (model_dir / "metrics.json").exists()

    second, metrics = resume(command, tmp_path)
    assert f"resuming from step {saved} of {TOTAL}" in second.stdout
    steps = [int(m.group(1)) for m in map(STEP_LINE.match, second.stdout.splitlines()) if m]
    assert steps[0] == saved + 1 and steps[-1] == TOTAL  # on at the next step, mid-epoch, to the plan's end
    assert metrics["resumed_from_step"] == saved
    assert metrics["global_step"] == TOTAL and metrics["steps_this_run"] == TOTAL - saved
    # The learning-rate schedule came back at the right step: cosine decay at step saved + 1.
    first_line = next(line for line in second.stdout.splitlines() if line.startswith(f"step {saved + 1}/"))
    learning_rate = float(re.search(r"learning rate ([0-9.e-]+)", first_line).group(1))
    expected = 0.5 * 1e-3 * (1 + math.cos(math.pi * (saved + 1) / TOTAL))
    assert learning_rate == pytest.approx(expected, rel=1e-2)


@pytest.mark.slow
def test_sigkill_loses_at_most_one_checkpoint_interval(stage1_dataset, tmp_path):
    model_dir = tmp_path / "model"
    interval = 5
    command = train_command(stage1_dataset("uint8"), model_dir, "--checkpoint-every", str(interval))
    run = RunningTraining(command, tmp_path)
    completed = run.wait_for_step(STEPS_PER_EPOCH + 13)
    run.process.send_signal(signal.SIGKILL)
    code, _ = run.finish()
    assert code == -signal.SIGKILL

    saved = max(checkpoint_steps(model_dir))
    # Steps are printed after their checkpoint: every completed step is within one interval of a checkpoint.
    assert completed - interval < saved <= run.steps[-1] + 1
    assert saved % interval == 0

    _, metrics = resume(command, tmp_path)
    assert metrics["resumed_from_step"] == saved
    assert metrics["global_step"] == TOTAL


@pytest.mark.slow
def test_sighup_saves_at_the_next_step_boundary_and_exits_143_like_sigterm(stage1_dataset, tmp_path):
    # SIGHUP: the ssh session that started training closed.
    model_dir = tmp_path / "model"
    command = train_command(stage1_dataset("uint8"), model_dir, "--checkpoint-every", "epoch")
    run = RunningTraining(command, tmp_path)
    completed = run.wait_for_step(5)
    run.process.send_signal(signal.SIGHUP)
    code, stderr = run.finish()

    assert code == PREEMPTED_EXIT_CODE, stderr[-3000:]
    assert "Traceback" not in stderr and "stopped by SIGHUP at step" in stderr
    saved = max(checkpoint_steps(model_dir))
    assert completed <= saved <= completed + 2 and saved >= run.steps[-1]
