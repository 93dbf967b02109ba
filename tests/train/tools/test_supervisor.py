"""`python -m train.tools.supervisor` with real child processes, real exit statuses and real signals."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from train.tools import supervisor

# Also in the Python 3.10 leg (scripts/test_py310.sh): the supervisor runs on a TPU VM's python3, 3.10.
pytestmark = pytest.mark.py310

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# A child that records each run in RUNS and exits with the next status of STATUSES
# ("kill" kills itself with SIGKILL; "wait" waits for SIGTERM and then exits 143 as train does;
# a status ending in "+" first saves a checkpoint one step further, through train.loop.progress_file as
# train/loop/checkpoints.py does; "late" sleeps past --crash-loop-seconds first). Each run first completes a
# training step (recorded as train/loop/checkpoints.py's StepCounter does), except under "early": it fails
# before its first step, as a run does when the TPU is not back yet.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from train.loop import progress_file
    runs_file, statuses = sys.argv[1], sys.argv[2].split(",")
    with open(runs_file, "a") as handle:
        handle.write("run\\n")
    with open(runs_file) as handle:
        run = sum(line == "run\\n" for line in handle)  # the fake gcloud below logs its calls there too
    status = statuses[min(run, len(statuses)) - 1]
    if status.startswith("early"):
        status = status[len("early"):]
    else:
        progress_file.record_first_step()
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
    return result, runs.read_text().splitlines().count("run") if runs.exists() else 0


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


def test_an_exiting_supervisor_leaves_a_pid_file_that_holds_another_supervisors_pid(tmp_path):
    # While this supervisor runs, another (start.sh relaunched it once this one wrote its stopped file) writes
    # its pid there; this one's exit must leave that file, or the next start.sh starts a second supervisor.
    pid_file = tmp_path / "supervisor.pid"
    other = f"{os.getpid()}\n"
    replace = f"open({str(pid_file)!r}, 'w').write({other!r})"
    result = subprocess.run(
        [sys.executable, "-m", "train.tools.supervisor", "--pid-file", str(pid_file), "--",
         sys.executable, "-c", replace],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert pid_file.read_text() == other


def test_runs_that_fail_before_their_first_step_do_not_count_against_the_no_progress_limit(tmp_path):
    # Run 1 trains and is interrupted; runs 2-4 fail before their first step (the TPU not back yet): with
    # --no-progress-limit 2 they would have stopped supervision at run 3.
    result, runs = supervise(
        tmp_path, ["late1+", "early2", "early1", "early1", "0"], "--no-progress-limit", "2",
        "--crash-loop-seconds", "0.2",
    )  # fmt: skip
    assert (result.returncode, runs) == (0, 5), result.stderr
    assert result.stderr.count("failed before its first training step") == 3


def test_failures_before_the_first_step_still_end_in_the_crash_loop_limit_however_long_they_last(tmp_path):
    stopped = tmp_path / "stopped"
    result, runs = supervise(
        tmp_path,
        ["early1"],
        "--crash-loop-limit",
        "3",
        "--crash-loop-seconds",
        "0",
        "--stopped-file",
        str(stopped),
    )
    assert (result.returncode, runs) == (1, 3), result.stderr
    assert stopped.read_text().startswith("crash loop")


# A `gcloud` for the supervisor's calls: `storage cp FILE gs://B/O` stores the object under GCS/B/O;
# `tpu-vm describe` answers READY with the next health of HEALTH (the last one stays) and the workers
# of PORTS (127.0.0.1 each), and logs "describe HEALTH" to LOG (the runs file: its order with the runs).
FAKE_GCLOUD = """#!{python}
import json, os, sys
d, log = {d!r}, {log!r}
args = sys.argv[1:]
if args[:2] == ["storage", "cp"]:
    target = os.path.join(d, "gcs", args[3][len("gs://"):])
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(args[2]) as source, open(target + ".partial", "w") as out:
        out.write(source.read())
    os.replace(target + ".partial", target)
