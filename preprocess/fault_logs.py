"""Keeping the runner's tracebacks of an input's fault off the terminal.

When a step raises one of the errors that are the input's fault, not the
code's (preprocess/finalize.py's INPUT_FAULTS: too many failed inputs, an
empty train split), Beam logs the step's traceback at ERROR, in the launcher
and in each local worker process, before the launcher says the same in a
few lines. `quiet_input_faults` drops those records (unless --verbose); every
other error keeps its traceback.
"""

import logging

# The classes' names, not the classes: a worker process installs this before it imports them.
INPUT_FAULT_NAMES = ("TooManyFailuresError", "EmptyTrainSplitError")


class DropInputFaultsFilter(logging.Filter):
    """Drops a log record about an input's fault (by its exception's class, or its text naming one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is not None:
            if record.exc_info[0].__name__ in INPUT_FAULT_NAMES:
                return False
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not ours to judge
            return True
        text += record.exc_text or ""
        return not any(name in text for name in INPUT_FAULT_NAMES)


_FILTER = DropInputFaultsFilter()


def quiet_input_faults() -> None:
    """Installs the filter on the handlers this process logs through (and Python's last-resort one)."""
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
