"""The on-VM mode trains in a [tpu] venv the launcher makes: which interpreter runs, and when it is (re)made.

The venv is made for real (without pip, which is fast); the `pip install
'SDIST[tpu]'` step is recorded instead of run: installing tensorflow-tpu is the
install test's job (tests/train/test_install.py), not this one's.
"""

import os
import subprocess
import sys
import time

from pipelines import dataflow
from pipelines.tpu import interpreter as tpu_interpreter
from pipelines.tpu import launch as tpu_launch
from pipelines.workflow import WorkflowPaths
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
    args = dataflow.build_parser().parse_args(
        [
            "--input",
            "gs://b/raw",
            "--workdir",
            "gs://b/run",
            "--project",
            "p",
            "--region",
            "r",
            "--tpu",
            "local",
        ]
    )
    spec = {"train_args": ["--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"]}
    installer = Installer()
    pid = dataflow.train_on_this_tpu_vm(args, WorkflowPaths(args.workdir), spec, run=installer)
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
