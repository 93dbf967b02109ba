"""Keeping the runner's tracebacks of an input's fault off the terminal."""

import logging
import os
import sys

from preprocess import errors

# By name: the runner may wrap the exception in its own, quoting the original's class in its text.
INPUT_FAULT_NAMES = tuple(fault.__name__ for fault in errors.INPUT_FAULTS)
# Set by the launcher for its local worker processes, which inherit its environment.
ENV_VAR = "PREPROCESS_QUIET_INPUT_FAULTS"


def _names_a_fault(text: str) -> bool:
    return any(name in text for name in INPUT_FAULT_NAMES)


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
        return not _names_a_fault(text + (record.exc_text or ""))


_FILTER = DropInputFaultsFilter()


def quiet_input_faults() -> None:
    """Installs the filter on the handlers this process logs through (and Python's last-resort one), and
    asks the local worker processes started from here to do the same."""
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    os.environ[ENV_VAR] = "1"


class _DropInputFaultsStream:
    """A text stream that passes every write on but those naming an input's fault (and the newline after)."""

    def __init__(self, stream):
        self._stream = stream
        self._dropped = False

    def write(self, text):
        if _names_a_fault(text):
            self._dropped = True  # print() writes its newline apart: drop that one too
            return len(text)
        if self._dropped and text == "\n":
            self._dropped = False
            return len(text)
        self._dropped = False
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def quiet_worker_stderr() -> None:
    """In a local worker process: drop the input faults' tracebacks that its harness prints, if asked to."""
    if os.environ.get(ENV_VAR):
        sys.stderr = _DropInputFaultsStream(sys.stderr)
