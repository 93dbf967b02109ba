"""A persistent, large CUDA JIT cache, so that only a GPU machine's first start compiles TensorFlow's kernels.

configure_cuda_cache sets CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE before TensorFlow initializes CUDA,
keeping a user's own values (why: docs/internals.md).
"""

import os

CACHE_DIR_NAME = os.path.join("tf-image-pipeline", "cuda-jit")
CUDA_CACHE_MAXSIZE_BYTES = 4 << 30


def default_cache_path(environ=os.environ) -> str:
    """$XDG_CACHE_HOME/tf-image-pipeline/cuda-jit, or ~/.cache/... without it."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, CACHE_DIR_NAME)


def configure_cuda_cache(environ=os.environ) -> dict:
    """Set CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE in `environ` where unset; returns what was set.

    Call before TensorFlow is imported. The directory is created (the driver
    does not create missing parents); if it cannot be, the variables are left
    alone and the driver uses its own default.
    """
    chosen = {}
    if "CUDA_CACHE_PATH" not in environ:
        path = default_cache_path(environ)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:
            path = None
        if path:
            chosen["CUDA_CACHE_PATH"] = path
    if "CUDA_CACHE_MAXSIZE" not in environ:
        chosen["CUDA_CACHE_MAXSIZE"] = str(CUDA_CACHE_MAXSIZE_BYTES)
    environ.update(chosen)
    return chosen
