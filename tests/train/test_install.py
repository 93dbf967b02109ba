"""The install lines of the README, run against the registry as a user would.

TPU VM: a fresh virtual environment, the README's TPU line exactly as written
(`pip install '.[tpu]'` in a copy of the source tree), then checks that no
generic `tensorflow` was installed beside tensorflow-tpu and its libtpu, and
runs the installed `python -m train` on the CPU to a finished export. One
venv per session; pip's cache (~/.cache/pip) makes later runs quicker (first
run here: ~4 min to install, ~1 min to train).

GPU and training-only CPU: the CUDA wheels are gigabytes, so those lines are
only resolved (`pip install --dry-run --report`) and the report is checked.

Every venv and resolution here uses this interpreter: scripts/test.sh runs this
file on Python 3.11 (the main suite) and on Python 3.10 (scripts/test_py310.sh,
the Python of Cloud TPU VM images), where the extras pin other Keras and NumPy.
"""

import importlib.metadata
import json
import mmap
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from train import install_lines

# The Python 3.10 leg (scripts/test_py310.sh) runs these, slow ones included: TPU VMs have Python 3.10.
pytestmark = pytest.mark.py310

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(REPO, "README.md")
NOT_SOURCE = (
    ".git",
    ".venv",
    ".venv-py310",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    ".pytest_cache",
    ".ruff_cache",
)
NOT_SOURCE += ("demo-output", "workdir", "dry-run")
TPU_LINE = install_lines.INSTALL_LINES["Cloud TPU VM (training)"]


