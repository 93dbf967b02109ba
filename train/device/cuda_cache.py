"""A persistent, large CUDA JIT cache, so that only a GPU machine's first start compiles TensorFlow's kernels.

configure_cuda_cache sets CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE before TensorFlow initializes CUDA,
keeping a user's own values (why, below the imports).
"""

import os

# Why, and what is set.
#
# Why: TensorFlow's GPU wheel carries machine code (SASS) for some GPU
# generations and PTX for the newest it knows; on a GPU it has no SASS for
# (TF 2.21: sm_60, 70, 80, 89 and compute_90, so H100/H200 at sm_90 among
# others), the CUDA driver compiles every kernel from PTX when it is first
# loaded. TensorFlow warns that this "could take 30 minutes or longer"
# (tensorflow/tensorflow#62320, 8xH100). The driver keeps what it compiled in
# its JIT cache, and a later start loads it from there; but the cache's default
# size is far below what all of TensorFlow's kernels need (256 MiB in NVIDIA's
# CUDA 10-11 guides), so older entries are evicted and a restart (the
# supervisor restarts training after every preemption) compiles again.
#
# What: before TensorFlow initializes CUDA (the driver reads these variables
# at cuInit), set, unless already set:
#
#     CUDA_CACHE_PATH     ~/.cache/tf-image-pipeline/cuda-jit ($XDG_CACHE_HOME if set): on the
#                         machine's own disk, which outlives the process and the supervisor's restarts
#                         (a model dir may be gs://, which the driver cannot write)
#     CUDA_CACHE_MAXSIZE  4 GiB (4294967296 bytes), the largest value the driver accepts
#
# Both are NVIDIA's documented variables (CUDA Programming Guide, "CUDA
# Environment Variables": https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html;
# NVIDIA's "CUDA Pro Tip: Understand Fat Binaries and JIT Caching"). A value
# the user set is kept, and CUDA_CACHE_DISABLE=1 turns the cache off as
# always. On a machine without an NVIDIA driver nothing reads them.

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
