"""The launcher of a Dataflow job: Ctrl-C leaves the job and its tf.Transform directory alone, and a
relaunch of the same request attaches to the running job instead of starting a second one.

Dataflow cannot run here: the runner is a stub whose job stays RUNNING, and the Dataflow API client (the
jobs list) a fake. The rest is real: the launcher's `main`, the job graph it builds, its options.
"""

import concurrent.futures
import logging
import os
import signal
import threading
import time
import uuid

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState

from preprocess import filesystem, options
from preprocess import pipeline as pipeline_module
from preprocess.launch import command, dataflow_job, job_record, launcher, local_runner
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


# ------------------------------------------------------------------ a relaunch under another job name


class FakeDataflow:
    """Dataflow's jobs API as the launcher uses it: jobs submitted by `SubmittingRunner`, each RUNNING
    for `polls` questions about it, then `final`."""

    def __init__(self, polls=3, final=None):
        from google.cloud.dataflow import JobState  # noqa: PLC0415

        self.jobs = {}
        self.gets = []
        self.polls = polls
        self.final = final or JobState.JOB_STATE_DONE
        self.running = JobState.JOB_STATE_RUNNING

    def submit(self, name, labels):
        job = FakeJob(
            f"2026-11-27_01_02_03-{len(self.jobs) + 1}", labels, [self.running] * self.polls + [self.final]
        )
        job.name = name
        self.jobs[job.id] = job
        return job

    def job_id_for_name(self, name):
        for job in self.jobs.values():
            if job.name == name and job.current_state == self.running:
                return job.id
        raise ValueError(f"No running job found with name '{name}'")

    def get_job(self, job_id):
        self.gets.append(job_id)
        job = self.jobs[job_id]
        job.advance()
        return job

    def list_messages(self, job_id, **kwargs):
        return [], None


class SubmittingRunner(PipelineRunner):
    """Submits the job to a FakeDataflow; the launcher's wait is then interrupted (an orchestrator's task
    killed or timed out while its job runs on)."""

    def __init__(self, service):
        self.service = service
        self.submitted = []

    def run_pipeline(self, pipeline, options):
        cloud = options.view_as(GoogleCloudOptions)
        job = self.service.submit(cloud.job_name, _labels(options))
        self.submitted.append(cloud.job_name)
        return RunningJob(job.id)


def _airflow_launch(monkeypatch, service, corpus, output, job_name):
    """python -m preprocess on Dataflow as Airflow's operators launch it: --job_name with a unique suffix."""
    runner = SubmittingRunner(service)
    monkeypatch.setattr(dataflow_job, "_application_client", lambda options: service)
    monkeypatch.setattr(local_runner, "runner_for", lambda options, verbose=False: runner)
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    command.main(["--input", corpus, "--output", str(output), *DATAFLOW_FLAGS, "--job_name", job_name])
    return runner


def test_a_relaunch_under_another_job_name_waits_for_the_running_job_instead_of_starting_a_second(
    monkeypatch, tmp_path, corpus, caplog
):
    service = FakeDataflow(polls=4)
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:  # Airflow's first try: its task dies, the job runs on
        _airflow_launch(monkeypatch, service, corpus, output, "preprocess-daily-20261127-7f3a9c01")
    assert exited.value.code == 130
    (first_job,) = service.jobs.values()
    first_run = dataflow_job.label_to_run_id(first_job.labels[dataflow_job.RUN_ID_LABEL])
    reported = []
    monkeypatch.setattr(launcher, "own_manifest", lambda output_dir, run_id: reported.append(run_id))
    with caplog.at_level(logging.WARNING):
        retry = _airflow_launch(monkeypatch, service, corpus, output, "preprocess-daily-20261127-e41b0d77")

    assert retry.submitted == []  # no second job...
    assert len(service.jobs) == 1
    assert first_job.current_state == service.final  # ...it waited for the first to end...
    assert reported == [first_run]  # ...and reports the first job's run
    assert "already running this request (recorded in" in caplog.text
    (record,) = job_record.read_records(str(output), first_job.labels[dataflow_job.REQUEST_LABEL]).values()
    assert (record.job_id, record.job_name) == (first_job.id, "preprocess-daily-20261127-7f3a9c01")


