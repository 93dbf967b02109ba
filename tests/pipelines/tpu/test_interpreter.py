"""The on-VM mode trains in a [tpu] venv the launcher makes: which interpreter runs, and when it is (re)made.

The venv is made for real (without pip, which is fast); the `pip install
'SDIST[tpu]'` step is recorded instead of run: installing tensorflow-tpu is the
install test's job (tests/train/test_install.py), not this one's.
"""

import os
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from pipelines import dataflow
from pipelines.tpu import interpreter as tpu_interpreter
from pipelines.tpu import launch as tpu_launch
from train import install_lines
from train.tools import supervisor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Installer:
    """Runs the venv command for real (without pip) and records the pip install."""

    def __init__(self):
        self.commands = []

    def __call__(self, command, check=True):
        self.commands.append(list(command))
        if command[1:3] == ["-m", "venv"]:
            subprocess.run([*command, "--without-pip"], check=check)


def test_the_venv_is_made_and_the_sdist_installed_with_its_tpu_extra_once_per_package(tmp_path):
    sdist = tmp_path / "tf-image-pipeline-0.1.0.tar.gz"
    sdist.write_bytes(b"first build")
    run_dir = str(tmp_path / "run")
    installer = Installer()
    python = tpu_interpreter.ensure_tpu_interpreter(run_dir, str(sdist), run=installer)
    venv = os.path.join(run_dir, "tpu-venv")
    assert python == os.path.join(venv, "bin", "python") and os.path.exists(python)
    assert installer.commands == [
        [sys.executable, "-m", "venv", venv],
        [python, "-m", "pip", "install", f"{sdist}[tpu]"],
    ]
    # The same package again: the venv is reused as it is.
    installer.commands.clear()
    assert tpu_interpreter.ensure_tpu_interpreter(run_dir, str(sdist), run=installer) == python
    assert installer.commands == []
    # Another package (a newer checkout): installed again into the same venv.
    sdist.write_bytes(b"second build")
    tpu_interpreter.ensure_tpu_interpreter(run_dir, str(sdist), run=installer)
    assert installer.commands == [[python, "-m", "pip", "install", f"{sdist}[tpu]"]]


