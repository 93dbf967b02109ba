"""The README's TPU VM line for the JAX backend, `pip install '.[tpu-jax]'`, run against the registry.

A fresh virtual environment on this interpreter (3.11, the Python the extra names), the line exactly as
written in a copy of the source tree, then: jax[tpu] with its libtpu and tensorflow-cpu, no generic
`tensorflow` or `tensorflow-tpu`, and the installed `python -m train --backend jax` trains on the CPU to a
finished export (JAX_PLATFORMS=cpu and TPU_LOAD_LIBRARY=0: libtpu is never loaded, nothing asks the
metadata server). Not in the Python 3.10 leg: jax 0.10 needs 3.11 (the extra says so).
"""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.train.test_install import REPO, installed, registry_env, source_tree
from train import install_lines

TPU_JAX_LINE = install_lines.INSTALL_LINES["Cloud TPU VM, JAX backend (training, Python 3.11+)"]


def test_the_tpu_jax_extra_pins_jax_and_tensorflow_cpu_and_the_readme_shows_its_line():
    assert TPU_JAX_LINE == "pip install '.[tpu-jax]'"
    assert install_lines.TPU_JAX_REQUIREMENTS == (
        f"jax[tpu]=={install_lines.JAX_VERSION}",
        f"tensorflow-cpu=={install_lines.TENSORFLOW_VERSION}",
    )
    constraints = open(os.path.join(REPO, "constraints.txt"), encoding="utf-8").read()
    assert f"jax=={install_lines.JAX_VERSION}\n" in constraints  # the suite's JAX leg runs the same jax


@pytest.fixture(scope="session")
def tpu_jax_venv(tmp_path_factory):
    """A fresh venv with the README's `[tpu-jax]` line run in it: its python."""
    root = tmp_path_factory.mktemp("tpu-jax-install")
    source = source_tree(root / "src")
    venv = root / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {key: value for key, value in registry_env().items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["bash", "-c", TPU_JAX_LINE], cwd=source, env=env, capture_output=True, text=True, timeout=3600
    )
    assert result.returncode == 0, result.stderr[-5000:]
    print(f"\n{TPU_JAX_LINE}: installed in {time.monotonic() - started:.0f} s")
    return str(venv / "bin" / "python")


@pytest.mark.slow  # builds a venv from the registry (jaxlib, libtpu, tensorflow-cpu): minutes the first time
def test_the_tpu_jax_line_installs_jax_with_its_libtpu_and_tensorflow_cpu_only(tpu_jax_venv):
    found = installed(
        tpu_jax_venv, "jax", "jaxlib", "libtpu", "tensorflow-cpu", "tensorflow", "tensorflow-tpu", "keras",
        "numpy", "apache-beam", "tf-image-pipeline",
    )  # fmt: skip
    assert found["jax"] == found["jaxlib"] == install_lines.JAX_VERSION
    assert found["libtpu"] is not None, "jax[tpu] brings the libtpu it was built against"
    assert found["tensorflow-cpu"] == install_lines.TENSORFLOW_VERSION
    assert found["tensorflow"] is None and found["tensorflow-tpu"] is None
    assert found["keras"] == install_lines.KERAS_VERSIONS["3.11+"]
    assert found["numpy"] == install_lines.NUMPY_VERSIONS["3.11+"]
    assert found["apache-beam"] is None and found["tf-image-pipeline"] is not None


@pytest.mark.slow  # trains a few steps on JAX and exports through a TensorFlow process: ~1-2 min
def test_the_tpu_jax_install_trains_on_the_cpu_with_jax_to_a_finished_export(
    tpu_jax_venv, stage1_dataset, tmp_path
):
    model_dir = tmp_path / "model"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "TPU_NAME")}
    env = {key: value for key, value in env.items() if not key.startswith("KERAS_")}
    # No TPU here: JAX on the CPU only; libtpu never loaded and the metadata server never asked.
    env.update(JAX_PLATFORMS="cpu", TPU_LOAD_LIBRARY="0", TPU_SKIP_MDS_QUERY="1", NO_GCE_CHECK="true")
    command = [tpu_jax_venv, "-m", "train", "--backend", "jax", "--data", stage1_dataset("uint8")]
    command += ["--model-dir", str(model_dir), "--steps", "4", "--global-batch-size", "8"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-5000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["backend"] == "jax" and metrics["global_step"] == 4
    assert (model_dir / "export" / "saved_model.pb").exists()
    assert (model_dir / "checkpoints" / "checkpoint.json").exists()
    where = subprocess.run(
        [tpu_jax_venv, "-c", "import train; print(train.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(os.path.dirname(os.path.dirname(tpu_jax_venv))), where.stdout
