"""Ctrl-C in `python -m train`, with real SIGINTs to a real training process: the first saves at the next
step boundary and exits 130 with the resume command; a second stops at once. The run prints its plan,
epoch lines with duration and ETA, and no TensorFlow C++ start-up lines, at the default verbosity."""

import signal
import time

import pytest

from tests.train.loop.test_preemption import ENV, STEP_LINE, RunningTraining, checkpoint_steps, resume
from tests.train.loop.test_preemption import train_command as preemption_train_command
from train.loop.checkpoints import INTERRUPTED_EXIT_CODE

# The default verbosity, as a user gets it: no TF_CPP_MIN_LOG_LEVEL from the environment.
QUIET_ENV = {name: value for name, value in ENV.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
NATIVE_STARTUP = ("cuInit", "oneDNN", "I0000", "E0000", "absl::InitializeLog")
EPOCHS = 2
STEPS_PER_EPOCH = 12
TOTAL = EPOCHS * STEPS_PER_EPOCH


def train_command(data_dir, model_dir):
    # The only mid-epoch checkpoint can come from the signal.
    return preemption_train_command(
        data_dir, model_dir, "--checkpoint-every", "epoch", epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH
    )


def catches_sigint(pid: int) -> bool:
    """Whether the process has a handler for SIGINT (its SigCgt mask in /proc)."""
    with open(f"/proc/{pid}/status") as handle:
        caught = next(line for line in handle if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.slow
def test_ctrl_c_saves_at_the_next_step_exits_130_with_the_resume_command_and_the_run_resumes_there(
    stage1_dataset, tmp_path
):
    model_dir = tmp_path / "model"
    command = train_command(stage1_dataset("uint8"), model_dir)
    run = RunningTraining(command, tmp_path, env=QUIET_ENV)
    completed = run.wait_for_step(STEPS_PER_EPOCH + 3)  # mid-way through the second epoch
    run.process.send_signal(signal.SIGINT)
    code, stderr = run.finish()

    assert code == INTERRUPTED_EXIT_CODE, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "stopped by SIGINT at step" in stderr
    assert "resume with: python -m train --data" in stderr and f"--model-dir {model_dir}" in stderr
    # Said once: what stopped, where the checkpoint is and the command that resumes, in one line.
    stopped = [line for line in stderr.splitlines() if "stopped" in line or "resume" in line]
    assert len(stopped) == 1 and stopped[0].startswith("stopped by SIGINT at step"), stopped
    saved = max(checkpoint_steps(model_dir))
    assert completed <= saved <= completed + 2 and saved >= run.steps[-1]
    assert saved % STEPS_PER_EPOCH != 0, "the checkpoint must be mid-epoch"

    # The plan at the start, and nothing from TensorFlow's native start-up, at the default verbosity.
    first = "".join(run.lines)
    assert "training small_cnn from random weights on" in first
    assert f"{STEPS_PER_EPOCH} steps of 8 images" in first and "schedule:" in first and "device:" in first
    assert "precision float32" in first
    assert not [marker for marker in NATIVE_STARTUP if marker in stderr], stderr[-3000:]

    second, metrics = resume(command, tmp_path)
    assert f"resuming from step {saved} of {TOTAL}" in second.stdout
    steps = [int(m.group(1)) for m in map(STEP_LINE.match, second.stdout.splitlines()) if m]
    assert steps[0] == saved + 1 and steps[-1] == TOTAL  # on at the next step, mid-epoch, to the plan's end
    assert metrics["resumed_from_step"] == saved and metrics["global_step"] == TOTAL
    # Each epoch's line has its duration and, but for the last, an ETA; the run ends with where it went.
    epoch_lines = [line for line in second.stdout.splitlines() if line.startswith("epoch ")]
    assert epoch_lines and all(" s" in line.rsplit("(", 1)[1] for line in epoch_lines)
    assert all("ETA" in line for line in epoch_lines[:-1]) and "ETA" not in epoch_lines[-1]
    assert second.stdout.strip().splitlines()[-1] == (
        f"export: none (--no-export); metrics: {model_dir}/metrics.json"
    )


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(stage1_dataset, tmp_path):
    model_dir = tmp_path / "model"
    command = train_command(stage1_dataset("uint8"), model_dir)
    run = RunningTraining(command, tmp_path, env=QUIET_ENV)
    run.wait_for_step(3)
    assert catches_sigint(run.process.pid)
    run.process.send_signal(signal.SIGINT)
    # The first Ctrl-C gives SIGINT back to the system's default action (no handler) until the run stops.
    deadline = time.monotonic() + 30
    while catches_sigint(run.process.pid):
        assert run.process.poll() is None, "the run ended before its handler was seen to change"
        assert time.monotonic() < deadline
        time.sleep(0.001)
    run.process.send_signal(signal.SIGINT)
    started = time.monotonic()
    code, stderr = run.finish()
    assert code == -signal.SIGINT, stderr[-3000:]  # ended by the signal itself, not after a save
    assert time.monotonic() - started < 5
    assert "Ctrl-C again to stop at once" in stderr
