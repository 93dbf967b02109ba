"""The switch of `dataset.json` as a compare-and-swap: one writer at a time, strictly.

`swap_manifest(output_dir, decide)` reads the manifest `dataset.json` holds,
hands it to `decide`, and writes what `decide` returns only if `dataset.json`
has not changed since it was read. So a check made by `decide` (does the
published manifest name an older run?) still holds at the instant of the
write: no other writer can slip in between.

- On GCS: the read takes the object's generation together with its bytes,
  and the upload carries `ifGenerationMatch` with that generation (0 when
  there was no `dataset.json`: "must not exist"). If another writer replaced
  it in between, GCS refuses the upload (412 Precondition Failed) and the
  swap starts over from a fresh read.
- On local disk: POSIX has no conditional rename, so the read, the check
  and the rename of the new file over `dataset.json` happen under an exclusive `fcntl.flock` of
  `dataset.json.lock` next to `dataset.json`. The kernel releases the lock
  when its holder dies (kill -9 included), so a crash never leaves the
  directory locked; a stale lock *file* is harmless and is removed by the
  next switch. The lock file is unlinked after use, so a locker checks,
  once it holds the lock, that the name still refers to the file it locked
  (else another switch unlinked it meanwhile, and it locks the new one).
  Readers never take the lock: the rename alone (atomic on POSIX) is what
  makes the switch atomic for them.
- On a bucket that refuses to replace objects (a retention policy, a default
  event-based hold: `overwrite_refusal`), nothing is ever overwritten: the
  never-overwrite layout (format 3, dataset_contract/manifest.py). The swap
  lists `manifests/`, reads the newest manifest, and creates the next one,
  `manifests/<sequence + 1>-<run id>.json`, with `ifGenerationMatch=0`
  ("must not exist"): if another writer created that sequence number
  first, GCS refuses (412) and the swap starts over, the same
  compare-and-swap on a new name. The first publish in that layout also
  turns `dataset.json` into the pointer (its only write, a CAS on its
  generation); once a pointer, always (`read_published` follows it).
"""

import contextlib
import datetime
import fcntl
import json
import logging
import os
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem

_UTC = datetime.timezone.utc
LOCK_FILE = manifest_lib.MANIFEST_FILE + ".lock"
# A writer that loses the race this many times in a row gives up (the runner retries the step).
_MAX_GCS_ATTEMPTS = 20

log = logging.getLogger(__name__)


class ManifestSwitchConflict(RuntimeError):
    """Another writer kept replacing dataset.json while this one tried to swap it."""


class OverwriteRefusedError(RuntimeError):
    """The bucket refuses to replace `dataset.json` (retention policy, event-based hold): what to do."""


def _reloaded_bucket(output_dir: str):
    """The bucket of gs:// `output_dir` with its metadata read, or None (local disk, or no permission)."""
    if FileSystems.get_scheme(output_dir) != "gs":
        return None
    from google.api_core import exceptions  # noqa: PLC0415 - GCS only

    bucket, _ = _blob(manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE))
    try:
        bucket.reload()
    except exceptions.Forbidden as exc:
        log.warning(
            "cannot read the metadata of bucket %s (%s): assuming it allows replacing objects",
            bucket.name,
            exc,
        )
        return None
    return bucket


def _refusal(bucket) -> str | None:
    if bucket is None:
        return None
    if bucket.retention_period:
        return f"bucket {bucket.name} has a retention policy of {bucket.retention_period} seconds"
    if bucket.default_event_based_hold:
        return f"bucket {bucket.name} puts a default event-based hold on new objects"
    return None


def overwrite_refusal(output_dir: str) -> str | None:
    """Why the bucket of `output_dir` refuses to replace or delete young objects, or None if it does not.

    A bucket retention policy (`retention_period`) or a default event-based
    hold (`default_event_based_hold`) on GCS; never on local disk. One read
    of the bucket's metadata, which needs storage.buckets.get: without it the
    answer is None, and a refused replacement of dataset.json says what to do.
    """
    return _refusal(_reloaded_bucket(output_dir))


def _parse(data: bytes | None, where: str) -> dict | None:
    if data is None:
        return None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        log.warning("%s is not valid JSON (%s); treating the directory as holding no dataset", where, exc)
        return None
    return manifest if isinstance(manifest, dict) else None


