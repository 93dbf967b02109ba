"""The superseded check costs a metadata request per process a minute, and a download per publish.

On the GCS emulator, through the tests' forwarder, which counts every request (tests/gcs_emulator.py).
"""

import json

import pytest
from google.cloud import storage

from dataset_contract import manifest as manifest_lib
from preprocess.publish import superseded
from preprocess.publish.commit import SupersededRunError, superseded_message
from preprocess.publish.runs import new_run_id

# A manifest of a large job is megabytes (every shard listed): the check must not download it each time.
MANIFEST_PADDING = 1 << 20


@pytest.fixture(autouse=True)
def fresh_process_cache():
    superseded._PROBES.clear()
    yield
    superseded._PROBES.clear()


def _publish(gcs_emulator, output: str, run_id: str) -> str:
    """Writes dataset.json naming `run_id` (as a publish would replace it); returns its object name."""
    name = f"{output.removeprefix(f'gs://{gcs_emulator.bucket}/')}/{manifest_lib.MANIFEST_FILE}"
    manifest = {"format_version": 2, "run": {"id": run_id}, "padding": "x" * MANIFEST_PADDING}
    storage.Client().bucket(gcs_emulator.bucket).blob(name).upload_from_string(json.dumps(manifest))
    return name


def test_many_checks_in_one_process_cost_one_metadata_request_a_minute_and_one_download_per_publish(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    output = f"{gcs_dir}/dataset"
    name = _publish(gcs_emulator, output, new_run_id())
    own = new_run_id()
    prefix = name.rsplit("/", 1)[0]

    # Four DoFn instances (threads of one SDK process), a thousand elements within the minute.
    checks = [superseded.StopIfSupersededFn(output) for _ in range(4)]
    for element in range(1000):
        assert list(checks[element % 4].process(element, own)) == [element]
    first = gcs_read_faults.count_requests(prefix)
    assert first["media"] == 1  # the manifest, once
    assert first["metadata"] <= 3  # its generation; Beam's reader asks for the metadata as it opens it
    assert gcs_read_faults.media_bytes[name] > MANIFEST_PADDING

    # Every check due (a minute passed each time), nothing published since: metadata only.
    due = [superseded.StopIfSupersededFn(output, check_seconds=0) for _ in range(4)]
    for element in range(20):
        assert list(due[element % 4].process(element, own)) == [element]
    again = gcs_read_faults.count_requests(prefix) - first
    assert again == {"metadata": 20}

    # A newer run publishes: the next check downloads the new manifest once, and stops this run.
    newer = new_run_id()
    _publish(gcs_emulator, output, newer)
    before = gcs_read_faults.count_requests(prefix)
    for check in due:
        with pytest.raises(SupersededRunError) as raised:
            list(check.process(0, own))
        assert str(raised.value) == superseded_message(output, own, newer)
    after = gcs_read_faults.count_requests(prefix) - before
    assert after["media"] == 1 and after["upload"] == 0


def test_no_manifest_yet_is_not_superseded_and_downloads_nothing(gcs_emulator, gcs_dir, gcs_read_faults):
    output = f"{gcs_dir}/dataset"
    check = superseded.StopIfSupersededFn(output, check_seconds=0)
    for element in range(5):
        assert list(check.process(element, new_run_id())) == [element]
    prefix = output.removeprefix(f"gs://{gcs_emulator.bucket}/")
    assert gcs_read_faults.count_requests(prefix) == {"metadata": 5}


def test_on_local_disk_a_replaced_manifest_is_seen_at_the_next_check(tmp_path):
    own = new_run_id()
    path = tmp_path / manifest_lib.MANIFEST_FILE
    path.write_text(json.dumps({"format_version": 2, "run": {"id": own}}))
    check = superseded.StopIfSupersededFn(str(tmp_path), check_seconds=0)
    assert list(check.process(1, own)) == [1]
    newer = new_run_id()
    path.write_text(json.dumps({"format_version": 2, "run": {"id": newer, "padding": "-"}}))
    with pytest.raises(SupersededRunError):
        list(check.process(2, own))


def test_in_the_never_overwrite_layout_a_new_manifests_object_is_seen_without_downloading_each_time(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    # Format 3 (a retention-locked bucket): dataset.json is a pointer written once, so its generation never
    # changes; a publish adds manifests/<sequence>-<run id>.json.
    output = f"{gcs_dir}/dataset"
    prefix = output.removeprefix(f"gs://{gcs_emulator.bucket}/")
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    bucket.blob(f"{prefix}/{manifest_lib.MANIFEST_FILE}").upload_from_string(
        json.dumps(manifest_lib.pointer_manifest())
    )

    def publish(sequence, run_id):
        manifest = {"format_version": 2, "run": {"id": run_id}, "padding": "x" * MANIFEST_PADDING}
        name = f"{prefix}/{manifest_lib.manifest_object_name(sequence, run_id)}"
        bucket.blob(name).upload_from_string(json.dumps(manifest))

    publish(1, new_run_id())
    own = new_run_id()
    check = superseded.StopIfSupersededFn(output, check_seconds=0)
    for element in range(5):
        assert list(check.process(element, own)) == [element]
    assert gcs_read_faults.count_requests(prefix).get("media", 0) == 2  # the pointer and the manifest, once

    newer = new_run_id()
    publish(2, newer)
    with pytest.raises(SupersededRunError) as raised:
        list(check.process(5, own))
    assert str(raised.value) == superseded_message(output, own, newer)
