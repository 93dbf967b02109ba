"""The identity of a stage 1 job on Dataflow, recorded in its output directory, so that a relaunch finds
the running job whatever name the scheduler gives it."""

import dataclasses
import datetime
import json
import logging
import os
import re
import time
from collections.abc import Callable

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.errors import first_line
from preprocess.publish import store as dataset_store

LAUNCHES_DIR = "launches"
# How long a recorded launch may take to get its job id from Dataflow (staging the package and the
# SDK, the job graph's upload) before a later launch of the same request counts it as dead.
SUBMIT_GRACE_SECONDS = 15 * 60
_POLL_SECONDS = 10.0
SUBMIT = "submit"
ATTACH = "attach"
# Dataflow's job states after which a job does nothing more (JOB_STATE_*).
_ENDED = {"DONE", "FAILED", "CANCELLED", "UPDATED", "DRAINED"}
_RECORD = re.compile(r"(?P<request>[0-9a-f]+)\.(?P<attempt>\d{4,})(?P<job>\.job)?\.json")

_FIELDS = ("job_name", "run_id", "build_id", "created_at")  # a record's content

log = logging.getLogger(__name__)


class RelaunchRefused(Exception):
    """A launch of this request is recorded and its job's state cannot be known: what to do."""

    exit_code = 2


@dataclasses.dataclass
class JobRecord:
    """One attempt at running a request on Dataflow."""

    output_dir: str
    request: str
    attempt: int
    job_name: str
    run_id: str | None
    build_id: str | None
    created_at: str
    job_id: str | None = None

    @property
    def path(self) -> str:
        return manifest_lib.join(self.output_dir, _record_name(self.request, self.attempt))

    @property
    def age_seconds(self) -> float:
        created = datetime.datetime.fromisoformat(self.created_at.replace("Z", "+00:00"))
        return (datetime.datetime.now(datetime.timezone.utc) - created).total_seconds()


def _record_name(request: str, attempt: int, job: bool = False) -> str:
    return f"{LAUNCHES_DIR}/{request}.{attempt:04d}{'.job' if job else ''}.json"


def _create(record: JobRecord, content: dict, job: bool = False) -> bool:
    """Create the record (or its `job` id's) only if no object or file has its name; True if this call made it."""
    store = dataset_store.open_store(record.output_dir)
    name = _record_name(record.request, record.attempt, job)
    return store.create_if_absent(name, json.dumps(content, indent=2).encode("utf-8"))


def read_records(output_dir: str, request: str) -> dict[int, JobRecord]:
    """The recorded attempts of `request`, by attempt, with their job ids (one listing, a read each)."""
    pattern = manifest_lib.join(output_dir, LAUNCHES_DIR, f"{request}.*.json")
    try:
        names = [metadata.path for metadata in filesystem.match(pattern)]
    except Exception:  # noqa: BLE001 - no launches/ yet (Beam raises on a pattern under a missing dir)
        return {}
    records, job_ids = {}, {}
    for path in names:
        found = _RECORD.fullmatch(os.path.basename(path))
        if found is None or found.group("request") != request:
            continue
        try:
            content = json.loads(filesystem.read_bytes(path))
        except (OSError, ValueError):
            continue  # being written, or damaged: the attempt does not count
        attempt = int(found.group("attempt"))
        if found.group("job"):
            job_ids[attempt] = content.get("job_id")
        elif content.get("job_name") and content.get("created_at"):
            records[attempt] = JobRecord(output_dir, request, attempt, *(content.get(key) for key in _FIELDS))
    for attempt, job_id in job_ids.items():
        if attempt in records:
            records[attempt].job_id = job_id
    return records


def claim(
    output_dir: str,
    request: str,
    job_name: str,
    run_id: str | None,
    build_id: str,
    job_state: Callable[[JobRecord], tuple[str | None, str | None]],
    grace_seconds: float = SUBMIT_GRACE_SECONDS,
    poll_seconds: float = _POLL_SECONDS,
) -> tuple[str, JobRecord]:
    """(SUBMIT, this launch's new record) or (ATTACH, the running job's record, its job id set).
    `job_state(record)`: (job id, state without JOB_STATE_) or (None, None); if it raises: RelaunchRefused."""
    while True:
        records = read_records(output_dir, request)
        newest = records[max(records)] if records else None
        if newest is not None:
            try:
                job_id, state = job_state(newest)
            except Exception as exc:  # noqa: BLE001 - whatever the API says, the answer is the same
                raise RelaunchRefused(_refusal(newest, exc)) from exc
            if state is not None and state not in _ENDED:
                newest.job_id = job_id
                return ATTACH, newest
            if state is None and newest.job_id is None and newest.age_seconds < grace_seconds:
                log.info(
                    "a launch of this request is submitting Dataflow job %s (recorded in %s): waiting for it",
                    newest.job_name,
                    newest.path,
                )
                time.sleep(poll_seconds)
                continue
        attempt = newest.attempt + 1 if newest is not None else 1
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        record = JobRecord(output_dir, request, attempt, job_name, run_id, build_id, now)
        if _create(record, {key: getattr(record, key) for key in _FIELDS}):
            return SUBMIT, record
        # Another launch created this attempt first: read it and decide again.


def record_job_id(record: JobRecord, job_id: str) -> None:
    """Record the id Dataflow gave the attempt's job (so a relaunch asks for it by id)."""
    record.job_id = job_id
    try:
        _create(record, {"job_id": job_id}, job=True)
    except Exception as exc:  # noqa: BLE001 - a relaunch finds the job by its name all the same
        path = manifest_lib.join(record.output_dir, _record_name(record.request, record.attempt, job=True))
        log.warning("could not record the id of Dataflow job %s in %s (%s)", job_id, path, exc)


def abandon(record: JobRecord) -> None:
    """Remove the record of an attempt whose job was never submitted (best effort)."""
    try:
        filesystem.delete_files([record.path])
    except Exception as exc:  # noqa: BLE001 - the grace period lets the next launch go on
        log.warning(
            "could not remove %s (%s): the next launch of this request waits up to %d minutes for its job",
            record.path,
            exc,
            SUBMIT_GRACE_SECONDS // 60,
        )


def _refusal(record: JobRecord, exc: BaseException) -> str:
    return (
        f"a launch of this same request is recorded in {record.path} (Dataflow job {record.job_name}"
        f"{f', id {record.job_id}' if record.job_id else ''}, run {record.run_id}, {record.created_at}), "
        f"and Dataflow cannot be asked whether it still runs ({first_line(exc)}).\n"
        f"  if it runs, wait for it: gcloud dataflow jobs list --filter=name={record.job_name}\n"
        "  to start anew once it has ended: launch again with the permission to view Dataflow jobs "
        f"(roles/dataflow.viewer), or remove {record.path}"
    )
