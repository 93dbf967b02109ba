"""Reading an input's bytes, and telling a file's own problem from a passing one."""

import base64
import contextlib
import functools
import hashlib
import os

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from preprocess import errors, filesystem

_READ_CHUNK_BYTES = 8 << 20
_GCS_PREFIX = "gs://"
_LOCAL_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


try:
    from google.api_core import exceptions as _api_exceptions

    _GCS_PATH_ERRORS = (_api_exceptions.NotFound, _api_exceptions.Forbidden)
except ImportError:  # Beam without its [gcp] extra: no gs:// paths either
    _GCS_PATH_ERRORS = ()
_DETERMINISTIC_READ_ERRORS = _LOCAL_PATH_ERRORS + _GCS_PATH_ERRORS + (NotImplementedError,)


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


def _filesystem(uri: str):
    try:
        return FileSystems.get_filesystem(uri)
    except ValueError as exc:  # a scheme no filesystem serves (a manifest row naming http://...)
        raise errors.ImageError(errors.UNREADABLE, str(exc)) from exc


def _open(uri: str):
    """A local (or other non-GCS) file, opened for reading raw bytes."""
    return _filesystem(uri).open(uri, compression_type=CompressionTypes.UNCOMPRESSED)


def _gcs_blob(uri: str):
    """(the Blob of gs:// `uri` on this thread's client, the job's retry policy for GCS requests)."""
    gcs = filesystem.gcs_io(uri)
    bucket, _, name = uri[len(_GCS_PREFIX) :].partition("/")
    # The policy Beam's GcsIO uses for its own requests (google-cloud-storage's, with Beam's throttling
    # counter), made from the job's options when the GcsIO was.
    return gcs.client.bucket(bucket).blob(name), gcs._storage_client_retry  # noqa: SLF001


def _gcs_range(uri: str, start: int, length: int) -> bytes:
    """Up to `length` bytes of a GCS object from `start`: one ranged download (b"" past its end)."""
    from google.api_core import exceptions as api_exceptions

    blob, retry = _gcs_blob(uri)
    try:
        # raw_download: the stored bytes, never decompressed (as Beam's reader reads them).
        return blob.download_as_bytes(
            start=start, end=start + length - 1, raw_download=True, checksum=None, retry=retry
        )
    except api_exceptions.RequestRangeNotSatisfiable:
        return b""  # 416: the range starts at or past the end of the object


def _is_gcs(uri: str) -> bool:
    return uri.startswith(_GCS_PREFIX)


def _check_size(uri: str, size: int, max_bytes: int | None):
    if max_bytes is not None and size > max_bytes:
        raise errors.ImageError(errors.TOO_LARGE, too_large_detail(size, max_bytes))


def too_large_detail(size: int, max_bytes: int) -> str:
    return f"{size} bytes, over the limit of {max_bytes} bytes (--max-file-mb {max_bytes / 1e6:g})"


def md5_hex(md5_base64: str | None) -> str | None:
    """GCS's `md5Hash` (base64) as a hex digest; None for none (a composite object)."""
    return base64.b64decode(md5_base64).hex() if md5_base64 else None


def size_and_md5(uri: str) -> tuple[int, str | None]:
    """(size in bytes, MD5 hex digest or None) of a file without reading it: on GCS one metadata request,
    locally a stat. Failures as for `read_file_bytes`."""
    with _unreadable_if_deterministic():
        if _is_gcs(uri):
            blob, retry = _gcs_blob(uri)
            blob.reload(retry=retry)
            return blob.size, md5_hex(blob.md5_hash)
        fs = _filesystem(uri)
        if filesystem.is_local(uri):
            return os.stat(uri).st_size, None
        return fs.metadata(uri).size_in_bytes, None


