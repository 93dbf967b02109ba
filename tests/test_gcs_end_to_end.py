"""Both stages and the local workflow with every input and output in GCS, as on a Cloud TPU VM.

On a TPU the data must live in GCS, and the ways a pipeline breaks there are specific: a path or
``open()`` call that takes ``gs://bucket/x`` for a local path (and quietly writes a ``gs:`` directory
into the working directory), a listing that matches more than it should, an object that is visible
before it is complete, checkpoints or logs that land on local disk. These tests run the real jobs
against a real GCS emulator and then look at the bucket itself, never through the code under test:

* stage 1 (``preprocess``, Beam's GCS IO; in process, and ``python -m preprocess``) reads the sample
  corpus from the bucket, as a class-per-folder tree and as a CSV manifest of ``gs://`` URIs, and writes
  the dataset into the bucket: ``dataset.json`` and the run's directory ``runs/<run id>/``, where every
  shard the manifest lists is, with its listed size and sha256, next to ``transform_fn/``,
  ``transformed_metadata/`` and the error files (``errors-*.jsonl``); nothing else is (no staging leftovers, no stale shard
  or manifest of an earlier run); the manifest appeared after everything it describes; objects next to
  the dataset directory are untouched; nothing reached local disk;
* stage 2 (``python -m train``, TensorFlow's own ``gs://`` filesystem) trains on that dataset, reading
  only the shards the manifest lists, and writes checkpoints, TensorBoard logs, the serving export and,
  last, ``metrics.json`` into the bucket; a run killed with SIGKILL after its first checkpoint resumes
  from the checkpoint in the bucket and stops at the planned epoch; the export loads from ``gs://`` and
  predicts;
* ``python -m pipelines.local --input gs://... --workdir gs://...`` runs both.

How each client reaches the emulator (the ``gcs_emulator`` fixture, tests/gcs_emulator.py):
google-cloud-storage and Beam honour ``STORAGE_EMULATOR_HOST`` and talk plain HTTP to the emulator.
TensorFlow does not: its endpoints are fixed ``https://*.googleapis.com`` URLs. So the fixture runs a
TLS-intercepting proxy, and TensorFlow is pointed at it with ``https_proxy``; the proxy answers
``CONNECT`` only for ``*.googleapis.com``, terminates TLS with a certificate from a throwaway CA that
TensorFlow trusts through ``CURL_CA_BUNDLE``, and forwards each request to the emulator.
``GOOGLE_AUTH_TOKEN_FOR_TESTING`` and ``NO_GCE_CHECK`` stop TensorFlow looking for real credentials. The
product code runs unchanged: the subprocesses get the same variables (``gcs_emulator.env``), and because
only TensorFlow goes through the proxy, the proxy's request log shows what TensorFlow itself read.
"""

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_transform as tft
from google.cloud import storage

from dataset_contract import commit_log, leases
from dataset_contract import manifest as manifest_lib
from pipelines.sample_corpus import TRUNCATED, USABLE_KINDS, split_for_content, write_manifest_csv
from preprocess import errors
from tests.stage1 import read_split, run_stage1, write_corpus

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
IMAGES_PER_CLASS = 6  # one plain image per class, so the corpus has exact duplicates too
IMAGE_SIZE = 32  # the smallest size every --model accepts
EPOCHS = 3
STEPS_PER_EPOCH = 40  # a few seconds an epoch: long enough to kill the run between two checkpoints
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
# What a run's directory holds besides its shards (docs/dataset_format.md).
RUN_ENTRIES = {
    manifest_lib.TRANSFORM_FN_DIR,
    manifest_lib.TRANSFORMED_METADATA_DIR,
}
# Files of a dataset or a model dir: none of them may appear on local disk when the paths are gs://.
OUTPUT_FILE_PATTERN = re.compile(
    r"(\.tfrecord|\.part|\.arrow|dataset\.json|errors\.jsonl|errors-.*\.jsonl|saved_model\.pb|schema\.pbtxt|metrics\.json"
    r"|^checkpoint(\.json)?$|^ckpt-.*|events\.out\.tfevents.*)$"
)


def object_name(gcs_emulator, url: str) -> str:
    """`gs://BUCKET/a/b` -> `a/b`."""
    prefix = f"gs://{gcs_emulator.bucket}/"
    assert url.startswith(prefix), url
    return url[len(prefix) :]