def test_a_relaunch_after_the_recorded_job_ended_starts_a_new_job(monkeypatch, tmp_path, corpus):
    from google.cloud.dataflow import JobState  # noqa: PLC0415

    service = FakeDataflow(polls=0, final=JobState.JOB_STATE_FAILED)
    output = tmp_path / "out"
    with pytest.raises(SystemExit):
        _airflow_launch(monkeypatch, service, corpus, output, "preprocess-daily-1")
    with pytest.raises(SystemExit):
        _airflow_launch(monkeypatch, service, corpus, output, "preprocess-daily-2")
    assert [job.name for job in service.jobs.values()] == ["preprocess-daily-1", "preprocess-daily-2"]
    request = next(iter(service.jobs.values())).labels[dataflow_job.REQUEST_LABEL]
    assert sorted(job_record.read_records(str(output), request)) == [1, 2]


def test_a_relaunch_that_cannot_ask_dataflow_about_the_recorded_job_refuses_with_what_to_do(
    monkeypatch, tmp_path, corpus, capsys
):
    service = FakeDataflow()
    output = tmp_path / "out"
    with pytest.raises(SystemExit):
        _airflow_launch(monkeypatch, service, corpus, output, "preprocess-daily-1")
    capsys.readouterr()

    def forbidden(job_id):
        raise PermissionError("403 Permission 'dataflow.jobs.get' denied on project proj")

    monkeypatch.setattr(service, "get_job", forbidden)
    with pytest.raises(SystemExit) as exited:
        _airflow_launch(monkeypatch, service, corpus, output, "preprocess-daily-2")
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 4, err
    assert "dataflow.jobs.get" in err and "gcloud dataflow jobs list --filter=name=preprocess-daily-1" in err
    assert f"remove {output}/{job_record.LAUNCHES_DIR}/" in err
    assert len(service.jobs) == 1


@pytest.mark.parametrize("launches", [2, 3, 8])
@pytest.mark.parametrize("where", ["local disk", "gcs emulator"])
def test_launches_of_one_request_at_once_start_exactly_one_job_and_the_others_wait_for_it(
    request, tmp_path, launches, where
):
    if where == "gcs emulator":
        request.getfixturevalue("gcs_read_faults")  # the forwarder enforces ifGenerationMatch
        output = request.getfixturevalue("gcs_dir")
    else:
        output = str(tmp_path / "out")
    barrier = threading.Barrier(launches)
    jobs = {}  # job name -> id, once "submitted"

    def job_state(record):
        job_id = record.job_id or jobs.get(record.job_name)
        return (job_id, "RUNNING") if job_id else (None, None)

    def launch(index):
        barrier.wait()
        decision, record = job_record.claim(
            output, "0123456789abcdef0123", f"airflow-{index}", f"run-{index}", BUILD_ID, job_state,
            poll_seconds=0.05,
        )  # fmt: skip
        if decision == job_record.SUBMIT:
            jobs[record.job_name] = f"job-of-{index}"
            job_record.record_job_id(record, f"job-of-{index}")
        return decision, record

    with concurrent.futures.ThreadPoolExecutor(launches) as pool:
        outcomes = list(pool.map(launch, range(launches)))
    submitted = [record for decision, record in outcomes if decision == job_record.SUBMIT]
    assert len(submitted) == 1, outcomes
    (winner,) = submitted
    assert all(record.job_id == jobs[winner.job_name] for _, record in outcomes)
    assert list(job_record.read_records(output, "0123456789abcdef0123")) == [1]


# ------------------------------------------------------------------ the quick check's index, uploaded

# A published version whose settings a re-run keeps: the re-run's launcher builds the quick check's index and
# uploads it to --temp_location for the job's workers (reuse/shared_index.py). The copy of a session's dataset
# that tests/preprocess/publish/ start from too.
PUBLISHED = {"images_per_class": 3, "image_size": 16, "encoding": "uint8", "min_shards": 1}


