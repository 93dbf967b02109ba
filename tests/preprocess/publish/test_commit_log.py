"""Publishing as a commit log (preprocess/publish/commit.py) and garbage collection (preprocess/publish/gc.py), on local disk
and on the GCS emulator in its retention mode (tests/gcs_emulator.py).

- 2, 3 and 8 publishers that read the same head are held at a barrier just before they create the next
  commit: exactly one wins each sequence, the newest run is the published one, and the run a reader holds
  a lease on is not removed.
- A locked bucket (retention policy, default event-based hold) whose workers cannot read the bucket's
  metadata: every publish succeeds, run after run.
- Garbage collection on a locked bucket over 20 publishes: no marker while nothing can go, requests per
  call bounded; once the retention has passed, what waited goes, within the budget of each call.

One real stage 1 run (module scope) gives the dataset; the other runs are copies of its files under other
run ids (real bytes, real sizes).
"""

import collections
import datetime
import json
import os
import shutil
import threading
import time

import pytest
from google.cloud import storage

from dataset_contract import commit_log, leases
from dataset_contract import manifest as manifest_lib
from preprocess.publish import commit as publish
from preprocess.publish import gc, protocol
from preprocess.publish import store as dataset_store
from preprocess.publish.runs import RunPaths, new_run_id
from tests.publishing import assert_complete_dataset

pytestmark = pytest.mark.slow

# The dataset every test starts from, written once per session (shared with test_gc.py and
# test_publish_retention.py): the sample corpus, 3 images per class, any failures allowed.
PUBLISHED = {"images_per_class": 3, "image_size": 16, "encoding": "uint8", "min_shards": 1}
RETENTION_SECONDS = 3600
MAX_RUNS = 5


@pytest.fixture(scope="module")
def published(tmp_path_factory, shared_stage1_datasets):
    output = tmp_path_factory.mktemp("published") / "dataset"
    _, manifest = shared_stage1_datasets.copy(output, **PUBLISHED)
    return str(output), manifest


def _bucket_prefix(gcs_emulator, url: str) -> str:
    return url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"


class Directory:
    """A dataset directory holding the published run, on local disk or gs://, and clones of it."""

    def __init__(self, published, url: str, gcs_emulator=None):
        self.source, self.manifest = published
        self.url = url
        self.gcs = gcs_emulator
        self.run_id = self.manifest["run"]["id"]
        if gcs_emulator is None:
            shutil.copytree(self.source, url)
        else:
            bucket = storage.Client().bucket(gcs_emulator.bucket)
            for root, _, names in os.walk(self.source):
                for name in names:
                    relative = os.path.relpath(os.path.join(root, name), self.source)
                    bucket.blob(_bucket_prefix(gcs_emulator, url) + relative).upload_from_filename(
                        os.path.join(root, name)
                    )

    def clone(self, run_id: str) -> dict:
        """The published run's files copied under `run_id`; its manifest."""
        if self.gcs is None:
            shutil.copytree(RunPaths(self.url, self.run_id).run_dir, RunPaths(self.url, run_id).run_dir)
        else:
            bucket = storage.Client().bucket(self.gcs.bucket)
            source = _bucket_prefix(self.gcs, self.url) + f"runs/{self.run_id}/"
            target = _bucket_prefix(self.gcs, self.url) + f"runs/{run_id}/"
            for blob in bucket.list_blobs(prefix=source):
                bucket.copy_blob(blob, bucket, target + blob.name[len(source) :])
        return json.loads(json.dumps(self.manifest).replace(self.run_id, run_id))

    def names(self) -> set[str]:
        if self.gcs is None:
            return {
                os.path.relpath(os.path.join(root, name), self.url)
                for root, _, names in os.walk(self.url)
                for name in names
            }
        prefix = _bucket_prefix(self.gcs, self.url)
        return {name[len(prefix) :] for name in self.gcs.list_objects(prefix)}

    def lease(self, run_id: str, holder_dir: str = "gs://models/reader"):
        """A training job's live lease on `run_id`, as stage 2 writes it."""
        expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
        name = leases.lease_name(run_id, leases.holder_id(holder_dir), expiry)
        dataset_store.open_store(self.url).create_if_absent(name, b"{}")


