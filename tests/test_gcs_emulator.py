"""The GCS emulator fixture holds for every client: google-cloud-storage, Beam's GCS IO, TensorFlow's gs://.

Multi-MB payloads are compared byte for byte across clients, since the ways they upload differ
(multipart, single-PUT resumable, multi-chunk resumable with ``Content-Range: bytes A-B/*``).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import pytest
import requests
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from google.cloud import storage

from tests import gcs_emulator as gcs_emulator_lib

MiB = 1 << 20


def _random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _split_gs_url(url: str) -> tuple[str, str]:
    bucket, _, name = url.removeprefix("gs://").partition("/")
    return bucket, name


def _object_name(url: str) -> str:
    return _split_gs_url(url)[1]


def _write_with_gcs_client(url: str, data: bytes) -> None:
    bucket, name = _split_gs_url(url)
    storage.Client().bucket(bucket).blob(name).upload_from_string(
        data, content_type="application/octet-stream"
    )


def _read_with_gcs_client(url: str) -> bytes:
    bucket, name = _split_gs_url(url)
    return storage.Client().bucket(bucket).blob(name).download_as_bytes()


def _write_with_beam(url: str, data: bytes) -> None:
    with FileSystems.create(url) as f:
        f.write(data)


def _read_with_beam(url: str) -> bytes:
    with FileSystems.open(url) as f:
        return f.read()


def _write_with_tensorflow(url: str, data: bytes) -> None:
    with tf.io.gfile.GFile(url, "wb") as f:
        f.write(data)


def _read_with_tensorflow(url: str) -> bytes:
    with tf.io.gfile.GFile(url, "rb") as f:
        return f.read()


WRITERS = {
    "google-cloud-storage": _write_with_gcs_client,
    "beam": _write_with_beam,
    "tensorflow": _write_with_tensorflow,
}
READERS = {
    "google-cloud-storage": _read_with_gcs_client,
    "beam": _read_with_beam,
    "tensorflow": _read_with_tensorflow,
}


def test_google_cloud_storage_uploads_and_downloads_bytes_exactly(gcs_emulator, gcs_dir):
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    small = _random_bytes(1000, seed=1)  # a multipart upload
    large = _random_bytes(9 * MiB + 7, seed=2)  # over 8 MiB: a resumable upload
    for name, data in (("small.bin", small), ("large.bin", large)):
        blob = bucket.blob(f"{_object_name(gcs_dir)}/{name}")
        blob.upload_from_string(data)
        assert blob.download_as_bytes() == data
        assert gcs_emulator.read_object(blob.name) == data
    assert gcs_emulator.list_objects(_object_name(gcs_dir)) == {
        f"{_object_name(gcs_dir)}/small.bin": len(small),
        f"{_object_name(gcs_dir)}/large.bin": len(large),
    }


def test_beam_filesystems_create_open_match_rename_delete_on_gcs(gcs_emulator, gcs_dir):
    data = _random_bytes(20 * MiB + 3, seed=3)  # Beam uploads in 16 MiB chunks: two of them
    original, renamed = f"{gcs_dir}/original.bin", f"{gcs_dir}/renamed.bin"

    _write_with_beam(original, data)
    [match] = FileSystems.match([f"{gcs_dir}/*"])
    assert [(m.path, m.size_in_bytes) for m in match.metadata_list] == [(original, len(data))]
    assert _read_with_beam(original) == data
    assert gcs_emulator.read_object(_object_name(original)) == data

    FileSystems.rename([original], [renamed])  # copy + delete, both as GCS batch requests
    assert [m.path for m in FileSystems.match([f"{gcs_dir}/*"])[0].metadata_list] == [renamed]
    assert not FileSystems.exists(original)
    assert _read_with_beam(renamed) == data

    FileSystems.delete([renamed])
    assert FileSystems.match([f"{gcs_dir}/*"])[0].metadata_list == []
    assert gcs_emulator.list_objects(_object_name(gcs_dir)) == {}


def test_beam_pipeline_writes_text_to_gcs_and_reads_it_back(gcs_emulator, gcs_dir):
    lines = [f"line {i}" for i in range(1000)]
    options = PipelineOptions(["--runner=DirectRunner"])
    with beam.Pipeline(options=options) as pipeline:
        _ = pipeline | beam.Create(lines) | beam.io.WriteToText(f"{gcs_dir}/out", num_shards=3)

    # Finalization renamed the shards into place and deleted Beam's temporary directory.
    shards = gcs_emulator.list_objects(_object_name(gcs_dir))
    assert sorted(shards) == [f"{_object_name(gcs_dir)}/out-0000{i}-of-00003" for i in range(3)]

    with beam.Pipeline(options=options) as pipeline:
        read = pipeline | beam.io.ReadFromText(f"{gcs_dir}/out-*")
        assert_that(read, equal_to(lines))


def test_tensorflow_gfile_write_read_list_rename_remove_on_gcs(gcs_emulator, gcs_dir):
    data = _random_bytes(12 * MiB + 5, seed=4)
    path, renamed = f"{gcs_dir}/sub/data.bin", f"{gcs_dir}/sub/renamed.bin"

    _write_with_tensorflow(path, data)
    assert tf.io.gfile.exists(path)
    assert tf.io.gfile.isdir(f"{gcs_dir}/sub")
    assert tf.io.gfile.listdir(gcs_dir) == ["sub/"]
    assert tf.io.gfile.listdir(f"{gcs_dir}/sub") == ["data.bin"]
    assert tf.io.gfile.glob(f"{gcs_dir}/sub/*.bin") == [path]
    assert tf.io.gfile.stat(path).length == len(data)
    assert _read_with_tensorflow(path) == data
    assert tf.io.read_file(path).numpy() == data

    tf.io.write_file(f"{gcs_dir}/written_by_op.txt", tf.constant(b"from a TF op"))
    assert gcs_emulator.read_object(f"{_object_name(gcs_dir)}/written_by_op.txt") == b"from a TF op"

    tf.io.gfile.rename(path, renamed)
    assert not tf.io.gfile.exists(path)
    assert _read_with_tensorflow(renamed) == data
    tf.io.gfile.remove(renamed)
    assert not tf.io.gfile.exists(renamed)
    assert gcs_emulator.list_objects(f"{_object_name(gcs_dir)}/sub/data") == {}


def test_tensorflow_renames_a_directory_on_gcs(gcs_emulator, gcs_dir):
    # TensorFlow asks for the bucket's storageLayout first (tf.Transform publishes transform_fn/ so).
    source, target = f"{gcs_dir}/staged", f"{gcs_dir}/final"
    files = {"saved_model.pb": b"graph", "variables/variables.index": b"index"}
    for name, data in files.items():
        _write_with_tensorflow(f"{source}/{name}", data)

    tf.io.gfile.rename(source, target, overwrite=True)

    for name, data in files.items():
        assert gcs_emulator.read_object(f"{_object_name(target)}/{name}") == data
    assert not [
        name for name in gcs_emulator.list_objects(f"{_object_name(source)}/") if not name.endswith("/")
    ]


@pytest.mark.parametrize("writer", WRITERS)
def test_bytes_written_by_one_client_are_read_back_exactly_by_every_client(gcs_emulator, gcs_dir, writer):
    # 17 MiB: two chunks for Beam's resumable writer, one PUT for TensorFlow, resumable for google-cloud-storage.
    data = _random_bytes(17 * MiB + 11, seed=5)
    url = f"{gcs_dir}/from-{writer}.bin"
    WRITERS[writer](url, data)
    assert gcs_emulator.list_objects(_object_name(url)) == {_object_name(url): len(data)}
    assert (
        hashlib.sha256(gcs_emulator.read_object(_object_name(url))).digest() == hashlib.sha256(data).digest()
    )
    for reader, read in READERS.items():
        assert read(url) == data, f"{reader} read back something else than {writer} wrote"


def test_tfrecord_dataset_reads_the_records_a_beam_pipeline_wrote_to_gcs(gcs_dir):
    records = [_random_bytes(20_000, seed=i) + b"#%d" % i for i in range(200)]  # about 4 MB in all
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as pipeline:
        _ = (
            pipeline
            | beam.Create(records)
            | beam.io.WriteToTFRecord(f"{gcs_dir}/records/part", file_name_suffix=".tfrecord", num_shards=2)
        )

    files = sorted(tf.io.gfile.glob(f"{gcs_dir}/records/part-*.tfrecord"))
    assert len(files) == 2
    # As stage 2 reads: parallel, non-deterministic interleave over the shards.
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2, deterministic=False
    )
    assert sorted(record.numpy() for record in dataset) == sorted(records)


def test_checkpoint_manager_saves_restores_and_prunes_on_gcs(gcs_emulator, gcs_dir):
    variable = tf.Variable([1.0, 2.0, 3.0])
    checkpoint = tf.train.Checkpoint(v=variable, step=tf.Variable(0))
    manager = tf.train.CheckpointManager(checkpoint, f"{gcs_dir}/ckpt", max_to_keep=1)
    first = manager.save()
    variable.assign([4.0, 5.0, 6.0])
    checkpoint.step.assign(1)
    second = manager.save()

    assert tf.train.latest_checkpoint(f"{gcs_dir}/ckpt") == second
    assert not tf.io.gfile.glob(f"{first}.*"), "max_to_keep=1 should have deleted the first checkpoint"
    variable.assign([0.0, 0.0, 0.0])
    checkpoint.step.assign(0)
    checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    assert variable.numpy().tolist() == [4.0, 5.0, 6.0]
    assert int(checkpoint.step) == 1


class _Scale(tf.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = tf.Variable(factor)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def __call__(self, x):
        return x * self.factor


def test_saved_model_round_trips_through_gcs(gcs_emulator, gcs_dir):
    export_dir = f"{gcs_dir}/saved_model"
    tf.saved_model.save(_Scale(2.5), export_dir)

    stored = gcs_emulator.list_objects(_object_name(export_dir))
    assert f"{_object_name(export_dir)}/saved_model.pb" in stored
    loaded = tf.saved_model.load(export_dir)
    assert loaded(tf.constant([1.0, 2.0])).numpy().tolist() == [2.5, 5.0]
    serving = loaded.signatures["serving_default"]
    assert next(iter(serving(tf.constant([4.0])).values())).numpy().tolist() == [10.0]


@pytest.mark.parametrize("route", ["STORAGE_EMULATOR_HOST", "https_proxy"])
def test_upload_sent_with_chunked_transfer_encoding_is_stored_exactly(gcs_emulator, gcs_dir, route):
    data = _random_bytes(3 * MiB + 1, seed=6)
    name = f"{_object_name(gcs_dir)}/chunked.bin"
    base = (
        os.environ["STORAGE_EMULATOR_HOST"]
        if route == "STORAGE_EMULATOR_HOST"
        else "https://www.googleapis.com"
    )

    def pieces():  # a generator body: requests sends it with Transfer-Encoding: chunked
        for start in range(0, len(data), 100_000):
            yield data[start : start + 100_000]

    response = requests.post(
        f"{base}/upload/storage/v1/b/{gcs_emulator.bucket}/o",
        params={"uploadType": "media", "name": name},
        data=pieces(),
        headers={"Content-Type": "application/octet-stream"},
        verify=os.environ["CURL_CA_BUNDLE"],  # REQUESTS_CA_BUNDLE, if set, would win over it
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert gcs_emulator.read_object(name) == data


def test_resumable_upload_answers_a_status_query_with_the_committed_range(gcs_emulator, gcs_dir):
    # TensorFlow's retry path: after a failed PUT it asks how much arrived (Content-Range: bytes */N)
    # and resumes from there. An emulator that finalized the object here would store it truncated.
    data = _random_bytes(2 * MiB + 100, seed=7)
    chunk = 4 * 256 * 1024
    name = f"{_object_name(gcs_dir)}/resumed.bin"
    ca_bundle = os.environ[
        "CURL_CA_BUNDLE"
    ]  # passed per request: REQUESTS_CA_BUNDLE would beat Session.verify
    with requests.Session() as session:
        started = session.post(
            f"https://www.googleapis.com/upload/storage/v1/b/{gcs_emulator.bucket}/o",
            params={"uploadType": "resumable", "name": name},
            headers={"X-Upload-Content-Length": str(len(data))},
            verify=ca_bundle,
            timeout=30,
        )
        assert started.status_code == 200, started.text
        upload_url = started.headers["Location"]
        assert upload_url.startswith("https://www.googleapis.com/"), "must come back through the proxy"

        def put(body: bytes, content_range: str) -> requests.Response:
            return session.put(
                upload_url,
                data=body,
                headers={"Content-Range": content_range},
                allow_redirects=False,  # 308 here means "resume incomplete", not a redirect
                verify=ca_bundle,
                timeout=30,
            )

        assert put(data[:chunk], f"bytes 0-{chunk - 1}/{len(data)}").status_code == 308
        status = put(b"", f"bytes */{len(data)}")
        assert (status.status_code, status.headers.get("Range")) == (308, f"bytes=0-{chunk - 1}")
        assert gcs_emulator.list_objects(name) == {}
        assert put(data[chunk:], f"bytes {chunk}-{len(data) - 1}/{len(data)}").status_code == 200
    assert gcs_emulator.read_object(name) == data


def test_proxy_tunnels_only_to_google_api_hosts(gcs_emulator):
    connection = http.client.HTTPConnection("127.0.0.1", gcs_emulator.proxy.port, timeout=10)
    try:
        connection.request("CONNECT", "example.com:443")
        assert connection.getresponse().status == 403
    finally:
        connection.close()


_SUBPROCESS_CHECK = """
import hashlib, json, sys, time
from apache_beam.io.filesystems import FileSystems
start = time.monotonic()
FileSystems.match([sys.argv[1] + "*"])
beam_match_s = time.monotonic() - start
import tensorflow as tf
data = tf.io.gfile.GFile(sys.argv[1], "rb").read()
tf.io.gfile.GFile(sys.argv[2], "wb").write(data[::-1])
print(json.dumps({"beam_match_s": beam_match_s, "sha256": hashlib.sha256(data).hexdigest()}))
"""


@pytest.mark.slow  # a fresh interpreter importing Beam and TensorFlow: 7-11 s here
def test_a_subprocess_given_env_reaches_the_emulator_without_credential_delays(gcs_emulator, gcs_dir):
    data = _random_bytes(5 * MiB, seed=8)
    source, reversed_copy = f"{gcs_dir}/for-child.bin", f"{gcs_dir}/from-child.bin"
    _write_with_gcs_client(source, data)

    result = gcs_emulator.run([sys.executable, "-c", _SUBPROCESS_CHECK, source, reversed_copy], timeout=300)

    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sha256"] == hashlib.sha256(data).hexdigest()
    assert gcs_emulator.read_object(_object_name(reversed_copy)) == data[::-1]
    # Without credentials Beam retries google.auth.default() for about 30 s before going anonymous.
    assert report["beam_match_s"] < 5, f"Beam's first gs:// match took {report['beam_match_s']:.1f} s"


def test_beam_first_gcs_match_in_this_process_is_fast(gcs_dir):
    start = time.monotonic()
    FileSystems.match([f"{gcs_dir}/*"])
    assert time.monotonic() - start < 5


def test_emulator_start_fails_clearly_when_its_port_is_taken(tmp_path, monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        monkeypatch.setattr(gcs_emulator_lib, "find_free_port", lambda: squatter.getsockname()[1])
        with pytest.raises(gcs_emulator_lib.EmulatorStartError, match="port .* is taken"):
            gcs_emulator_lib.StorageEmulatorProcess.start(tmp_path, timeout_s=20)


# Last in this file on purpose: it checks what the tests above left behind.
def test_gcs_paths_never_land_on_local_disk(gcs_emulator, request, tmp_path_factory):
    # A gs:// path that reached a local filesystem would show up as a directory named "gs:".
    places = {Path.cwd(), request.config.rootpath, Path(tempfile.gettempdir())}
    stray = [str(place / "gs:") for place in places if (place / "gs:").exists()]
    stray += [str(path) for path in tmp_path_factory.getbasetemp().rglob("gs:")]
    assert not stray, f"gs:// paths were written to local disk: {stray}"
