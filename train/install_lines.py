"""How to install this package on each kind of machine: the pins and the command lines.

One place for what the README shows, what `tests/train/test_install.py` runs in a
fresh virtual environment, and what `pipelines/dataflow.py` runs on a TPU
VM. Nothing here imports TensorFlow.

Why extras rather than one requirement set: generic `tensorflow` and
`tensorflow-tpu` install the same `tensorflow/` package and overwrite each
other, and tf.Transform, tfx-bsl and tensorflow-serving-api all require the
generic one. So `setup.py`'s install_requires hold no TensorFlow at all; each
machine kind names its own through an extra:

  all    stage 1 (Beam, tf.Transform), the workflows, training on the CPU: TensorFlow 2.21
  train  training only (no Beam, no tf.Transform), on the CPU: TensorFlow 2.21
  gpu    training only, with the CUDA libraries: tensorflow[and-cuda] 2.21
  tpu    training only, on a Cloud TPU VM: tensorflow-tpu 2.20 and the libtpu built for it
  tpu-jax  training only, on a Cloud TPU VM, on Keras' JAX backend (--backend jax): jax[tpu] (with the
         libtpu it pins) and tensorflow-cpu for tf.data only; Python 3.11+
"""

TENSORFLOW_VERSION = "2.21.0"

# The newest tensorflow-tpu on PyPI (2.20.0, 2025-08; there is no 2.21). The
# train package is tested on both this and TENSORFLOW_VERSION (tests/train/test_install.py).
TENSORFLOW_TPU_VERSION = "2.20.0"

# tensorflow-tpu 2.20.0's wheel requires `libtpu~=0.0.14`, which pip resolves to
# the newest libtpu (0.0.52 when tried): a JAX-era library without TensorFlow's
# TPU ops, with which `import tensorflow` aborts ("ConfigureDistributedTpuOp_DoWork
# not available in this library"). 0.0.14 is the libtpu the release was cut
# against. Where that comes from: TensorFlow's tensorflow/tools/pip_package/setup.py
# pins the TPU wheel's libtpu from `LATEST_RELEASE_LIBTPU_VERSION` ("update this
# version when a new libtpu stable version is released"); a stored copy of its
# master branch (after 2.19.1's libtpu 0.0.10) reads LATEST_RELEASE_LIBTPU_VERSION =
# '0.0.13', NEXT_LIBTPU_VERSION = '0.0.14', and the 2.20.0 wheel's own requirement
# is `libtpu~=0.0.14` (the same scheme gave 2.19.1 `libtpu==0.0.10`). Checked here
# without loading either library: 0.0.14's libtpu.so has the ConfigureDistributedTpuOp_DoWork entry point,
# 0.0.52's has not (tests/train/test_install.py holds the installed one to it).
# Both are on PyPI, so no `-f https://storage.googleapis.com/libtpu-tf-releases/index.html`
# is needed (that index served the 2.18 line's `libtpu==2.18.0`).
LIBTPU_VERSION = "0.0.14"

# Keras' JAX backend on a TPU VM (--backend jax): jax[tpu] pins its own libtpu (0.0.42.* for 0.10.2), and
# needs Python 3.11 (jax 0.10 and Keras 3.13+ dropped 3.10; on 3.10 jax[tpu] resolves jax 0.6 and Keras
# 3.12, versions this package is not tested with, so the extra requires 3.11). TensorFlow only runs
# tf.data there, on the CPU: tensorflow-cpu, the same TensorFlow without CUDA and TPU support.
JAX_VERSION = "0.10.2"
JAX_PYTHON = "3.11"
# No python_version marker: on 3.10 the install fails, with pip naming jax's Requires-Python, rather than
# installing a training package without its backend.
TPU_JAX_REQUIREMENTS = (f"jax[tpu]=={JAX_VERSION}", f"tensorflow-cpu=={TENSORFLOW_VERSION}")

# A Cloud TPU VM image (Ubuntu 22.04) has Python 3.10 only, so the [tpu-jax] extra gets a uv-managed
# CPython 3.11 (python-build-standalone, downloaded by `uv python install`) in a venv of its own. uv comes from
# the registry (`pip install uv`: the wheel carries the binary; `python -m uv` runs it without PATH changes).
UV_VERSION = "0.13.9"
PACKAGE_NAME = (
    "tf-image-pipeline"  # setup.py's name: reinstalled into an existing venv (a new sdist, same version)
)