@pytest.fixture(params=["local", "gcs"])
def directory(request, published, tmp_path):
    if request.param == "local":
        return Directory(published, str(tmp_path / "dataset"))
    gcs_emulator = request.getfixturevalue("gcs_emulator")
    forwarder = request.getfixturevalue("gcs_read_faults")  # enforces ifGenerationMatch, as GCS does
    forwarder.retention_seconds = RETENTION_SECONDS
    forwarder.bucket_metadata_status = 403
    return Directory(published, request.getfixturevalue("gcs_dir"), gcs_emulator)


def commits(directory: Directory) -> dict[int, str]:
    """Sequence -> the run its commit publishes."""
    found = {}
    store = dataset_store.open_store(directory.url)
    for stored in store.list(f"{manifest_lib.MANIFESTS_DIR}/").objects:
        sequence = commit_log.commit_sequence(stored.name)
        if sequence is not None:
            found[sequence] = json.loads(store.read(stored.name))["run"]["id"]
    return found


@pytest.mark.parametrize("publishers", [2, 3, 8])
def test_publishers_that_read_the_same_head_commit_one_each_in_order_and_the_newest_is_published(
    directory, publishers, monkeypatch
):
    directory.lease(directory.run_id)  # a reader trains on the published run
    run_ids = sorted(new_run_id() for _ in range(publishers))
    manifests = {run_id: directory.clone(run_id) for run_id in run_ids}
    # Every publisher reads the head (commit 1), then waits here until all have read it.
    barrier = threading.Barrier(publishers, timeout=120)
    waited = set()
    real_pause = protocol.pause_point

    def pause(point, run_id):
        if point == "before-commit" and run_id not in waited:
            waited.add(run_id)
            barrier.wait()
        real_pause(point, run_id)

    monkeypatch.setattr(protocol, "pause_point", pause)
    created = collections.Counter()
    for store_class in (dataset_store.LocalStore, dataset_store.GcsStore):
        real_create = store_class.create_if_absent

        def create(store, name, data, real_create=real_create):
            won = real_create(store, name, data)
            if won and name.startswith(manifest_lib.MANIFESTS_DIR + "/"):
                created[name] += 1
            return won

        monkeypatch.setattr(store_class, "create_if_absent", create)

    outcomes = {}

    def run(run_id):
        try:
            publish.publish_run(directory.url, run_id, manifests[run_id], retention_days=0)
            outcomes[run_id] = "published"
        except publish.SupersededRunError as exc:
            outcomes[run_id] = f"superseded: {exc}"

    threads = [threading.Thread(target=run, args=(run_id,)) for run_id in run_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(outcomes) == publishers and waited == set(run_ids)

    log = commits(directory)
    # Exactly one publisher won each sequence: every commit was created once, by one run...
    assert set(created.values()) == {1} and len(created) == len(log) - 1
    # ...and along the log, the runs only ever get newer; the newest run is the head.
    runs_in_order = [log[sequence] for sequence in sorted(log)]
    assert runs_in_order == sorted(set(runs_in_order))
    assert runs_in_order[0] == directory.run_id and runs_in_order[-1] == run_ids[-1]
    assert sorted(log) == list(range(1, len(log) + 1))
    assert outcomes[run_ids[-1]] == "published"
    for run_id, outcome in outcomes.items():
        assert (outcome == "published") == (run_id in runs_in_order), (run_id, outcome)
    published_manifest = assert_complete_dataset(directory.url)
    assert published_manifest["run"]["id"] == run_ids[-1]
    # The run a reader holds stays, whatever was removed.
    assert publish.missing_run_files(directory.url, directory.run_id, directory.manifest) == []


def test_on_a_locked_bucket_whose_workers_cannot_read_its_metadata_every_publish_succeeds(
    published, gcs_emulator, gcs_dir, gcs_read_faults
):
    gcs_read_faults.bucket_metadata_status = 403
    directory = Directory(published, gcs_dir, gcs_emulator)
    for index in range(8):
        # Half the runs under a retention policy, half under a default event-based hold.
        gcs_read_faults.retention_seconds = RETENTION_SECONDS if index % 2 == 0 else None
        gcs_read_faults.default_event_based_hold = index % 2 == 1
        run_id = new_run_id()
        committed = publish.publish_run(gcs_dir, run_id, directory.clone(run_id), retention_days=0)
        assert committed["run"]["id"] == run_id
        assert publish.read_published_manifest(gcs_dir)["run"]["id"] == run_id
    assert commits(directory)[9] == run_id
    # Nothing was ever replaced: the bucket refused only deletes of young objects, and the hint.
    replaced = {name for kind, name in gcs_read_faults.refused_by_retention if kind == "replace"}
    assert replaced <= {_bucket_prefix(gcs_emulator, gcs_dir) + commit_log.HINT_FILE}


def test_gc_on_a_locked_bucket_over_20_publishes_writes_no_marker_it_cannot_delete_and_stays_bounded(
    published, gcs_emulator, gcs_dir, gcs_read_faults
):
    gcs_read_faults.retention_seconds = RETENTION_SECONDS
    gcs_read_faults.bucket_metadata_status = 403
    directory = Directory(published, gcs_dir, gcs_emulator)
    reports = []
    for _ in range(20):
        run_id = new_run_id()
        publish.publish_run(gcs_dir, run_id, directory.clone(run_id), retention_days=0, gc_budget=0)
        reports.append(gc.collect_garbage(gcs_dir, max_objects=200, max_runs=MAX_RUNS))
    # Every object is young: nothing could go, so no marker was written, and each call says what waits.
    assert [report.markers_written for report in reports] == [0] * 20
    assert all(report.waiting > 0 and report.deleted == 0 for report in reports)
    until = datetime.datetime.fromtimestamp(reports[-1].waiting_until, datetime.timezone.utc)
    assert (
        datetime.timedelta(minutes=50)
        < until - datetime.datetime.now(datetime.timezone.utc)
        < datetime.timedelta(hours=1)
    )
    assert f"{reports[-1].waiting} objects wait for the bucket's retention (until" in "\n".join(
        reports[-1].lines()
    )
    assert not [name for name in directory.names() if name.startswith("leases/")]
    # Requests per call: a few listings, and four per run it looks at (its leases, its files, its
    # staging, its build record), at most MAX_RUNS of them: once that many runs wait, every call costs the
    # same however many publishes follow.
    requests = [report.requests for report in reports]
    assert max(requests) == requests[-1] == requests[MAX_RUNS + 1], requests
    assert requests[-1] <= 4 * MAX_RUNS + 15, requests

    # The retention period passes: each call removes up to its budget, writes one marker per run it
    # removes, and the calls converge: only the published run is left.
    gcs_read_faults.retention_seconds = 0.5
    time.sleep(1.0)
    later = []
    for _ in range(40):
        report = gc.collect_garbage(gcs_dir, max_objects=60, max_runs=MAX_RUNS)
        later.append(report)
        # At most one marker per run it removes (a removal that takes several calls reuses its marker).
        assert report.deleted <= 60 and report.markers_written <= MAX_RUNS
        if not report.more and not report.waiting and report.deleted == 0:
            break
        time.sleep(0.6)  # the markers it wrote become deletable
    else:
        pytest.fail(f"garbage collection did not converge: {[r.lines() for r in later]}")
    head = publish.read_published_manifest(gcs_dir)["run"]["id"]
    runs = {name.split("/")[1].split(".")[0] for name in directory.names() if name.startswith("runs/")}
    assert runs == {head}  # its files, and the marker of its publish, young when it published
    assert not [name for name in directory.names() if name.startswith(("leases/", "staging/"))]
    assert_complete_dataset(gcs_dir)
    # Idempotent: a call with nothing to do deletes nothing and writes nothing.
    again = gc.collect_garbage(gcs_dir)
    assert (again.deleted, again.markers_written, again.removed_runs) == (0, 0, [])
