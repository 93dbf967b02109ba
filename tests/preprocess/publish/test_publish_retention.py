"""Retention: buckets that refuse overwrites, retention that no later publish shortens, training leases.

- On GCS through the test forwarder in its retention mode (tests/gcs_emulator.py): a bucket whose
  retention policy refuses, with GCS's 403 retentionPolicyNotMet, to replace or delete an object younger
  than the period. Publishing there is the same commit log as everywhere (nothing is overwritten),
  readers of both stages find the newest commit, an old reader is told it cannot read the layout, a
  directory in format 2 whose dataset.json is young becomes the log at its next publish, retried writes
  under fixed names are skipped, and a failed publish raises its own cause.
- On local disk (same code paths, faster): the A(30) / B(30) / C(0) case, a retained run whose files
  are gone, a training job's lease, and a launcher whose run published and was then superseded.

One real stage 1 run (module scope) gives the dataset; other runs are copies of its files under other
run ids (real bytes, real sizes).
"""

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.cloud import storage

from dataset_contract import commit_log, leases, verification
from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.launch import launcher
from preprocess.publish import commit as publish
from preprocess.publish import protocol
from preprocess.publish.runs import RunPaths, new_run_id
from tests.publishing import assert_complete_dataset

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
RETENTION_SECONDS = 3600
STAGE1_ARGS = ["--image-size", "16", "--encoding", "uint8", "--min-shards", "1", "--max-failed-fraction", "1"]
# The dataset every test starts from, written by STAGE1_ARGS once per session (shared with test_gc.py and
# test_commit_log.py): the sample corpus, 3 images per class.
PUBLISHED = {"images_per_class": 3, "image_size": 16, "encoding": "uint8", "min_shards": 1}


@dataclasses.dataclass
class Published:
    corpus: str
    output: str
    manifest: dict

    @property
    def run_id(self) -> str:
        return self.manifest["run"]["id"]


@pytest.fixture(scope="module")
def published(tmp_path_factory, shared_stage1_datasets):
    """A dataset written by the real stage 1 (`python -m preprocess`, in process), once per session."""
    output = tmp_path_factory.mktemp("published") / "dataset"
    corpus_root, manifest = shared_stage1_datasets.copy(output, **PUBLISHED)
    return Published(corpus_root, str(output), manifest)


@pytest.fixture
def output(published, tmp_path):
    copy = tmp_path / "dataset"
    shutil.copytree(published.output, copy)
    return str(copy)


def clone_run(data_dir: str, manifest: dict, run_id: str) -> dict:
    """A run's files copied under another run id (local disk); returns its manifest."""
    source, target = RunPaths(data_dir, manifest["run"]["id"]), RunPaths(data_dir, run_id)
    shutil.copytree(source.run_dir, target.run_dir)
    return json.loads(json.dumps(manifest).replace(manifest["run"]["id"], run_id))


def retained_ids(manifest: dict) -> list[str]:
    return [entry["id"] for entry in manifest.get(publish.RETAINED_RUNS, [])]


# ------------------------------------------------------------------ a bucket with a retention policy


@pytest.fixture
def retention_bucket(gcs_read_faults):
    """The test forwarder acting as a bucket with a retention policy of an hour (every object is young)."""
    gcs_read_faults.retention_seconds = RETENTION_SECONDS
    return gcs_read_faults


@pytest.fixture(params=["retention policy", "default event-based hold"])
def locked_bucket(request, gcs_read_faults):
    """A bucket that refuses to replace or delete objects: by its retention policy, or because every
    object is held (a default event-based hold)."""
    if request.param == "retention policy":
        gcs_read_faults.retention_seconds = RETENTION_SECONDS
    else:
        gcs_read_faults.default_event_based_hold = True
    return gcs_read_faults


def retention_bucket_name(url: str) -> str:
    return url.removeprefix("gs://").split("/")[0]


def bucket_prefix(gcs_emulator, url: str) -> str:
    return url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"