def registry_env() -> dict:
    """This process's environment for pip, without a proxy on this machine.

    The `gcs_emulator` fixture lives for the whole session and sets HTTPS_PROXY to its TLS proxy, which
    tunnels only to *.googleapis.com; pip must reach the registry directly, as a user's would.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not (
            key.lower() in ("https_proxy", "http_proxy") and ("127.0.0.1" in value or "localhost" in value)
        )
    }
    return env


def source_tree(destination) -> str:
    """A copy of the repository as a clone has it, so that the build leaves nothing in the real one."""
    shutil.copytree(REPO, destination, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    return str(destination)


def installed(python, *names) -> dict:
    """{distribution: version or None} in the environment of `python`."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def version(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({name: version(name) for name in sys.argv[1:]}))\n"
    )
    result = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def resolve(line: str, source: str, report) -> dict:
    """What `line` (a README `pip install` line) would install into an empty environment: {name: version}."""
    words = shlex.split(line)
    assert words[:2] == ["pip", "install"], line
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    # The registry serves no separate wheel metadata (PEP 658), so a plain dry run downloads every wheel
    # whole: 3.2 GB in /tmp for the GPU line's CUDA libraries, which once filled CI's disk. fast-deps reads
    # each wheel's METADATA with HTTP range requests instead (5 s, nothing on disk); it changes only how
    # pip learns the dependencies, and resolves the same 55 distributions at the same versions.
    command += ["--use-feature=fast-deps", "--no-cache-dir", "--report", str(report), *words[2:]]
    result = subprocess.run(
        command, cwd=source, env=registry_env(), capture_output=True, text=True, timeout=1200
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = json.loads(report.read_text())["install"]
    return {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in resolved
    }


def pinned_for(python: tuple[int, int], versions: dict[str, str]) -> str:
    """The version train/install_lines.py pins for `python` (KERAS_VERSIONS or NUMPY_VERSIONS)."""
    return versions["3.10"] if python < (3, 11) else versions["3.11+"]


def constraint(path: str, package: str) -> str:
    text = open(os.path.join(REPO, path), encoding="utf-8").read()
    (version,) = re.findall(rf"^{re.escape(package)}==(\S+)$", text, flags=re.MULTILINE)
    return version


@pytest.mark.parametrize(
    ("constraints", "python"), [("constraints.txt", (3, 11)), ("constraints-py310.txt", (3, 10))]
)
def test_the_extras_pin_the_keras_and_numpy_that_the_suite_installs_on_each_python(constraints, python):
    # The suite's environments (scripts/bootstrap.sh on 3.11, scripts/test_py310.sh on 3.10) install
    # these constraints; a user's `pip install '.[tpu]'` gets the extras' pins. They must agree.
    assert constraint(constraints, "keras") == pinned_for(python, install_lines.KERAS_VERSIONS)
    assert constraint(constraints, "numpy") == pinned_for(python, install_lines.NUMPY_VERSIONS)


def test_this_python_runs_the_keras_and_numpy_the_extras_pin_for_it():
    python = sys.version_info[:2]
    assert importlib.metadata.version("keras") == pinned_for(python, install_lines.KERAS_VERSIONS)
    assert importlib.metadata.version("numpy") == pinned_for(python, install_lines.NUMPY_VERSIONS)


def test_the_readme_gives_one_install_line_per_machine_kind():
    readme = open(README, encoding="utf-8").read()
    for kind, line in install_lines.INSTALL_LINES.items():
        assert line in readme, f"README lacks the {kind} install line: {line}"


@pytest.fixture(scope="session")
def tpu_venv(tmp_path_factory):
    """A fresh venv with the README's TPU VM line run in it: (its python, seconds the install took)."""
    root = tmp_path_factory.mktemp("tpu-install")
    source = source_tree(root / "src")
    venv = root / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {key: value for key, value in registry_env().items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # `pip` in the line is the venv's
    result = subprocess.run(
        ["bash", "-c", TPU_LINE], cwd=source, env=env, capture_output=True, text=True, timeout=3600
    )
    assert result.returncode == 0, result.stderr[-5000:]
    seconds = time.monotonic() - started
    print(f"\n{TPU_LINE}: installed in {seconds:.0f} s")
    return str(venv / "bin" / "python"), seconds


@pytest.mark.slow  # builds a venv from the registry: ~4 min the first time, less with pip's cache
def test_the_tpu_line_installs_tensorflow_tpu_and_its_libtpu_and_no_generic_tensorflow(tpu_venv):
    python, _ = tpu_venv
    found = installed(
        python, "tensorflow", "tensorflow-tpu", "libtpu", "tensorflow-serving-api", "tensorflow-transform",
        "tfx-bsl", "apache-beam", "tf-image-pipeline", "keras", "numpy",
    )  # fmt: skip
    assert found["tensorflow"] is None, "generic tensorflow was installed: it overwrites tensorflow-tpu"
    assert found["tensorflow-tpu"] == install_lines.TENSORFLOW_TPU_VERSION
    assert found["libtpu"] == install_lines.LIBTPU_VERSION
    # The venv's Python is this one (3.10 in scripts/test_py310.sh, as on a TPU VM): the Keras and NumPy
    # the extra pins for it, which the rest of this session's train tests run with.
    assert found["keras"] == pinned_for(sys.version_info[:2], install_lines.KERAS_VERSIONS)
    assert found["numpy"] == pinned_for(sys.version_info[:2], install_lines.NUMPY_VERSIONS)
    for absent in ("tensorflow-serving-api", "tensorflow-transform", "tfx-bsl", "apache-beam"):
        assert found[absent] is None, f"{absent} {found[absent]} was installed"
    assert found["tf-image-pipeline"] is not None


@pytest.mark.slow  # reads the installed libtpu.so (~340 MB) once
def test_the_installed_libtpu_carries_tensorflows_tpu_ops(tpu_venv):
    # TensorFlow looks TPU ops up by name in libtpu.so; a libtpu without them (0.0.52, which
    # `libtpu~=0.0.14` resolves to unpinned) makes `import tensorflow` abort on a TPU VM with
    # "ConfigureDistributedTpuOp_DoWork not available in this library". Read, never loaded.
    python, _ = tpu_venv
    where = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('libtpu').submodule_search_locations[0])"],
        capture_output=True, text=True, check=True, env={**os.environ, "TPU_LOAD_LIBRARY": "0"},
    )  # fmt: skip
    with open(os.path.join(where.stdout.strip(), "libtpu.so"), "rb") as library:
        with mmap.mmap(library.fileno(), 0, access=mmap.ACCESS_READ) as data:
            assert data.find(b"ConfigureDistributedTpuOp_DoWork\0") >= 0