def test_the_on_vm_mode_starts_the_supervisor_and_training_on_the_venv_python(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", REPO)  # the venv has no packages here: the recorded install put none
    spec = {"train_args": ["--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"]}
    installer = Installer()
    pid = dataflow.train_on_this_tpu_vm(spec, run=installer)
    python = tpu_interpreter.venv_python(str(tmp_path / tpu_launch.RUN_DIR))
    # The real sdist of this checkout went into the venv with its [tpu] extra.
    (install,) = [command for command in installer.commands if "pip" in command]
    assert install[0] == python and install[-1].endswith(".tar.gz[tpu]")
    assert f"Training interpreter: {python}" in capsys.readouterr().out
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
        time.sleep(0.1)
    assert os.waitstatus_to_exitcode(status) == supervisor.SETUP_ERROR_EXIT_CODE
    log = (tmp_path / tpu_launch.LOG_FILE).read_text()
    assert f"run 1: {python} -m train --data" in log  # python -m train ran on the venv's python


def test_the_on_vm_mode_installs_nothing_while_a_supervisor_runs_there(tmp_path, monkeypatch, capsys):
    # A second --tpu local launch: the check for a running supervisor, under the start lock, comes before
    # the venv install, which would otherwise reinstall the package under the running trainer.
    monkeypatch.setenv("HOME", str(tmp_path))
    run_dir = tmp_path / tpu_launch.RUN_DIR
    run_dir.mkdir()
    running = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "train.tools.supervisor"]
    )
    try:
        (run_dir / "supervisor.pid").write_text(f"{running.pid}\n")
        deadline = time.monotonic() + 30  # until its cmdline is readable: an instant after the fork it is not
        while (
            tpu_launch.running_supervisor(str(run_dir / "supervisor.pid")) is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        monkeypatch.setattr(dataflow, "build_sdist", lambda build_dir: pytest.fail("the sdist was built"))
        installer = Installer()
        assert dataflow.train_on_this_tpu_vm({"train_args": []}, run=installer) == running.pid
        assert installer.commands == []
        assert "is already running (not started again)" in capsys.readouterr().out
    finally:
        running.kill()
        running.wait()


def python_without_ensurepip(tmp_path):
    """This Python as Debian and Ubuntu ship it without python3.X-venv: its ensurepip cannot be imported."""
    hidden = tmp_path / "hide-ensurepip"
    (hidden / "ensurepip").mkdir(parents=True)
    (hidden / "ensurepip" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ensurepip'\")\n"
    )
    wrapper = tmp_path / "python3"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={hidden} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_python_whose_venv_has_no_ensurepip_is_named_with_the_package_to_install(tmp_path):
    assert tpu_interpreter.venv_problem(sys.executable) is None
    problem = tpu_interpreter.venv_problem(python_without_ensurepip(tmp_path))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (
        f"sudo apt-get install python{version}-venv" in problem and "No module named 'ensurepip'" in problem
    )


def test_the_on_vm_mode_refuses_before_stage_1_when_the_training_venv_cannot_be_made(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sys, "executable", python_without_ensurepip(tmp_path))
    ran = []
    monkeypatch.setattr(dataflow, "run_workflow", lambda **kwargs: ran.append(kwargs))
    code = dataflow.main(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central1",
         "--tpu", "local", "--accelerator-type", "v5litepod-8", "--skip-preprocess"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and ran == [], err
    assert "-venv" in err and "scripts/tpu_vm_setup.sh" in err and "Traceback" not in err


def test_a_failed_uv_step_of_the_on_vm_jax_install_says_what_to_do_and_exits_2(tmp_path, monkeypatch, capfd):
    # The real uv, offline, with no managed Python yet (a TPU VM without network): `uv python install 3.11`
    # fails. The workflow stops with what to do, exit 2, no traceback; nothing trains.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "managed-pythons"))
    monkeypatch.setenv("UV_PYTHON_BIN_DIR", str(tmp_path / "bin"))
    sdist = tmp_path / "tf-image-pipeline-0.1.0.tar.gz"
    sdist.write_bytes(b"an sdist")
    monkeypatch.setattr(dataflow, "build_sdist", lambda build_dir: str(sdist))
    monkeypatch.setattr(dataflow, "run_workflow", lambda **kwargs: kwargs["launch_training"]({}))
    monkeypatch.setattr(tpu_launch, "start_detached", lambda *args, **kwargs: pytest.fail("training started"))
    code = dataflow.main(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central1",
         "--tpu", "local", "--accelerator-type", "v5litepod-8", "--skip-preprocess", "--backend", "jax"]
    )  # fmt: skip
    err = capfd.readouterr().err
    assert code == 2, err
    ours = err[err.index("error: the JAX backend's training venv") :]
    assert "uv python install 3.11` failed (exit" in ours and "--backend tensorflow" in ours
    assert len(ours.splitlines()) <= 4 and "Traceback" not in err


def tiny_wheel(directory, module, name, extra, version="0.1"):
    """A pure wheel of `name` with an empty `extra`: a stand-in for a package, installed offline."""
    dist = name.replace("-", "_")
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "READY = True\n")
        archive.writestr(
            f"{dist}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nProvides-Extra: {extra}\n",
        )
        archive.writestr(
            f"{dist}-{version}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(
            f"{dist}-{version}.dist-info/RECORD",
            f"{module}/__init__.py,,\n{dist}-{version}.dist-info/METADATA,,\n",
        )
    return wheel


SETUP = os.path.join(REPO, "scripts", "tpu_vm_setup.sh")


