"""The `[tpu]` interpreter the on-VM mode trains in: a venv the launcher makes on the TPU VM.

`python -m pipelines.dataflow ... --tpu local` runs on the TPU VM from an
install with Beam (stage 1's launcher), but training needs the TPU build of
TensorFlow, and the two cannot share one environment: tf.Transform and
tfx-bsl require generic `tensorflow`, which replaces `tensorflow-tpu`
(/work/shared/TPU-FACTS.md; `[all]` has no TPU build, `[tpu]` has no Beam).
So training gets its own venv, ~/tf-image-pipeline/tpu-venv, made from this
package's sdist with its [tpu] extra (the same install line a TPU VM gets
from the cloud launch, train/install_lines.py), and the supervisor and
`python -m train` run on that venv's python. The venv is made once and kept
while the package is the same: the sdist's sha256 is recorded in it, and a
different package installs again.
"""

import hashlib
import os
import subprocess
import sys

from train import install_lines

VENV_DIR = "tpu-venv"
INSTALLED_MARKER = ".tf-image-pipeline-sdist-sha256"


def venv_python(run_dir: str) -> str:
    return os.path.join(run_dir, VENV_DIR, "bin", "python")


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def install_commands(run_dir: str, sdist: str, base_python: str = sys.executable) -> list[list[str]]:
    """Make the venv (unless it exists), then install `sdist` with its [tpu] extra into it."""
    venv = os.path.join(run_dir, VENV_DIR)
    commands = [] if os.path.exists(venv_python(run_dir)) else [[base_python, "-m", "venv", venv]]
    return commands + [
        [venv_python(run_dir), "-m", "pip", "install", *install_lines.TPU_PIP_OPTIONS,
         f"{sdist}[{install_lines.TPU}]"]
    ]  # fmt: skip


def ensure_tpu_interpreter(
    run_dir: str, sdist: str, base_python: str = sys.executable, run=subprocess.run
) -> str:
    """The venv's python with `sdist[tpu]` installed: reused when it holds this sdist, (re)installed otherwise."""
    marker = os.path.join(run_dir, VENV_DIR, INSTALLED_MARKER)
    wanted = _sha256(sdist)
    if os.path.exists(venv_python(run_dir)) and os.path.exists(marker):
        with open(marker) as handle:
            if handle.read().strip() == wanted:
                return venv_python(run_dir)
    for command in install_commands(run_dir, sdist, base_python):
        run(command, check=True)
    with open(marker, "w") as handle:
        handle.write(wanted + "\n")
    return venv_python(run_dir)
