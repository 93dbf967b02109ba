"""The launcher of a Dataflow job: Ctrl-C leaves the job and its tf.Transform directory alone, and a
relaunch of the same request attaches to the running job instead of starting a second one.

Dataflow cannot run here: the runner is a stub whose job stays RUNNING, and the Dataflow API client (the
jobs list) a fake. The rest is real: the launcher's `main`, the job graph it builds, its options.
"""

import logging
import uuid

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState

from preprocess import filesystem
from preprocess.launch import command, dataflow_job, launcher, local_runner
from preprocess.publish.runs import tft_temp_dir
from tests.stage1 import write_corpus

BUILD_ID = "0123456789ab"
DATAFLOW_FLAGS = ["--runner", "DataflowRunner", "--project", "proj", "--region", "europe-west4"]


def _labels(options) -> dict:
    return dict(label.split("=", 1) for label in options.view_as(GoogleCloudOptions).labels or [])


class RunningJob(PipelineResult):
    """A Dataflow job that stays RUNNING; waiting for it is interrupted by Ctrl-C."""

    def __init__(self, job_id="2026-11-26_01_02_03-123"):
        super().__init__(PipelineState.RUNNING)
        self._job_id = job_id

    def job_id(self):
        return self._job_id

    @property
    def has_job(self):
        return True

    def wait_until_finish(self, duration=None):
        raise KeyboardInterrupt


class StubDataflowRunner(PipelineRunner):
    """Submits nothing: writes into the build's tf.Transform directory, as the job's analysis would."""

    def __init__(self, result):
        self.result = result
        self.submitted = []

    def run_pipeline(self, pipeline, options):
        filesystem.write_bytes(f"{tft_temp_dir(self.output_dir, BUILD_ID)}/analysis/saved_model.pb", b"graph")
        self.submitted.append(options.view_as(GoogleCloudOptions).job_name)
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root, images_per_class=2, include_broken=False)
    return str(root)


def _launch(monkeypatch, runner, corpus, output, *extra):
    runner.output_dir = str(output)
    monkeypatch.setattr(launcher.uuid, "uuid4", lambda: uuid.UUID(BUILD_ID + "0" * 20))
    monkeypatch.setattr(local_runner, "runner_for", lambda options, verbose=False: runner)
    command.main(["--input", corpus, "--output", str(output), *DATAFLOW_FLAGS, *extra])


def test_ctrl_c_leaves_the_running_job_and_its_transform_directory_and_says_how_to_cancel(
    monkeypatch, tmp_path, corpus, capsys
):
    runner = StubDataflowRunner(RunningJob())
    with pytest.raises(SystemExit) as exited:
        _launch(monkeypatch, runner, corpus, tmp_path / "out")
    assert exited.value.code == 130
    err = capsys.readouterr().err
    assert "goes on" in err
    assert "gcloud dataflow jobs cancel 2026-11-26_01_02_03-123 --region europe-west4" in err
    assert "Traceback" not in err
    # The job's analysis is still there for the workers that start after the launcher stopped.
    staged = list((tmp_path / "out").rglob("saved_model.pb"))
    assert len(staged) == 1, staged


def test_a_finished_job_has_its_transform_directory_removed(monkeypatch, tmp_path, corpus):
    class FailedJob(RunningJob):
        def __init__(self):
            super().__init__()
            self._state = PipelineState.FAILED

        def wait_until_finish(self, duration=None):
            raise RuntimeError("Dataflow pipeline failed. State: FAILED")

    runner = StubDataflowRunner(FailedJob())
    with pytest.raises(RuntimeError, match="FAILED"):
        _launch(monkeypatch, runner, corpus, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("saved_model.pb"))


def test_the_job_name_is_the_same_for_a_retry_and_differs_for_another_request(tmp_path):
    config = {"input": "gs://b/raw", "image_size": 224, "encoding": "uint8"}
    names = []
    for flags, cfg in (
        (DATAFLOW_FLAGS, config),
        ([*DATAFLOW_FLAGS, "--labels", "team=vision"], config),  # labels alone do not make another request
        (DATAFLOW_FLAGS, {**config, "image_size": 256}),
        ([*DATAFLOW_FLAGS, "--max_num_workers", "5"], config),
    ):
        options = PipelineOptions(flags)
        names.append(dataflow_job.set_job_identity(options, "gs://b/ds", cfg, flags, {"run-id": "x"}))
    assert names[0] == names[1]
    assert len({names[0], names[2], names[3]}) == 3
    assert names[0].startswith("preprocess-")
    # A name given by hand is kept.
    options = PipelineOptions([*DATAFLOW_FLAGS, "--job_name", "mine"])
    assert dataflow_job.set_job_identity(options, "gs://b/ds", config, [], {}) == "mine"


class FakeJob:
    def __init__(self, job_id, labels, states):
        self.id = job_id
        self.labels = labels
        self._states = list(states)
        self.current_state = self._states[0]

    def advance(self):
        if len(self._states) > 1:
            self._states.pop(0)
        self.current_state = self._states[0]


class FakeJobsClient:
    """Dataflow's jobs API as the launcher uses it: one running job, which ends after a few polls."""

    def __init__(self, job):
        self.job = job
        self.gets = []

    def job_id_for_name(self, name):
        return self.job.id

    def get_job(self, job_id):
        self.gets.append(job_id)
        self.job.advance()
        return self.job

    def list_messages(self, job_id, **kwargs):
        return [], None


def test_a_relaunch_of_a_running_request_attaches_to_its_job_instead_of_starting_a_second(
    monkeypatch, tmp_path, corpus, caplog
):
    from apache_beam.runners.dataflow.internal import apiclient
    from google.cloud.dataflow import JobState

    first_run = "20261126T010203000000Z-0a1b2c3d"
    job = FakeJob(
        "2026-11-26_01_02_03-999",
        {"run-id": first_run.lower(), "build-id": "feedfacecafe"},
        [JobState.JOB_STATE_RUNNING, JobState.JOB_STATE_RUNNING, JobState.JOB_STATE_DONE],
    )
    client = FakeJobsClient(job)
    monkeypatch.setattr(dataflow_job, "_application_client", lambda options: client)
    monkeypatch.setattr("time.sleep", lambda seconds: None)  # Beam polls the job every few seconds
    refusal = apiclient.DataflowJobAlreadyExistsError(
        f"There is already active job named preprocess-x with id: {job.id}. If you want to submit a "
        "second job, try again by setting a different name using --job_name."
    )
    runner = StubDataflowRunner(refusal)
    reported = []
    monkeypatch.setattr(launcher, "own_manifest", lambda output, run_id: reported.append(run_id))
    with caplog.at_level(logging.WARNING):
        _launch(monkeypatch, runner, corpus, tmp_path / "out")
    assert job.id in client.gets  # it waited for the running job...
    assert reported == [first_run]  # ...and reports that job's run, not one of its own
    assert "already running this request" in caplog.text
    # Its own build's tf.Transform directory was never used by a job: only the attached job's build
    # is removed once that job has ended.
    assert len(runner.submitted) == 1


def test_the_run_id_survives_the_trip_through_a_job_label():
    run_id = "20261126T010203123456Z-0a1b2c3d"
    options = PipelineOptions(DATAFLOW_FLAGS)
    dataflow_job.set_job_identity(options, "gs://b/ds", {}, [], {dataflow_job.RUN_ID_LABEL: run_id})
    assert dataflow_job.label_to_run_id(_labels(options)[dataflow_job.RUN_ID_LABEL]) == run_id
