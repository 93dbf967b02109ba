"""Ending a stage-1 process once its work is done, without the interpreter's teardown."""

import atexit
import logging
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Exits with `code` now. The exit handlers still run and the output is flushed; only the teardown is skipped."""
    # CPython's own exit runs these, then the teardown; os._exit runs neither.
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
