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

In the never-overwrite layout (format 3, a bucket with a retention policy:
docs/dataset_format.md) `dataset.json` is a pointer written once, so its
generation says nothing: there the version is also the newest name listed in
`manifests/` (a listing of names, no download).
"""

import dataclasses
import os
import threading
import time

import apache_beam as beam

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.publish import manifest_switch
from preprocess.publish.commit import (
    SUPERSEDED_CHECK_SECONDS,
    SupersededRunError,
    published_run_id,
    superseded_message,
)

_GCS_PREFIX = "gs://"


def manifest_version(output_dir: str, pointer: bool = False):
    """A token that changes whenever the published manifest changes (None: there is none); metadata only.

    `pointer`: `dataset.json` is format 3's pointer, so the newest `manifests/` name is part of the token.
    """
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    if path.startswith(_GCS_PREFIX):
        bucket, _, name = path[len(_GCS_PREFIX) :].partition("/")
        client = filesystem.gcs_io(path).client
        blob = client.bucket(bucket).get_blob(name)
        if blob is None:
            return None
        if not pointer:
            return blob.generation
        prefix = name[: -len(manifest_lib.MANIFEST_FILE)] + manifest_lib.MANIFESTS_DIR + "/"
        listed = (
            item.name for item in client.list_blobs(bucket, prefix=prefix, fields="items(name),nextPageToken")
        )
        return blob.generation, manifest_lib.newest_manifest_name(listed)
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
    pointer: bool = False  # dataset.json is format 3's pointer to manifests/


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
        version = manifest_version(output_dir, probe.pointer)
        if version is None:
            probe.version, probe.published = None, ""
        elif version != probe.version:
            manifest, read_from = manifest_switch.read_published(output_dir)
            probe.published = published_run_id(manifest)
            pointer = not read_from.endswith("/" + manifest_lib.MANIFEST_FILE)
            # Seen a pointer for the first time: take the token that covers manifests/ from now on.
            probe.version = manifest_version(output_dir, True) if pointer and not probe.pointer else version
            probe.pointer = pointer
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
