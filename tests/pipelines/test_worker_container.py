"""The Dataflow worker image (Dockerfile) stays in step with the launcher.

No Docker engine runs here, so the image is not built in the tests. What a
build on Cloud Build depends on is checked instead: Dataflow refuses (or
breaks at run time) a worker whose Python minor version or Beam version
differs from the launcher's, and the image must carry every package the
workers import.
"""

import re
from pathlib import Path

import setuptools

from preprocess.launch import worker_image

REPO = Path(__file__).resolve().parents[2]


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _pinned_version(package: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        match = re.fullmatch(rf"{re.escape(package)}(\[[\w,]+\])?==([\w.]+)", line.strip())
        if match:
            return match.group(2)
    raise AssertionError(f"{package} is not pinned in requirements.txt")


def test_base_image_is_the_beam_sdk_of_the_pinned_beam_and_python():
    (base,) = [rest for keyword, rest in _dockerfile_instructions() if keyword == "FROM"]
    # The image's Python is the launchers' (worker_image.IMAGE_PYTHON, held to the base image below), not
    # ruff's target-version: that one is the oldest Python the packages must run on (3.10, TPU VMs).
    python = ".".join(map(str, worker_image.IMAGE_PYTHON))
    assert base == f"apache/beam_python{python}_sdk:{_pinned_version('apache-beam')}"


def test_the_launchers_require_the_python_of_the_base_image():
    (base,) = [rest for keyword, rest in _dockerfile_instructions() if keyword == "FROM"]
    image_python = ".".join(map(str, worker_image.IMAGE_PYTHON))
    assert base.startswith(f"apache/beam_python{image_python}_sdk:"), (base, worker_image.IMAGE_PYTHON)


def _shell_commands() -> list[tuple[str, str]]:
    """Every command of every RUN, in order, with the directory it runs in (WORKDIR, then `cd`)."""
    commands, workdir = [], "/"
    for keyword, rest in _dockerfile_instructions():
        if keyword == "WORKDIR":
            workdir = rest
        elif keyword == "RUN":
            cwd = workdir
            for command in rest.split("&&"):
                command = " ".join(command.split())
                if command.startswith("cd "):
                    cwd = command[3:].strip()
                commands.append((cwd, command))
    return commands


def test_the_build_runs_pip_check_after_installing_the_package():
    commands = [command for _, command in _shell_commands()]
    installs = [i for i, command in enumerate(commands) if command.startswith("pip install")]
    checks = [i for i, command in enumerate(commands) if command == "pip check"]
    assert installs and checks and max(checks) > max(installs), commands


def test_the_import_probe_imports_the_installed_package_from_outside_the_source_folder():
    copied_to = {rest for keyword, rest in _dockerfile_instructions() if keyword == "WORKDIR"}
    probes = [(cwd, command) for cwd, command in _shell_commands() if command.startswith("python -c")]
    assert probes, "the build should import the installed package once"
    for cwd, command in probes:
        # From the source folder, `import preprocess` would find ./preprocess whatever pip installed.
        assert cwd not in copied_to, (cwd, command)
        assert "'/site-packages/' in preprocess.__file__" in command
        # The stage-1 modules import TensorFlow and tf.Transform lazily: the probe names them itself.
        imported = re.search(r"import ([\w., ]+);", command).group(1)
        names = {name.strip() for name in imported.split(",")}
        assert {"tensorflow", "tensorflow_transform", "apache_beam", "preprocess.pipeline", "train"} <= names


def test_image_copies_every_package_that_setup_py_installs():
    copied = {
        source.rstrip("/")
        for keyword, rest in _dockerfile_instructions()
        if keyword == "COPY"
        for source in rest.split()[:-1]  # the last word is the destination
    }
    top_level = {name.split(".")[0] for name in setuptools.find_packages(str(REPO), exclude=["tests*"])}
    assert top_level - {"benchmarks"} <= copied, top_level - copied
    assert {"constraints.txt", "setup.py"} <= copied
    for source in copied:
        assert (REPO / source).exists(), source


def test_setup_py_does_not_pin_beam_over_the_workers_sdk():
    requirements = re.findall(r'"(apache-beam[^"]*)"', (REPO / "setup.py").read_text())
    assert requirements, "setup.py should still require apache-beam (as a range)"
    assert all("==" not in requirement for requirement in requirements), requirements
