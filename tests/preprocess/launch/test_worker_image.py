"""A launch that names the worker image refuses a launcher Python other than the image's (3.11)."""

import os
import subprocess
import sys
import textwrap

import pytest

from pipelines import dataflow
from preprocess.launch import worker_image
from tests.cli_probe import REPO

IMAGE = "us-docker.pkg.dev/project/repository/tf-image-pipeline:1"


@pytest.mark.parametrize(
    "beam_args",
    [
        ["--sdk_container_image", IMAGE],
        [f"--sdk_container_image={IMAGE}"],
        ["--worker_harness_container_image", IMAGE],
        ["--runner", "DataflowRunner", "--sdk_container_image", IMAGE, "--project", "p"],
    ],
)
def test_a_launcher_python_other_than_the_images_is_refused_with_the_python_to_use(beam_args):
    with pytest.raises(
        worker_image.LauncherPythonError, match=r"runs Python 3\.11.*Launch with Python 3\.11"
    ):
        worker_image.check_launcher_python(beam_args, version_info=(3, 12, 1))


def test_the_images_python_or_no_image_is_accepted():
    worker_image.check_launcher_python(["--sdk_container_image", IMAGE], version_info=(3, 11, 9))
    worker_image.check_launcher_python(["--runner", "DataflowRunner"], version_info=(3, 12, 1))


# python -m preprocess, as a user runs it, with only the image's Python changed (this test runs on 3.11).
_PROBE = textwrap.dedent(
    """
    import runpy, sys
    from preprocess.launch import worker_image
    worker_image.IMAGE_PYTHON = (3, 99)
    sys.argv = ["preprocess", *sys.argv[1:]]
    try:
        runpy.run_module("preprocess", run_name="__main__", alter_sys=True)
    finally:
        print("HEAVY", sorted(m for m in ("tensorflow", "apache_beam") if m in sys.modules), file=sys.stderr)
    """
)


def test_python_m_preprocess_refuses_before_importing_beam_or_tensorflow(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, "--input", "gs://b/raw", "--output", "gs://b/dataset"]
        + ["--runner", "DataflowRunner", "--sdk_container_image", IMAGE],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"runs Python 3.99, but this launcher runs Python {running}" in result.stderr, result.stderr
    assert "HEAVY []" in result.stderr


def test_python_m_pipelines_dataflow_refuses_with_the_image(monkeypatch, capsys):
    monkeypatch.setattr(worker_image, "IMAGE_PYTHON", (3, 99))
    argv = ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "r"]
    assert dataflow.main([*argv, "--dry-run", "--sdk_container_image", IMAGE]) == 2
    assert "Launch with Python 3.99" in capsys.readouterr().err