def fake_apt(tmp_path):
    """A bin directory with an apt-get (through a sudo) that records and fails, and a stand-in uv wheel."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/apt\n[ "$1" = update ] && exit 0\n'
        'echo "E: Unable to locate package $4" >&2; exit 100\n'
    )
    (bin_dir / "sudo").write_text('#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"\n')
    for tool in ("apt-get", "sudo"):
        (bin_dir / tool).chmod(0o755)
    wheels = (
        tmp_path / "wheels"
    )  # the launcher venv gets uv too; offline here: a stand-in at the pinned version
    wheels.mkdir(exist_ok=True)
    tiny_wheel(wheels, "uv", "uv", extra="none", version=install_lines.UV_VERSION)
    return bin_dir, {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "LAUNCHER_VENV": str(tmp_path / "launcher-venv"),
    }


def run_setup(tmp_path, python, *args):
    """scripts/tpu_vm_setup.sh with PYTHON311=python, and an apt-get (through a sudo) that records and fails."""
    bin_dir, offline = fake_apt(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON311": python, **offline}
    return subprocess.run(["bash", SETUP, *args], env=env, capture_output=True, text=True, timeout=300)


def test_the_vm_setup_refuses_a_python_that_is_not_3_11_with_what_to_run(tmp_path):
    not_311 = tmp_path / "python3"
    not_311.write_text("#!/bin/sh\nexit 1\n")  # as a 3.10 answers the version check
    not_311.chmod(0o755)
    result = run_setup(tmp_path, str(not_311))
    assert result.returncode == 2, result.stderr
    assert (
        "is not Python 3.11" in result.stderr
        and "sudo apt-get install python3.11 python3.11-venv" in result.stderr
    )
    assert not (tmp_path / "launcher-venv").exists()


def test_the_vm_setup_installs_the_venv_package_or_says_to(tmp_path):
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the setup makes a Python 3.11 venv; the main suite runs on 3.11")
    result = run_setup(tmp_path, python_without_ensurepip(tmp_path))
    assert result.returncode == 2, result.stderr
    # It tried to bring python3.11-venv with apt-get, which could not; then it says what to run.
    assert "install -y -q python3.11-venv" in (tmp_path / "apt").read_text()
    assert "Run: sudo apt-get install python3.11-venv" in result.stderr
    assert not (tmp_path / "launcher-venv").exists()


def test_the_vm_setup_makes_the_launcher_venv_with_the_all_extra(tmp_path):
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the setup makes a Python 3.11 venv; the main suite runs on 3.11")
    # A wheel standing in for this package (its [all] extra empty), installed without the registry.
    wheel = tiny_wheel(tmp_path, "tiny", "tiny", extra="all")
    result = run_setup(tmp_path, sys.executable, str(wheel))
    assert result.returncode == 0, result.stderr
    python = tmp_path / "launcher-venv" / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import tiny; assert tiny.READY"], check=False).returncode == 0
    assert "The on-VM launcher is ready. Run: source" in result.stdout
    assert not (tmp_path / "apt").exists()  # nothing to install: 3.11 and its venv were there


class UvInstaller:
    """Records the JAX venv's commands; `uv venv` makes a venv for real from this Python (no download here)."""

    def __init__(self):
        self.commands = []

    def __call__(self, command, check=True):
        self.commands.append(list(command))
        if command[1:4] == ["-m", "uv", "venv"]:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", command[-1]], check=check)


def test_the_jax_venv_is_made_with_uv_on_its_own_python_3_11_once_per_package(tmp_path):
    sdist = tmp_path / "tf-image-pipeline-0.1.0.tar.gz"
    sdist.write_bytes(b"first build")
    run_dir = str(tmp_path / "run")
    installer = UvInstaller()
    python = tpu_interpreter.ensure_interpreter(run_dir, str(sdist), "jax", run=installer)
    venv = os.path.join(run_dir, "jax-venv")
    assert python == os.path.join(venv, "bin", "python") and os.path.exists(python)
    uv = [sys.executable, "-m", "uv"]
    assert installer.commands == [
        # uv into the launcher's own venv (no --user there), then a uv-managed 3.11 and the venv on it.
        [sys.executable, "-m", "pip", "install", "--quiet", f"uv=={install_lines.UV_VERSION}"],
        [*uv, "python", "install", "3.11"],
        [*uv, "venv", "--allow-existing", "--managed-python", "--python", "3.11", venv],
        [*uv, "pip", "install", "--compile-bytecode", "--python", f"{venv}/bin/python", "--reinstall-package", "tf-image-pipeline",
         f"{sdist}[tpu-jax]"],
    ]  # fmt: skip
    installer.commands.clear()
    assert tpu_interpreter.ensure_interpreter(run_dir, str(sdist), "jax", run=installer) == python
    assert installer.commands == []  # the same package: reused as it is
    # TensorFlow's [tpu] venv is another one, beside it.
    assert tpu_interpreter.ensure_interpreter(run_dir, str(sdist), "tensorflow", run=Installer()) != python


