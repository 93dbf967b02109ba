"""Whether a newer run has published, asked cheaply enough for a thousand workers to ask it."""

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time

import apache_beam as beam

from dataset_contract import commit_log
from preprocess.publish import store as dataset_store
from preprocess.publish.commit import (
    SUPERSEDED_CHECK_SECONDS,
    SupersededRunError,
    published_run_id,
    read_published,
    superseded_message,
)


class _WorkerCache:
    """`{"checked_at", "sequence", "run_id"}` for one output directory, shared by a worker's processes."""

    def __init__(self, output_dir: str):
        digest = hashlib.sha256(output_dir.rstrip("/").encode("utf-8")).hexdigest()[:16]
        self.path = os.path.join(tempfile.gettempdir(), f"preprocess-superseded-{digest}.json")

    def read(self) -> dict | None:
        try:
            with open(self.path) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def write(self, state: dict):
        temporary = f"{self.path}.{os.getpid()}"
        with open(temporary, "w") as handle:
            json.dump(state, handle)
        os.replace(temporary, self.path)

    @contextlib.contextmanager
    def asking(self):
        """True if this process may ask now (it holds the worker's lock), False if another process asks."""
        with open(self.path + ".lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _advance(store, output_dir: str, state: dict | None) -> dict:
    """The head now, from `state`: one metadata read of the next commit's name (and a download per new
    commit); a listing only the first time."""
    if state is None:
        head = read_published(output_dir, store)
        return {
            "sequence": head.sequence if head is not None else 0,
            "run_id": published_run_id(head.manifest()) if head is not None else "",
        }
    sequence, run_id = state["sequence"], state["run_id"]
    while store.exists(commit_log.commit_name(sequence + 1)):
        sequence += 1
        data = store.read(commit_log.commit_name(sequence))
        if data is not None:
            run_id = published_run_id(json.loads(data.decode("utf-8")))
    return {"sequence": sequence, "run_id": run_id}


def published_run(output_dir: str, check_seconds: float = SUPERSEDED_CHECK_SECONDS) -> str:
    """The id of the published run ('' for none), at most about `check_seconds` old: one metadata read per
    worker per `check_seconds`."""
    cache = _WorkerCache(output_dir)
    state = cache.read()
    if state is not None and time.time() - state["checked_at"] < check_seconds:
        return state["run_id"]
    with cache.asking() as may_ask:
        if not may_ask:
            return state["run_id"] if state is not None else ""
        state = cache.read()  # another process may have asked while this one waited for the lock
        if state is not None and time.time() - state["checked_at"] < check_seconds:
            return state["run_id"]
        answer = _advance(dataset_store.open_store(output_dir), output_dir, state)
        cache.write({**answer, "checked_at": time.time()})
        return answer["run_id"]


class StopIfSupersededFn(beam.DoFn):
    """Passes elements through; raises SupersededRunError (on every element, the same way) once a newer run
    has published, asking `published_run` about once a minute per worker."""

    def __init__(self, output_dir: str, check_seconds: float = SUPERSEDED_CHECK_SECONDS):
        self._output_dir = output_dir
        self._check_seconds = check_seconds

    def process(self, element, run_id):
        current = published_run(self._output_dir, self._check_seconds)
        if current > run_id:
            raise SupersededRunError(superseded_message(self._output_dir, run_id, current))
        yield element
