"""`python -m train.tools.supervisor` with real child processes, real exit statuses and real signals."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from train.tools import supervisor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A child that records each run in RUNS and exits with the next status of STATUSES
# ("kill" kills itself with SIGKILL; "wait" waits for SIGTERM and then exits 143 as train does;
# a status ending in "+" first saves a checkpoint one step further, through train.loop.progress_file as
# train/loop/checkpoints.py does; "late" sleeps past --crash-loop-seconds first).
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from train.loop import progress_file
    runs_file, statuses = sys.argv[1], sys.argv[2].split(",")
    with open(runs_file, "a") as handle:
        handle.write("run\\n")
    with open(runs_file) as handle:
        run = len(handle.readlines())
    status = statuses[min(run, len(statuses)) - 1]
    if status.startswith("late"):
        time.sleep(0.5)
        status = status[len("late"):]
    if status.endswith("+"):
        progress_file.record_saved_step(100 * run)
        status = status[:-1]
    if status == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if status == "wait":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        open(runs_file + ".ready", "w").close()
        time.sleep(60)
    sys.exit(int(status))
    """
)


def supervise(tmp_path, statuses, *options, timeout=60):
    runs = tmp_path / "runs"
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    result = subprocess.run(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", *options,
         "--", sys.executable, str(child), str(runs), ",".join(statuses)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": REPO},
    )  # fmt: skip
    return result, len(runs.read_text().splitlines()) if runs.exists() else 0


def test_a_run_interrupted_by_sigterm_is_restarted_and_supervision_ends_at_success(tmp_path):
    result, runs = supervise(tmp_path, ["143", "0"])
    assert (result.returncode, runs) == (0, 2), result.stderr
    assert "restarting" in result.stderr and "training finished" in result.stderr


def test_a_peer_preemption_runtime_error_and_a_sigkill_are_restarted(tmp_path):
    result, runs = supervise(tmp_path, ["1", "kill", "0"])
    assert (result.returncode, runs) == (0, 3), result.stderr
    assert "killed by SIGKILL" in result.stderr


def test_a_setup_error_stops_supervision_without_a_restart(tmp_path):
    result, runs = supervise(tmp_path, ["2", "0"])
    assert (result.returncode, runs) == (2, 1), result.stderr
    assert "not restarting" in result.stderr


def test_a_setup_error_after_an_interruption_is_retried_as_the_tpu_coming_back(tmp_path):
    # Run 2 fails to set up (a slice's preempted worker not back yet), run 3 resumes.
    result, runs = supervise(tmp_path, ["1", "2", "0"])
    assert (result.returncode, runs) == (0, 3), result.stderr


def test_the_wait_before_a_restart_doubles_with_each_quick_failure_up_to_ten_minutes():
    delays = [supervisor.Supervisor(["true"], restart_delay=30).delay_after(n) for n in (0, 1, 2, 3, 4, 6)]
    assert delays == [30, 30, 60, 120, 240, 600]


def test_a_command_that_keeps_failing_at_once_is_given_up_after_the_crash_loop_limit(tmp_path):
    result, runs = supervise(tmp_path, ["1"], "--crash-loop-limit", "3", "--crash-loop-seconds", "60")
    assert (result.returncode, runs) == (1, 3), result.stderr
    assert "giving up" in result.stderr


def test_failures_after_a_long_run_do_not_count_towards_the_crash_loop_limit(tmp_path):
    # --crash-loop-seconds 0: every run counts as long, so five failures in a row that each saved a
    # further checkpoint still restart.
    result, runs = supervise(tmp_path, ["1+", "1+", "1+", "1+", "1+", "0"], "--crash-loop-limit", "2",
                             "--crash-loop-seconds", "0")  # fmt: skip
    assert (result.returncode, runs) == (0, 6), result.stderr


def test_late_failures_that_advance_no_checkpoint_stop_supervision_after_the_no_progress_limit(tmp_path):
    # Each run lasts past --crash-loop-seconds (a truncated shard mid-epoch, an OOM at the epoch-end
    # evaluation) and fails again from the same checkpoint: the crash-loop rule never fires, this one does.
    stopped = tmp_path / "stopped"
    result, runs = supervise(
        tmp_path, ["late1+", "late1", "late1", "late1", "0"], "--crash-loop-seconds", "0.2",
        "--no-progress-limit", "3", "--stopped-file", str(stopped),
    )  # fmt: skip
    assert (result.returncode, runs) == (1, 4), result.stderr
    assert "3 runs in a row failed without advancing the checkpoint (still at step 100)" in result.stderr
    assert "giving up" in result.stderr and stopped.read_text().startswith("no progress")


def test_a_run_that_saves_a_further_checkpoint_resets_the_no_progress_count(tmp_path):
    result, runs = supervise(tmp_path, ["1", "1+", "1", "1+", "1", "0"], "--no-progress-limit", "2",
                             "--crash-loop-seconds", "0")  # fmt: skip
    assert (result.returncode, runs) == (0, 6), result.stderr
    assert "last saved step 400" in result.stderr


def test_success_writes_the_stopped_file_and_a_stop_request_does_not(tmp_path):
    stopped = tmp_path / "stopped"
    result, _ = supervise(tmp_path, ["0"], "--stopped-file", str(stopped))
    assert result.returncode == 0 and stopped.read_text().startswith("training finished")


def test_the_real_train_cli_with_a_bad_flag_exits_with_the_setup_error_status_the_supervisor_stops_on(
    tmp_path,
):
    result = subprocess.run(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", "--",
         sys.executable, "-m", "train", "--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == supervisor.SETUP_ERROR_EXIT_CODE, result.stderr
    assert result.stderr.count("run 1:") == 1 and "run 2:" not in result.stderr


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_supervisor_reaches_the_command_as_sigterm_and_ends_supervision(
    tmp_path, stop_signal
):
    runs = tmp_path / "runs"
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    pid_file = tmp_path / "supervisor.pid"
    process = subprocess.Popen(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", "--pid-file", str(pid_file),
         "--stopped-file", str(tmp_path / "stopped"), "--", sys.executable, str(child), str(runs), "wait,0"],
        cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(f"{runs}.ready") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(pid_file.read_text()) == process.pid
        process.send_signal(stop_signal)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    # The command got SIGTERM (its handler exits 143, as train does after saving) and was not started again.
    assert process.returncode == supervisor.PREEMPTED_EXIT_CODE, stderr
    assert len(runs.read_text().splitlines()) == 1
    assert "stopped on request" in stderr
    assert not pid_file.exists()
    # A shutdown's SIGTERM is such a request: the boot hook must resume this run, so no stopped file.
    assert not (tmp_path / "stopped").exists()
