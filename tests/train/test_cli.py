"""The command line's manners: --help before TensorFlow, quiet start-up, TPU coordinator environment."""

import os

import pytest

from tests.cli_probe import probe_module
from train import console

# In the Python 3.10 leg's subset (scripts/test_py310.sh): `python -m train --help` and the start-up on a TPU VM's Python.
pytestmark = pytest.mark.py310


def test_help_prints_before_tensorflow_or_keras_is_imported(tmp_path):
    result = probe_module("train", ["--help"], ("tensorflow", "keras", "numpy"), tmp_path)
    assert "EXIT 0 HEAVY []" in result.stderr, result.stderr[-2000:]
    assert "--checkpoint-every" in result.stdout and "--profile-steps" in result.stdout
    # Several GPUs run several steps per execution, in train/loop/multi_step.py's loop; the defaults per device.
    assert "tf.range" in result.stdout and "--parallel-files" in result.stdout
    assert "--learning-rate-scaling" in result.stdout
    # Nothing from TensorFlow's native start-up either.
    assert "cuda" not in result.stderr.lower() and "absl" not in result.stderr


def test_native_startup_info_is_dropped_and_warnings_kept():
    assert console.is_native_noise(
        "I0000 00:00:1795375825.398589 6113 cpu_feature_guard.cc:227] This TensorFlow"
    )
    assert console.is_native_noise(
        "WARNING: All log messages before absl::InitializeLog() is called are written"
    )
    assert console.is_native_noise(
        "E0000 00:00:17 6113 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
        "Failed call to cuInit: UNKNOWN ERROR (303)"
    )
    assert console.is_native_noise(  # the first uint8 image a SavedModel decodes on a CPU without AVX-512
        "E0000 00:00:1795684991.216352   16259 util.cc:131] oneDNN supports DT_UINT8 only on platforms with "
        "AVX-512. Falling back to the default Eigen-based implementation if present."
    )
    assert not console.is_native_noise("W0000 00:00:17 123 dataset.cc:12] The input pipeline is slow")
    assert not console.is_native_noise("E0000 00:00:17 123 tpu.cc:1] TPU initialization failed")


def test_filtered_native_stderr_replays_what_is_not_noise(capfd):
    with console.filtered_native_stderr():
        os.write(2, b"I0000 00:00:1 1 x.cc:1] chatter\nW0000 00:00:1 1 x.cc:2] a real warning\n")
    err = capfd.readouterr().err
    assert "a real warning" in err and "chatter" not in err


def test_a_named_tpu_makes_this_process_leave_the_local_chips_to_the_tpu_server(monkeypatch):
    monkeypatch.delenv("TPU_LOAD_LIBRARY", raising=False)
    console.configure(verbose=False, tpu="local")
    assert "TPU_LOAD_LIBRARY" not in os.environ
    console.configure(verbose=False, tpu="my-v4-32")
    assert os.environ["TPU_LOAD_LIBRARY"] == "0"


def test_quiet_by_default_verbose_on_request(monkeypatch):
    import logging

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    console.configure(verbose=False)
    assert logging.getLogger().level == logging.WARNING and os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    console.configure(verbose=True)
    assert logging.getLogger().level == logging.INFO and os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    console.configure(verbose=False)  # leave the test session as the other tests expect it