def upload(gcs_emulator, local_dir: str, url: str, only: str = ""):
    """Upload the files of `local_dir` (those below `only`) to `url`, straight to the emulator."""
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    for root, _, names in os.walk(os.path.join(local_dir, only)):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), local_dir)
            bucket.blob(bucket_prefix(gcs_emulator, url) + relative).upload_from_filename(
                os.path.join(root, name)
            )


def gcs_clone(gcs_emulator, url: str, manifest: dict, run_id: str) -> dict:
    """A run's objects copied under another run id, straight on the emulator; returns its manifest."""
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    source = bucket_prefix(gcs_emulator, url) + f"runs/{manifest['run']['id']}/"
    target = bucket_prefix(gcs_emulator, url) + f"runs/{run_id}/"
    for blob in bucket.list_blobs(prefix=source):
        bucket.copy_blob(blob, bucket, target + blob.name[len(source) :])
    return json.loads(json.dumps(manifest).replace(manifest["run"]["id"], run_id))


def objects(gcs_emulator, url: str) -> set[str]:
    prefix = bucket_prefix(gcs_emulator, url)
    return {name[len(prefix) :] for name in gcs_emulator.list_objects(prefix)}


def test_on_a_locked_bucket_each_publish_creates_a_commit_and_both_stages_read_the_newest(
    published, gcs_emulator, gcs_dir, locked_bucket
):
    retention_bucket = locked_bucket
    # A directory on the bucket with run A's files, not yet published.
    upload(gcs_emulator, published.output, gcs_dir, only=f"runs/{published.run_id}")
    a_id = published.run_id
    publish.publish_run(gcs_dir, a_id, published.manifest, retention_days=30)
    b_id = new_run_id()
    run_b = gcs_clone(gcs_emulator, gcs_dir, published.manifest, b_id)
    publish.publish_run(gcs_dir, b_id, run_b, retention_days=30)

    names = objects(gcs_emulator, gcs_dir)
    assert {"dataset.json", commit_log.commit_name(1), commit_log.commit_name(2)} <= names
    # Nothing was replaced but dataset.json, the copy of the newest commit for people and older readers:
    # the bucket refused deletes of young objects (markers), and the second publish's copy.
    replaced = {
        name.rsplit("/", 1)[-1] for kind, name in retention_bucket.refused_by_retention if kind == "replace"
    }
    assert replaced <= {"dataset.json"}
    copy = json.loads(gcs_emulator.read_object(bucket_prefix(gcs_emulator, gcs_dir) + "dataset.json"))
    assert copy["run"]["id"] == a_id  # stale: written after commit 1, and young when commit 2 came

    # Stage 1 (Beam), stage 2 (TensorFlow's gs://) and the launcher all read run B's manifest.
    assert publish.read_published_manifest(gcs_dir)["run"]["id"] == b_id
    assert verification.read_manifest(gcs_dir)["run"]["id"] == b_id
    assert retained_ids(launcher.own_manifest(gcs_dir, b_id)) == [a_id]
    from train.data import checks  # noqa: PLC0415 - stage 2's own reader

    assert checks.read_manifest(gcs_dir)["run"]["id"] == b_id
    assert not verification.verify_named_files(gcs_dir, checks.read_manifest(gcs_dir))


def test_a_directory_in_format_2_on_a_retention_bucket_becomes_the_commit_log_at_its_next_publish(
    published, gcs_emulator, gcs_dir, retention_bucket
):
    """Its dataset.json, still under retention, cannot be replaced, and need not be: the next publish
    creates commit 1 on top of it."""
    # Format 2: runs/A/ and dataset.json, A's manifest (no log).
    upload(gcs_emulator, published.output, gcs_dir, only=f"runs/{published.run_id}")
    blob = (
        storage.Client()
        .bucket(gcs_emulator.bucket)
        .blob(bucket_prefix(gcs_emulator, gcs_dir) + "dataset.json")
    )
    blob.upload_from_string(json.dumps(published.manifest))
    assert publish.read_published_manifest(gcs_dir)["run"]["id"] == published.run_id
    newer_id = new_run_id()
    committed = publish.publish_run(
        gcs_dir, newer_id, gcs_clone(gcs_emulator, gcs_dir, published.manifest, newer_id), retention_days=30
    )
    assert retained_ids(committed) == [published.run_id]
    assert publish.read_published_manifest(gcs_dir)["run"]["id"] == newer_id
    assert verification.read_manifest(gcs_dir)["run"]["id"] == newer_id
    assert commit_log.commit_name(1) in objects(gcs_emulator, gcs_dir)


