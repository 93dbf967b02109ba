"""Keep a training command running on a TPU VM: restart it after an interruption, stop after success or a setup error.

    python3 -m train.tools.supervisor --pid-file ~/tf-image-pipeline/supervisor.pid \\
        --status-uri gs://BUCKET/runs/r50/supervisor.json --tpu NAME --zone ZONE --project PROJECT -- \\
        python3 -m train --data gs://BUCKET/dataset --model-dir gs://BUCKET/runs/r50 --tpu local ...

What each exit status of the command leads to, and the waits between runs: docs/internals.md.
"""

import argparse
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from train.loop import progress_file
from train.tools import run_status, tpu_servers

# The statuses of `python -m train` (train/__main__.py; tests/train/tools/test_supervisor.py holds them together).
SUCCESS_EXIT_CODE = 0
SETUP_ERROR_EXIT_CODE = 2
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
MAX_RESTART_DELAY = 600.0
# Each wait before a restart (the TPU healthy again, a slice's servers answering) lasts at most this long.
TPU_WAIT_TIMEOUT = 3600.0
# After exit 143, how long the TPU may still report healthy before a maintenance event shows (Autocheckpoint:
# Cloud TPU waits for the process to exit, at most 5 minutes, then starts maintenance).
MAINTENANCE_GRACE = 300.0