def tpu_jax_venv_commands(python: str, package: str, venv: str, pip_user: bool) -> list[list[str]]:
    """uv (into `python`: --user for a system Python), a uv-managed Python 3.11, a venv on it, `package[tpu-jax]`.

    Run again on the same machine it reuses the interpreter and the venv, and reinstalls the package.
    """
    uv = [python, "-m", "uv"]
    return [
        [python, "-m", "pip", "install", "--quiet", *(["--user"] if pip_user else []), f"uv=={UV_VERSION}"],
        [*uv, "python", "install", JAX_PYTHON],
        [*uv, "venv", "--allow-existing", "--managed-python", "--python", JAX_PYTHON, venv],
        [*uv, "pip", "install", "--compile-bytecode", "--python", f"{venv}/bin/python", "--reinstall-package",
         PACKAGE_NAME, f"{package}[{TPU_JAX}]"],
    ]  # fmt: skip


TENSORFLOW_REQUIREMENT = f"tensorflow=={TENSORFLOW_VERSION}"
TENSORFLOW_GPU_REQUIREMENT = f"tensorflow[and-cuda]=={TENSORFLOW_VERSION}"
TPU_REQUIREMENTS = (f"tensorflow-tpu=={TENSORFLOW_TPU_VERSION}", f"libtpu=={LIBTPU_VERSION}")
# Keras and NumPy per Python version, at the versions the test suite runs on that Python
# (constraints.txt on 3.11, constraints-py310.txt on 3.10; tests/train/test_install.py holds them equal).
# The trainer relies on private Keras hooks, so a Keras the suite never ran is a risk; and left free, the
# training-only extras resolve a NumPy no Beam install allows (2.5 on 3.11+). Keras 3.13+ and NumPy 2.3+
# require Python 3.11, and a Cloud TPU VM image (Ubuntu 22.04) has Python 3.10: it gets the last releases
# that support 3.10.
KERAS_VERSIONS = {"3.10": "3.12.4", "3.11+": "3.15.1"}
NUMPY_VERSIONS = {"3.10": "2.2.6", "3.11+": "2.4.6"}


def _per_python(package: str, versions: dict[str, str]) -> tuple[str, ...]:
    return (
        f'{package}=={versions["3.10"]}; python_version < "3.11"',
        f'{package}=={versions["3.11+"]}; python_version >= "3.11"',
    )


TRAINING_PINS = _per_python("keras", KERAS_VERSIONS) + _per_python("numpy", NUMPY_VERSIONS)

# What stage 1 needs besides Beam (which a Dataflow worker's container already has). Dataflow
# installs a `--setup_file` package without extras, so a launch without the worker image must hand
# these to the workers itself (e.g. `--requirements_file` with `--requirements_cache skip`).
STAGE1_REQUIREMENTS = (TENSORFLOW_REQUIREMENT, "tensorflow-transform==1.21.0")

# The extras of setup.py, by machine kind.
ALL, TRAIN, GPU, TPU, TPU_JAX = "all", "train", "gpu", "tpu", "tpu-jax"

# Extra pip options the TPU install needs (none: tensorflow-tpu and its libtpu are both on PyPI).
TPU_PIP_OPTIONS: tuple[str, ...] = ()


def pip_install(package: str, extra: str, options: tuple[str, ...] = ()) -> str:
    """`pip install '<package>[extra]'`: `package` is a source tree (`.`) or a built sdist/wheel."""
    return " ".join(["pip install", *options, f"'{package}[{extra}]'"])


def tpu_install_command(package: str) -> str:
    """The install on a TPU VM (every worker of a slice), `package` being `.` or the staged sdist."""
    return pip_install(package, TPU, TPU_PIP_OPTIONS)


# What the README's install section shows, one line per machine kind, run from a clone.
INSTALL_LINES = {
    "laptop / CPU (both stages and the workflows)": pip_install(".", ALL),
    "GPU machine (training)": pip_install(".", GPU),
    "Cloud TPU VM (training)": tpu_install_command("."),
    "Cloud TPU VM, JAX backend (training, Python 3.11+)": pip_install(".", TPU_JAX),
    "Dataflow workers (stage 1)": "gcloud builds submit --tag REGION-docker.pkg.dev/PROJECT/REPOSITORY/tf-image-pipeline:TAG .",
}

# What a GPU machine without TensorFlow's CUDA libraries is told to run.
GPU_INSTALL_LINE = INSTALL_LINES["GPU machine (training)"]