def test_a_failed_publish_raises_its_own_cause_when_its_marker_cannot_be_removed(
    published, gcs_emulator, gcs_dir, retention_bucket
):
    upload(gcs_emulator, published.output, gcs_dir, only=f"runs/{published.run_id}")
    publish.publish_run(gcs_dir, published.run_id, published.manifest)
    # A newer run whose files are not there: publishing it fails; its marker is young, so the bucket
    # refuses to delete it. The error is the publish's, not the 403.
    ghost_id = new_run_id()
    ghost = json.loads(json.dumps(published.manifest).replace(published.run_id, ghost_id))
    with pytest.raises(publish.SupersededRunError, match="files it would publish are gone"):
        publish.publish_run(gcs_dir, ghost_id, ghost)
    assert any(
        kind == "delete" and f"runs/{ghost_id}.publishing." in name
        for kind, name in retention_bucket.refused_by_retention
    )


def test_a_retried_write_under_a_fixed_name_is_skipped_when_the_same_bytes_are_there(
    gcs_dir, retention_bucket, tmp_path
):
    build = f"{gcs_dir}/staging/run/build.json"
    filesystem.write_bytes(build, b'{"build_id": "x"}')
    filesystem.write_bytes(build, b'{"build_id": "x"}')  # a retried bundle: the same bytes, skipped
    with pytest.raises(Exception, match="403"):
        filesystem.write_bytes(build, b'{"build_id": "y"}')  # other bytes: GCS refuses, as it must

    parts = [f"{gcs_dir}/parts/{index}" for index in range(3)]
    for index, part in enumerate(parts):
        filesystem.write_bytes(part, bytes([index]) * 1000)
    packed = f"{gcs_dir}/runs/run/train-packed.tfrecord"
    first = filesystem.write_concatenation(parts, packed, expected_bytes=3000)
    again = filesystem.write_concatenation(parts, packed, expected_bytes=3000)
    assert first == again and first[0] == 3000

    copied = f"{gcs_dir}/runs/run/transform_fn/saved_model.pb"
    filesystem.copy_file(parts[0], copied)
    filesystem.copy_file(parts[0], copied)
    # Only the deliberate overwrite of build.json was refused.
    replaced = {name for kind, name in retention_bucket.refused_by_retention if kind == "replace"}
    assert replaced == {build.removeprefix(f"gs://{retention_bucket_name(build)}/")}


# ------------------------------------------------------------------ retention never shortens (local disk)


def test_a_publish_with_retention_0_after_30_keeps_the_runs_retained_for_30(published, output):
    """Runs A and B published with --retention-days 30, then C with 0: C removes only the run it
    supersedes itself (B, kept 0 days), never A (kept 30 days by B's publish), and lists only A."""
    a_id = published.run_id
    b_id, c_id = new_run_id(), None
    run_b = clone_run(output, published.manifest, b_id)
    publish.publish_run(output, b_id, run_b, retention_days=30)
    c_id = new_run_id()
    run_c = clone_run(output, published.manifest, c_id)
    manifest_c = publish.publish_run(output, c_id, run_c, retention_days=0)

    assert retained_ids(manifest_c) == [a_id]
    (entry,) = manifest_c[publish.RETAINED_RUNS]
    until = datetime.datetime.fromisoformat(entry["retain_until"].replace("Z", "+00:00"))
    assert until - datetime.datetime.now(datetime.timezone.utc) > datetime.timedelta(days=29)
    assert publish.missing_run_files(output, a_id, published.manifest) == []
    assert not os.path.exists(RunPaths(output, b_id).run_dir)
    assert retained_ids(assert_complete_dataset(output)) == [a_id]


