"""File operations that are safe to retry, on local disk and gs:// alike (Beam FileSystems)."""

import base64
import contextlib
import functools
import hashlib
import logging
import os
import posixpath
import threading
import uuid

from apache_beam.io.filesystem import BeamIOError, FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from dataset_contract import manifest as manifest_lib

_COPY_CHUNK_BYTES = 8 << 20


_per_thread = threading.local()


def gcs_io(path: str):
    """This thread's Beam GcsIO for gs:// `path`, built from the job's options once and reused (rebuilt when
    the options or STORAGE_EMULATOR_HOST change)."""
    filesystem = FileSystems.get_filesystem(path)
    options = filesystem._pipeline_options  # noqa: SLF001 - the options Beam builds its own GcsIO from
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    cached = getattr(_per_thread, "gcs", None)
    if cached is None or cached[0] is not options or cached[1] != host:
        # Beam's own construction (credentials, options).
        cached = _per_thread.gcs = (options, host, filesystem._gcsIO())  # noqa: SLF001
    return cached[2]


def is_local(path: str) -> bool:
    return isinstance(FileSystems.get_filesystem(path), LocalFileSystem)


def _is_gcs(path: str) -> bool:
    return FileSystems.get_scheme(path) == "gs"


def list_files(directory: str) -> list[FileMetadata]:
    """Every file below `directory`, recursively ([] if there is none); GCS directory placeholders left out."""
    pattern = manifest_lib.join(directory.rstrip("/"), "**")
    return [
        metadata
        for metadata in FileSystems.match([pattern])[0].metadata_list
        if not metadata.path.endswith("/")
    ]


def match(pattern: str) -> list[FileMetadata]:
    """The files matching a glob (`*` stays within one directory level)."""
    return FileSystems.match([pattern])[0].metadata_list


def _make_parent(path: str):
    parent = posixpath.dirname(path)
    if parent and not FileSystems.exists(parent):
        try:
            FileSystems.mkdirs(parent)
        except (OSError, BeamIOError):
            pass  # made concurrently


@contextlib.contextmanager
def write_atomically(path: str, tmp_dir: str | None = None):
    """A binary handle whose bytes appear at `path` whole, on a clean exit only (`tmp_dir`, local disk only,
    holds the file until its rename; default: next to `path`)."""
    if not is_local(path):
        # A GCS upload that fails or is abandoned creates no object.
        with FileSystems.create(path) as handle:
            yield handle
        return
    base = tmp_dir or posixpath.dirname(path)
    temporary = manifest_lib.join(base, f".{posixpath.basename(path)}.tmp-{uuid.uuid4().hex}")
    handle = FileSystems.create(temporary)
    try:
        yield handle
        handle.close()
        _make_parent(path)
        FileSystems.rename([temporary], [path])
    except BaseException:
        handle.close()
        delete_files([temporary])
        raise


class _AbortWhenDropped:
    """Mixed into google-cloud-storage's BlobWriter (Beam's GCS writer): close() aborts, commit() finalizes,
    so that a writer dropped unclosed never publishes its partial bytes."""

    _aborted = False

    def commit(self):
        super().close()

    def close(self):
        if self.closed or self._aborted:
            return
        self._aborted = True
        try:
            self.terminate()
        except Exception as exc:  # noqa: BLE001 - an unfinished upload never becomes an object anyway
            logging.warning(
                "could not cancel the upload of %s (it stays unfinished): %s", self._blob.name, exc
            )


@functools.cache
def _aborting_class(writer_class: type) -> type:
    return type(f"Aborting{writer_class.__name__}", (_AbortWhenDropped, writer_class), {})


def _is_gcs_writer(handle) -> bool:
    try:
        from google.cloud.storage.fileio import BlobWriter
    except ImportError:  # no GCS support installed: no GCS writer either
        return False
    return isinstance(handle, BlobWriter)


class UncommittedFile:
    """A binary file written at `path`, kept by `commit()`; `abort()` or dropping it uncommitted discards it
    (on GCS the object appears at commit() only)."""

    def __init__(self, path: str):
        self.path = path
        self._handle = FileSystems.create(path)
        if _is_gcs_writer(self._handle):
            self._handle.__class__ = _aborting_class(type(self._handle))

    def write(self, data: bytes) -> int:
        return self._handle.write(data)

    # What a file-like sink must also answer (pyarrow's PythonFile asks both).
    @property
    def closed(self) -> bool:
        return self._handle.closed

    def flush(self):
        self._handle.flush()

    def commit(self):
        if isinstance(self._handle, _AbortWhenDropped):
            self._handle.commit()
        else:
            self._handle.close()

    def abort(self):
        self._handle.close()  # on GCS: cancels the upload
        if is_local(self.path):
            delete_files([self.path])


