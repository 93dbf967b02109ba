"""Keep a training command running on a TPU VM: restart it after an interruption, stop after success or a setup error.

    python3 -m train.tools.supervisor --pid-file ~/tf-image-pipeline/supervisor.pid -- \\
        python3 -m train --data gs://BUCKET/dataset --model-dir gs://BUCKET/runs/r50 --tpu local ...

pipelines/tpu/launch.py starts it detached from the ssh session that
launched it (`setsid nohup ... &`, output to a log file), so a dropped
connection does not end training. Each run of the command resumes from the
last checkpoint in --model-dir, so restarting is always safe. What the
command's exit status means (train/__main__.py):

  0                       training finished (and exported)  -> stop, exit 0
  2                       a setup error: bad flags, an incompatible dataset, no TPU -> stop, exit 2
                          (running the same command again cannot succeed; the log says what to fix),
                          unless an earlier run of it was interrupted: then it set up fine before,
                          and the error is the machine (a slice whose preempted worker is not back
                          yet: no TPU could be initialized) -> restart, as a crash
  143                     SIGTERM: a checkpoint was saved   -> restart
  anything else, or       on a multi-host slice a peer's preemption reaches worker 0's
  killed by a signal      process as a runtime error (exit 1); SIGKILL, OOM -> restart

A command that keeps failing soon after it starts (--crash-loop-limit runs
in a row, each within --crash-loop-seconds) is a bug, not an interruption:
the supervisor then stops with the last status. So is one that keeps failing
without advancing its checkpoint, however long each run lasts (a truncated
shard mid-epoch, an OOM at the epoch-end evaluation: each run resumes from
the same checkpoint and fails at the same place): after --no-progress-limit
such runs in a row the supervisor stops. The command tells it its progress
through a small local file named in its environment (TRAIN_PROGRESS_FILE,
train/loop/progress_file.py): `python -m train` writes each checkpoint step it
saves there. A command that writes nothing there never shows progress. The wait before a restart
doubles with each such failure (from --restart-delay, at most 10 minutes),
giving a slice's workers time to come back. SIGTERM, SIGINT or SIGHUP
to the supervisor itself (a shutdown, `kill $(cat supervisor.pid)`) reaches
the command as SIGTERM, on which it saves a checkpoint, and the supervisor
then exits without restarting it.

When supervision ends for good (success, a setup error, giving up) and not
on a stop request, the supervisor writes --stopped-file with the reason: the
boot hook that resumes training after a reboot (pipelines/tpu/launch.py)
then leaves the finished run alone, while a run stopped by the shutdown
itself resumes.

Why a supervisor process under setsid/nohup and not a systemd unit
(`systemd-run -p Restart=on-failure -p RestartPreventExitStatus=2`): a system
unit runs as root with systemd's environment, not as the ssh user whose
`pip install` put tensorflow-tpu in ~/.local; a user unit dies with the ssh
session unless lingering is enabled (root again); and this one also tells a
stop request from an interruption and bounds a crash loop. It is plain
Python (no TensorFlow import), so it runs, and is tested, wherever `python -m
train` does.
"""

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from train.loop import progress_file

# The statuses of `python -m train` (train/__main__.py; tests/train/tools/test_supervisor.py holds them together).
SUCCESS_EXIT_CODE = 0
SETUP_ERROR_EXIT_CODE = 2
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
MAX_RESTART_DELAY = 600.0

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
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def describe_status(status: int) -> str:
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"


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
    ):
        self.command = list(command)
        self.crash_loop_limit = crash_loop_limit
        self.crash_loop_seconds = crash_loop_seconds
        self.restart_delay = restart_delay
        self.no_progress_limit = no_progress_limit
        self.progress_file = progress_file
        self.stopped_file = stopped_file
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
        """End supervision for good: the reason goes to --stopped-file, so a reboot does not resume the run."""
        if self.stopped_file:
            with open(self.stopped_file, "w") as handle:
                handle.write(f"{reason} ({describe_status(status)})\n")
        return status

    def run(self) -> int:
        if self.progress_file is None:
            with tempfile.TemporaryDirectory(prefix="supervisor-") as scratch:
                self.progress_file = os.path.join(scratch, "progress.json")
                return self._run()
        return self._run()

    def _run(self) -> int:
        quick_failures = 0
        runs_without_progress = 0
        interrupted = False  # whether an earlier run got past its setup and was interrupted
        environment = {**os.environ, progress_file.PROGRESS_FILE_ENV: self.progress_file}
        while True:
            self.runs += 1
            started = time.monotonic()
            step_before = progress_file.read_saved_step(self.progress_file)
            log.info("run %d: %s", self.runs, " ".join(self.command))
            self.child = subprocess.Popen(self.command, env=environment)
            if self.stop_requested.is_set() and self.child.poll() is None:
                self.child.send_signal(signal.SIGTERM)  # the stop came while it was starting
            status = self.child.wait()
            lasted = time.monotonic() - started
            step_after = progress_file.read_saved_step(self.progress_file)
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
                log.warning("stopped on request; the same command resumes from the last checkpoint")
                return status
            # The same command set up fine before: a setup error now is the machine, e.g. a slice whose
            # preempted worker is not back yet ("no TPU could be initialized"). Retried like a crash.
            interrupted = True
            quick_failures = quick_failures + 1 if lasted < self.crash_loop_seconds else 0
            progressed = step_after is not None and (step_before is None or step_after > step_before)
            runs_without_progress = 0 if progressed else runs_without_progress + 1
            final = status if status > 0 else 128 - status
            if quick_failures >= self.crash_loop_limit:
                log.error(
                    "%d runs in a row failed within %g s of starting: not an interruption; giving up",
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
            if self.stop_requested.wait(delay):
                log.warning("stopped on request before the restart")
                return status


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        build_parser().error("give the command to supervise after --")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s %(message)s")
    supervisor = Supervisor(
        command,
        args.crash_loop_limit,
        args.crash_loop_seconds,
        args.restart_delay,
        no_progress_limit=args.no_progress_limit,
        progress_file=args.progress_file,
        stopped_file=args.stopped_file,
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
            try:
                os.remove(args.pid_file)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    sys.exit(main())
