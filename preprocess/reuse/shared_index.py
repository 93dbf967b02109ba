"""The quick check's index, built once per job by the launcher (ledger.write_index), and made once per machine
by copying it: the first worker process of a machine copies it, under a lock named by the job's token, the
others of that machine open that copy. How, and why: docs/internals.md (inputs/content.py, the quick check).
"""

import contextlib
import dataclasses
import fcntl
import os
import shutil
import socket
import sqlite3
import tempfile
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

    def machine_copy(self):
        """(path, where from) of this machine's copy of the index: made by the first process to ask, under the
        job's lock (a download, once per machine, not per process), opened by the rest (where from: ledger.MACHINE).
        None: neither source can be read here; build it. Only the lock's holder writes the partial copy (a
        process killed while it copies leaves it, and frees the lock: the next holder writes it anew), and
        only a rename puts it under the name the others open."""
        path, lock_path, partial = machine_paths(self.token)
        if os.path.exists(path):
            return path, ledger.MACHINE
        with open(lock_path, "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # freed when closed, or when this process dies
            if os.path.exists(path):
                return path, ledger.MACHINE  # another process of this machine made it while this one waited
            remove_unused_copies()
            source = self.copy_to(partial)
            if source is not None:
                os.rename(partial, path)
                return path, source
        return None


_COPY_PREFIX = "quick-check-job-"


def machine_directory() -> str:
    """Where a machine's copies go: a Beam SDK container's semi-persistent directory where its boot names one
    (on Dataflow a directory of the VM that its SDK containers share, where /tmp is each container's own),
    else the temporary directory."""
    directory = os.environ.get("SEMI_PERSISTENT_DIRECTORY")
    if directory and os.path.isdir(directory) and os.access(directory, os.W_OK):
        return directory
    return tempfile.gettempdir()


def machine_paths(token: str) -> tuple[str, str, str]:
    """This machine's copy of the index of the job `token`, its lock file, and its partial copy."""
    base = os.path.join(machine_directory(), f"{_COPY_PREFIX}{token}")
    return f"{base}.sqlite", f"{base}.lock", f"{base}.partial"


def remove_unused_copies() -> None:
    """Removes the copies of other jobs on this machine that no process copies (its lock) or holds (ledger.hold) any
    more, and their partial copies: the job ended (a Dataflow VM ends with its job; a launcher on this
    machine removes its own, release). The caller's own job is skipped: it holds its lock."""
    directory = machine_directory()
    for name in os.listdir(directory):
        if not (name.startswith(_COPY_PREFIX) and name.endswith(".lock")):
            continue
        paths = machine_paths(name.removeprefix(_COPY_PREFIX).removesuffix(".lock"))
        try:
            with open(paths[1], "rb") as lock, contextlib.ExitStack() as held:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no process copying it
                if os.path.exists(paths[0]):
                    fcntl.flock(held.enter_context(open(paths[0], "rb")), fcntl.LOCK_EX | fcntl.LOCK_NB)
                for unused in paths:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(unused)
        except OSError:
            pass  # copied or read by a process now, or gone


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
        for path in machine_paths(self.token):  # the copy this machine's worker processes made
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
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
    """The job of `pipeline` has ended, or will not run: its index is freed (see HeldIndex.close)."""
    held = _held.pop(pipeline, None)
    if held is not None:
        held.close()


def upload_of(pipeline) -> str | None:
    """Where the index of `pipeline`'s job was uploaded for its workers (None: nowhere, or released)."""
    held = _held.get(pipeline)
    return None if held is None else held.uploaded