@pytest.mark.slow  # imports TensorFlow and trains a few steps in the TPU venv: ~1 min
def test_the_tpu_install_trains_on_the_cpu_to_a_finished_export(tpu_venv, stage1_dataset, tmp_path):
    python, _ = tpu_venv
    model_dir = tmp_path / "model"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "TPU_NAME")}
    # Off a TPU, tensorflow-tpu's libtpu must not be loaded: loading it polls the GCE metadata
    # server for TPU settings (network traffic off this machine), and a libtpu that is not the one
    # the TensorFlow build expects aborts `import tensorflow`. TPU_LOAD_LIBRARY=0 keeps it unloaded.
    env.update(TPU_LOAD_LIBRARY="0", NO_GCE_CHECK="true")
    command = [python, "-m", "train", "--data", stage1_dataset("uint8"), "--model-dir", str(model_dir)]
    command += ["--steps", "4", "--global-batch-size", "8"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-5000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 4 and metrics["strategy"] == "default"
    assert (model_dir / "export" / "saved_model.pb").exists()
    assert (model_dir / "export" / "assets.extra" / "tf_serving_warmup_requests").exists()
    # The train package that ran is the installed one, not this checkout.
    where = subprocess.run(
        [python, "-c", "import train; print(train.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(os.path.dirname(os.path.dirname(python))), where.stdout


@pytest.mark.slow  # imports TensorFlow in the TPU venv: ~30 s
def test_the_tpu_install_refuses_xla_on_the_cpu_with_a_clear_error(tpu_venv, stage1_dataset, tmp_path):
    # Found by running train on tensorflow-tpu 2.20: its build has no XLA:CPU backend, and a step
    # compiled for the CPU failed deep in Keras ("no registered transfer manager for platform Host").
    python, _ = tpu_venv
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "TPU_NAME")}
    env.update(TPU_LOAD_LIBRARY="0", NO_GCE_CHECK="true")  # as above: no libtpu off a TPU
    command = [
        python,
        "-m",
        "train",
        "--data",
        stage1_dataset("uint8"),
        "--model-dir",
        str(tmp_path / "model"),
    ]
    command += ["--steps", "2", "--global-batch-size", "8", "--jit-compile", "on"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 2, result.stderr[-5000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --jit-compile on: this TensorFlow (2.20.0) cannot compile for the CPU"), (
        error
    )
    assert "--jit-compile off" in error


def test_generic_tensorflow_compiles_for_the_cpu_so_xla_is_let_through():
    from train.device import accelerator

    cpu = accelerator.DeviceDescription(kind=accelerator.CPU)
    accelerator.check_cpu_xla_available(cpu, accelerator.choose_defaults(cpu, jit_compile="on"))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return source_tree(tmp_path_factory.mktemp("resolve") / "src")


@pytest.mark.slow  # resolves against the registry: ~30 s
def test_the_gpu_line_resolves_tensorflow_with_its_cuda_libraries(source, tmp_path):
    resolved = resolve(install_lines.GPU_INSTALL_LINE, source, tmp_path / "gpu.json")
    assert resolved.get("tensorflow") == install_lines.TENSORFLOW_VERSION
    assert "tensorflow-tpu" not in resolved
    for cuda in ("nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12", "nvidia-nccl-cu12"):
        assert cuda in resolved, f"{cuda} missing from the GPU install: {sorted(resolved)}"


@pytest.mark.slow  # resolves against the registry: ~20 s
def test_the_train_extra_resolves_without_beam_or_tf_transform(source, tmp_path):
    resolved = resolve(install_lines.pip_install(".", install_lines.TRAIN), source, tmp_path / "train.json")
    assert resolved.get("tensorflow") == install_lines.TENSORFLOW_VERSION
    for absent in ("apache-beam", "tensorflow-transform", "tfx-bsl", "tensorflow-serving-api"):
        assert absent not in resolved, f"{absent} {resolved[absent]} in the training-only install"
    assert not any(name.startswith("nvidia-") for name in resolved)