def objects_under(gcs_emulator, url: str) -> dict[str, int]:
    """Relative name -> size of every object below `url`, directory placeholders left out."""
    prefix = object_name(gcs_emulator, url).rstrip("/") + "/"
    return {
        name[len(prefix) :]: size
        for name, size in gcs_emulator.list_objects(prefix).items()
        if not name.endswith("/")
    }


def creation_times(gcs_emulator, url: str) -> dict[str, str]:
    """Relative name -> timeCreated (ISO 8601, microseconds) of every object below `url`, from the emulator.

    A copy or rename makes a new object, so this is when each object became visible under its name.
    """
    prefix = object_name(gcs_emulator, url).rstrip("/") + "/"
    times, page_token = {}, ""
    while True:
        query = urllib.parse.urlencode({"prefix": prefix, "pageToken": page_token})
        listing = f"{gcs_emulator.emulator.url}/storage/v1/b/{gcs_emulator.bucket}/o?{query}"
        with urllib.request.urlopen(listing, timeout=30) as response:
            page = json.load(response)
        for item in page.get("items", []):
            if not item["name"].endswith("/"):
                times[item["name"][len(prefix) :]] = item["timeCreated"]
        page_token = page.get("nextPageToken", "")
        if not page_token:
            return times


def assert_created_last(gcs_emulator, url: str, last: str, others) -> None:
    """Object `last` below `url` appeared after every object in `others` (relative names)."""
    times = creation_times(gcs_emulator, url)
    later = sorted(name for name in others if times[name] > times[last])
    assert not later, f"{last} was visible before these were complete: {later}"


def upload_file(gcs_emulator, local_path: Path, url: str) -> None:
    storage.Client().bucket(gcs_emulator.bucket).blob(object_name(gcs_emulator, url)).upload_from_filename(
        str(local_path)
    )


def local_outputs(*roots: Path) -> list[str]:
    """Dataset or model files, and `gs:` directories, below `roots`: what must not be on local disk."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.name == "gs:" or (path.is_file() and OUTPUT_FILE_PATTERN.search(path.name)):
                found.append(str(path))
    return found


def urls_tensorflow_requested(gcs_emulator) -> str:
    """The request lines the TLS proxy logged, unquoted: only TensorFlow's requests go through it."""
    return urllib.parse.unquote(gcs_emulator.proxy.log_path.read_text(errors="replace"))


def assert_dataset_is_complete_in_the_bucket(gcs_emulator, dataset_url: str, manifest: dict) -> None:
    """The bucket holds exactly the dataset the manifest describes, byte for byte."""
    objects = objects_under(gcs_emulator, dataset_url)
    prefix = object_name(gcs_emulator, dataset_url) + "/"
    listed = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            listed[shard["path"]] = shard
    assert listed, "the manifest lists no shard"
    for path, shard in listed.items():
        assert objects.get(path) == shard["num_bytes"], f"{path}: in the bucket {objects.get(path)} bytes"
        data = gcs_emulator.read_object(prefix + path)
        assert hashlib.sha256(data).hexdigest() == shard["sha256"], path
    # Nothing but the dataset: no staging leftovers, no stale or unlisted shard, no other run; and, once a
    # training job has read it, that job's lease on the run (train/data/dataset_lease.py), which expires.
    leases_dir = f"{leases.run_leases_dir(manifest['run']['id'])}/"
    held = {name for name in objects if name.startswith(f"{leases.LEASES_DIR}/")}
    assert all(name.startswith(leases_dir) and leases.parse_lease(name) for name in held), sorted(held)
    objects = {name: size for name, size in objects.items() if name not in held}
    run_dir = manifest["run"]["dir"]
    commit = commit_log.commit_name(1)
    assert {name.split("/", 1)[0] for name in objects} == {
        manifest_lib.MANIFEST_FILE,
        manifest_lib.MANIFESTS_DIR,
        manifest_lib.RUNS_DIR,
    }
    assert {name for name in objects if name.startswith(manifest_lib.MANIFESTS_DIR + "/")} == {commit}
    assert {name.rsplit("/", 1)[0] for name in listed} == {run_dir}
    in_run = {name[len(run_dir) + 1 :].split("/", 1)[0] for name in objects if name.startswith(run_dir + "/")}
    error_files = manifest_lib.error_file_paths(manifest)
    # The version's ledger (issue 32: what a re-run reuses) is in the run's directory too.
    ledger_files = manifest_lib.ledger_file_paths(manifest)
    assert ledger_files
    expected = RUN_ENTRIES | {name[len(run_dir) + 1 :] for name in [*listed, *error_files, *ledger_files]}
    assert in_run == expected, sorted(in_run ^ expected)
    assert len(objects) == 2 + sum(1 for name in objects if name.startswith(run_dir + "/"))
    assert error_files and all(path.startswith(f"{run_dir}/errors-") for path in error_files)
    for name in (
        "transform_fn/saved_model.pb",
        "transform_fn/variables/variables.index",
        "transform_fn/assets/labels",
        "transformed_metadata/schema.pbtxt",
    ):
        assert f"{run_dir}/{name}" in objects, f"{name} is not in the bucket: {sorted(objects)}"
    stored = json.loads(gcs_emulator.read_object(prefix + commit))
    assert stored == manifest
    # dataset.json: a copy of the commit, for people and older readers.
    assert gcs_emulator.read_object(prefix + manifest_lib.MANIFEST_FILE) == gcs_emulator.read_object(
        prefix + commit
    )
    # A reader that finds the commit finds every file it describes complete.
    assert_created_last(
        gcs_emulator,
        dataset_url,
        commit,
        {name: size for name, size in objects.items() if name != manifest_lib.MANIFEST_FILE},
    )


