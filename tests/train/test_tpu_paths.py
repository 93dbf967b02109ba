"""A TPU run refuses local --data / --model-dir: a spot TPU VM is deleted with its disk."""

import os
import subprocess
import sys

import pytest

from train.config import TrainConfig, check_paths_for_tpu, requests_tpu
from train.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(*args, cwd):
    # TPU_LOAD_LIBRARY=0: no libtpu may be loaded here (it would poll the GCE metadata server).
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3", "TPU_LOAD_LIBRARY": "0"}
    env.pop("TPU_NAME", None)
    return subprocess.run(
        [sys.executable, "-m", "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("tpu_flags", [("--tpu", "local"), ("--strategy", "tpu")])
def test_the_cli_refuses_local_paths_on_a_tpu_and_says_to_use_gcs(tmp_path, tpu_flags):
    result = run_cli("--data", str(tmp_path / "dataset"), "--model-dir", str(tmp_path / "model"), *tpu_flags,
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"--data {tmp_path / 'dataset'}, --model-dir {tmp_path / 'model'}: not on gs://" in result.stderr
    assert "uses a TPU" in result.stderr and "gs://BUCKET/" in result.stderr
    assert "Traceback" not in result.stderr


def test_each_local_path_is_named_and_gcs_or_a_shared_filesystem_is_accepted():
    with pytest.raises(ConfigError, match=r"^--model-dir /tmp/m: not on gs://"):
        check_paths_for_tpu("gs://b/ds", "/tmp/m", shared_filesystem=False)
    with pytest.raises(ConfigError, match=r"^--data /data/ds: not on gs://"):
        check_paths_for_tpu("/data/ds", "gs://b/m", shared_filesystem=False)
    check_paths_for_tpu("gs://b/ds", "gs://b/m", shared_filesystem=False)
    check_paths_for_tpu("/mnt/filestore/ds", "/mnt/filestore/m", shared_filesystem=True)


def test_only_tpu_flags_request_a_tpu():
    assert requests_tpu(TrainConfig(data_dir="", model_dir="", tpu="local"))
    assert requests_tpu(TrainConfig(data_dir="", model_dir="", strategy="tpu"))
    assert not requests_tpu(TrainConfig(data_dir="", model_dir="", strategy="auto"))
    assert not requests_tpu(TrainConfig(data_dir="", model_dir="", strategy="multiworker"))
