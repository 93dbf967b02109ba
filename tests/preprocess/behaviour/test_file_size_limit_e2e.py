"""The real stage 1 job with --max-file-mb: a file over the limit is recorded as too_large, never read.

The corpus sits in the GCS emulator, listed as a class-per-folder tree (the listing gives each object's
size). The large file answers 403 to any download through the `gcs_read_faults` forwarder, so had the job
read it, it would be `unreadable`; the forwarder also shows that no request for it was sent at all.
"""

import os

import pytest
from google.cloud import storage

from preprocess import errors
from tests.gcs_emulator import ReadFaults
from tests.stage1 import read_errors, run_stage1, write_corpus

pytestmark = pytest.mark.slow


def test_a_file_over_max_file_mb_is_too_large_and_never_read(
    gcs_emulator, gcs_dir, gcs_read_faults, tmp_path
):
    corpus = write_corpus(tmp_path / "corpus", images_per_class=4, seed=7)
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    root = f"{gcs_dir}/raw"
    prefix = root.removeprefix(f"gs://{gcs_emulator.bucket}/")
    for corpus_file in corpus.files:
        bucket.blob(f"{prefix}/{corpus_file.path}").upload_from_filename(corpus.uri(corpus_file))
    largest = max(os.path.getsize(corpus.uri(corpus_file)) for corpus_file in corpus.files)
    limit = largest + 1  # every corpus file is under it
    huge_name = f"{prefix}/{corpus.class_names[0]}/huge.jpg"
    with open(corpus.uri(corpus.files[0]), "rb") as handle:
        bucket.blob(huge_name).upload_from_string(handle.read() + bytes(limit))
    gcs_read_faults.faults = ReadFaults(media={huge_name: 403})
    output = tmp_path / "dataset"

    manifest = run_stage1(
        root, output, "--max-file-mb", f"{limit / 1e6}", image_size=16, encoding="uint8", min_shards=1
    )

    inputs = manifest["inputs"]
    assert inputs["num_written"] == corpus.num_usable
    assert inputs["num_duplicates"] == corpus.num_duplicates
    assert inputs["num_failed"] == corpus.num_failed + 1
    assert inputs["failures_by_reason"][errors.TOO_LARGE] == 1
    assert inputs["num_found"] == inputs["num_written"] + inputs["num_failed"] + inputs["num_duplicates"]
    recorded = {error["uri"]: error["reason"] for error in read_errors(output)}
    assert recorded[f"gs://{gcs_emulator.bucket}/{huge_name}"] == errors.TOO_LARGE
    assert manifest["image"]["max_file_bytes"] == limit
    # Never read: no request for the object at all (no download, no metadata), so no 403 either.
    assert [read for read in gcs_read_faults.forwarded_reads if read.name == huge_name] == []
    assert gcs_read_faults.injected == []
    # The others were read, without a metadata request: the listing gave their sizes.
    image_reads = [read for read in gcs_read_faults.forwarded_reads if read.name.startswith(prefix + "/")]
    assert image_reads and all(read.media for read in image_reads)