def _gcs_object_checksum(path: str) -> tuple[int, str | None] | None:
    """(size, base64 md5) of the GCS object at `path` (md5 None for a composite object), or None if absent."""
    from apache_beam.io.gcp.gcsio import parse_gcs_path  # noqa: PLC0415 - GCS only

    bucket, name = parse_gcs_path(path)
    blob = gcs_io(path).client.bucket(bucket).get_blob(name)
    return None if blob is None else (int(blob.size), blob.md5_hash)


def _md5_base64(digest) -> str:
    return base64.b64encode(digest.digest()).decode("ascii")


def already_written(path: str, size: int, md5_base64: str) -> bool:
    """Whether GCS already holds these exact bytes (size and md5) at `path`; always False on local disk,
    where replacing a file is allowed."""
    if not _is_gcs(path) or _gcs_object_checksum(path) != (size, md5_base64):
        return False
    logging.info("%s already holds these %d bytes (a retried write): not written again", path, size)
    return True


def write_bytes(path: str, data: bytes, tmp_dir: str | None = None):
    """Write `data` at `path` atomically, unless the same bytes are already there (GCS)."""
    if already_written(path, len(data), _md5_base64(hashlib.md5(data))):  # noqa: S324 - GCS's checksum
        return
    with write_atomically(path, tmp_dir) as handle:
        handle.write(data)


def write_concatenation(
    sources: list[str], destination: str, tmp_dir: str | None = None, expected_bytes: int | None = None
) -> tuple[int, str]:
    """Write the files `sources` one after the other into `destination`; returns (size, hex sha256). A
    retried write on GCS keeps an object of `expected_bytes` whose md5 matches the sources'."""
    if expected_bytes is not None and _is_gcs(destination):
        found = _gcs_object_checksum(destination)
        if found is not None and found[0] == expected_bytes:
            md5 = hashlib.md5()  # noqa: S324 - GCS's checksum
            num_bytes, sha256 = _copy_chunks(sources, md5.update)
            if already_written(destination, num_bytes, _md5_base64(md5)):
                return num_bytes, sha256
    with write_atomically(destination, tmp_dir=tmp_dir) as out:
        return _copy_chunks(sources, out.write)


def _copy_chunks(sources, write) -> tuple[int, str]:
    """Hands the bytes of `sources`, one after the other, a chunk at a time, to `write`; (size, hex sha256)."""
    sha256, num_bytes = hashlib.sha256(), 0
    for source in sources:
        with FileSystems.open(source) as handle:
            while chunk := handle.read(_COPY_CHUNK_BYTES):
                sha256.update(chunk)
                write(chunk)
                num_bytes += len(chunk)
    return num_bytes, sha256.hexdigest()


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path) as handle:
        return handle.read()


def copy_file(source: str, destination: str, tmp_dir: str | None = None):
    """Copy one file; the destination appears whole or not at all."""
    if not is_local(destination):
        if _is_gcs(source) and _is_gcs(destination):
            size, md5 = _gcs_object_checksum(source) or (None, None)
            if md5 is not None and already_written(destination, size, md5):
                return
        FileSystems.copy([source], [destination])
        return
    with write_atomically(destination, tmp_dir) as writer:
        _copy_chunks([source], writer.write)


def delete_files(paths: list[str]):
    """Delete files; those already gone are fine. Raises BeamIOError if one could not be deleted."""
    gcs = [path for path in paths if _is_gcs(path)]
    if gcs:
        # GcsIO.delete_batch sends up to 100 deletes per HTTP request and treats 404 as done; the filesystem
        # object carries the job's pipeline options.
        batch = FileSystems.get_filesystem(gcs[0])._gcsIO().delete_batch(gcs)  # noqa: SLF001 - no public batch delete
        failed = {path: code for path, code in batch if code is not None}
        if failed:
            raise BeamIOError("Delete operation failed", failed)
    for path in (path for path in paths if not _is_gcs(path)):
        try:
            FileSystems.delete([path])
        except BeamIOError:
            if FileSystems.exists(path):
                raise


def remove_empty_directory(directory: str):
    """Remove a local directory if it is empty (a listing of an object store has no empty directories)."""
    if is_local(directory):
        try:
            os.rmdir(directory)
        except OSError:
            pass  # not empty (another run's files), or gone


def delete_tree(directory: str):
    """Delete every file below `directory`, then the directory itself (local disk keeps empty ones)."""
    files = [metadata.path for metadata in list_files(directory)]
    if files:
        delete_files(files)
    if is_local(directory) and FileSystems.exists(directory):
        delete_files([directory])
