"""What a command of this package prints before its first step: logging levels and TensorFlow's start-up.

Quiet by default: Python logging at WARNING (ours, TensorFlow's, absl's),
TensorFlow's C++ logging without INFO (TF_CPP_MIN_LOG_LEVEL=1 unless set),
and the lines TensorFlow's native libraries print while they load, before
that setting takes effect ("All log messages before absl::InitializeLog()
...", "Could not find cuda drivers ...", "failed call to cuInit" on a
machine without a GPU), filtered out: warnings and errors from the native
side are kept. `--verbose` keeps everything and logs at INFO.

Environment that must be set before TensorFlow is imported is set here too:
a multi-host TPU coordinator (--tpu NAME on a TPU VM) must not claim the
local chips, which the worker's own TPU server drives (TPU_LOAD_LIBRARY=0).
"""

import contextlib
import logging
import os
import re
import sys
import tempfile

# glog-style INFO lines ("I0000 00:00:...") and absl's banner about them; the
# CUDA probe's complaint on a machine that has no GPU driver at all; and oneDNN's
# note, logged as an error, that it leaves uint8 ops to Eigen on a CPU without
# AVX-512 (the first uint8 image a SavedModel decodes there).
_NATIVE_NOISE = re.compile(
    r"^(I\d{4} |WARNING: All log messages before absl::InitializeLog\(\)|"
    r"E\d{4} .*failed call to cuInit: .*(UNKNOWN ERROR \(303\)|CUDA_ERROR_NO_DEVICE)|"
    r"E\d{4} .*oneDNN supports DT_UINT8 only on platforms with AVX-512)"
)


def configure(verbose: bool, tpu: str | None = None) -> None:
    """Logging levels and pre-import environment; call before importing TensorFlow."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")  # unless configured already
    for name in ("", "tensorflow", "absl", "keras"):
        logging.getLogger(name).setLevel(level)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "1")
    if tpu and tpu != "local":
        os.environ.setdefault("TPU_LOAD_LIBRARY", "0")


def is_native_noise(line: str) -> bool:
    """Whether a line TensorFlow's native start-up printed is INFO chatter (dropped unless --verbose)."""
    return bool(_NATIVE_NOISE.match(line))


@contextlib.contextmanager
def filtered_native_stderr(enabled: bool = True):
    """Hold what native code writes to stderr (fd 2) meanwhile, then replay it without the noise.

    Python exceptions are not affected: only the file descriptor is redirected,
    and everything that is not noise comes back, in order, when the block ends.
    """
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode(errors="replace").splitlines()
                if not is_native_noise(line)
            ]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()


def import_tensorflow(verbose: bool) -> None:
    """Import TensorFlow and initialize its devices with the start-up noise filtered (see the docstring)."""
    with filtered_native_stderr(enabled=not verbose):
        import tensorflow as tf

        tf.config.list_physical_devices()  # the CUDA probe runs here, not at import
