"""A training job's lease on the dataset run it reads, so that stage 1's cleanup leaves the run alone.

Stage 1 removes a superseded run's files once its retention period has
passed (docs/dataset_format.md), but a training job may read its pinned run
(train/data/dataset_pin.py) for longer. While it trains, the chief holds a lease
(dataset_contract/leases.py):

    DATA_DIR/leases/<run id>/<model dir hash>.<expiry>.json

written at the start and again every `refresh_seconds` (an hour), each
lasting `lease_seconds` (a day) from when it is written. Stage 1's cleanup
never removes a run with a live lease. Each refresh writes a new object
(never replaces one: a bucket with a retention policy refuses that) and
then removes this job's older leases, best effort. When training stops,
the last lease is left to expire by itself: a preempted job that resumes
within a day finds its run still there.

Only TensorFlow's file system is used (stage 2 never imports Beam).
"""

import contextlib
import datetime
import json
import logging
import posixpath
import threading

import tensorflow as tf

from dataset_contract import leases
from dataset_contract import manifest as manifest_lib

LEASE_SECONDS = 24 * 3600
REFRESH_SECONDS = 3600

_UTC = datetime.timezone.utc

log = logging.getLogger(__name__)


class DatasetLease:
    """The lease of the job training in `model_dir` on run `run_id` of `data_dir`."""

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
        self._stop = threading.Event()
        self._thread = None

    @property
    def directory(self) -> str:
        return manifest_lib.join(self.data_dir, leases.run_leases_dir(self.run_id))

    def refresh(self, now: datetime.datetime | None = None) -> str:
        """Write a new lease lasting `lease_seconds` from `now`, then remove this holder's older ones;
        returns its path."""
        now = now or datetime.datetime.now(_UTC)
        expires = now + datetime.timedelta(seconds=self.lease_seconds)
        path = manifest_lib.join(self.data_dir, leases.lease_name(self.run_id, self.holder, expires))
        record = {"run_id": self.run_id, "model_dir": self.model_dir, "expires_at": expires.isoformat()}
        if not self.directory.startswith("gs://"):
            tf.io.gfile.makedirs(self.directory)  # on GCS: no directory placeholder objects
        with tf.io.gfile.GFile(path, "wb") as handle:
            handle.write(json.dumps(record).encode("utf-8"))
        written = posixpath.basename(path)
        for name in tf.io.gfile.listdir(self.directory):
            parsed = leases.parse_lease(name)
            # Its older leases only (the names hold whole seconds: compare them, not `expires`).
            if (
                parsed
                and parsed[0] == self.holder
                and name != written
                and parsed[1] <= leases.parse_lease(written)[1]
            ):
                try:
                    tf.io.gfile.remove(manifest_lib.join(self.directory, name))
                except tf.errors.OpError as exc:  # a retention policy keeps it; it expires all the same
                    log.debug("could not remove the older lease %s: %s", name, exc)
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

    def __enter__(self):
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - e.g. read-only access to the data: train all the same
            log.warning(
                "could not write a lease on dataset run %s in %s (%s): training goes on, but the run is "
                "kept only for stage 1's retention period (preprocess --retention-days)",
                self.run_id,
                self.directory,
                exc,
            )
        self._thread = threading.Thread(target=self._keep_refreshing, name="dataset-lease", daemon=True)
        self._thread.start()
        log.info("holding a lease on dataset run %s (%s/)", self.run_id, self.directory)
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def held(pinned, model_dir: str, enabled: bool = True):
    """A lease on the pinned run while the block runs (chief only: `enabled`); none for a format 1
    dataset, which has no runs."""
    if not enabled or not pinned.run_id:
        return contextlib.nullcontext()
    return DatasetLease(pinned.data_dir, pinned.run_id, model_dir)