def assert_inputs_accounted_for(gcs_emulator, dataset_url: str, manifest: dict, corpus) -> None:
    """Counts as the corpus generator says, and every broken gs:// input in the error files with its reason."""
    inputs = manifest["inputs"]
    assert inputs["num_found"] == corpus.num_found
    assert inputs["num_written"] == corpus.num_usable
    assert inputs["num_failed"] == corpus.num_failed
    assert inputs["num_duplicates"] == corpus.num_duplicates
    lines = []
    for path in manifest_lib.error_file_paths(manifest):
        lines += (
            gcs_emulator.read_object(object_name(gcs_emulator, dataset_url) + "/" + path)
            .decode()
            .splitlines()
        )
    reasons = {error["uri"]: error["reason"] for error in map(json.loads, filter(None, lines))}
    expected = {corpus.uri(f): f.expected_error for f in corpus.files if f.expected_error}
    assert reasons == expected


@pytest.fixture(scope="module")
def gcs_root(gcs_emulator) -> str:
    """A directory of this module's own in the bucket."""
    return gcs_emulator.url(f"end-to-end-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def gcs_corpus(gcs_emulator, gcs_root, tmp_path_factory):
    """The sample corpus, generated locally and uploaded to GCS_ROOT/raw/tree; its CorpusInfo has gs:// URIs.

    Next to the tree, GCS_ROOT/raw/tree-old holds one more image: a listing of the tree by name prefix
    alone would count it.
    """
    local = write_corpus(tmp_path_factory.mktemp("corpus"), images_per_class=IMAGES_PER_CLASS, seed=3)
    root = f"{gcs_root}/raw/tree"
    for corpus_file in local.files:
        upload_file(gcs_emulator, Path(local.uri(corpus_file)), f"{root}/{corpus_file.path}")
    decoy = next(f for f in local.files if f.kind in USABLE_KINDS)
    upload_file(gcs_emulator, Path(local.uri(decoy)), f"{root}-old/{decoy.path}")
    return dataclasses.replace(local, root=root)


def run_stage1_without_local_disk(scratch: Path, input_url: str, output_url: str, **kwargs):
    """run_stage1 in process, with the working directory and TMPDIR moved into `scratch`."""
    cwd, tmp = scratch / "cwd", scratch / "tmp"
    cwd.mkdir(parents=True)
    tmp.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.setenv("TMPDIR", str(tmp))
        patch.setattr(tempfile, "tempdir", str(tmp))
        return run_stage1(input_url, output_url, **kwargs)


@pytest.fixture(scope="module")
def tree_dataset(gcs_emulator, gcs_root, gcs_corpus, tmp_path_factory):
    """Stage 1 from the corpus tree in GCS into GCS_ROOT/ds, over the remains of an earlier run.

    Before the run, GCS_ROOT/ds holds an old manifest and a shard of another shard count, and objects
    sit next to it whose names start with the same characters: the run must remove the first and
    leave the others alone. Returns (dataset url, manifest, local scratch dir, sibling objects).
    """
    output = f"{gcs_root}/ds"
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    for stale in (manifest_lib.MANIFEST_FILE, manifest_lib.shard_file_name(manifest_lib.TRAIN, 0, 32)):
        bucket.blob(object_name(gcs_emulator, f"{output}/{stale}")).upload_from_string(b"from an earlier run")
    siblings = {
        object_name(gcs_emulator, f"{gcs_root}/{name}"): f"not part of the dataset: {name}".encode()
        for name in ("ds-backup/train-00000-of-00001.tfrecord", "ds.keep", "dsx/dataset.json")
    }
    for name, data in siblings.items():
        bucket.blob(name).upload_from_string(data)
    scratch = tmp_path_factory.mktemp("stage1-tree-local")
    manifest = run_stage1_without_local_disk(
        scratch, gcs_corpus.root, output, image_size=IMAGE_SIZE, encoding="uint8", min_shards=2
    )
    return output, manifest, scratch, siblings


def test_stage1_reads_a_corpus_tree_from_gcs_and_writes_the_whole_dataset_to_gcs(
    gcs_emulator, gcs_corpus, tree_dataset
):
    output, manifest, scratch, siblings = tree_dataset

    assert manifest["source"] == {"input": gcs_corpus.root, "kind": "directory"}
    assert_dataset_is_complete_in_the_bucket(gcs_emulator, output, manifest)
    assert_inputs_accounted_for(gcs_emulator, output, manifest, gcs_corpus)
    for name, data in siblings.items():
        assert gcs_emulator.read_object(name) == data, f"{name}, next to the dataset, was changed"
    assert not local_outputs(scratch), "stage 1 wrote to local disk instead of GCS"
    assert not list((scratch / "cwd").iterdir()), "stage 1 wrote into its working directory"
    # The dataset is usable from gs:// as stage 2 and serving use it: the transform graph loads and the
    # records name the gs:// files they were made from.
    transform = tft.TFTransformOutput(manifest_lib.join(output, manifest_lib.transform_output_dir(manifest)))
    assert set(transform.transformed_feature_spec()) >= {"image", "label"}
    rows = read_split(output, manifest_lib.TRAIN, manifest=manifest)
    assert len(rows) == manifest["splits"][manifest_lib.TRAIN]["num_examples"]
    assert all(row["uri"].startswith(gcs_corpus.root + "/") for row in rows)


def test_stage1_command_reads_a_csv_manifest_of_gcs_uris_from_gcs(
    gcs_emulator, gcs_root, gcs_corpus, tmp_path
):
    csv_path = tmp_path / "manifest.csv"
    write_manifest_csv(gcs_corpus, str(csv_path), with_split=True)
    csv_url = f"{gcs_root}/raw/manifest.csv"
    upload_file(gcs_emulator, csv_path, csv_url)
    output = f"{gcs_root}/ds-from-csv"
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()

    result = gcs_emulator.run(
        [
            sys.executable, "-m", "preprocess",
            "--input", csv_url,
            "--output", output,
            "--image-size", str(IMAGE_SIZE),
            "--encoding", "jpeg",
            "--min-shards", "1",
            "--max-failed-fraction", "1",  # the sample corpus's broken files are a sixth of it
        ],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(tmp)},
        check=False,
        timeout=900,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads(gcs_emulator.read_object(object_name(gcs_emulator, f"{output}/dataset.json")))
    assert manifest["source"] == {"input": csv_url, "kind": "csv"}
    assert_dataset_is_complete_in_the_bucket(gcs_emulator, output, manifest)
    assert_inputs_accounted_for(gcs_emulator, output, manifest, gcs_corpus)
    assert not local_outputs(cwd, tmp), "stage 1 wrote to local disk instead of GCS"
    assert not list(cwd.iterdir()), "stage 1 wrote into its working directory"
    # The summary it prints read the error files back from the bucket.
    truncated = gcs_corpus.uri(gcs_corpus.files_of_kind(TRUNCATED)[0])
    assert f"{errors.TRUNCATED} 1: {truncated}" in result.stdout
    # Every example is in the split the manifest's split column gave its file.
    for split in manifest_lib.SPLITS:
        for row in read_split(output, split, manifest=manifest):
            assert row["uri"].startswith(gcs_corpus.root + "/")
            assert split_for_content(row["sha256"]) == split, row["uri"]


def checkpoint_numbers(checkpoint_dir: str) -> list[int]:
    """The steps train's checkpoint index (checkpoint.json, train/loop/checkpoints.py) lists."""
    index = f"{checkpoint_dir}/checkpoint.json"
    if not tf.io.gfile.exists(index):
        return []
    with tf.io.gfile.GFile(index) as handle:
        return sorted(json.load(handle)["steps"])


def kill_after_the_first_checkpoint(gcs_emulator, command, cwd, env, checkpoint_index: str) -> None:
    """Start `command`; SIGKILL it as soon as the object `checkpoint_index` is in the bucket."""
    run = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # The index is written last, once the checkpoint's file is in the bucket (train/loop/checkpoints.py).
        deadline = time.monotonic() + 300
        while checkpoint_index not in gcs_emulator.list_objects(checkpoint_index):
            assert run.poll() is None, (
                "the run ended before its first checkpoint: " + run.stderr.read().decode()[-3000:]
            )
            assert time.monotonic() < deadline, "no checkpoint in the bucket after 300 s"
            time.sleep(0.1)
        run.send_signal(signal.SIGKILL)
        run.communicate()
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == -signal.SIGKILL


def test_training_reads_the_gcs_dataset_writes_to_gcs_and_resumes_from_its_gcs_checkpoint_after_a_kill(
    gcs_emulator, gcs_root, gcs_corpus, tree_dataset, tmp_path
):
    dataset_url, manifest, _, _ = tree_dataset
    model_dir = f"{gcs_root}/model"
    checkpoint_index = object_name(gcs_emulator, f"{model_dir}/checkpoints/checkpoint.json")
    command = [
        sys.executable, "-m", "train",
        "--data", dataset_url,
        "--model-dir", model_dir,
        "--epochs", str(EPOCHS),
        "--steps-per-epoch", str(STEPS_PER_EPOCH),
        "--global-batch-size", "8",
        "--verify-data",  # reads every shard in full through TensorFlow and checks its sha256
    ]  # fmt: skip
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = gcs_emulator.subprocess_env(
        {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(tmp)}
    )

    # A shard that is not in the manifest (say, left by a copy of an older dataset): training must
    # not read it, and would fail on its bytes if it did.
    stray_shard = object_name(gcs_emulator, f"{dataset_url}/{manifest_lib.shard_file_name('train', 0, 32)}")
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    bucket.blob(stray_shard).upload_from_string(b"not a TFRecord file")
    try:
        kill_after_the_first_checkpoint(gcs_emulator, command, cwd, env, checkpoint_index)
        # Checkpoints are named by global step; without --checkpoint-every's interval passing, at epoch ends.
        done_when_killed = max(checkpoint_numbers(f"{model_dir}/checkpoints"))
        assert STEPS_PER_EPOCH <= done_when_killed < TOTAL_STEPS, "the kill must land before the last epoch"
        assert "metrics.json" not in objects_under(gcs_emulator, model_dir)

        second = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        bucket.blob(stray_shard).delete()  # the dataset is shared with the other tests of this module

    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from step {done_when_killed} of {TOTAL_STEPS}" in second.stdout
    objects = objects_under(gcs_emulator, model_dir)
    metrics = json.loads(gcs_emulator.read_object(object_name(gcs_emulator, f"{model_dir}/metrics.json")))
    assert metrics["resumed_from_step"] == done_when_killed  # resumed from the bucket, not restarted
    assert metrics["initial_epoch"] == done_when_killed // STEPS_PER_EPOCH
    assert metrics["steps_this_run"] == TOTAL_STEPS - done_when_killed
    assert metrics["global_step"] == TOTAL_STEPS
    assert metrics["data_dir"] == dataset_url
    assert metrics["export_dir"] == f"{model_dir}/export"
    assert (
        metrics["validation"]["num_examples"] == manifest["splits"][manifest_lib.VALIDATION]["num_examples"]
    )
    assert max(checkpoint_numbers(f"{model_dir}/checkpoints")) == TOTAL_STEPS
    assert f"checkpoints/ckpt-{TOTAL_STEPS}.weights.h5" in objects
    for log_dir in ("logs/train", "logs/validation"):
        assert any(name.startswith(f"{log_dir}/events.out.tfevents.") for name in objects), log_dir
    assert "export/saved_model.pb" in objects
    assert "export/variables/variables.index" in objects
    # TensorFlow itself read the shards: only its requests go through the TLS proxy.
    requested = urls_tensorflow_requested(gcs_emulator)
    for shard in manifest["splits"][manifest_lib.TRAIN]["shards"]:
        assert object_name(gcs_emulator, f"{dataset_url}/{shard['path']}") in requested
    assert stray_shard not in requested, "training touched a shard the manifest does not list"
    # metrics.json is written last: once it is there, the export and the checkpoints are complete.
    assert_created_last(gcs_emulator, model_dir, "metrics.json", objects)
    assert not local_outputs(cwd, tmp), "training wrote to local disk instead of GCS"
    assert not list(cwd.iterdir()), "training wrote into its working directory"

    serve = tf.saved_model.load(f"{model_dir}/export").signatures["serving_default"]
    image_url = gcs_corpus.uri(next(f for f in gcs_corpus.files if f.kind in USABLE_KINDS))
    with tf.io.gfile.GFile(image_url, "rb") as handle:
        outputs = serve(image_bytes=tf.constant([handle.read()]))
    assert outputs["probabilities"].shape == (1, len(manifest["labels"]))
    assert outputs["label"][0].numpy().decode() in manifest["labels"]


def test_local_workflow_runs_with_gcs_input_and_workdir(gcs_emulator, gcs_root, gcs_corpus, tmp_path):
    workdir = f"{gcs_root}/workflow"
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()

    result = gcs_emulator.run(
        [
            sys.executable, "-m", "pipelines.local",
            "--input", gcs_corpus.root,
            "--workdir", workdir,
            "--image-size", str(IMAGE_SIZE),
            "--epochs", "1",
            "--global-batch-size", "4",
            "--workers", "2",  # Beam's multi-process DirectRunner: its workers reach GCS too
            "--max-failed-fraction", "1",  # the sample corpus's broken files are a sixth of it
        ],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(tmp)},
        check=False,
        timeout=900,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    dataset_url, model_dir = f"{workdir}/dataset", f"{workdir}/model"
    manifest = json.loads(gcs_emulator.read_object(object_name(gcs_emulator, f"{dataset_url}/dataset.json")))
    assert manifest["source"]["input"] == gcs_corpus.root
    assert_dataset_is_complete_in_the_bucket(gcs_emulator, dataset_url, manifest)
    assert_inputs_accounted_for(gcs_emulator, dataset_url, manifest, gcs_corpus)
    objects = objects_under(gcs_emulator, model_dir)
    metrics = json.loads(gcs_emulator.read_object(object_name(gcs_emulator, f"{model_dir}/metrics.json")))
    for name in (
        "metrics.json",
        "checkpoints/checkpoint.json",
        f"checkpoints/ckpt-{metrics['global_step']}.weights.h5",  # named by global step: one epoch's steps
        "export/saved_model.pb",
    ):
        assert name in objects, f"{name} is not in {model_dir}: {sorted(objects)}"
    assert metrics["global_step"] == metrics["steps_per_epoch"]
    assert any(name.startswith("logs/train/events.out.tfevents.") for name in objects)
    assert_created_last(gcs_emulator, model_dir, "metrics.json", objects)
    assert metrics["data_dir"] == dataset_url
    assert f"dataset:      {dataset_url}" in result.stdout
    # The report's prediction: the exported model, loaded from gs://, on a source image read from gs://.
    assert f"prediction by the exported model on {gcs_corpus.root}/" in result.stdout
    assert not local_outputs(cwd, tmp), "the workflow wrote to local disk instead of GCS"
    assert not list(cwd.iterdir()), "the workflow wrote into its working directory"
