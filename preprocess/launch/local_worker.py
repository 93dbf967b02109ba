"""The SDK worker process of a local run: Beam's own harness, minus the interpreter's teardown."""

import os
import signal


def _exit_at_ctrl_c(signum, frame):
    # A Ctrl-C in the terminal reaches every process of its group. The launcher stops the run and says
    # so in one line (preprocess/launch/launcher.py), and its runner waits for each worker to exit: the worker
    # exits now, without the traceback of a KeyboardInterrupt, and with status 0, as any other would
    # make the runner print a traceback per worker ("Worker subprocess exited with return code ...").
    os._exit(0)


# Before the imports below: they take seconds, and a Ctrl-C during them would print their traceback.
signal.signal(signal.SIGINT, _exit_at_ctrl_c)

import sys  # noqa: E402
import traceback  # noqa: E402

from apache_beam.runners.worker import sdk_worker_main  # noqa: E402

from dataset_contract import native_logs  # noqa: E402
from preprocess.launch import logs  # noqa: E402
from preprocess.launch.beam_signatures import remember_signatures  # noqa: E402
from preprocess.launch.process_exit import exit_without_teardown  # noqa: E402


def main() -> None:
    # Each stage this worker runs builds its DoFns anew, asking Beam for their parameters (beam_signatures.py).
    remember_signatures()
    logs.configure_worker(os.environ.get("PIPELINE_OPTIONS"))
    logs.quiet_worker_stderr()
    code = 0
    # Quiet as the launcher is (logs.QUIET_INPUT_FAULTS_ENV_VAR: not --verbose): this worker's stderr is the terminal,
    # and TensorFlow, when a stage first needs it, prints its native start-up lines there (native_logs.py).
    try:
        with native_logs.filtered_native_stderr(
            enabled=bool(os.environ.get(logs.QUIET_INPUT_FAULTS_ENV_VAR))
        ):
            sdk_worker_main.main(sys.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the runner is told by the exit code; the log keeps the trace
        traceback.print_exc()
        code = 1
    exit_without_teardown(code)


if __name__ == "__main__":
    main()