log = logging.getLogger("train.tools.supervisor")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m train.tools.supervisor",
        description="Run COMMAND; run it again after an interruption (any status but 0 and 2); stop after "
        "success (0) or a setup error (2). SIGTERM/SIGINT/SIGHUP reach COMMAND as SIGTERM and end supervision.",
    )
    parser.add_argument(
        "--crash-loop-limit",
        type=int,
        default=5,
        help="Stop after this many failures in a row that each came within --crash-loop-seconds of the start "
        "(default %(default)s).",
    )
    parser.add_argument(
        "--crash-loop-seconds",
        type=float,
        default=300.0,
        help="A run that fails sooner than this counts towards --crash-loop-limit (default %(default)s).",
    )
    parser.add_argument(
        "--restart-delay",
        type=float,
        default=30.0,
        help="Seconds between a failure and the restart, doubled for each quick failure in a row, at most 600 "
        "(default %(default)s).",
    )
    parser.add_argument(
        "--no-progress-limit",
        type=int,
        default=3,
        help="Stop after this many failed runs in a row that saved no checkpoint beyond the last one, however "
        "long each lasted (default %(default)s).",
    )
    parser.add_argument(
        "--progress-file",
        default=None,
        help="Where the command records its last saved checkpoint step (passed to it as $TRAIN_PROGRESS_FILE; "
        "default: a temporary file).",
    )
    parser.add_argument(
        "--stopped-file",
        default=None,
        help="Write the reason here when supervision ends for good (success, setup error, giving up); not on "
        "a stop request.",
    )
    parser.add_argument("--pid-file", default=None, help="Write this process's id here while it runs.")
    parser.add_argument(
        "--status-uri",
        default=None,
        help="Keep a status object here (local or gs://, e.g. MODEL_DIR/supervisor.json): a heartbeat every "
        "--heartbeat-seconds while supervising, the reason when supervision ends for good. python -m "
        "pipelines.tpu.restart reads it.",
    )
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=60.0,
        help="Seconds between two writes of --status-uri (default %(default)s).",
    )
    tpu = parser.add_argument_group(
        "the TPU",
        "Given the TPU this runs on, each restart first waits until Cloud TPU reports it READY and "
        "HEALTHY (after a maintenance event's save too), and on a slice until every worker's TPU server answers.",
    )
    tpu.add_argument(
        "--tpu", default=None, help="The TPU's name (as gcloud compute tpus tpu-vm describe knows it)."
    )
    tpu.add_argument("--zone", default=None)
    tpu.add_argument("--project", default=None)
    tpu.add_argument(
        "--wait-for-tpu-servers",
        action="store_true",
        help="A multi-host slice: before each restart wait until every worker's TPU server answers.",
    )
    tpu.add_argument(
        "--tpu-wait-timeout",
        type=float,
        default=TPU_WAIT_TIMEOUT,
        help="Each of those waits lasts at most this many seconds; then supervision ends for good "
        "(default %(default)s).",
    )
    tpu.add_argument(
        "--maintenance-grace",
        type=float,
        default=MAINTENANCE_GRACE,
        help="After a SIGTERM save (exit 143), wait this long for a maintenance event to show in the TPU's "
        "health before restarting on a healthy TPU (default %(default)s).",
    )
    tpu.add_argument("--tpu-poll-seconds", type=float, default=20.0, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def describe_status(status: int) -> str:
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """The TPU the supervised command runs on, for the waits before a restart."""

    name: str
    zone: str
    project: str
    slice: bool = False  # then also wait for every worker's TPU server


class Supervisor:
    """Runs `command` until it succeeds, hits a setup error, stops progressing, or is told to stop."""

    def __init__(
        self,
        command,
        crash_loop_limit=5,
        crash_loop_seconds=300.0,
        restart_delay=30.0,
        no_progress_limit=3,
        progress_file=None,
        stopped_file=None,
        status: run_status.StatusReport | None = None,
        tpu: TpuTarget | None = None,
        tpu_wait_timeout=TPU_WAIT_TIMEOUT,
        maintenance_grace=MAINTENANCE_GRACE,
        tpu_poll_seconds=20.0,
    ):
        self.command = list(command)
        self.crash_loop_limit = crash_loop_limit
        self.crash_loop_seconds = crash_loop_seconds
        self.restart_delay = restart_delay
        self.no_progress_limit = no_progress_limit
        self.progress_file = progress_file
        self.stopped_file = stopped_file
        self.status = status or run_status.StatusReport(None)
        self.tpu = tpu
        self.tpu_wait_timeout = tpu_wait_timeout
        self.maintenance_grace = maintenance_grace
        self.tpu_poll_seconds = tpu_poll_seconds
        self.stop_requested = threading.Event()
        self.child: subprocess.Popen | None = None
        self.runs = 0

    def request_stop(self, signum, _frame=None) -> None:
        """A signal handler: SIGTERM to the running command (it saves a checkpoint) and no restart after it."""
        log.warning(
            "received %s: sending SIGTERM to training; no restart after this run", signal.Signals(signum).name
        )
        self.stop_requested.set()
        if self.child is not None and self.child.poll() is None:
            # SIGTERM whatever arrived: it is the signal python -m train saves a checkpoint on.
            self.child.send_signal(signal.SIGTERM)

    def delay_after(self, quick_failures: int) -> float:
        """Seconds before the next run: --restart-delay, doubled for each quick failure in a row, at most 10 min."""
        return min(self.restart_delay * 2 ** max(0, quick_failures - 1), MAX_RESTART_DELAY)

    def _finish(self, status: int, reason: str) -> int:
        """End supervision for good: the reason goes to --stopped-file, so a reboot does not resume the run,
        and to the status object, where the off-VM loop reads it."""
        described = f"{reason} ({describe_status(status)})"
        if self.stopped_file:
            with open(self.stopped_file, "w") as handle:
                handle.write(f"{described}\n")
        self.status.stop()
        self.status.report(run_status.STOPPED, described, attempts=3, reason=reason, status=status)
        return status

    def _exit_on_request(self, status: int, why: str) -> int:
        log.warning("%s; the same command resumes from the last checkpoint", why)
        self.status.stop()
        self.status.report(run_status.EXITED, why, attempts=3, status=status)
        return status

    def run(self) -> int:
        if self.progress_file is None:
            with tempfile.TemporaryDirectory(prefix="supervisor-") as scratch:
                self.progress_file = os.path.join(scratch, "progress.json")
                return self._run_reporting()
        return self._run_reporting()

    def _run_reporting(self) -> int:
        # Each heartbeat carries the last saved checkpoint step: how far training is, seen from the model dir.
        self.status.saved_step = lambda: progress_file.read_saved_step(self.progress_file)
        self.status.start()
        try:
            return self._run()
        finally:
            self.status.stop()

    def _run(self) -> int:
        quick_failures = 0
        runs_without_progress = 0
        interrupted = False  # whether an earlier run got past its setup and was interrupted
        environment = {**os.environ, progress_file.PROGRESS_FILE_ENV: self.progress_file}
        while True:
            self.runs += 1
            progress_file.start_run(self.progress_file)
            started = time.monotonic()
            step_before = progress_file.read_saved_step(self.progress_file)
            log.info("run %d: %s", self.runs, " ".join(self.command))
            self.status.report(run_status.RUNNING, f"run {self.runs}", run=self.runs)
            self.child = subprocess.Popen(self.command, env=environment)
            if self.stop_requested.is_set() and self.child.poll() is None:
                self.child.send_signal(signal.SIGTERM)  # the stop came while it was starting
            status = self.child.wait()
            lasted = time.monotonic() - started
            progress = progress_file.read_progress(self.progress_file)
            step_after = progress.saved_step
            log.info(
                "run %d ended after %.0f s: %s; last saved step %s",
                self.runs,
                lasted,
                describe_status(status),
                "none" if step_after is None else step_after,
            )
            if status == SUCCESS_EXIT_CODE:
                log.info("training finished")
                return self._finish(status, "training finished")
            if status == SETUP_ERROR_EXIT_CODE and not interrupted:
                log.error("setup error (see the message above): fix the flags or the dataset; not restarting")
                return self._finish(status, "setup error")
            if self.stop_requested.is_set():
                return self._exit_on_request(status, "stopped on request")
            # The same command set up fine before: a setup error now is the machine, e.g. a slice whose
            # preempted worker is not back yet ("no TPU could be initialized"). Retried like a crash.
            interrupted = True
            before_first_step = not progress.stepped
            quick = lasted < self.crash_loop_seconds or before_first_step
            quick_failures = quick_failures + 1 if quick else 0
            if before_first_step:
                # The TPU not ready, a slice's server not answering: the machine, not a failure of training.
                log.warning(
                    "run %d failed before its first training step: not counted against --no-progress-limit",
                    self.runs,
                )
            else:
                progressed = step_after is not None and (step_before is None or step_after > step_before)
                runs_without_progress = 0 if progressed else runs_without_progress + 1
            final = status if status > 0 else 128 - status
            if quick_failures >= self.crash_loop_limit:
                log.error(
                    "%d runs in a row failed within %g s of starting or before their first step: not an "
                    "interruption; giving up",
                    quick_failures,
                    self.crash_loop_seconds,
                )
                return self._finish(final, "crash loop")
            if runs_without_progress >= self.no_progress_limit:
                log.error(
                    "%d runs in a row failed without advancing the checkpoint (still at step %s): each resumes "
                    "from the same place and fails again, which is not an interruption; giving up",
                    runs_without_progress,
                    "none" if step_after is None else step_after,
                )
                return self._finish(final, "no progress")
            delay = self.delay_after(quick_failures)
            log.warning(
                "interrupted (%s): restarting in %g s from the last checkpoint",
                describe_status(status),
                delay,
            )
            self.status.report(
                run_status.WAITING, f"restarting in {delay:g} s after {describe_status(status)}"
            )
            if self.stop_requested.wait(delay):
                return self._exit_on_request(status, "stopped on request before the restart")
            problem = self._wait_for_the_tpu(maintenance=status == PREEMPTED_EXIT_CODE)
            if self.stop_requested.is_set():
                return self._exit_on_request(status, "stopped on request before the restart")
            if problem:
                log.error("%s: giving up", problem)
                return self._finish(final, problem)

    def _wait_for_the_tpu(self, maintenance: bool) -> str | None:
        """Before a restart: the TPU healthy, a slice's servers answering. None, or why it did not come back."""
        if self.tpu is None:
            return None
        problem = self._wait_until_healthy(self.maintenance_grace if maintenance else 0.0)
        if problem is None and self.tpu.slice:
            problem = self._wait_for_servers()
        return problem

    def _wait_until_healthy(self, grace: float) -> str | None:
        """Wait until Cloud TPU reports the TPU READY and HEALTHY.

        Within `grace` seconds a healthy report is not enough: a maintenance event may not show yet.
        Once the TPU has reported otherwise, the first healthy report ends the wait. When gcloud cannot
        describe the TPU, the wait ends after `grace` (training then finds out itself).
        """
        tpu = self.tpu
        started = time.monotonic()
        seen_unhealthy = False
        if grace:
            log.info(
                "a SIGTERM save (a maintenance event, with Autocheckpoint): restarting once TPU %s has been "
                "through its maintenance, or after %g s if none shows",
                tpu.name,
                grace,
            )
            self.status.report(run_status.WAITING, f"up to {grace:g} s for a maintenance event to show")
        while True:
            try:
                node = tpu_servers.describe_tpu(tpu.name, tpu.zone, tpu.project)
            except RuntimeError as exc:
                node = None
                log.warning("%s", exc)
            elapsed = time.monotonic() - started
            if node is not None and tpu_servers.is_healthy(node):
                if seen_unhealthy:
                    log.info(
                        "TPU %s is %s again after %.0f s", tpu.name, tpu_servers.health_of(node), elapsed
                    )
                    return None
                if elapsed >= grace:
                    return None
            elif node is not None:
                if not seen_unhealthy:
                    log.warning(
                        "TPU %s is %s: restarting once it is READY/HEALTHY",
                        tpu.name,
                        tpu_servers.health_of(node),
                    )
                    self.status.report(run_status.WAITING, f"TPU {tpu_servers.health_of(node)}")
                seen_unhealthy = True
            elif elapsed >= grace:
                return None
            if elapsed >= self.tpu_wait_timeout:
                return f"TPU {tpu.name} not READY/HEALTHY after {self.tpu_wait_timeout:g} s"
            if self.stop_requested.wait(self.tpu_poll_seconds):
                return None

    def _wait_for_servers(self) -> str | None:
        """Wait until every worker's TPU server answers (the slice's workers, as Cloud TPU lists them)."""
        tpu = self.tpu
        deadline = time.monotonic() + self.tpu_wait_timeout
        while True:
            try:
                endpoints = tpu_servers.worker_endpoints(tpu.name, tpu.zone, tpu.project)
            except (RuntimeError, ValueError, KeyError) as exc:
                log.warning("%s", exc)
            else:
                silent = [
                    worker for worker in range(len(endpoints)) if not tpu_servers.answers(*endpoints[worker])
                ]
                if silent:
                    log.warning(
                        "the TPU servers of workers %s of %s do not answer: restarting once they do (at most "
                        "%g s)",
                        ", ".join(map(str, silent)),
                        tpu.name,
                        self.tpu_wait_timeout,
                    )
                    self.status.report(
                        run_status.WAITING,
                        f"the TPU servers of workers {', '.join(map(str, silent))} do not answer",
                    )
                    silent = tpu_servers.wait_for_servers(
                        endpoints,
                        max(0.0, deadline - time.monotonic()),
                        min(self.tpu_poll_seconds, 2.0),
                        stop=self.stop_requested,
                    )
                if not silent:
                    return None
                if time.monotonic() >= deadline:
                    where = ", ".join(f"worker {worker} ({endpoints[worker][0]})" for worker in silent)
                    return f"the TPU servers of {where} of {tpu.name} did not answer within {self.tpu_wait_timeout:g} s"
            if time.monotonic() >= deadline:
                return f"gcloud could not list the workers of {tpu.name} within {self.tpu_wait_timeout:g} s"
            if self.stop_requested.wait(self.tpu_poll_seconds):
                return None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to supervise after --")
    if (args.tpu or args.wait_for_tpu_servers) and not (args.tpu and args.zone and args.project):
        parser.error("--tpu needs --zone and --project (and --wait-for-tpu-servers needs all three)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
    tpu = TpuTarget(args.tpu, args.zone, args.project, args.wait_for_tpu_servers) if args.tpu else None
    supervisor = Supervisor(
        command,
        args.crash_loop_limit,
        args.crash_loop_seconds,
        args.restart_delay,
        no_progress_limit=args.no_progress_limit,
        progress_file=args.progress_file,
        stopped_file=args.stopped_file,
        status=run_status.StatusReport(args.status_uri, args.heartbeat_seconds),
        tpu=tpu,
        tpu_wait_timeout=args.tpu_wait_timeout,
        maintenance_grace=args.maintenance_grace,
        tpu_poll_seconds=args.tpu_poll_seconds,
    )
    for signum in STOP_SIGNALS:
        signal.signal(signum, supervisor.request_stop)
    if args.pid_file:
        with open(args.pid_file, "w") as handle:
            handle.write(f"{os.getpid()}\n")
    try:
        return supervisor.run()
    finally:
        if args.pid_file:
            remove_own_pid_file(args.pid_file)


def remove_own_pid_file(path: str) -> None:
    """Remove the pid file only while it still holds this process's id: a supervisor started after this one
    (start.sh relaunched once this one wrote its stopped file) has written its own there, and removing that
    would let the next start.sh start a second supervisor beside it. The window between the read and the
    remove remains (a pid written there in between is removed); start.sh writes its pid under a lock, at
    once, so only a start.sh run in that window of microseconds could lose it."""
    try:
        with open(path) as handle:
            holder = handle.read().strip()
    except FileNotFoundError:
        return
    if holder == str(os.getpid()):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    sys.exit(main())
