"""The switch of dataset.json is a compare-and-swap (preprocess/publish/manifest_switch.py), on local disk and GCS.

A writer's check ("does dataset.json name an older run?") holds at the instant of its write: if another
writer replaced dataset.json after it was read, the swap reads it again and decides again.
"""

import json
import os
import threading

import pytest
from google.cloud import storage

from dataset_contract import manifest as manifest_lib
from preprocess.publish import manifest_switch


def _manifest(run_id: str, seen: dict | None = None) -> bytes:
    return json.dumps({"run": {"id": run_id}, "replaced": (seen or {}).get("run", {}).get("id")}).encode()


def _blob(gcs_emulator, url: str):
    name = url.removeprefix(f"gs://{gcs_emulator.bucket}/")
    return storage.Client().bucket(gcs_emulator.bucket).blob(name)


def test_on_gcs_a_switch_is_refused_if_dataset_json_changed_since_it_was_read_and_decided_again(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    manifest_blob = _blob(gcs_emulator, f"{gcs_dir}/{manifest_lib.MANIFEST_FILE}")
    manifest_blob.upload_from_string(_manifest("r1"))
    seen = []

    def decide(current):
        seen.append(current["run"]["id"])
        if len(seen) == 1:  # another writer switches between this read and this write
            manifest_blob.upload_from_string(_manifest("r2"))
        return _manifest("mine", current)

    assert manifest_switch.swap_manifest(gcs_dir, decide, tmp_dir=None)
    assert seen == ["r1", "r2"]
    assert gcs_read_faults.failed_preconditions == [manifest_blob.name]
    assert json.loads(manifest_blob.download_as_bytes()) == {"run": {"id": "mine"}, "replaced": "r2"}


def test_on_gcs_a_first_switch_is_refused_if_another_writer_created_dataset_json_meanwhile(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    manifest_blob = _blob(gcs_emulator, f"{gcs_dir}/{manifest_lib.MANIFEST_FILE}")
    seen = []

    def decide(current):
        seen.append(current)
        if len(seen) == 1:
            manifest_blob.upload_from_string(_manifest("first"))
        return _manifest("mine", current)

    assert manifest_switch.swap_manifest(gcs_dir, decide, tmp_dir=None)
    assert seen[0] is None and seen[1]["run"]["id"] == "first"
    assert json.loads(manifest_blob.download_as_bytes())["replaced"] == "first"


def test_a_refusal_inside_the_swap_writes_nothing(tmp_path):
    (tmp_path / manifest_lib.MANIFEST_FILE).write_bytes(_manifest("newer"))

    def refuse(current):
        raise RuntimeError(f"{current['run']['id']} is newer")

    with pytest.raises(RuntimeError, match="newer is newer"):
        manifest_switch.swap_manifest(str(tmp_path), refuse, tmp_dir=str(tmp_path / "tmp"))
    assert json.loads((tmp_path / manifest_lib.MANIFEST_FILE).read_bytes())["run"]["id"] == "newer"
    assert os.listdir(tmp_path) == [manifest_lib.MANIFEST_FILE]  # the lock file is gone


def test_on_local_disk_a_switch_waits_for_the_one_under_way_and_decides_on_its_result(tmp_path):
    (tmp_path / manifest_lib.MANIFEST_FILE).write_bytes(_manifest("r1"))
    first_is_deciding, let_first_write = threading.Event(), threading.Event()
    seen = {}

    def first(current):
        seen["first"] = current["run"]["id"]
        first_is_deciding.set()
        assert let_first_write.wait(30)
        return _manifest("first", current)

    def second(current):
        seen["second"] = current["run"]["id"]
        return _manifest("second", current)

    def swap(decide):
        manifest_switch.swap_manifest(str(tmp_path), decide, tmp_dir=str(tmp_path / "tmp"))

    first_thread = threading.Thread(target=swap, args=(first,))
    first_thread.start()
    assert first_is_deciding.wait(30)
    second_thread = threading.Thread(target=swap, args=(second,))
    second_thread.start()
    second_thread.join(timeout=1.0)
    assert second_thread.is_alive() and "second" not in seen  # held at the lock, not deciding on r1
    let_first_write.set()
    first_thread.join(timeout=30)
    second_thread.join(timeout=30)
    assert seen == {"first": "r1", "second": "first"}
    assert json.loads((tmp_path / manifest_lib.MANIFEST_FILE).read_bytes()) == {
        "run": {"id": "second"},
        "replaced": "first",
    }
    assert not (tmp_path / manifest_switch.LOCK_FILE).exists()
