"""A job's lease on the dataset run it reads, taken before it commits to the run, so that stage 1's
cleanup leaves the run alone.

Stage 1 removes a superseded run's files once its retention period has
passed (docs/dataset_format.md), but a training job may read its pinned run
(train/data/dataset_pin.py) for longer, and `train.evaluate` reads it again
later. While it reads, the job holds a lease (dataset_contract/leases.py):

    DATA_DIR/leases/<run id>/<model dir hash>.<expiry>.json

written before the job commits to the run, and again every
`refresh_seconds` (an hour), each lasting `lease_seconds` (a day) from when
it is written. Each refresh writes a new object (never replaces one: a
bucket with a retention policy refuses that) and then removes this job's
older leases, best effort. When the job stops, the last lease is left to
expire by itself: a preempted job that resumes within a day finds its run
still there.

No window is left between choosing a run and protecting it
(`resolve_and_lease`): the job writes its lease first, then looks for a
removal marker on the run (a remover writes its marker first, then looks
for leases: one of the two always sees the other).
- A first start reads the published run, leases it, and if a remover is at
  work on it (or finished before the lease), backs off to the newest run.
- A resume leases its pinned run, waits for a remover at work on it to
  finish or back off, and only then checks that the run is whole. If its
  lease lapsed while the job was stopped (longer than a day) and the run is
  gone, it says so and what to do (DatasetError: exit 2).

Only TensorFlow's file system is used (stage 2 never imports Beam).
"""

import datetime
import json
import logging
import os
import posixpath
import threading
import time

import tensorflow as tf

from dataset_contract import leases
from dataset_contract import manifest as manifest_lib
from train.data import dataset_pin
from train.errors import DatasetError

LEASE_SECONDS = 24 * 3600
REFRESH_SECONDS = 3600
# A resume waits this long at most for a remover at work on its run to finish or back off (a remover
# holds its marker for the seconds of a listing and a few deletes, or until it has deleted the run).
REMOVAL_WAIT_SECONDS = 300.0
_REMOVAL_POLL_SECONDS = 2.0
# A first start backs off to the newest run at most this many times (each a publish and a removal
# that came between its read and its lease).
_FIRST_START_ATTEMPTS = 5

_UTC = datetime.timezone.utc
_LEGACY_REMOVAL_MARKER = "deleting"

log = logging.getLogger(__name__)


