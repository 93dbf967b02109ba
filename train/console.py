"""What a command of this package prints before its first step: logging levels and TensorFlow's start-up.

Quiet by default: Python logging at WARNING (ours, TensorFlow's, absl's),
TensorFlow's C++ logging without INFO (TF_CPP_MIN_LOG_LEVEL=1 unless set),
and the lines TensorFlow's native libraries print while they load, before
that setting takes effect ("All log messages before absl::InitializeLog()
...", "Could not find cuda drivers ...", "failed call to cuInit" on a
machine without a GPU), filtered out as they are written: warnings and
errors from the native side are kept, and a fatal error that aborts the
import (a libtpu or driver abort) reaches the log before the process dies.
`--verbose` keeps everything and logs at INFO.

Environment that must be set before TensorFlow is imported is set here too:
a multi-host TPU coordinator (--tpu NAME on a TPU VM) must not claim the
local chips, which the worker's own TPU server drives (TPU_LOAD_LIBRARY=0).
So is Keras' backend (KERAS_BACKEND, read once, when Keras is imported); on
JAX, TensorFlow is the input pipeline only and leaves the TPU to JAX
(TPU_LOAD_LIBRARY=0) and the GPUs too (import_tensorflow hides them from it).
"""

import logging
import os

from dataset_contract import log_format
from dataset_contract.native_logs import filtered_native_stderr, is_native_noise  # noqa: F401 - re-exported


def configure(verbose: bool, tpu: str | None = None, backend: str | None = None) -> None:
    """Logging levels and pre-import environment; call before importing TensorFlow or Keras.

    `backend` (`--backend`, already resolved: config.resolve_backend) becomes KERAS_BACKEND.
    """
    level = logging.INFO if verbose else logging.WARNING
    log_format.configure()  # unless configured already
    for name in ("", "tensorflow", "absl", "keras"):
        logging.getLogger(name).setLevel(level)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "1")
    if tpu and tpu != "local":
        os.environ.setdefault("TPU_LOAD_LIBRARY", "0")
    if backend is not None:
        set_backend(backend)


def set_backend(backend: str) -> None:
    """KERAS_BACKEND for Keras' first import; on JAX, TensorFlow (tf.data only) keeps off the TPU."""
    os.environ["KERAS_BACKEND"] = backend
    if backend == "jax":
        os.environ.setdefault("TPU_LOAD_LIBRARY", "0")  # the chips are JAX's; TensorFlow only reads files


def import_tensorflow(verbose: bool) -> None:
    """Import TensorFlow and initialize its devices with the start-up noise filtered (see the docstring)."""
    with filtered_native_stderr(enabled=not verbose):
        import tensorflow as tf

        tf.config.list_physical_devices()  # the CUDA probe runs here, not at import
        if os.environ.get("KERAS_BACKEND") == "jax":
            hide_accelerators_from_tensorflow()


def hide_accelerators_from_tensorflow() -> None:
    """On the JAX backend TensorFlow runs tf.data only: on the CPU, leaving every GPU's memory to JAX."""
    import tensorflow as tf

    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # already initialized (a notebook that ran TensorFlow first): nothing to take back
        pass
