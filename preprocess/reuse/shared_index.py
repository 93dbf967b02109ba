"""The quick check's index, built once per job: the launcher builds it (ledger.write_index) before the
pipeline starts, and each worker process copies it instead of building it from the ledger (19 s per
million inputs per process before; a copy of its 104 bytes an input: benchmarks/RESULTS.md, issue 32).

    launcher: builds the file in a temporary directory, keeps it open, unlinks it (nothing to remove
        however the launcher ends); on Dataflow, also uploads it to --temp_location, removed after the job
    a worker process on the launcher's machine: copies /proc/<launcher pid>/fd/<fd>, once per process
    a worker elsewhere (Dataflow): copies the uploaded file, once per process
    neither readable, or not this job's (its token differs): builds it from the ledger files, as before

Each worker opens its own copy, not the launcher's file: SQLite resolves a path's symbolic links, and
/proc/<pid>/fd/<fd> links to the deleted name, which it cannot open. The copy is then opened and unlinked
as a built one was (ledger.KnownKeys).
"""

import contextlib
import dataclasses
import os
import shutil
import socket
import sqlite3
import uuid
import weakref

from apache_beam.io.filesystems import FileSystems

from preprocess.reuse import ledger


def _machine() -> str:
    """This machine, as seen from a process on it: its host name and boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


@dataclasses.dataclass(frozen=True)
class SharedIndex:
    """Where a worker finds the job's index (what KeyContentFn is given, pickled with it): the launcher's
    open file (`machine`, `pid`, `fd`), the uploaded copy (`uploaded`, or None), and the ledger files to
    build it from when neither can be read. `token` names this job's index: a copy whose token differs
    (another process holding that fd number since) is not used."""

    ledger_files: tuple[str, ...]
    token: str
    machine: str
    pid: int
    fd: int
    uploaded: str | None = None

    def copy_to(self, path: str) -> str | None:
        """Copies the index to `path` (absent); where from, or None (nothing left at `path`): build it."""
        sources = []
        if self.machine == _machine():
            sources.append(f"/proc/{self.pid}/fd/{self.fd}")
        if self.uploaded:
            sources.append(self.uploaded)
        for source in sources:
            try:
                with (
                    FileSystems.open(source, compression_type="uncompressed")
                    if "://" in source
                    else open(source, "rb") as reader,
                    open(path, "wb") as writer,
                ):
                    shutil.copyfileobj(reader, writer, 1 << 20)
                if _token(path) == self.token:
                    return source
            except (OSError, sqlite3.Error, ValueError):
                pass  # gone (the launcher ended), not readable here, or not an index: the next one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return None


def _token(path: str) -> str | None:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
        row = connection.execute("SELECT token FROM made").fetchone()
    return None if row is None else row[0]


class HeldIndex:
    """The launcher's side: the index built once, held open while the job runs (its name already
    unlinked), and its uploaded copy."""

    def __init__(self, ledger_files, upload_dir: str | None = None):
        self.token = uuid.uuid4().hex
        directory = ledger.index_directory()
        path = os.path.join(directory, "known.sqlite")
        try:
            ledger.write_index(ledger_files, path, self.token)
            self._file = open(path, "rb")  # noqa: SIM115 - held until the job ends (close)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self.uploaded = None
        if upload_dir:
            self.uploaded = FileSystems.join(upload_dir, f"quick-check-{self.token}.sqlite")
            with FileSystems.create(self.uploaded, compression_type="uncompressed") as writer:
                shutil.copyfileobj(self._file, writer, 1 << 20)
            self._file.seek(0)
        self.shared = SharedIndex(
            ledger_files=tuple(ledger_files),
            token=self.token,
            machine=_machine(),
            pid=os.getpid(),
            fd=self._file.fileno(),
            uploaded=self.uploaded,
        )

    def close(self) -> None:
        """Ends the sharing: the file is freed; its uploaded copy removed (a worker that starts later
        builds the index itself)."""
        self._file.close()
        if self.uploaded:
            with contextlib.suppress(Exception):
                FileSystems.delete([self.uploaded])
            self.uploaded = None


# The index each pipeline holds, closed when the launcher releases it, or when the pipeline is collected.
_held: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def share(pipeline, ledger_files, upload_dir: str | None = None) -> SharedIndex:
    """Builds the index of `ledger_files` for the job of `pipeline` (once, in this process); what its workers
    are given. `upload_dir`: where workers on other machines fetch it (Dataflow's --temp_location)."""
    held = HeldIndex(ledger_files, upload_dir)
    _held[pipeline] = held
    # Without a release (a graph built and dropped), the file is freed with the pipeline. The upload is not
    # removed then: a Dataflow job may still run after its launcher ends; --temp_location is its scratch.
    weakref.finalize(pipeline, held._file.close)
    return held.shared


def release(pipeline) -> None:
    """The job of `pipeline` has ended: its index is freed (see HeldIndex.close)."""
    held = _held.pop(pipeline, None)
    if held is not None:
        held.close()