def test_a_retained_run_whose_files_are_gone_is_no_longer_listed(published, output):
    b_id = new_run_id()
    run_b = clone_run(output, published.manifest, b_id)
    publish.publish_run(output, b_id, run_b, retention_days=30)
    shutil.rmtree(RunPaths(output, published.run_id).run_dir)  # removed by hand, or by a lifecycle rule
    c_id = new_run_id()
    manifest_c = publish.publish_run(output, c_id, clone_run(output, run_b, c_id), retention_days=30)
    assert retained_ids(manifest_c) == [b_id]


def test_a_run_with_a_live_training_lease_is_kept_whatever_its_age_and_goes_once_the_lease_expires(
    published, output, tmp_path
):
    from train.data.dataset_lease import DatasetLease  # noqa: PLC0415 - stage 2's side of the lease

    a_id = published.run_id
    lease = DatasetLease(output, a_id, str(tmp_path / "model"))
    lease.refresh()
    b_id = new_run_id()
    manifest_b = publish.publish_run(
        output, b_id, clone_run(output, published.manifest, b_id), retention_days=0
    )
    assert publish.missing_run_files(output, a_id, published.manifest) == []
    assert retained_ids(manifest_b) == [a_id]

    # The job stopped refreshing: its lease expired a minute ago.
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=lease.lease_seconds + 60)
    lease.refresh(now=past)  # a new, expired lease; the live one stays (it expires later)...
    for name in os.listdir(lease.directory):
        if leases.parse_lease(name)[1] > datetime.datetime.now(datetime.timezone.utc):
            os.remove(os.path.join(lease.directory, name))  # ...so it is removed, as if it had run out
    c_id = new_run_id()
    manifest_c = publish.publish_run(
        output, c_id, clone_run(output, published.manifest, c_id), retention_days=0
    )
    assert retained_ids(manifest_c) == []
    assert not os.path.exists(RunPaths(output, a_id).run_dir)
    assert not os.path.exists(lease.directory)


def test_a_training_lease_is_refreshed_with_a_new_object_and_the_older_one_removed(published, tmp_path):
    from train.data.dataset_lease import DatasetLease  # noqa: PLC0415

    data_dir = str(tmp_path / "data")
    with DatasetLease(data_dir, published.run_id, str(tmp_path / "model"), refresh_seconds=0.2) as lease:
        first = set(os.listdir(lease.directory))
        deadline = time.monotonic() + 10
        later = first
        # Until the refresh has written its new object and removed the older one: a listing between the
        # two sees both (a CI run under load once did).
        while (later == first or len(later) != 1) and time.monotonic() < deadline:
            time.sleep(0.05)
            later = set(os.listdir(lease.directory))
    assert len(first) == 1 and len(later) == 1 and later != first
    assert leases.live_holders(later, datetime.datetime.now(datetime.timezone.utc)) == {lease.holder}


# ------------------------------------------------------------------ published, then superseded: exit 0


def test_a_retried_publish_of_a_run_that_published_and_was_then_superseded_succeeds(published, output):
    """Its publish step switched, died before it returned, and was retried after a newer run published."""
    b_id, c_id = new_run_id(), new_run_id()
    run_b = clone_run(output, published.manifest, b_id)
    publish.publish_run(output, b_id, run_b, retention_days=30)
    publish.publish_run(output, c_id, clone_run(output, run_b, c_id), retention_days=30)
    assert publish.publish_run(output, b_id, run_b, retention_days=30) == run_b  # the retry: no error
    assert publish.read_published_manifest(output)["run"]["id"] == c_id
    assert not [path for path in os.listdir(os.path.join(output, "runs")) if f"{b_id}.publishing." in path]