def test_the_uv_commands_parse_with_the_real_uv_at_the_pinned_version(tmp_path):
    # The interpreter download cannot run here (python-build-standalone comes from GitHub): each command is
    # given to the real uv with --help, which fails (exit 2) on any flag or argument uv does not take.
    version = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True, text=True)
    assert version.stdout.split()[:2] == ["uv", install_lines.UV_VERSION], version.stderr
    for command in tpu_interpreter.jax_install_commands(str(tmp_path / "run"), str(tmp_path / "p.tar.gz")):
        if command[1:3] == ["-m", "uv"]:
            result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, (command, result.stderr)


def test_the_uv_venv_and_install_steps_work_for_real_on_a_local_python(tmp_path):
    # The same `uv venv` and `uv pip install` as the launch, on this Python 3.11 instead of a managed one
    # (no download), twice, as a second launch on the same VM runs them: the venv is kept, the package replaced.
    wheel = tiny_wheel(tmp_path, "tf_image_pipeline", "tf-image-pipeline", extra="tpu-jax")
    venv = str(tmp_path / "jax-venv")
    commands = install_lines.tpu_jax_venv_commands(sys.executable, str(wheel), venv, pip_user=False)
    make_venv, install = commands[2], commands[3]
    make_venv[make_venv.index("--python") + 1] = sys.executable
    make_venv.remove("--managed-python")
    for _ in range(2):
        for command in (make_venv, [*install[:4], "--offline", *install[4:]]):
            result = subprocess.run(command, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, (command, result.stderr)
    check = "import sys, tf_image_pipeline; print('%d.%d' % sys.version_info[:2])"
    assert subprocess.run(
        [f"{venv}/bin/python", "-c", check], capture_output=True, text=True
    ).stdout.strip() == (f"{sys.version_info.major}.{sys.version_info.minor}")


def test_the_vm_setup_falls_back_to_a_uv_managed_python_3_11_where_apt_has_none(tmp_path):
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the setup makes a Python 3.11 venv; the main suite runs on 3.11")
    # A stock TPU VM as far as the script can tell: python3 (3.10) only, apt-get unable to install 3.11.
    # uv's interpreter download cannot run here, so `python3` records each call and, for `uv python find`,
    # answers with this Python 3.11 as the uv-managed one; the launcher venv is then made on it for real.
    bin_dir, offline = fake_apt(tmp_path)
    for tool in ("dirname", "id", "sed", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/python3-calls\n'
        f'case "$*" in *"uv python find"*) echo {sys.executable};; esac\n'
    )
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), **offline}
    wheel = tiny_wheel(tmp_path, "tiny", "tiny", extra="all")
    result = subprocess.run(
        ["/bin/bash", SETUP, str(wheel)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "install -y -q python3.11 python3.11-venv" in (tmp_path / "apt").read_text()  # apt first
    assert (tmp_path / "python3-calls").read_text().splitlines() == [
        f"-m pip install --quiet --user uv=={install_lines.UV_VERSION}",
        "-m uv python install 3.11",
        "-m uv python find --managed-python 3.11",
    ]
    assert f"using the uv-managed {sys.executable}" in result.stdout
    launcher = tmp_path / "launcher-venv" / "bin" / "python"
    assert subprocess.run([str(launcher), "-c", "import tiny, uv"], check=False).returncode == 0
