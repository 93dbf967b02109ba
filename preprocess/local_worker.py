"""The SDK worker process of a local run: Beam's own harness, minus the interpreter's teardown.

The local runner (preprocess/local_runner.py) starts `--direct_num_workers`
of these in place of `python -m apache_beam.runners.worker.sdk_worker_main`.
Each runs that same harness. When the harness returns, the runner has every
result of the worker, and the worker has imported TensorFlow: the interpreter's
ordinary teardown would then take about a second per worker, and the runner
stops the workers one after the other, waiting for each to exit. So the
worker flushes its output and exits at once instead.
"""

import os
import sys
import traceback

from apache_beam.runners.worker import sdk_worker_main


def main() -> None:
    code = 0
    try:
        sdk_worker_main.main(sys.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the runner is told by the exit code; the log keeps the trace
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
