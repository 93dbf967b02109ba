"""The TPU VM install for the JAX backend, as the docs give it, run against the registry.

The docs' commands (install_lines.tpu_jax_venv_commands: docs/training.md, the cloud launch, the on-VM mode),
in a copy of the source tree: uv from the registry into a fresh venv (the launcher's venv, as the on-VM mode
has it; a TPU VM's `python3 -m pip install --user` differs only by --user), `uv python install 3.11`, `uv venv
--managed-python` on it, and `'.[tpu-jax]'` from the registry. Then: jax[tpu] with its libtpu and
tensorflow-cpu, no generic `tensorflow` or `tensorflow-tpu`, and the installed `python -m train --backend jax`
trains on the CPU to a finished export (JAX_PLATFORMS=cpu and TPU_LOAD_LIBRARY=0: libtpu is never loaded,
nothing asks the metadata server). Not in the Python 3.10 leg: jax 0.10 needs 3.11 (the extra says so).

`uv python install` downloads python-build-standalone from GitHub, not from the registry, and a test machine
may not reach GitHub: uv is pointed (UV_PYTHON_DOWNLOADS_JSON_URL) at a stand-in download, this machine's own
Python 3.11 packed as uv unpacks a managed one, so the command runs as written and every package still comes
from the registry. uv's own cache is kept between sessions (the registry's files, not an environment).
"""

import json
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import tarfile
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


def test_the_docs_give_the_jax_venv_commands_this_test_runs():
    with open(os.path.join(REPO, "docs", "training.md"), encoding="utf-8") as handle:
        text = handle.read()
    block = text[text.index("```bash\npython3 -m pip install --quiet --user uv==") :].split("```")[1]
    documented = [shlex.split(line) for line in block.splitlines()[1:] if line.strip()]
    venv = "~/tf-image-pipeline/jax-venv"  # the on-VM mode's and the launch's place (pipelines/tpu/)
    assert documented == install_lines.tpu_jax_venv_commands("python3", ".", venv, pip_user=True)


def stand_in_python_download(root) -> dict:
    """uv's environment for `uv python install 3.11` off GitHub: this Python, packed as a managed download.

    A tarball of this interpreter's base install (its `python/` prefix, as python-build-standalone's
    install_only archives have it) and a downloads list naming it, which UV_PYTHON_DOWNLOADS_JSON_URL gives
    uv in place of its own. Its executable finds its standard library from where it lies.
    """
    base = sys.base_prefix
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    archive = root / f"cpython-{platform.python_version()}-stand-in.tar"
    skipped = ("site-packages", "dist-packages", "test", "__pycache__", "idlelib", "tkinter")
    with tarfile.open(archive, "w") as packed:
        packed.add(os.path.realpath(sys._base_executable), f"python/bin/python{version}")
        packed.add(sysconfig.get_paths()["stdlib"], f"python/lib/python{version}", filter=_without(skipped))
        for library in sysconfig.get_config_vars("INSTSONAME", "LDLIBRARY"):
            if library and os.path.exists(os.path.join(base, "lib", library)):
                packed.add(os.path.join(base, "lib", library), f"python/lib/{library}")
    major, minor, patch = sys.version_info[:3]
    key = f"cpython-{major}.{minor}.{patch}-linux-{platform.machine()}-gnu"
    downloads = root / "python-downloads.json"
    downloads.write_text(
        json.dumps({
            key: {"name": "cpython", "arch": {"family": platform.machine(), "variant": None}, "os": "linux",
                  "libc": "gnu", "major": major, "minor": minor, "patch": patch, "prerelease": "",
                  "url": archive.as_uri(), "sha256": None, "variant": None, "build": "0"},
        })
    )  # fmt: skip
    return {
        "UV_PYTHON_DOWNLOADS_JSON_URL": downloads.as_uri(),
        "UV_PYTHON_INSTALL_DIR": str(root / "uv-python"),  # not the user's managed Pythons
        "UV_PYTHON_BIN_DIR": str(root / "uv-bin"),  # nor ~/.local/bin
    }


def _without(names):
    def keep(member):
        return None if set(member.name.split("/")) & set(names) else member

    return keep


@pytest.fixture(scope="session")
def tpu_jax_venv(tmp_path_factory):
    """A fresh venv made by the docs' uv commands, with '.[tpu-jax]' from the registry: its python."""
    if sys.platform != "linux" or sys.version_info[:2] != (3, 11):
        pytest.skip("the stand-in download is this Linux machine's Python 3.11")
    root = tmp_path_factory.mktemp("tpu-jax-install")
    source = source_tree(root / "src")
    started = time.monotonic()
    launcher = root / "launcher-venv"
    subprocess.run([sys.executable, "-m", "venv", str(launcher)], check=True)
    venv = root / "jax-venv"
    env = {key: value for key, value in registry_env().items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env = {key: value for key, value in env.items() if not key.startswith("UV_")}
    env.update(stand_in_python_download(root))
    commands = install_lines.tpu_jax_venv_commands(str(launcher / "bin" / "python"), ".", str(venv), False)
    for command in commands:
        result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=3600)
        assert result.returncode == 0, (command, result.stderr[-5000:])
    print(f"\n{len(commands)} uv install commands: {time.monotonic() - started:.0f} s")
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