def swap_manifest(
    output_dir: str,
    decide: Callable[[dict | None], bytes | None],
    tmp_dir: str,
    never_overwrite: str | None = None,
) -> bool:
    """Publish `decide(current manifest)` unless the published manifest changed meanwhile; True if written.

    `decide` gets the published manifest (None for none) and returns the
    bytes of the new one, or None to write nothing; it may raise to refuse.
    It may be called more than once (GCS, after a lost race). `tmp_dir`
    (local disk) holds the new file until its rename over `dataset.json`.
    `never_overwrite` (overwrite_refusal's answer) publishes in the
    never-overwrite layout; a directory already in it stays in it.
    """
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    if filesystem.is_local(path):
        return _swap_local(path, decide, tmp_dir)
    if FileSystems.get_scheme(path) == "gs":
        return _swap_gcs(path, decide, never_overwrite)
    raise ValueError(f"{path}: publishing needs local disk or gs://")


def read_published(output_dir: str) -> tuple[dict | None, str]:
    """The published manifest of `output_dir` (None if there is none, or it is not JSON), and its path.

    `dataset.json`, or in the never-overwrite layout the newest manifest of
    `manifests/` that `dataset.json` points to.
    """
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    # Never deleted once written, only replaced: if it exists now, it can be read.
    if not FileSystems.exists(path):
        return None, path
    manifest = _parse(filesystem.read_bytes(path), path)
    if not manifest_lib.is_pointer(manifest):
        return manifest, path
    pattern = manifest_lib.join(output_dir, manifest_lib.MANIFESTS_DIR, "*.json")
    newest = manifest_lib.newest_manifest_name(metadata.path for metadata in filesystem.match(pattern))
    if newest is None:
        return None, path
    return _parse(filesystem.read_bytes(newest), newest), newest


# ------------------------------------------------------------------ local disk


@contextlib.contextmanager
def _locked(lock_path: str):
    """Hold an exclusive flock of `lock_path` (made if absent), the file that name refers to now."""
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
            except FileNotFoundError:
                same = False
            if same:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # unlinked by the holder before us: lock the file the name refers to now
    try:
        yield
    finally:
        # Unlinked while still held: a locker waiting on this file finds it gone and starts over.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        os.close(fd)


def _swap_local(path: str, decide, tmp_dir: str) -> bool:
    with _locked(path + ".lock"):
        try:
            with open(path, "rb") as handle:
                current = handle.read()
        except FileNotFoundError:
            current = None
        data = decide(_parse(current, path))
        if data is None:
            return False
        # Written under a temporary name, then renamed over dataset.json (os.rename replaces atomically).
        filesystem.write_bytes(path, data, tmp_dir)
        return True


# ------------------------------------------------------------------ GCS

_POINTER_BYTES = (json.dumps(manifest_lib.pointer_manifest(), indent=2) + "\n").encode("utf-8")


def _blob(path: str):
    from apache_beam.io.gcp.gcsio import parse_gcs_path  # noqa: PLC0415 - GCS only

    bucket, name = parse_gcs_path(path)
    client = FileSystems.get_filesystem(path)._gcsIO().client  # noqa: SLF001 - Beam's client, its credentials
    return client.bucket(bucket), name


def _read_with_generation(bucket, name: str) -> tuple[bytes | None, int]:
    blob = bucket.get_blob(name)
    if blob is None:
        return None, 0
    # Read at that generation: the bytes and the generation go together (if the emulator or a
    # cache served newer bytes, the precondition below fails and the swap starts over: still safe).
    generation = int(blob.generation)  # taken first: a download may reset it from the response's headers
    return blob.download_as_bytes(), generation


def _swap_gcs(path: str, decide, never_overwrite: str | None) -> bool:
    from google.api_core import exceptions  # noqa: PLC0415 - GCS only

    bucket, name = _blob(path)
    for _ in range(_MAX_GCS_ATTEMPTS):
        data, generation = _read_with_generation(bucket, name)
        top = _parse(data, path)
        if never_overwrite or manifest_lib.is_pointer(top):
            written = _append_gcs(bucket, name, top, generation, decide, never_overwrite)
            if written is None:
                continue
            return written
        new = decide(top)
        if new is None:
            return False
        try:
            bucket.blob(name).upload_from_string(
                new, content_type="application/json", if_generation_match=generation
            )
        except exceptions.PreconditionFailed:
            log.info("%s changed while being swapped (another writer); reading it again", path)
            continue
        except exceptions.Forbidden as exc:
            raise OverwriteRefusedError(
                f"gs://{bucket.name}/{name}: the bucket refused to replace it ({exc.message}). A bucket with a "
                "retention policy or an event-based hold refuses to replace young objects; publishing there "
                "uses a layout that never overwrites, chosen when the job can read the bucket's metadata. "
                "Grant the job's service account storage.buckets.get on the bucket (e.g. "
                "roles/storage.legacyBucketReader) and run it again, or publish into a bucket without a "
                "retention policy"
            ) from exc
        return True
    raise ManifestSwitchConflict(
        f"{path} was replaced by other writers {_MAX_GCS_ATTEMPTS} times while this run tried to publish"
    )


