"""The launcher's side of a job that runs elsewhere (Dataflow): its identity, attaching, Ctrl-C."""

import functools
import hashlib
import json
import re
import types

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.runners.runner import PipelineState

from preprocess.launch.progress import runner_name

# Dataflow job names: [a-z]([-a-z0-9]{0,1022}[a-z0-9])?; labels: lowercase letters, digits, '-' and '_'.
_JOB_NAME_PREFIX = "preprocess-"
_NAME_FINGERPRINT_CHARS = 20
RUN_ID_LABEL = "run-id"
BUILD_ID_LABEL = "build-id"
REQUEST_LABEL = "request"
_ALREADY_EXISTS_ID = re.compile(r"with id: ([\w-]+)")


class JobContinuesError(Exception):
    """The launcher was interrupted while its remote job runs on; the message says how to cancel it."""

    exit_code = 130  # what a shell reports for a program stopped by SIGINT


def runs_remotely(options: PipelineOptions) -> bool:
    """Whether --runner is Dataflow's (the job runs on, whatever happens to this process)."""
    return runner_name(options) in ("dataflowrunner", "dataflow")


def is_remote_job(result) -> bool:
    """Whether `result` is a job a service runs (it has a job id), not one running in this process."""
    if result is None or not callable(getattr(result, "job_id", None)):
        return False
    return getattr(result, "has_job", True)


def is_finished(result) -> bool:
    """Whether the job of `result` has ended (DONE, FAILED, CANCELLED, UPDATED, DRAINED); None (no job) and a
    job this process ran itself count as ended."""
    if not is_remote_job(result):
        return True
    try:
        return PipelineState.is_terminal(result.state)
    except Exception:  # noqa: BLE001 - the state could not be asked for: assume the job runs on
        return False


def continues_message(result, options: PipelineOptions, index_upload: str | None = None) -> str:
    """What an interrupted launcher says about the job that goes on (and the quick check's index uploaded
    for its workers, which stays: the launcher that would remove it at the job's end is gone)."""
    cloud = options.view_as(GoogleCloudOptions)
    region = cloud.region or "REGION"
    job_id = result.job_id()
    project = f" --project {cloud.project}" if cloud.project else ""
    message = (
        f"interrupted: the launcher stops, but Dataflow job {job_id} goes on (Ctrl-C does not cancel it); "
        "it publishes the dataset when it finishes.\n"
        f"  to watch it:  gcloud dataflow jobs show {job_id} --region {region}{project}\n"
        f"  to cancel it: gcloud dataflow jobs cancel {job_id} --region {region}{project}"
    )
    if index_upload:
        message += (
            f"\n  its workers fetch the quick check's index from {index_upload}: delete it once the job has "
            f"ended (gcloud storage rm {index_upload})"
        )
    return message


def request_digest(output_dir: str, config: dict, beam_args: list[str]) -> str:
    """20 hex digits: the same for every launch of the same request (its settings and Beam flags) into the
    same output directory, whatever its --job_name and --labels (they differ between two launches of one
    request without changing what it does)."""
    identity = ("--job_name", "--labels")
    kept = [
        arg
        for index, arg in enumerate(beam_args)
        if arg.split("=", 1)[0] not in identity and (index == 0 or beam_args[index - 1] not in identity)
    ]
    request = json.dumps({"config": config, "beam_args": sorted(kept)}, sort_keys=True, default=str)
    request = hashlib.sha256(request.encode("utf-8")).hexdigest()
    return hashlib.sha256(f"{output_dir}\n{request}".encode()).hexdigest()[:_NAME_FINGERPRINT_CHARS]


def set_job_identity(
    options: PipelineOptions, output_dir: str, config: dict, beam_args: list[str], ids: dict
):
    """Gives a Dataflow job its stable name, `preprocess-<request digest>` (unless --job_name was given), from
    `config` (without the build id), and its run's labels `ids`; returns the job name."""
    cloud = options.view_as(GoogleCloudOptions)
    digest = request_digest(output_dir, config, beam_args)
    if not cloud.job_name or cloud.job_name.startswith("beamapp-"):
        cloud.job_name = _JOB_NAME_PREFIX + digest
    ids = {REQUEST_LABEL: digest, **ids}
    labels = [label for label in (cloud.labels or []) if label.split("=", 1)[0] not in ids]
    cloud.labels = labels + [
        f"{key}={re.sub(r'[^a-z0-9_-]', '_', value.lower())[:63]}" for key, value in ids.items()
    ]
    return cloud.job_name


def label_to_run_id(value: str | None) -> str | None:
    """The run id a `run-id` label holds (labels are lowercase: runs.new_run_id's 'T' and 'Z' come back)."""
    if not value:
        return None
    match = re.fullmatch(r"(\d{8})t(\d{12})z-([0-9a-f]{8})", value)
    return f"{match.group(1)}T{match.group(2)}Z-{match.group(3)}" if match else None


def _application_client(options: PipelineOptions):
    from apache_beam.runners.dataflow.internal.apiclient import DataflowApplicationClient

    return DataflowApplicationClient(options)


def attach_to_running_job(options: PipelineOptions, exc: BaseException):
    """(PipelineResult of the running job that holds this job's name, its labels), from Dataflow's refusal
    `exc`, which names the job's id."""
    client = _application_client(options)
    found = _ALREADY_EXISTS_ID.search(str(exc))
    job_id = found.group(1) if found else client.job_id_for_name(options.view_as(GoogleCloudOptions).job_name)
    return attach_to_job(options, job_id, client)


def attach_to_job(options: PipelineOptions, job_id: str, client=None):
    """(PipelineResult of Dataflow job `job_id`, which waiting on follows, its labels)."""
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult

    client = client or _application_client(options)
    job = client.get_job(job_id)
    # What DataflowPipelineResult asks of its runner: a client, and the polling loop's last error.
    runner = types.SimpleNamespace(dataflow_client=client, last_error_msg=None)
    return DataflowPipelineResult(job, runner, options), dict(job.labels or {})


def recorded_job_state(options: PipelineOptions):
    """job_record.claim's `job_state`: asks Dataflow about a recorded launch's job, by id once it has
    one, else by name (running jobs only); the client is made at the first question."""
    make_client = functools.cache(lambda: _application_client(options))

    def state(record) -> tuple[str | None, str | None]:
        dataflow = make_client()
        if record.job_id:
            # JobState.JOB_STATE_RUNNING (an enum member, or its name) -> RUNNING
            state = dataflow.get_job(record.job_id).current_state
            name = getattr(state, "name", None) or str(state)
            return record.job_id, name.rsplit(".", 1)[-1].removeprefix("JOB_STATE_")
        try:
            job_id = dataflow.job_id_for_name(record.job_name)
        except ValueError:  # Beam's client: no running job of that name
            return None, None
        return job_id, "RUNNING"

    return state
