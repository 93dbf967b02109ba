"""The real stage 1 job reading its images from GCS while the storage service fails some reads.

The corpus sits in the GCS emulator; the `gcs_read_faults` forwarder in front of it (tests/gcs_emulator.py)
answers 503 to chosen object reads. What the job must do (issue 10):

* a 503 that the GCS client's own retries absorb costs nothing: every image is written, and only the
  genuinely broken inputs (a missing object, one that answers 403, the corpus's bad files) are recorded;
* a 503 that outlasts the client's retries is raised out of the DoFn, so that the runner retries the
  bundle. Dataflow does (a failing bundle is retried, four times in batch). The local runner stage 1 uses,
  Beam's FnApiRunner, does not retry bundles at all: the first exception out of a DoFn fails the job
  (`fn_runner.py` raises `RuntimeError(result.error)`; apache/beam#18640). So locally the honest check is
  that the job fails loudly and publishes nothing, instead of writing a dataset that silently lacks the
  image; that the DoFn raises is also checked alone in test_reading.py.
"""

import csv
import os

import pytest
from google.cloud import storage

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from tests.gcs_emulator import ReadFaults
from tests.stage1 import read_errors, run_stage1, write_corpus

pytestmark = pytest.mark.slow

FAULT_FRACTION = 0.3


def _upload_corpus(gcs_emulator, gcs_dir, tmp_path):
    """The sample corpus in GCS, plus an object that answers 403 and a manifest row naming a missing object.

    Returns (manifest url, corpus info, {uri: expected reason}, object prefix of the images).
    """
    corpus = write_corpus(tmp_path / "corpus", images_per_class=4, seed=5)
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    images = f"{gcs_dir}/raw"
    prefix = images.removeprefix(f"gs://{gcs_emulator.bucket}/")
    rows, expected = [], {}
    for corpus_file in corpus.files:
        url = f"{images}/{corpus_file.path}"
        bucket.blob(f"{prefix}/{corpus_file.path}").upload_from_filename(corpus.uri(corpus_file))
        rows.append((url, corpus_file.class_name))
        if corpus_file.expected_error:
            expected[url] = corpus_file.expected_error
    forbidden = f"{images}/{corpus.class_names[0]}/forbidden.jpg"
    with open(corpus.uri(corpus.files[0]), "rb") as handle:
        bucket.blob(f"{prefix}/{corpus.class_names[0]}/forbidden.jpg").upload_from_string(
            handle.read() + b"another file"
        )
    missing = f"{images}/{corpus.class_names[1]}/missing.jpg"
    rows += [(forbidden, corpus.class_names[0]), (missing, corpus.class_names[1])]
    expected.update({forbidden: errors.UNREADABLE, missing: errors.UNREADABLE})
    local_manifest = tmp_path / "labels.csv"
    with open(local_manifest, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["uri", "label"])
        writer.writerows(rows)
    manifest_url = f"{gcs_dir}/labels.csv"
    bucket.blob(manifest_url.removeprefix(f"gs://{gcs_emulator.bucket}/")).upload_from_filename(
        str(local_manifest)
    )
    return manifest_url, corpus, expected, prefix, f"{prefix}/{corpus.class_names[0]}/forbidden.jpg"


def test_503s_absorbed_by_the_client_retries_lose_no_image(
    gcs_emulator, gcs_dir, gcs_read_faults, fast_gcs_backoff, tmp_path
):
    # The client's retries with 1/20 of their waits (fast_gcs_backoff): ~25 503s waited ~1 s each.
    manifest_url, corpus, expected, prefix, forbidden = _upload_corpus(gcs_emulator, gcs_dir, tmp_path)
    gcs_read_faults.faults = ReadFaults(fraction=FAULT_FRACTION, prefix=prefix + "/", media={forbidden: 403})
    output = tmp_path / "dataset"

    manifest = run_stage1(manifest_url, output, image_size=16, encoding="uint8", min_shards=1)

    inputs = manifest["inputs"]
    assert inputs["num_written"] == corpus.num_usable
    assert inputs["num_duplicates"] == corpus.num_duplicates
    assert inputs["num_failed"] == corpus.num_failed + 2
    assert inputs["num_found"] == inputs["num_written"] + inputs["num_failed"] + inputs["num_duplicates"]
    recorded = {error["uri"]: error["reason"] for error in read_errors(output)}
    assert recorded == expected
    # The faults did happen, at the planned rate, on reads of the images (metadata and bytes).
    image_reads = [read for read, _ in gcs_read_faults.injected] + gcs_read_faults.forwarded_reads
    image_reads = [read for read in image_reads if read.name.startswith(prefix + "/")]
    failed_503 = [read for read, status in gcs_read_faults.injected if status == 503]
    assert len(failed_503) >= 20
    assert abs(len(failed_503) / len(image_reads) - FAULT_FRACTION) < 0.05
    assert any(read.media for read in failed_503) and any(not read.media for read in failed_503)


def test_a_503_that_outlasts_the_client_retries_fails_the_job_and_publishes_nothing(
    gcs_emulator, gcs_dir, gcs_read_faults, short_gcs_retries, tmp_path
):
    manifest_url, corpus, _, prefix, _ = _upload_corpus(gcs_emulator, gcs_dir, tmp_path)
    usable = next(f for f in corpus.files if f.expected_error is None)
    busy = f"{prefix}/{usable.path}"
    gcs_read_faults.faults = ReadFaults(media={busy: 503})
    output = tmp_path / "dataset"

    with pytest.raises(Exception, match="RetryError") as raised:
        run_stage1(manifest_url, output, image_size=16, encoding="uint8", min_shards=1)

    assert "503" in str(raised.value)
    assert not os.path.exists(output / manifest_lib.MANIFEST_FILE)
    assert [read.name for read, status in gcs_read_faults.injected] and {
        read.name for read, _ in gcs_read_faults.injected
    } == {busy}
