"""The one reader of the published dataset (dataset_contract/commit_log.py), in every layout, with the file
access of each stage (TensorFlow's for stage 2, the publish store's for stage 1 and the workflows)."""

import json

import pytest

from dataset_contract import commit_log
from dataset_contract import manifest as manifest_lib
from preprocess.publish import store as dataset_store
from preprocess.publish.protocol import StoreFiles


@pytest.fixture(params=["tensorflow", "store"])
def files(request, tmp_path):
    return (
        commit_log.TensorFlowFiles()
        if request.param == "tensorflow"
        else StoreFiles(dataset_store.open_store(str(tmp_path)))
    )


def write(directory, name, document) -> bytes:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(document).encode()
    path.write_bytes(data)
    return data


def test_the_head_is_the_highest_sequence_of_either_name_form_and_dataset_json_is_not_trusted(
    tmp_path, files
):
    write(tmp_path, "manifests/000000000007-20260101T000000000000Z-1a2b3c4d.json", {"run": {"id": "old"}})
    write(tmp_path, commit_log.commit_name(8), {"run": {"id": "eight"}})
    newest = write(tmp_path, commit_log.commit_name(10), {"run": {"id": "ten"}})
    write(tmp_path, "manifests/notes.txt", {"run": {"id": "not a commit"}})
    write(tmp_path, "dataset.json", {"format_version": 2, "run": {"id": "eight"}})  # a stale copy
    published = commit_log.read_published(str(tmp_path), files)
    assert (published.data, published.sequence) == (newest, 10)
    assert published.path == str(tmp_path / "manifests" / "00000000000000000010.json")
    assert published.manifest() == {"run": {"id": "ten"}}


def test_a_directory_in_format_2_is_read_from_dataset_json(tmp_path, files):
    data = write(tmp_path, "dataset.json", {"format_version": 2, "run": {"id": "r"}})
    published = commit_log.read_published(str(tmp_path), files)
    assert (published.data, published.sequence, published.path) == (data, 0, str(tmp_path / "dataset.json"))


def test_no_dataset_is_none_and_a_pointer_without_a_commit_says_the_first_publish_has_not_finished(
    tmp_path, files
):
    assert commit_log.read_published(str(tmp_path / "absent"), files) is None
    write(tmp_path, "dataset.json", {"format_version": 3, "layout": "manifests"})  # format 3's pointer
    with pytest.raises(manifest_lib.ManifestError, match="holds no manifest"):
        commit_log.read_published(str(tmp_path), files)


def test_a_head_removed_between_the_listing_and_the_read_is_listed_again():
    class Flaky:
        listed = 0

        def list_names(self, directory):
            self.listed += 1
            return ["00000000000000000002.json", "00000000000000000001.json"][self.listed - 1 :]

        def read(self, path):
            return None if path.endswith("2.json") else b"{}"

    files = Flaky()
    assert commit_log.read_published("d", files).sequence == 1
    assert files.listed == 2


def test_on_gcs_no_dataset_yet_is_none_and_the_newest_commit_is_found(gcs_emulator, gcs_dir):
    files = StoreFiles(dataset_store.open_store(gcs_dir))
    assert commit_log.read_published(gcs_dir, files) is None
    from google.cloud import storage  # noqa: PLC0415

    prefix = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    storage.Client().bucket(gcs_emulator.bucket).blob(
        f"{prefix}/{commit_log.commit_name(3)}"
    ).upload_from_string(b'{"run": {"id": "three"}}')
    assert commit_log.read_published(gcs_dir, files).manifest() == {"run": {"id": "three"}}