def test_a_launcher_whose_run_published_and_was_then_superseded_exits_0_saying_so(
    published, output, tmp_path
):
    flag = tmp_path / "switched.flag"
    log_path = tmp_path / "stage1.log"
    command = [
        sys.executable,
        "-m",
        "preprocess",
        "--input",
        published.corpus,
        "--output",
        output,
        *STAGE1_ARGS,
    ]
    env = {**os.environ, protocol.PAUSE_ENV: f"switched:{flag}", "PYTHONPATH": str(REPO)}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.1)
    launched = publish.read_published_manifest(output)  # the launcher's run, just switched
    newer_id = new_run_id()
    publish.publish_run(output, newer_id, clone_run(output, launched, newer_id), retention_days=0)
    flag.unlink()
    assert process.wait(timeout=300) == 0, log_path.read_text()
    text = log_path.read_text()
    assert (
        f"run {launched['run']['id']} published into {output}, but run {newer_id}, which started later"
        in text
    )
    assert "Traceback" not in text


def test_every_reader_follows_the_pointer_to_the_newest_manifest(published, output, tmp_path, capsys):
    """The same directory in format 3 (dataset.json a pointer, the manifests in manifests/), on local
    disk: verify, the pin of a training job and stage 1 all read the newest manifest, and the next publish
    continues its log."""
    from preprocess import verify as verify_cli  # noqa: PLC0415
    from train.data import dataset_pin  # noqa: PLC0415

    newer_id = new_run_id()
    newer = clone_run(output, published.manifest, newer_id)
    shutil.rmtree(os.path.join(output, manifest_lib.MANIFESTS_DIR))  # this code's log: format 3 had its own
    os.makedirs(os.path.join(output, manifest_lib.MANIFESTS_DIR))
    with open(os.path.join(output, format3_name(9, published.run_id)), "w") as handle:
        json.dump(published.manifest, handle)
    with open(os.path.join(output, format3_name(10, newer_id)), "w") as handle:
        json.dump(newer, handle)
    with open(os.path.join(output, "dataset.json"), "w") as handle:
        json.dump(FORMAT3_POINTER, handle)

    assert verify_cli.main([output]) == 0, capsys.readouterr().out
    pinned = dataset_pin.resolve_dataset(output, str(tmp_path / "model"))
    assert pinned.run_id == newer_id
    assert pinned.manifest_bytes == open(os.path.join(output, format3_name(10, newer_id)), "rb").read()
    assert publish.read_published_manifest(output)["run"]["id"] == newer_id
    # Its next publish continues the sequence in this layout's names.
    latest_id = new_run_id()
    publish.publish_run(output, latest_id, clone_run(output, published.manifest, latest_id))
    assert os.path.exists(os.path.join(output, commit_log.commit_name(11)))
    assert verification.read_manifest(output)["run"]["id"] == latest_id
    assert json.loads(open(os.path.join(output, "dataset.json")).read())["run"]["id"] == latest_id  # its copy
    # A format 3 pointer whose log holds no commit: no dataset yet, and readers say so.
    with open(os.path.join(output, "dataset.json"), "w") as handle:
        json.dump(FORMAT3_POINTER, handle)
    for name in os.listdir(os.path.join(output, manifest_lib.MANIFESTS_DIR)):
        os.remove(os.path.join(output, manifest_lib.MANIFESTS_DIR, name))
    with pytest.raises(manifest_lib.ManifestError, match="holds no manifest"):
        verification.read_manifest(output)


def format3_name(sequence: int, run_id: str) -> str:
    """How format 3 named its commits: `manifests/<12-digit sequence>-<run id>.json`."""
    return f"{manifest_lib.MANIFESTS_DIR}/{sequence:012d}-{run_id}.json"


# What format 3 wrote into dataset.json.
FORMAT3_POINTER = {
    "format_version": 3,
    "layout": "manifests",
    "manifests": "manifests/",
    "image": {},
    "labels": [],
    "normalization": {},
    "splits": {},
    "inputs": {"num_found": 0},
}