elif args[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
    with open(os.path.join(d, "health")) as handle:
        healths = handle.read().split()
    if len(healths) > 1:
        with open(os.path.join(d, "health"), "w") as handle:
            handle.write(" ".join(healths[1:]))
    with open(log, "a") as handle:
        handle.write("describe " + healths[0] + chr(10))
    ports = json.load(open(os.path.join(d, "ports"))) if os.path.exists(os.path.join(d, "ports")) else []
    print(json.dumps({{"state": "READY", "health": healths[0],
                      "networkEndpoints": [{{"ipAddress": "127.0.0.1", "port": port}} for port in ports]}}))
else:
    sys.exit("fake gcloud: unexpected " + " ".join(args))
"""

TPU = ["--tpu", "t", "--zone", "z", "--project", "p", "--tpu-poll-seconds", "0.05"]


def fake_gcloud(tmp_path, healths=("HEALTHY",), ports=None):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(
        FAKE_GCLOUD.format(python=sys.executable, d=str(tmp_path), log=str(tmp_path / "runs"))
    )
    (bin_dir / "gcloud").chmod(0o755)
    (tmp_path / "health").write_text(" ".join(healths))
    if ports is not None:
        (tmp_path / "ports").write_text(json.dumps(ports))
    return {**os.environ, "PYTHONPATH": REPO, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_after_a_maintenance_save_the_restart_waits_until_the_tpu_reports_healthy_again(tmp_path):
    # Run 1 saves on the maintenance event's SIGTERM and exits 143; Cloud TPU reports the maintenance a
    # moment later (two HEALTHY answers first), then HEALTHY again: run 2 starts only then.
    env = fake_gcloud(
        tmp_path, ["HEALTHY", "HEALTHY", "UNHEALTHY_MAINTENANCE", "UNHEALTHY_MAINTENANCE", "HEALTHY"]
    )
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    result = subprocess.run(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", *TPU, "--maintenance-grace", "30",
         "--", sys.executable, str(child), str(tmp_path / "runs"), "143+,0"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs").read_text().splitlines() == [
        "run", "describe HEALTHY", "describe HEALTHY", "describe UNHEALTHY_MAINTENANCE",
        "describe UNHEALTHY_MAINTENANCE", "describe HEALTHY", "run",
    ]  # fmt: skip
    assert "READY/UNHEALTHY_MAINTENANCE: restarting once it is READY/HEALTHY" in result.stderr


def test_after_a_runtime_error_on_a_healthy_tpu_the_restart_asks_cloud_tpu_once(tmp_path):
    env = fake_gcloud(tmp_path)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    result = subprocess.run(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", *TPU, "--",
         sys.executable, str(child), str(tmp_path / "runs"), "1,0"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs").read_text().splitlines() == ["run", "describe HEALTHY", "run"]


# Worker 0's training on a slice: run 1 trains and then loses a peer (a runtime error, exit 1); later runs
# need every worker's TPU server (the ports in PORTS) and fail before their first step while one is down.
SLICE_CHILD = textwrap.dedent(
    """
    import json, socket, sys
    from train.loop import progress_file
    runs_file, ports_file = sys.argv[1], sys.argv[2]
    with open(runs_file, "a") as handle:
        handle.write("run" + chr(10))
    run = open(runs_file).read().splitlines().count("run")
    if run == 1:
        progress_file.record_first_step()
        progress_file.record_saved_step(100)
        sys.exit(1)
    for port in json.load(open(ports_file)):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            print(f"no TPU could be initialized: the worker at port {port} does not answer", file=sys.stderr)
            sys.exit(2)
    progress_file.record_first_step()
    sys.exit(0)
    """
)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_peer_worker_down_for_ten_minutes_costs_the_wait_not_the_run(tmp_path):
    # Times at 1/100: the peer is down for 6 s (10 minutes), the restart delay is 0.3 s (30 s), the servers'
    # wait at most 36 s (an hour). Restarting into the missing peer, the no-progress rule stopped after 3
    # runs (0.3 + 0.6 + 1.2 s: 3.5 minutes); now the supervisor waits for the peer's server, then resumes.
    up = socket.create_server(("127.0.0.1", 0))
    down_port = closed_port()
    env = fake_gcloud(tmp_path, ports=[up.getsockname()[1], down_port])
    child = tmp_path / "child.py"
    child.write_text(SLICE_CHILD)
    process = subprocess.Popen(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0.3", "--crash-loop-seconds", "3",
         *TPU, "--wait-for-tpu-servers", "--tpu-wait-timeout", "36", "--stopped-file", str(tmp_path / "stopped"),
         "--", sys.executable, str(child), str(tmp_path / "runs"), str(tmp_path / "ports")],
        cwd=REPO, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    back = None
    try:
        time.sleep(6)
        back = socket.create_server(("127.0.0.1", down_port))  # the peer's TPU server answers again
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        up.close()
        if back is not None:
            back.close()
    assert process.returncode == 0, stderr
    assert (tmp_path / "runs").read_text().splitlines().count("run") == 2, stderr
    assert "the TPU servers of workers 1 of t do not answer" in stderr
    assert (tmp_path / "stopped").read_text().startswith("training finished")


def test_a_slice_whose_server_stays_silent_stops_for_good_and_says_why_in_the_status_object(tmp_path):
    env = fake_gcloud(tmp_path, ports=[closed_port()])
    child = tmp_path / "child.py"
    child.write_text(SLICE_CHILD)
    status = tmp_path / "gcs" / "b" / "run" / "model" / "supervisor.json"
    result = subprocess.run(
        [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", *TPU, "--wait-for-tpu-servers",
         "--tpu-wait-timeout", "1", "--stopped-file", str(tmp_path / "stopped"),
         "--status-uri", "gs://b/run/model/supervisor.json", "--heartbeat-seconds", "0.1",
         "--", sys.executable, str(child), str(tmp_path / "runs"), str(tmp_path / "ports")],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    reason = "the TPU servers of worker 0 (127.0.0.1) of t did not answer within 1 s"
    assert (tmp_path / "stopped").read_text() == f"{reason} (exit status 1)\n"
    written = json.loads(status.read_text())
    assert (written["state"], written["reason"], written["status"]) == ("stopped", reason, 1)
    assert written["saved_step"] == 100  # run 1's checkpoint, as each write carries it
    # The heartbeat went on while the supervisor waited (a write each 0.1 s, besides the 4 reports).
    assert written["heartbeat"] > 6, written
