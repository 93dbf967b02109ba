"""Stage 1 runs on the FnApiRunner when the runner is the DirectRunner, and leaves other runners to Beam."""

import os
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner

from preprocess.launch import local_runner
from tests.cli_probe import REPO


@pytest.mark.parametrize(
    "flags",
    [[], ["--runner", "DirectRunner"], ["--runner=direct"], ["--runner", "SwitchingDirectRunner"]],
)
def test_the_direct_runner_means_the_fn_api_runner_with_the_job_options(flags):
    options = PipelineOptions([*flags, "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    runner = local_runner.runner_for(options)
    assert isinstance(runner, fn_runner.FnApiRunner)
    # The SDK workers get the job's options through the provision info, as under the DirectRunner.
    encoded = runner._provision_info.provision_info.pipeline_options
    assert int(encoded["beam:option:direct_num_workers:v1"]) == 2


@pytest.mark.parametrize("runner", ["DataflowRunner", "PrismRunner", "PortableRunner"])
def test_other_runners_are_left_to_beam(runner):
    assert local_runner.runner_for(PipelineOptions(["--runner", runner])) is None


def _tree(root, files_per_class=5, classes=("cat", "dog")):
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(files_per_class):
            (root / name / f"{i}.jpg").write_bytes(b"x")
    return str(root)


def test_counting_inputs_stops_at_the_limit(tmp_path):
    root = _tree(tmp_path / "tree", files_per_class=30)
    assert local_runner.count_inputs_up_to(root, 1000) == 60
    assert local_runner.count_inputs_up_to(root, 10) == 10
    manifest = tmp_path / "inputs.csv"
    manifest.write_text("uri,label\na.jpg,cat\n\nb.jpg,dog\n")
    assert local_runner.count_inputs_up_to(str(manifest), 1000) == 3  # the header counts, blank lines do not
    # Not listable here: left to the job, which reports it with its own message.
    assert local_runner.count_inputs_up_to(str(tmp_path / "missing"), 1000) is None


def _worker_options(*flags):
    return PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2", *flags])


def test_a_small_local_job_runs_in_this_process_whatever_the_mode_asked(tmp_path, caplog):
    root = _tree(tmp_path / "tree")
    options = _worker_options()
    with caplog.at_level("INFO"):
        assert local_runner.run_small_jobs_in_process(options, root, below=1000)
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == ("in_memory", 1)
    assert local_runner.runs_in_this_process(options)  # the progress line waits for no worker process
    assert "10 inputs: running in this process" in caplog.text
    # The runner is built from the changed options: its workers (none) get them too.
    encoded = local_runner.runner_for(options)._provision_info.provision_info.pipeline_options
    assert encoded["beam:option:direct_running_mode:v1"] == "in_memory"


@pytest.mark.parametrize(
    "flags, below",
    [
        ([], 10),  # as many inputs as the threshold: a large job
        ([], 0),  # the switch is off
        (["--runner", "DataflowRunner"], 1000),  # not a local run
    ],
)
def test_large_jobs_other_runners_and_a_zero_threshold_keep_the_workers_asked_for(tmp_path, flags, below):
    root = _tree(tmp_path / "tree")
    options = _worker_options(*flags)
    assert not local_runner.run_small_jobs_in_process(options, root, below=below)
    assert not local_runner.runs_in_this_process(options)
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == ("multi_processing", 2)


class _TeardownMarker:
    """Creates `path` when freed: at the latest by the interpreter's teardown, which frees every module."""

    def __init__(self, path):
        self._path, self._open, self._close = path, os.open, os.close

    def __del__(self):
        self._close(self._open(self._path, os.O_CREAT | os.O_WRONLY))


# Held by this module, in the worker process that imports it to run _RecordWorkerFn.
_TEARDOWN_MARKERS = []


class _RecordWorkerFn(beam.DoFn):
    """Notes, per element, the command line of the worker process it ran in, and arms a teardown marker there."""

    def __init__(self, directory):
        self._directory = directory

    def process(self, element):
        with open("/proc/self/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode()
        with open(os.path.join(self._directory, f"element-{element}"), "w") as handle:
            handle.write(command)
        # Written only if this worker's interpreter tears down (frees its modules) on exit.
        _TEARDOWN_MARKERS.append(_TeardownMarker(os.path.join(self._directory, f"teardown-{os.getpid()}")))
        yield element


def test_worker_processes_run_beams_harness_and_exit_without_the_interpreters_teardown(tmp_path):
    options = _worker_options()
    with beam.Pipeline(runner=local_runner.runner_for(options), options=options) as pipeline:
        _ = pipeline | beam.Create(range(4)) | beam.ParDo(_RecordWorkerFn(str(tmp_path)))
    commands = [path.read_text() for path in sorted(tmp_path.glob("element-*"))]
    assert len(commands) == 4
    assert all("-m preprocess.launch.local_worker" in command for command in commands), commands
    assert not list(tmp_path.glob("teardown-*"))


def test_a_worker_whose_harness_fails_exits_with_an_error(tmp_path):
    # No control service to connect to: Beam's harness raises before it starts.
    env = {key: value for key, value in os.environ.items() if key != "CONTROL_API_SERVICE_DESCRIPTOR"}
    env["PYTHONPATH"] = REPO
    result = subprocess.run(
        [sys.executable, "-m", "preprocess.launch.local_worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "CONTROL_API_SERVICE_DESCRIPTOR" in result.stderr