@pytest.fixture
def rerun(monkeypatch, tmp_path, shared_stage1_datasets, gcs_dir):
    """launch(runner): the re-run's launcher, on a stub of Dataflow; (its corpus, output, temp location)."""
    output = tmp_path / "out"
    corpus_root, _ = shared_stage1_datasets.copy(output, **PUBLISHED)
    temp = f"{gcs_dir}/temp"

    def launch(runner, command_line=False):
        runner.output_dir = str(output)
        monkeypatch.setattr(launcher.uuid, "uuid4", lambda: uuid.UUID(BUILD_ID + "0" * 20))
        monkeypatch.setattr(local_runner, "runner_for", lambda options, verbose=False: runner)
        argv = ["--input", corpus_root, "--output", str(output), "--image-size", "16", "--encoding", "uint8"]
        argv += ["--temp_location", temp, *DATAFLOW_FLAGS]
        if command_line:  # only where the job goes on: the command ends an interrupted build with os._exit
            return command.main(argv)
        return launcher.run(*options.parse_args(argv))

    return launch, temp


def _index_uploads(temp: str) -> list[str]:
    return [found.path for found in filesystem.FileSystems.match([f"{temp}/quick-check-*"])[0].metadata_list]


def test_ctrl_c_while_the_job_runs_leaves_the_index_upload_for_its_workers_and_says_how_to_remove_it(rerun):
    launch, temp = rerun
    with pytest.raises(dataflow_job.JobContinuesError) as continues:
        launch(StubDataflowRunner(RunningJob()))
    [upload] = _index_uploads(temp)  # the job's workers, which start later, fetch it
    assert f"fetch the quick check's index from {upload}: delete it once the job has ended" in str(
        continues.value
    )
    assert f"(gcloud storage rm {upload})" in str(continues.value)


class TerminatedJob(RunningJob):
    """A running job whose launcher an orchestrator stops with SIGTERM while it waits."""

    def wait_until_finish(self, duration=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # a handler that raises ends this at once
        raise AssertionError("SIGTERM did not end the wait")


def test_sigterm_while_the_job_runs_ends_the_launcher_as_ctrl_c_does(rerun, capsys):
    launch, temp = rerun
    received = []

    def outside(signum, frame):  # what SIGTERM does here outside the launch (its default would end pytest)
        received.append(signum)

    before = signal.signal(signal.SIGTERM, outside)
    try:
        with pytest.raises(SystemExit) as exited:
            launch(StubDataflowRunner(TerminatedJob()), command_line=True)
        assert signal.getsignal(signal.SIGTERM) is outside  # given back once the launch ends
    finally:
        signal.signal(signal.SIGTERM, before)
    assert exited.value.code == 130 and received == []
    err = capsys.readouterr().err
    assert "goes on" in err and "gcloud dataflow jobs cancel" in err and "Traceback" not in err
    [upload] = _index_uploads(temp)
    assert f"gcloud storage rm {upload}" in err


def test_ctrl_c_before_the_job_is_submitted_removes_the_index_upload(rerun, monkeypatch):
    launch, temp = rerun

    def interrupted(*args):  # the graph's build goes on after the index is uploaded
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline_module, "reuse_published", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch(StubDataflowRunner(RunningJob()))
    assert _index_uploads(temp) == []
    # While it is submitted: no job to use it either.
    monkeypatch.undo()
    with pytest.raises(KeyboardInterrupt):
        launch(StubDataflowRunner(KeyboardInterrupt()))
    assert _index_uploads(temp) == []


def test_a_launch_that_attaches_to_another_launchs_job_removes_its_own_index_upload(rerun, monkeypatch):
    from apache_beam.runners.dataflow.internal import apiclient
    from google.cloud.dataflow import JobState

    launch, temp = rerun
    job = FakeJob("2026-11-26_01_02_03-999", {}, [JobState.JOB_STATE_RUNNING])
    client = FakeJobsClient(job)
    monkeypatch.setattr(dataflow_job, "_application_client", lambda options: client)
    real_sleep = time.sleep

    def sleep(seconds):
        # Beam waits for the job in its own thread, polling: Ctrl-C reaches the launcher's thread, waiting.
        if threading.current_thread() is threading.main_thread() and client.gets:
            raise KeyboardInterrupt
        real_sleep(0.01)

    monkeypatch.setattr("time.sleep", sleep)
    refusal = apiclient.DataflowJobAlreadyExistsError(
        f"There is already active job named x with id: {job.id}."
    )
    try:
        with pytest.raises(dataflow_job.JobContinuesError) as continues:
            launch(StubDataflowRunner(refusal))
    finally:
        job._states = [JobState.JOB_STATE_DONE]  # Beam's polling thread ends
    assert _index_uploads(temp) == []  # the running job has its own
    assert "quick check" not in str(continues.value)
