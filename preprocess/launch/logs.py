"""What a local run prints: its progress, warnings and the summary, not the libraries' INFO lines."""

import json
import logging
import os

from dataset_contract import log_format

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