class DatasetLease:
    """The lease of the job reading run `run_id` of `data_dir` for `model_dir`."""

    def __init__(
        self,
        data_dir: str,
        run_id: str,
        model_dir: str,
        lease_seconds: float = LEASE_SECONDS,
        refresh_seconds: float = REFRESH_SECONDS,
    ):
        self.data_dir = data_dir
        self.run_id = run_id
        self.holder = leases.holder_id(model_dir)
        self.lease_seconds = lease_seconds
        self.refresh_seconds = refresh_seconds
        self.model_dir = model_dir
        self.written = None  # the path of the newest lease this object wrote
        self._stop = threading.Event()
        self._thread = None

    @property
    def directory(self) -> str:
        return manifest_lib.join(self.data_dir, leases.run_leases_dir(self.run_id))

    def _names(self) -> list[str]:
        try:
            return tf.io.gfile.listdir(self.directory)
        except tf.errors.NotFoundError:
            return []

    def newest_expiry(self) -> datetime.datetime | None:
        """When this holder's newest lease on the run expires (or expired); None if it holds none."""
        expiries = [
            parsed[1]
            for parsed in map(leases.parse_lease, self._names())
            if parsed and parsed[0] == self.holder
        ]
        return max(expiries, default=None)

    def refresh(self, now: datetime.datetime | None = None, prune: bool = True) -> str:
        """Write a new lease lasting `lease_seconds` from `now`, then (`prune`) remove this holder's older
        ones; returns its path."""
        now = now or datetime.datetime.now(_UTC)
        expires = now + datetime.timedelta(seconds=self.lease_seconds)
        path = manifest_lib.join(self.data_dir, leases.lease_name(self.run_id, self.holder, expires))
        record = {"run_id": self.run_id, "model_dir": self.model_dir, "expires_at": expires.isoformat()}
        if not self.directory.startswith("gs://"):
            tf.io.gfile.makedirs(self.directory)  # on GCS: no directory placeholder objects
        with tf.io.gfile.GFile(path, "wb") as handle:
            handle.write(json.dumps(record).encode("utf-8"))
        self.written = path
        if not prune:
            return path
        written = posixpath.basename(path)
        for name in self._names():
            parsed = leases.parse_lease(name)
            # Its older leases only (the names hold whole seconds: compare them, not `expires`).
            if (
                parsed
                and parsed[0] == self.holder
                and name != written
                and parsed[1] <= leases.parse_lease(written)[1]
            ):
                _remove_quietly(manifest_lib.join(self.directory, name))
        return path

    def _keep_refreshing(self):
        while not self._stop.wait(self.refresh_seconds):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the next refresh tries again; the lease still runs
                log.warning(
                    "could not refresh the lease on dataset run %s in %s (%s); trying again in %ds",
                    self.run_id,
                    self.directory,
                    exc,
                    self.refresh_seconds,
                )

    def start(self, prune: bool = True) -> bool:
        """Write the lease, then keep refreshing it in a thread until `stop`; False if it could not be
        written (read-only access to the data: the job reads all the same, unprotected). Without
        `prune`, this holder's older leases stay until the first refresh."""
        try:
            self.refresh(prune=prune)
        except Exception as exc:  # noqa: BLE001 - e.g. read-only access to the data: read all the same
            log.warning(
                "could not write a lease on dataset run %s in %s (%s): the job goes on, but the run is "
                "kept only for stage 1's retention period (preprocess --retention-days)",
                self.run_id,
                self.directory,
                exc,
            )
            return False
        self._thread = threading.Thread(target=self._keep_refreshing, name="dataset-lease", daemon=True)
        self._thread.start()
        log.info("holding a lease on dataset run %s (%s/)", self.run_id, self.directory)
        return True

    def stop(self):
        """Stop refreshing; the last lease stays and expires by itself."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def release(self):
        """Stop refreshing and remove the lease this object wrote (best effort): the job will not read the run."""
        self.stop()
        if self.written is not None:
            _remove_quietly(self.written)

    def removal_markers(self) -> list[str]:
        """The live removal markers on the run: a remover at work on it (one listing of the run's leases
        directory, dataset_contract/leases.py), or a remover of stage 1 before its commit log at work."""
        now = datetime.datetime.now(_UTC)
        names = self._names()
        live = leases.live_removals(names, now)
        markers = [name for name in names if (leases.parse_removal_marker(name) or ("",))[0] in live]
        return markers + legacy_removal_markers(self.data_dir, self.run_id)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info):
        self.stop()


def _remove_quietly(path: str):
    try:
        tf.io.gfile.remove(path)
    except tf.errors.OpError as exc:  # a retention policy keeps it; it expires all the same
        log.debug("could not remove the lease %s: %s", path, exc)


def legacy_removal_markers(data_dir: str, run_id: str) -> list[str]:
    """`runs/<run id>.deleting.*`: the removal markers of stage 1 before its commit log (issue 31), which a
    job launched with that code may still write (one listing)."""
    runs = manifest_lib.join(data_dir, manifest_lib.RUNS_DIR)
    prefix = f"{run_id}.{_LEGACY_REMOVAL_MARKER}."
    try:
        # listdir, not glob: on GCS, TensorFlow's glob lists everything below runs/, every shard of every run.
        names = tf.io.gfile.listdir(runs)
    except tf.errors.NotFoundError:
        return []
    return [manifest_lib.join(runs, name) for name in names if name.startswith(prefix)]


def is_chief_process() -> bool:
    """Whether this process is the one that writes for the job, from TF_CONFIG alone (before any strategy
    exists): the chief, or worker 0 of a cluster without one, or a process outside any cluster."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return True
    task = config.get("task") or {}
    kind = task.get("type")
    if kind in (None, "chief"):
        return True
    return (
        kind == "worker" and int(task.get("index", 0)) == 0 and "chief" not in (config.get("cluster") or {})
    )