def _append_gcs(
    bucket, name: str, top: dict | None, generation: int, decide, reason: str | None
) -> bool | None:
    """One attempt of the never-overwrite swap; True/False as swap_manifest, None to start over (lost race)."""
    from google.api_core import exceptions  # noqa: PLC0415 - GCS only

    directory = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
    prefix = directory + manifest_lib.MANIFESTS_DIR + "/"
    newest = manifest_lib.newest_manifest_name(
        blob.name for blob in bucket.client.list_blobs(bucket, prefix=prefix)
    )
    pointer = manifest_lib.is_pointer(top)
    if pointer:
        current = _parse(bucket.blob(newest).download_as_bytes(), newest) if newest else None
    else:
        current = (
            top  # the first publish in this layout: dataset.json is still an ordinary manifest (or none)
        )
    new = decide(current)
    if new is None:
        return False
    sequence = manifest_lib.parse_manifest_object(newest)[0] + 1 if newest else 1
    run_id = manifest_lib.manifest_run_id(json.loads(new.decode("utf-8")))
    target = directory + manifest_lib.manifest_object_name(sequence, run_id)
    try:
        bucket.blob(target).upload_from_string(new, content_type="application/json", if_generation_match=0)
    except exceptions.PreconditionFailed:
        log.info(
            "gs://%s/%s was created by another writer first; reading %s again", bucket.name, target, prefix
        )
        return None
    if pointer:
        return True
    try:
        bucket.blob(name).upload_from_string(
            _POINTER_BYTES, content_type="application/json", if_generation_match=generation
        )
    except exceptions.PreconditionFailed:
        log.info("gs://%s/%s changed while it was turned into a pointer; starting over", bucket.name, name)
        return None
    except exceptions.Forbidden as exc:
        raise OverwriteRefusedError(
            pointer_refused_message(f"gs://{bucket.name}/{name}", reason, exc.message)
        ) from exc
    log.info(
        "gs://%s/%s now points to %s (%s: no object is ever overwritten)", bucket.name, name, prefix, reason
    )
    return True


def pointer_refused_message(path: str, reason: str | None, detail: str) -> str:
    """What to do when an ordinary dataset.json cannot yet be turned into the never-overwrite pointer."""
    return (
        f"{path} holds a dataset published before this directory used the layout that never overwrites, "
        f"and the bucket refuses to replace it yet ({reason or 'it refuses overwrites'}: {detail}). Publish "
        "into a new output directory (the layout is used there from the first run), or run again once "
        f"{manifest_lib.MANIFEST_FILE} is older than the retention period (or its hold is released)"
    )


def check_publishable(output_dir: str) -> str | None:
    """Before the job starts: why the bucket refuses overwrites (None: it does not, or local disk).

    Raises OverwriteRefusedError if the first publish in the never-overwrite
    layout could not turn the directory's existing dataset.json into its
    pointer (the object is under retention or on hold): better said now than
    after hours of work.
    """
    bucket = _reloaded_bucket(output_dir)
    reason = _refusal(bucket)
    if reason is None:
        return None
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    _, name = _blob(path)
    blob = bucket.get_blob(name)
    if blob is None or manifest_lib.is_pointer(_parse(blob.download_as_bytes(), path)):
        return reason
    held = bool(blob.event_based_hold or blob.temporary_hold)
    until = blob.retention_expiration_time
    if until is None and bucket.retention_period and blob.time_created is not None:
        until = blob.time_created + datetime.timedelta(seconds=int(bucket.retention_period))
    if held or (until is not None and until > datetime.datetime.now(_UTC)):
        detail = "it is on hold" if held else f"its retention lasts until {until.isoformat()}"
        raise OverwriteRefusedError(pointer_refused_message(path, reason, detail))
    return reason
