"""What a run prints: its progress, warnings and the summary; not the libraries' INFO lines (of a local
run), nor the runner's tracebacks of an input's fault."""

import json
import logging
import os
import sys

from dataset_contract import log_format
from preprocess import errors

LIBRARY_LOGGERS = ("apache_beam", "absl", "tensorflow", "tensorflow_transform", "tfx_bsl")
# Loggers of Beam's worker harness that warn about the options it re-parses from the launcher
# ("Discarding unparseable args", "No semi_persistent_directory found"): nothing a user can act on.
_HARNESS_OPTION_LOGGERS = (
    "apache_beam.runners.worker.sdk_worker_main",
    "apache_beam.options.pipeline_options",
)
_QUIET_LEVEL = "WARNING"
_TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# Beam's worker options (SdkWorkerOptions) that the harness applies.
WORKER_LEVEL_OPTION = "default_sdk_harness_log_level"
WORKER_OVERRIDES_OPTION = "sdk_harness_log_level_overrides"


def configure_launcher(verbose: bool, local: bool = True) -> None:
    """This process logs INFO and up; for a `local` run, unless `verbose`, the libraries only WARNING and up.

    Call before TensorFlow is imported: its C++ logging reads the environment once.
    """
    log_format.configure(logging.INFO)
    if verbose or not local:
        return
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(_QUIET_LEVEL)
    # 1 drops TensorFlow's C++ INFO lines (CPU features, CUDA probing); a user's own setting wins.
    os.environ.setdefault(_TF_CPP_MIN_LOG_LEVEL, "1")


def worker_log_options(options: dict, verbose: bool) -> dict:
    """The local runner's worker options (`options`, as get_all_options gives them), with quiet log levels.

    A level the user chose (--default_sdk_harness_log_level, --sdk_harness_log_level_overrides) stays.
    """
    if verbose:
        return options
    options = dict(options)
    if not options.get(WORKER_LEVEL_OPTION):
        options[WORKER_LEVEL_OPTION] = _QUIET_LEVEL
    if not options.get(WORKER_OVERRIDES_OPTION):
        options[WORKER_OVERRIDES_OPTION] = dict.fromkeys(_HARNESS_OPTION_LOGGERS, "ERROR")
    return options


def configure_worker(pipeline_options_json: str | None) -> None:
    """In a local worker process, before Beam's harness starts: the libraries' loggers at the workers' level
    (the harness resets only the root logger)."""
    if not pipeline_options_json:
        return
    try:
        options = json.loads(pipeline_options_json)
    except ValueError:
        return  # the harness reports unreadable options itself
    # The runner hands the options over as a Struct: {"options": {name: value}} or {"beam:option:name:v1": value}.
    options = options.get("options", options)
    level = options.get(WORKER_LEVEL_OPTION) or options.get(f"beam:option:{WORKER_LEVEL_OPTION}:v1")
    if not level:
        return
    level = int(level) if str(level).isdecimal() else str(level).upper()
    for name in LIBRARY_LOGGERS:
        try:
            logging.getLogger(name).setLevel(level)
        except (TypeError, ValueError):
            return  # an unknown level: the harness reports it and logs at INFO


# By name: the runner may wrap the exception in its own, quoting the original's class in its text.
INPUT_FAULT_NAMES = tuple(fault.__name__ for fault in errors.INPUT_FAULTS)
# Set by the launcher for its local worker processes, which inherit its environment.
QUIET_INPUT_FAULTS_ENV_VAR = "PREPROCESS_QUIET_INPUT_FAULTS"


def _names_a_fault(text: str) -> bool:
    return any(name in text for name in INPUT_FAULT_NAMES)


def _not_an_input_fault(record: logging.LogRecord) -> bool:
    """A log filter: drops a record about an input's fault (by its exception's class, or its text naming one)."""
    if (
        record.exc_info
        and record.exc_info[0] is not None
        and record.exc_info[0].__name__ in INPUT_FAULT_NAMES
    ):
        return False
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a record that cannot be formatted is not ours to judge
        return True
    return not _names_a_fault(text + (record.exc_text or ""))


def quiet_input_faults() -> None:
    """Installs the filter on the handlers this process logs through (and Python's last-resort one), and
    asks the local worker processes started from here to do the same."""
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and _not_an_input_fault not in handler.filters:
            handler.addFilter(_not_an_input_fault)
    os.environ[QUIET_INPUT_FAULTS_ENV_VAR] = "1"


# Printed by Beam's worker log handler when the runner's logging stream closes under it: at a Ctrl-C, a
# worker whose main thread is blocked in gRPC gets the signal late, after the launcher has said its lines.
_LOST_RUNNER = "Logging client failed:"


class _DropInputFaultsStream:
    """A text stream that passes every write on but those naming an input's fault or the lost runner's
    logging stream (and the newline after)."""

    def __init__(self, stream):
        self._stream = stream
        self._dropped = False

    def write(self, text):
        if _names_a_fault(text) or text.startswith(_LOST_RUNNER):
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
    """In a local worker process: drop the input faults' tracebacks that its harness prints, and its
    logging client's failure once the runner is gone, if asked to (not --verbose)."""
    if os.environ.get(QUIET_INPUT_FAULTS_ENV_VAR):
        sys.stderr = _DropInputFaultsStream(sys.stderr)
