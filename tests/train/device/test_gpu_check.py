"""A machine with an NVIDIA GPU that TensorFlow cannot see stops training, unless --allow-cpu.

The driver probe reads /proc/driver/nvidia/version; $TRAIN_NVIDIA_DRIVER_FILE
points it at a file the test writes, so the real `python -m train` (a
subprocess, the real dataset, TensorFlow without CUDA as installed here) sees
a "driver" and no GPU: exactly a GPU machine with plain `tensorflow` installed.
"""

import json
import os
import subprocess
import sys

import pytest

from train import install_lines
from train.device import strategy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DRIVER_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"


def run_train(tmp_path, data, *args, driver_file):
    env = {
        **os.environ,
        "PYTHONPATH": REPO,
        "TPU_LOAD_LIBRARY": "0",
        strategy.NVIDIA_DRIVER_FILE_ENV: str(driver_file),
    }
    command = [sys.executable, "-m", "train", "--data", data, "--model-dir", str(tmp_path / "model"), *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def fake_driver(tmp_path):
    path = tmp_path / "nvidia-version"
    path.write_text(DRIVER_LINE + "\nGCC version:  gcc version 12.2.0\n")
    return path


def test_no_driver_means_no_gpu_to_miss(tmp_path, monkeypatch):
    monkeypatch.setenv(strategy.NVIDIA_DRIVER_FILE_ENV, str(tmp_path / "absent"))
    assert strategy.nvidia_driver() is None
    strategy.refuse_hidden_gpu(allow_cpu=False)  # the CPU machine trains as before


def test_a_driver_without_a_visible_gpu_stops_with_the_gpu_install_line(
    tmp_path, fake_driver, stage1_dataset
):
    result = run_train(tmp_path, stage1_dataset("uint8"), "--steps", "1", driver_file=fake_driver)
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: this machine has an NVIDIA GPU (driver: NVRM version: NVIDIA UNIX"), error
    assert install_lines.GPU_INSTALL_LINE in error and "--allow-cpu" in error
    assert not (tmp_path / "model" / "checkpoints").exists()  # stopped before the first step


@pytest.mark.slow  # trains (a few steps of the small CNN) in a subprocess: ~30 s
def test_allow_cpu_trains_on_the_cpu_on_purpose(tmp_path, fake_driver, stage1_dataset):
    result = run_train(
        tmp_path,
        stage1_dataset("uint8"),
        "--steps",
        "2",
        "--global-batch-size",
        "8",
        "--no-export",
        "--allow-cpu",
        driver_file=fake_driver,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["global_step"] == 2
