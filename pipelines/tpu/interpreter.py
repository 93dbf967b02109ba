"""The interpreter the on-VM mode trains in: a venv the launcher makes on the TPU VM.

`[tpu]` (TensorFlow) in a venv of the launcher's Python; `[tpu-jax]` (--backend jax) in a venv on a
uv-managed Python 3.11 (train/install_lines.py spells the uv commands, the remote launch runs the same).
Why and how: docs/internals.md.
"""

import hashlib
import os
import subprocess
import sys

from pipelines.workflow import WorkflowError
from train import install_lines
from train.config import JAX

VENV_DIR = "tpu-venv"
JAX_VENV_DIR = "jax-venv"  # pipelines/tpu/launch.py's JAX_VENV, on the remote launch's VMs
INSTALLED_MARKER = ".tf-image-pipeline-sdist-sha256"


class JaxInstallError(WorkflowError):
    """A step of the [tpu-jax] install failed (uv, its Python 3.11, the registry): the workflow stops, exit 2."""

    def __init__(self, command: list[str], why: str):
        # What to do, in a few lines (the step's own are above).
        super().__init__(
            f"the JAX backend's training venv could not be made on this TPU VM: `{subprocess.list2cmdline(command)}` "
            f"{why}.\n"
            "  It needs the registry (pypi.org: uv and the [tpu-jax] packages) and GitHub (python-build-standalone: "
            "uv's Python 3.11).\n"
            "  With the network back, run the same command again: it reuses what was done. Or train with "
            "--backend tensorflow (tensorflow-tpu on the image's Python, no uv)."
        )


def venv_python(run_dir: str, venv_dir: str = VENV_DIR) -> str:
    return os.path.join(run_dir, venv_dir, "bin", "python")


def venv_problem(base_python: str | None = None) -> str | None:
    """None when `base_python` (default: this Python) can make a venv with pip; else what to install, in words."""
    base_python = base_python or sys.executable
    probe = "import sys; print('%d.%d' % sys.version_info[:2], flush=True); import ensurepip, venv"
    try:
        result = subprocess.run([base_python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{base_python} cannot be run to make the training venv: {exc}"
    if result.returncode == 0:
        return None
    version = result.stdout.strip() or "3.X"
    return (
        f"the on-VM mode trains in a venv of its own (~/tf-image-pipeline/{VENV_DIR}, this package's [tpu] "
        f"extra), and this Python ({base_python}, {version}) cannot make one: its venv module has no ensurepip, "
        f"which Debian and Ubuntu ship apart. Run: sudo apt-get install python{version}-venv (or "
        f"scripts/tpu_vm_setup.sh, which sets up this launcher on a TPU VM). Python said: "
        f"{(result.stderr.strip().splitlines() or ['-'])[-1]}"
    )


def _ensure_venv(run_dir: str, venv_dir: str, sdist: str, commands, run, failed=None) -> str:
    """The python of `venv_dir`, reused when its marker names this sdist; else `commands` run first.

    `failed(command, reason)`, when given, makes the exception a failed command raises instead of its own."""
    python, marker = venv_python(run_dir, venv_dir), os.path.join(run_dir, venv_dir, INSTALLED_MARKER)
    with open(sdist, "rb") as handle:
        wanted = hashlib.sha256(handle.read()).hexdigest()
    if os.path.exists(python) and os.path.exists(marker):
        with open(marker) as handle:
            if handle.read().strip() == wanted:
                return python
    for command in commands:
        try:
            run(command, check=True)
        except (subprocess.CalledProcessError, OSError) as exc:
            if failed is None:
                raise
            ran = isinstance(exc, subprocess.CalledProcessError)
            raise failed(
                command, f"failed (exit {exc.returncode})" if ran else f"could not run ({exc})"
            ) from exc
    with open(marker, "w") as handle:
        handle.write(wanted + "\n")
    return python


def ensure_tpu_interpreter(
    run_dir: str, sdist: str, base_python: str = sys.executable, run=subprocess.run
) -> str:
    """The venv's python with `sdist[tpu]` installed: reused when it holds this sdist, (re)installed otherwise
    (the venv made first unless it exists)."""
    python = venv_python(run_dir)
    make = [] if os.path.exists(python) else [[base_python, "-m", "venv", os.path.join(run_dir, VENV_DIR)]]
    install = [
        python,
        "-m",
        "pip",
        "install",
        *install_lines.TPU_PIP_OPTIONS,
        f"{sdist}[{install_lines.TPU}]",
    ]
    return _ensure_venv(run_dir, VENV_DIR, sdist, [*make, install], run)


def jax_install_commands(run_dir: str, sdist: str, base_python: str = sys.executable) -> list[list[str]]:
    """uv into the launcher's venv (`base_python`'s), a uv-managed Python 3.11, the JAX venv, `sdist[tpu-jax]`."""
    venv = os.path.join(run_dir, JAX_VENV_DIR)
    return install_lines.tpu_jax_venv_commands(base_python, sdist, venv, pip_user=False)


def ensure_interpreter(
    run_dir: str, sdist: str, backend: str, base_python: str = sys.executable, run=subprocess.run
) -> str:
    """The training interpreter for `backend`, with `sdist` installed: reused when it holds this sdist."""
    if backend != JAX:
        return ensure_tpu_interpreter(run_dir, sdist, base_python, run)
    commands = jax_install_commands(run_dir, sdist, base_python)
    return _ensure_venv(run_dir, JAX_VENV_DIR, sdist, commands, run, failed=JaxInstallError)
