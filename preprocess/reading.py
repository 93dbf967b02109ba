"""Reading an input's bytes, and telling a file's own problem from a passing one.

On Dataflow a bundle that raises is retried (four times in batch), on a
corpus of millions some GCS requests fail whatever the client does, and a
worker can run out of memory. So a read failure is recorded as this input's
error (`unreadable` in errors.jsonl) only when reading it again would fail the
same way; everything else is raised, so that the runner retries the bundle or
the job fails loudly, rather than writing a dataset that silently lacks a
different set of images on every run.

Recorded (deterministic, a property of the path or the object):

- a URI whose scheme no Beam filesystem serves;
- local files: `FileNotFoundError`, `PermissionError`, and the other path
  problems `IsADirectoryError`, `NotADirectoryError`;
- GCS (Beam's GcsIO on google-cloud-storage): `google.api_core.exceptions.
  NotFound` (404: no such object or bucket) and `Forbidden` (403: access
  denied). GcsIO raises them as they are, from `FileSystems.open` (its reader
  asks for the object's metadata first) or from a read (the object went away
  in between); and `NotImplementedError`, which its reader raises at open for
  an object stored gzip-encoded with a gzip content type, which it cannot read.

Raised (anything else), notably:

- 408/429/500/502/503/504 and connection errors: the GCS client retries them
  with exponential back-off for up to 120 s (`google.cloud.storage.retry.
  _should_retry`, Beam's `gcsio_retry`), then raises `google.api_core.
  exceptions.RetryError` (or the error itself); 401 (credentials) and every
  other status code;
- `MemoryError`, timeouts, and any other `OSError` of the transport or disk.

An empty file is recorded by the callers (`empty_file`), and whether the bytes
are an image is decided after they are read (decode_stage.py): a decoder can
raise `OSError` for a truncated image, which has nothing to do with reading.
Bytes are read raw: an image whose name ends in `.gz` is not decompressed.
"""

import contextlib
import hashlib
import os

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from preprocess import errors

_READ_CHUNK_BYTES = 1 << 20
# How much of a file its content key reads (content_key): small next to a photo, so that a file is
# read about once in all (its prefix here, then whole when it is decoded); large enough to take in
# a JPEG's or PNG's headers and the start of its compressed data, where two different images differ.
CONTENT_KEY_PREFIX_BYTES = 16 * 1024
_GCS_PREFIX = "gs://"
_LOCAL_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _gcs_deterministic_errors() -> tuple[type[BaseException], ...]:
    try:
        from google.api_core import exceptions as api_exceptions
    except ImportError:  # Beam without its [gcp] extra: no gs:// paths either
        return ()
    return (api_exceptions.NotFound, api_exceptions.Forbidden)


_DETERMINISTIC_READ_ERRORS = _LOCAL_PATH_ERRORS + _gcs_deterministic_errors() + (NotImplementedError,)


def is_deterministic_read_failure(exc: BaseException) -> bool:
    """True when reading the same path again would fail the same way (see the module docstring)."""
    return isinstance(exc, _DETERMINISTIC_READ_ERRORS)


@contextlib.contextmanager
def _unreadable_if_deterministic():
    """Turns a deterministic read failure into ImageError(UNREADABLE); lets everything else through."""
    try:
        yield
    except Exception as exc:
        if is_deterministic_read_failure(exc):
            raise errors.ImageError(errors.UNREADABLE, f"{type(exc).__name__}: {exc}") from exc
        raise


def _open(uri: str, read_ahead_bytes: int | None = None):
    """The file, opened for reading raw bytes.

    `read_ahead_bytes` caps what one read fetches from GCS: Beam's GCS reader
    fetches 16 MiB (or the whole object) per read, which for a prefix would be
    the whole file. Local files are read as asked.
    """
    try:
        filesystem = FileSystems.get_filesystem(uri)
    except ValueError as exc:  # a scheme no filesystem serves (a manifest row naming http://...)
        raise errors.ImageError(errors.UNREADABLE, str(exc)) from exc
    if read_ahead_bytes is not None and uri.startswith(_GCS_PREFIX):
        # Beam's GcsIO, as its GCS filesystem builds it for every open (credentials, the emulator).
        return filesystem._gcsIO().open(uri, "rb", read_buffer_size=read_ahead_bytes)
    return filesystem.open(uri, compression_type=CompressionTypes.UNCOMPRESSED)


def read_file_bytes(uri: str) -> bytes:
    """The whole file; raises ImageError(UNREADABLE) for a deterministic failure, else the failure itself."""
    with _unreadable_if_deterministic(), _open(uri) as handle:
        return handle.read()


def hash_file(uri: str) -> tuple[str, int]:
    """(sha256 hex digest, size in bytes) of a file, read in chunks; failures as for `read_file_bytes`."""
    digest = hashlib.sha256()
    size = 0
    with _unreadable_if_deterministic(), _open(uri) as handle:
        while chunk := handle.read(_READ_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def content_key(uri: str) -> tuple[str, int]:
    """(content key, size in bytes) of a file, from its size and first CONTENT_KEY_PREFIX_BYTES bytes.

    Two files with the same bytes have the same key, so a key seen once is
    an image with no copy, known without reading the whole file; files that
    share a key are hashed in full to tell copies from look-alikes
    (content.py). Failures as for `read_file_bytes`.
    """
    with _unreadable_if_deterministic(), _open(uri, read_ahead_bytes=CONTENT_KEY_PREFIX_BYTES) as handle:
        prefix = handle.read(CONTENT_KEY_PREFIX_BYTES)
        if len(prefix) < CONTENT_KEY_PREFIX_BYTES:
            size = len(prefix)
        else:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
    digest = hashlib.sha256(b"%d:" % size)
    digest.update(prefix)
    return digest.hexdigest(), size
