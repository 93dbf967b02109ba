"""The superseded check costs one small metadata read per worker a minute, and a download per publish.

On the GCS emulator, through the tests' forwarder, which counts every request (tests/gcs_emulator.py). The
processes of one worker are real processes sharing its temporary directory, as a Dataflow worker's SDK
processes do.
"""

import json
import multiprocessing
import os

import pytest
from google.cloud import storage

from dataset_contract import commit_log
from preprocess.publish import superseded
from preprocess.publish.commit import SupersededRunError, superseded_message
from preprocess.publish.runs import new_run_id

# A manifest of a large job is megabytes (every shard listed): the check must not download it each time.
MANIFEST_PADDING = 1 << 20


@pytest.fixture(autouse=True)
def worker_tmp(tmp_path, monkeypatch):
    """A worker's own temporary directory (the check's cache lives there)."""
    directory = tmp_path / "worker-tmp"
    directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(directory))
    monkeypatch.setattr("tempfile.tempdir", None)
    return directory


def _commit(gcs_emulator, output: str, sequence: int, run_id: str) -> str:
    """Creates commit `sequence` naming `run_id` (as a publish would); returns its object name."""
    name = f"{output.removeprefix(f'gs://{gcs_emulator.bucket}/')}/{commit_log.commit_name(sequence)}"
    manifest = {"format_version": 2, "run": {"id": run_id}, "padding": "x" * MANIFEST_PADDING}
    storage.Client().bucket(gcs_emulator.bucket).blob(name).upload_from_string(json.dumps(manifest))
    return name


def _check_in_a_process(output, own, elements, check_seconds, env, results):
    os.environ.update(env)
    check = superseded.StopIfSupersededFn(output, check_seconds=check_seconds)
    try:
        results.put(len([out for element in range(elements) for out in check.process(element, own)]))
    except SupersededRunError as exc:
        results.put(str(exc))


def _run_processes(count, output, own, elements, check_seconds, env) -> list:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=_check_in_a_process, args=(output, own, elements, check_seconds, env, results))
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    answers = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return answers


def test_the_processes_of_a_worker_share_one_metadata_read_a_minute_and_one_download_per_publish(
    gcs_emulator, gcs_dir, gcs_read_faults, worker_tmp
):
    output = f"{gcs_dir}/dataset"
    first_name = _commit(gcs_emulator, output, 1, new_run_id())
    own = new_run_id()
    prefix = first_name.rsplit("/", 2)[0]
    env = {**gcs_read_faults.env, "TMPDIR": str(worker_tmp)}

    # Four SDK processes of one worker, 500 elements each within the minute: the first asks (one listing
    # of manifests/ and one download to learn the head), the others read its answer.
    assert _run_processes(4, output, own, 500, 60.0, env) == [500] * 4
    first = gcs_read_faults.count_requests(prefix)
    assert first["listing"] == 1 and first["media"] == 1, first

    # The minute has passed (check_seconds 0): each check is one metadata read of the next commit's
    # name, which does not exist; no listing, no download.
    check = superseded.StopIfSupersededFn(output, check_seconds=0)
    for element in range(20):
        assert list(check.process(element, own)) == [element]
    again = gcs_read_faults.count_requests(prefix) - first
    assert again == {"metadata": 20}, again

    # A newer run publishes (commit 2): the next check downloads it once, and stops this run, with the
    # same message at every element (a retried bundle fails the same way).
    newer = new_run_id()
    second_name = _commit(gcs_emulator, output, 2, newer)
    before = gcs_read_faults.count_requests(prefix)
    messages = []
    for element in range(3):
        with pytest.raises(SupersededRunError) as raised:
            list(check.process(element, own))
        messages.append(str(raised.value))
    assert messages == [superseded_message(output, own, newer)] * 3
    after = gcs_read_faults.count_requests(prefix) - before
    assert after["media"] == 1 and after["listing"] == 0, after
    assert gcs_read_faults.media_bytes[second_name] > MANIFEST_PADDING


def test_no_dataset_yet_is_not_superseded_and_then_costs_one_metadata_read_a_check(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    check = superseded.StopIfSupersededFn(f"{gcs_dir}/dataset", check_seconds=0)
    own = new_run_id()
    assert list(check.process("first", own)) == ["first"]  # lists manifests/, looks for dataset.json
    before = gcs_read_faults.count_requests()
    for element in range(5):
        assert list(check.process(element, own)) == [element]
    spent = gcs_read_faults.count_requests() - before
    assert (spent["metadata"], spent["media"], spent["listing"]) == (5, 0, 0), spent


def test_on_local_disk_a_new_commit_is_seen_at_the_next_check(tmp_path):
    output = tmp_path / "dataset"
    (output / "manifests").mkdir(parents=True)
    own = new_run_id()
    check = superseded.StopIfSupersededFn(str(output), check_seconds=0)
    assert list(check.process("x", own)) == ["x"]
    newer = new_run_id()
    (output / commit_log.commit_name(1)).write_text(json.dumps({"run": {"id": newer}}))
    with pytest.raises(SupersededRunError, match=f"run {newer}, which started later"):
        list(check.process("y", own))