def _describe(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def resolve_and_lease(
    data_dir: str,
    model_dir: str,
    enabled: bool = True,
    removal_wait_seconds: float = REMOVAL_WAIT_SECONDS,
    lease_seconds: float = LEASE_SECONDS,
    refresh_seconds: float = REFRESH_SECONDS,
) -> tuple[dataset_pin.PinnedDataset, DatasetLease | None]:
    """The dataset run to read (dataset_pin.resolve_dataset), with a started lease on it taken before
    the job commits to it; (pinned, None) when `enabled` is False or the dataset has no runs (format 1).

    See the module docstring. Raises DatasetError as resolve_dataset does, and when a resumed job's
    run is gone, saying whether its lease lapsed while it was stopped.
    """
    if not enabled:
        return dataset_pin.resolve_dataset(data_dir, model_dir), None

    def lease_on(run_id: str) -> DatasetLease:
        return DatasetLease(data_dir, run_id, model_dir, lease_seconds, refresh_seconds)

    pinned = dataset_pin.read_pin(model_dir, data_dir)
    if pinned is not None:
        return _resume(data_dir, model_dir, pinned, lease_on, removal_wait_seconds)
    for _ in range(_FIRST_START_ATTEMPTS):
        candidate = dataset_pin.resolve_dataset(data_dir, model_dir)
        if not candidate.run_id:
            return candidate, None
        lease = lease_on(candidate.run_id)
        if not lease.start():
            return candidate, None
        # After the lease is written: a remover that comes later sees it and backs off.
        problem = _being_removed(data_dir, candidate, lease)
        if problem is None:
            return candidate, lease
        lease.release()
        log.warning("%s: taking the newest run instead", problem)
    raise DatasetError(
        f"{data_dir}: the published dataset changed {_FIRST_START_ATTEMPTS} times while this job chose a run, "
        "each time removed before the job could lease it; run the same command again once stage 1 is done"
    )


def _being_removed(data_dir: str, candidate: dataset_pin.PinnedDataset, lease: DatasetLease) -> str | None:
    """Why a first start must not read `candidate` after all (a remover got to it first), or None."""
    run = dataset_pin.describe_run(candidate.manifest, candidate.manifest_sha256)
    published = dataset_pin.published_bytes_or_none(data_dir)
    if published is not None and manifest_lib.manifest_sha256(published) == candidate.manifest_sha256:
        # Still the published run after the lease: no remover removes that one (it reads the published
        # run again after its marker), so a marker left on it by a remover that died does not matter.
        return None
    if lease.removal_markers():
        return f"dataset {run} is being removed from {data_dir} by stage 1's cleanup"
    # A newer run published since the read; a remover may even have come and gone before the lease.
    missing = dataset_pin.missing_shards(data_dir, candidate.manifest)
    if missing:
        return f"dataset {run} was removed from {data_dir} by stage 1's cleanup (e.g. {missing[0]} is gone)"
    return None


def _resume(data_dir, model_dir, pinned, lease_on, removal_wait_seconds):
    """A resume: lease the pinned run, let a remover at work on it finish, then check the run is whole."""
    if not pinned.run_id:
        return dataset_pin.resolve_dataset(data_dir, model_dir), None
    lease = lease_on(pinned.run_id)
    now = datetime.datetime.now(_UTC)
    last = lease.newest_expiry()
    # No live lease of its own: it expired while no job read the run, or went with the run's files.
    lapsed = last is None or last <= now
    # The lapsed lease stays until the run is known whole: a failed resume, run again, says the same.
    lease.start(prune=False)
    deadline = time.monotonic() + removal_wait_seconds
    while lease.removal_markers() and time.monotonic() < deadline:
        time.sleep(_REMOVAL_POLL_SECONDS)
    try:
        resolved = dataset_pin.resolve_dataset(data_dir, model_dir)
    except DatasetError as exc:
        lease.release()
        if lapsed:
            gone = _lapsed_run_gone(data_dir, model_dir, pinned, last, lease.lease_seconds)
            if gone is not None:
                raise DatasetError(gone) from exc
        raise
    if lapsed:
        log.info(
            "the lease %s held on dataset run %s %s while no job read it; re-checked: the run is whole, and "
            "leased again",
            model_dir,
            pinned.run_id,
            f"expired at {_describe(last)}" if last else "had lapsed",
        )
    return resolved, lease


def _lapsed_run_gone(data_dir, model_dir, pinned, expired_at, lease_seconds) -> str | None:
    """What a job says when its lease lapsed and its run is gone, and the way forward; None if the run
    is whole (its problem is another)."""
    missing = dataset_pin.missing_shards(data_dir, pinned.manifest)
    if not missing:
        return None
    total = len(manifest_lib.shard_paths(pinned.manifest, dataset_pin.TRAINING_SPLITS))
    published = dataset_pin.published_bytes_or_none(data_dir)
    where = manifest_lib.join(data_dir, manifest_lib.MANIFEST_FILE)
    state, published_run = dataset_pin.describe_published(published, where)
    lapse = f"expired at {_describe(expired_at)}" if expired_at else "has lapsed"
    return (
        f"the lease {model_dir} held on dataset run {pinned.run_id} {lapse} (a lease "
        f"lasts {lease_seconds / 3600:g} h and is renewed only while a job reads the run), and stage 1's "
        f"cleanup has removed the run since: {len(missing)} of its {total} train and validation shards are gone "
        f"from {data_dir} (e.g. {missing[0]}); {state}.\n"
        f"The checkpoints in {model_dir} are kept. To go on, either:\n"
        f"  train on {published_run or 'a new dataset'}: start a new --model-dir (this one never switches "
        "datasets), or\n"
        f"  finish on run {pinned.run_id}: restore its files in {data_dir} (their manifest is "
        f"{manifest_lib.join(model_dir, dataset_pin.PINNED_MANIFEST_FILE)}) and run the same command again"
    )
