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
"""

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem

LOCK_FILE = manifest_lib.MANIFEST_FILE + ".lock"
# A writer that loses the race this many times in a row gives up (the runner retries the step).
_MAX_GCS_ATTEMPTS = 20

log = logging.getLogger(__name__)


class ManifestSwitchConflict(RuntimeError):
    """Another writer kept replacing dataset.json while this one tried to swap it."""


def _parse(data: bytes | None, where: str) -> dict | None:
    if data is None:
        return None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        log.warning("%s is not valid JSON (%s); treating the directory as holding no dataset", where, exc)
        return None
    return manifest if isinstance(manifest, dict) else None


def swap_manifest(output_dir: str, decide: Callable[[dict | None], bytes | None], tmp_dir: str) -> bool:
    """Replace `dataset.json` with `decide(current manifest)`, unless it changed meanwhile; True if written.

    `decide` gets the manifest `dataset.json` holds (None for none) and
    returns the bytes to write, or None to write nothing; it may raise to
    refuse. It may be called more than once (GCS, after a lost race).
    `tmp_dir` (local disk) holds the new file until its rename over `dataset.json`.
    """
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    if filesystem.is_local(path):
        return _swap_local(path, decide, tmp_dir)
    if FileSystems.get_scheme(path) == "gs":
        return _swap_gcs(path, decide)
    raise ValueError(f"{path}: publishing needs local disk or gs://")


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


def _swap_gcs(path: str, decide) -> bool:
    from google.api_core import exceptions  # noqa: PLC0415 - GCS only

    bucket, name = _blob(path)
    for _ in range(_MAX_GCS_ATTEMPTS):
        data, generation = _read_with_generation(bucket, name)
        new = decide(_parse(data, path))
        if new is None:
            return False
        try:
            bucket.blob(name).upload_from_string(
                new, content_type="application/json", if_generation_match=generation
            )
        except exceptions.PreconditionFailed:
            log.info("%s changed while being swapped (another writer); reading it again", path)
            continue
        return True
    raise ManifestSwitchConflict(
        f"{path} was replaced by other writers {_MAX_GCS_ATTEMPTS} times while this run tried to publish"
    )
