"""Whether a newer run has published, asked cheaply enough for a thousand workers to ask it.

A run that a newer one superseded can never publish, so the decode stage
stops it (`StopIfSupersededFn`) rather than let it decode for hours. The
question is asked by every SDK process of the job; the answer lives in
`dataset.json`, which at 10M images is 3-5 MB. Downloading it every minute
from every process of 1,000 workers would be at least 0.4 GB/s from one
object. So:

- one answer per process, shared by every DoFn instance and thread in it
  (`_PROBES`), asked again at most every `check_seconds` (a minute);
- asking is a metadata request for `dataset.json` (its generation on GCS; its
  modification time, size and inode on local disk), through the thread's one
  reused GCS client (filesystem.gcs_io), not a download;
- the manifest itself is downloaded only when that version has changed since
  this process last read it: once per publish, which is rare.
"""

import dataclasses
import os
import threading
import time

import apache_beam as beam

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.publish import (
    SUPERSEDED_CHECK_SECONDS,
    SupersededRunError,
    published_run_id,
    read_published_manifest,
    superseded_message,
)

_GCS_PREFIX = "gs://"


def manifest_version(output_dir: str):
    """A token that changes whenever `dataset.json` is replaced (None: there is none); metadata only."""
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    if path.startswith(_GCS_PREFIX):
        bucket, _, name = path[len(_GCS_PREFIX) :].partition("/")
        blob = filesystem.gcs_io(path).client.bucket(bucket).get_blob(name)
        return None if blob is None else blob.generation
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


@dataclasses.dataclass
class _Probe:
    """What this process last learned about one output directory's published run."""

    checked_at: float | None = None
    version: object = None
    published: str = ""


_PROBES: dict[str, _Probe] = {}
_PROBES_LOCK = threading.Lock()


def published_run(output_dir: str, check_seconds: float = SUPERSEDED_CHECK_SECONDS) -> str:
    """The id of the run `dataset.json` names ('' for none), at most `check_seconds` old.

    One metadata request per process per `check_seconds`; a download only
    when the manifest was replaced since this process last read it.
    """
    with _PROBES_LOCK:
        probe = _PROBES.setdefault(output_dir, _Probe())
        now = time.monotonic()
        if probe.checked_at is not None and now - probe.checked_at < check_seconds:
            return probe.published
        probe.checked_at = now
        version = manifest_version(output_dir)
        if version is None:
            probe.version, probe.published = None, ""
        elif version != probe.version:
            probe.published = published_run_id(read_published_manifest(output_dir))
            probe.version = version
        return probe.published


class StopIfSupersededFn(beam.DoFn):
    """Passes elements through; raises SupersededRunError once a newer run has published.

    Asks `published_run` at its elements: in all, one metadata request per
    process a minute (see the module docstring). Once superseded it raises on
    every element with the same message, so the runner's retries of the
    bundle (4 on Dataflow) fail at once, the same way, and the job stops.
    """

    def __init__(self, output_dir: str, check_seconds: float = SUPERSEDED_CHECK_SECONDS):
        self._output_dir = output_dir
        self._check_seconds = check_seconds

    def process(self, element, run_id):
        current = published_run(self._output_dir, self._check_seconds)
        if current > run_id:
            raise SupersededRunError(superseded_message(self._output_dir, run_id, current))
        yield element
