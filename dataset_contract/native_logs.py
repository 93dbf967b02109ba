"""TensorFlow's native start-up chatter, filtered out of stderr as it is written."""

import contextlib
import os
import re
import select
import subprocess
import sys

# glog-style INFO lines ("I0000 00:00:...") and absl's banner about them; the
# CUDA probe's complaint on a machine that has no GPU driver at all; and oneDNN's
# note, logged as an error, that it leaves uint8 ops to Eigen on a CPU without
# AVX-512 (the first uint8 image a SavedModel decodes there).
NATIVE_NOISE = re.compile(
    r"^(I\d{4} |WARNING: All log messages before absl::InitializeLog\(\)|"
    r"E\d{4} .*failed call to cuInit: .*(UNKNOWN ERROR \(303\)|CUDA_ERROR_NO_DEVICE)|"
    r"E\d{4} .*oneDNN supports DT_UINT8 only on platforms with AVX-512)"
)


def is_native_noise(line: str) -> bool:
    """Whether a line TensorFlow's native start-up printed is INFO chatter (dropped unless --verbose)."""
    return bool(NATIVE_NOISE.match(line))


# The filter between native code and the real stderr, in its own process: a native abort (a libtpu or
# driver fatal error during `import tensorflow`) kills this process at once, threads included, but the
# filter reads on to the end of the pipe, so the fatal lines reach the log as they were written.
_FILTER_PROGRAM = """
import os, re, signal, sys
for name in ("SIGINT", "SIGHUP", "SIGTERM"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)  # it ends when the pipe does, after the last line
noise = re.compile(sys.argv[1].encode())
out = sys.stdout.buffer
os.close(int(sys.argv[2]))  # ready: about to read
for line in sys.stdin.buffer:
    if not noise.match(line):
        out.write(line)
        out.flush()
"""
# How long the end of the block waits for the filter to pass on the last lines.
_FILTER_DRAIN_SECONDS = 10.0
# How long the start waits for the filter to be reading: a native abort at once (the import's first lines)
# then finds it running, and its fatal line reaches the log while the process dies, not after whoever
# watches that process (train.tools.supervisor) has logged its death and exited.
_FILTER_START_SECONDS = 10.0


@contextlib.contextmanager
def filtered_native_stderr(enabled: bool = True):
    """Pass what native code writes to stderr (fd 2) meanwhile, line by line, through a filter process that
    drops the noise (a fatal line still reaches the log)."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    ready_read, ready_write = os.pipe()  # the filter closes its end once it reads (or dies): EOF here
    try:
        filter_process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FILTER_PROGRAM, NATIVE_NOISE.pattern, str(ready_write)],
            stdin=subprocess.PIPE,
            stdout=saved,
            stderr=saved,
            pass_fds=(ready_write,),
        )
    except OSError:
        filter_process = None
    finally:
        os.close(ready_write)
    if filter_process is None:
        os.close(ready_read)
        os.close(saved)
        yield  # no filter to be had: the noise stays, nothing is lost
        return
    try:
        ready = select.poll()  # not select.select: a process with many files open has descriptors over 1023
        ready.register(ready_read, select.POLLIN)
        ready.poll(_FILTER_START_SECONDS * 1000)
    finally:
        os.close(ready_read)
    os.dup2(filter_process.stdin.fileno(), 2)
    filter_process.stdin.close()  # fd 2 is now the pipe's only write end here
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's write end: the filter drains it and exits
        os.close(saved)
        try:
            filter_process.wait(timeout=_FILTER_DRAIN_SECONDS)
        except subprocess.TimeoutExpired:
            pass  # a process started meanwhile still holds the pipe: the filter ends with it


def import_tensorflow_quietly(verbose: bool = False) -> None:
    """Import TensorFlow with its devices probed, the start-up noise filtered unless `verbose` (and
    TF_CPP_MIN_LOG_LEVEL 1 unless the user set it). A no-op once TensorFlow is imported."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "1")
    with filtered_native_stderr(enabled=not verbose):
        import tensorflow as tf  # noqa: PLC0415

        tf.config.list_physical_devices()  # the CUDA probe ("failed call to cuInit") runs here, not at import
