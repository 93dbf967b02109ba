"""A local run prints its progress and summary, not Beam's, tf.Transform's and the workers' INFO lines; --verbose brings them back.

Real runs of `python -m preprocess` on a tiny corpus: in this process (the
default below --in-process-below), and with two worker processes forced.
"""

import io
import json
import os
import subprocess
import sys

import pytest

from dataset_contract import native_logs
from preprocess.launch import logs
from tests.cli_probe import REPO
from tests.stage1 import write_corpus

# What the libraries log at INFO in every run (tf.Transform, Beam's batching, TensorFlow's SavedModel writer).
LIBRARY_INFO_LINES = ("struct2tensor is not available", "BatchElements statistics", "Assets written to")
# What each worker process forwards through the runner when it connects.
WORKER_INFO_LINE = "Creating client data channel"
WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2", "--in-process-below", "0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("logs_corpus"), images_per_class=2, include_broken=False).root


def _run_preprocess(corpus, output, *flags) -> str:
    env = {**os.environ, "PYTHONPATH": REPO, "TPU_LOAD_LIBRARY": "0", "NO_GCE_CHECK": "true"}
    result = subprocess.run(
        [sys.executable, "-m", "preprocess", "--input", str(corpus), "--output", str(output)]
        + ["--image-size", "16", "--min-shards", "1", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output_text = result.stdout + result.stderr
    assert result.returncode == 0, output_text[-4000:]
    return output_text


def native_noise(text: str) -> list[str]:
    """TensorFlow's native start-up lines ("I0000 ...", absl's banner, "failed call to cuInit") in `text`."""
    return [line for line in text.splitlines() if native_logs.is_native_noise(line)]


def _assert_progress_and_summary(text, output):
    assert "] done: " in text and "decoded" in text, text[-3000:]
    assert f"Dataset {output}" in text and f"manifest: {output}/dataset.json" in text, text[-3000:]


@pytest.mark.slow
def test_a_run_in_this_process_prints_progress_and_summary_without_library_info_lines(corpus, tmp_path):
    text = _run_preprocess(corpus, tmp_path / "dataset")
    _assert_progress_and_summary(text, tmp_path / "dataset")
    assert [line for line in LIBRARY_INFO_LINES if line in text] == [], text[-4000:]
    assert native_noise(text) == []


@pytest.mark.slow
def test_worker_processes_forward_no_info_lines(corpus, tmp_path):
    text = _run_preprocess(corpus, tmp_path / "dataset", *WORKERS)
    _assert_progress_and_summary(text, tmp_path / "dataset")
    assert [line for line in (*LIBRARY_INFO_LINES, WORKER_INFO_LINE) if line in text] == [], text[-4000:]
    assert "Worker: severity: INFO" not in text
    assert native_noise(text) == []  # the workers' TensorFlow too (preprocess/launch/local_worker.py)


@pytest.mark.slow
def test_verbose_brings_the_library_and_worker_info_lines_back(corpus, tmp_path):
    text = _run_preprocess(corpus, tmp_path / "dataset", *WORKERS, "--verbose")
    _assert_progress_and_summary(text, tmp_path / "dataset")
    assert [line for line in (*LIBRARY_INFO_LINES, WORKER_INFO_LINE) if line not in text] == []


def test_worker_options_are_quiet_unless_verbose_and_a_users_level_stays():
    assert logs.worker_log_options({}, verbose=True) == {}
    quiet = logs.worker_log_options({"direct_num_workers": 2}, verbose=False)
    assert quiet[logs.WORKER_LEVEL_OPTION] == "WARNING" and quiet["direct_num_workers"] == 2
    chosen = logs.worker_log_options({logs.WORKER_LEVEL_OPTION: "DEBUG"}, verbose=False)
    assert chosen[logs.WORKER_LEVEL_OPTION] == "DEBUG"


def test_a_worker_sets_the_libraries_loggers_to_the_level_in_its_options():
    # As the runner hands options to a worker process: a JSON Struct of "beam:option:<name>:v1" keys.
    script = (
        "import logging, os\n"
        "from preprocess.launch import logs\n"
        "logs.configure_worker(os.environ['PIPELINE_OPTIONS'])\n"
        "print([logging.getLevelName(logging.getLogger(n).getEffectiveLevel()) for n in logs.LIBRARY_LOGGERS])\n"
    )
    options = json.dumps({f"beam:option:{logs.WORKER_LEVEL_OPTION}:v1": "WARNING"})
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": REPO, "PIPELINE_OPTIONS": options},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(["WARNING"] * len(logs.LIBRARY_LOGGERS))


@pytest.mark.parametrize(
    "verbose, local, quiet", [(False, True, True), (True, True, False), (False, False, False)]
)
def test_the_launcher_quiets_the_libraries_only_for_a_local_run_without_verbose(verbose, local, quiet):
    # A fresh process: logger levels are process-wide. On Dataflow, Beam's INFO lines are the job's progress.
    script = (
        "import logging, os\n"
        "from preprocess.launch import logs\n"
        f"logs.configure_launcher({verbose}, local={local})\n"
        "print(logging.getLevelName(logging.getLogger('apache_beam.runners').getEffectiveLevel()),\n"
        "      logging.getLevelName(logging.getLogger('preprocess.publish.commit').getEffectiveLevel()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["WARNING" if quiet else "INFO", "INFO"]


def test_a_quiet_worker_drops_its_logging_clients_failure_when_the_runner_is_gone(monkeypatch):
    # At a Ctrl-C a worker can outlive the launcher's last line by a moment, and Beam's log handler then
    # prints the closed stream's gRPC error (five lines) into the terminal below it.
    monkeypatch.setenv(logs.QUIET_INPUT_FAULTS_ENV_VAR, "1")
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    logs.quiet_worker_stderr()
    error = '<_MultiThreadedRendezvous of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = "Stream removed (Socket closed)"\n>'
    print(f"Logging client failed: {error}... resetting", file=sys.stderr)
    print("a line of its own", file=sys.stderr)
    assert terminal.getvalue() == "a line of its own\n"