def read_file_bytes(uri: str, max_bytes: int | None = None, size: int | None = None) -> bytearray | bytes:
    """The whole file, read into one buffer of its size; ImageError(TOO_LARGE) past `max_bytes` (read no
    further), ImageError(UNREADABLE) for a deterministic failure, else the failure itself."""
    limit = None if max_bytes is None else max_bytes + 1
    with _unreadable_if_deterministic():
        if _is_gcs(uri):
            data = _gcs_whole(uri, limit, size)
        else:
            with _open(uri) as handle:
                data = handle.read() if limit is None else handle.read(limit)
    _check_size(uri, len(data), max_bytes)
    return data


class _FillingBuffer:
    """A write-only stream into one bytearray of the expected size, grown only if more comes."""

    def __init__(self, expected_size: int | None):
        self.data = bytearray(expected_size or 0)
        self._filled = 0

    def write(self, chunk) -> int:
        end = self._filled + len(chunk)
        if end <= len(self.data):
            self.data[self._filled : end] = chunk
        else:  # more than expected (the object changed since it was listed)
            del self.data[self._filled :]
            self.data += chunk
        self._filled = end
        return len(chunk)

    def seek(self, position: int, whence: int = 0) -> int:
        # A retried download starts over (google-resumable-media rewinds its stream).
        self._filled = position if whence == 0 else self._filled + position
        return self._filled

    def tell(self) -> int:
        return self._filled

    def finished(self) -> bytearray:
        del self.data[self._filled :]  # in place: less than expected (the object shrank)
        return self.data


def _gcs_whole(uri: str, limit: int | None, size: int | None = None) -> bytearray:
    """A GCS object's bytes, up to `limit`, in one streamed download (`size`: its expected size)."""
    from google.api_core import exceptions as api_exceptions

    blob, retry = _gcs_blob(uri)
    buffer = _FillingBuffer(size if limit is None or size is None else min(size, limit))
    try:
        blob.download_to_file(
            buffer,
            start=0 if limit is not None else None,
            end=limit - 1 if limit is not None else None,
            raw_download=True,
            checksum=None,
            retry=retry,
        )
    except api_exceptions.RequestRangeNotSatisfiable:
        return bytearray()  # 416: an empty object asked for a range
    return buffer.finished()


def hash_file(uri: str, max_bytes: int | None = None, algorithm: str = "sha256") -> tuple[str, int]:
    """(hex digest, size in bytes) of a file, read in chunks; failures as for `read_file_bytes`."""
    digest = hashlib.new(algorithm)
    size = 0
    limit = None if max_bytes is None else max_bytes + 1
    with _unreadable_if_deterministic(), contextlib.ExitStack() as stack:
        if _is_gcs(uri):  # ranged downloads of _READ_CHUNK_BYTES
            read = functools.partial(_gcs_range, uri)
        else:
            handle = stack.enter_context(_open(uri))
            read = lambda _, length: handle.read(length)  # noqa: E731 - the local read, as _gcs_range's
        while limit is None or size < limit:
            length = _READ_CHUNK_BYTES if limit is None else min(_READ_CHUNK_BYTES, limit - size)
            chunk = read(size, length)
            digest.update(chunk)
            size += len(chunk)
            if len(chunk) < length:
                break
    _check_size(uri, size, max_bytes)
    return digest.hexdigest(), size


def content_key(
    uri: str, size: int | None = None, md5: str | None = None, max_bytes: int | None = None
) -> tuple[str, int]:
    """(content key, size in bytes) of a file: `key_of_md5` of the MD5 of all its bytes, from the listing's
    `size` and `md5` when given (nothing read), else the object's metadata or the bytes. Failures as for
    `read_file_bytes`."""
    if md5 is None or size is None:
        if _is_gcs(uri) and size is None:
            # A manifest's row: its metadata has the MD5 (unless composite). A listed object without
            # one is composite: asking again would say the same.
            size, md5 = size_and_md5(uri)
        if md5 is None:
            md5, size = hash_file(uri, max_bytes, algorithm="md5")
    return key_of_md5(md5), size


def key_of_md5(md5: str) -> str:
    """The content key of a file whose MD5 (hex) is `md5`: the SHA-256 (hex) of that hex digest (a uniform
    number for the split, a function of the bytes alone)."""
    return hashlib.sha256(md5.encode("ascii")).hexdigest()
