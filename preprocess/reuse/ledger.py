"""A version's ledger: one JSON line per image it wrote (and per input whose bytes failed), what the next
version reuses without decoding; and the quick check's index of it (KnownKeys). Its lines, field by field:
docs/internals.md, `preprocess/reuse/`.
"""

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import sqlite3
import tempfile
import threading

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from preprocess import errors

LEDGER = "ledger"
# Failures of the bytes themselves (not of the path, nor of a size that may have changed since): the same
# content fails the same way under the same --max-pixels, so a re-run carries them over.
# Where from, for a process that opened the machine's copy of the index another process of it made.
MACHINE = "this machine's copy"

CARRIED_FAILURES = (errors.NOT_AN_IMAGE, errors.TRUNCATED, errors.DECODE_ERROR, errors.TOO_MANY_PIXELS)


def new_entry(key, sha256, uri, label, split, moments: list, signature, shard, facts: dict) -> dict:
    """The ledger entry of an image written: its fields, its moments (floats), its near-duplicate signature
    (None or "" without one), the shard that holds its record (or none), its input's facts (`facts_of`).
    `entry_of` builds one from an example, stage.CarriedImage from the previous entry (no round trips)."""
    entry = {"key": key, "sha256": sha256, "uri": uri, "label": label, "split": split, "moments": moments}
    if signature not in (None, ""):
        entry["signature"] = int(signature)  # text after a spill (routing.py)
    if shard:
        entry["shard"] = shard
    entry.update(facts)
    return entry


def entry_of(example: dict) -> dict:
    """The ledger entry of an example written (decoded, or carried over: both carry the same keys)."""
    return new_entry(
        example["key"],
        example["sha256"],
        example["uri"],
        example["label"],
        example["split"],
        np.frombuffer(example["moments"], dtype="<f8").tolist(),
        signature=example.get("signature"),
        shard=example.get("shard"),
        facts=json.loads(example["input"]) if example.get("input") else {},
    )


def facts_of(image, source_size=None) -> dict:
    """What the ledger keeps of an input beside its key: a UniqueInput's size and mtime, the source image's
    size (width, height)."""
    facts = {}
    if getattr(image, "mtime_ns", None) is not None and image.size is not None:
        facts["size"], facts["mtime_ns"] = int(image.size), int(image.mtime_ns)
    if source_size is not None:
        facts["source_size"] = [int(side) for side in source_size]
    return facts


def input_facts(image, source_size=None) -> str:
    """`facts_of` as the example's `input` text: a text column crosses the near-duplicate spill as it is."""
    return json.dumps(facts_of(image, source_size), sort_keys=True)


def entry_bytes(entry: dict) -> bytes:
    """An entry as its ledger line."""
    return json.dumps(entry, sort_keys=True).encode("utf-8")


def entry_line(example: dict) -> bytes:
    return entry_bytes(entry_of(example))


def moments_bytes(entry: dict) -> bytes:
    """An entry's moments as the analysis takes them (transform.IMAGE_MOMENTS): exact, float64 round-trips JSON."""
    return np.asarray(entry["moments"], dtype="<f8").tobytes()


def decoder_version() -> str:
    """What decides whether given bytes decode: Pillow's version and the project's (decode/image.py). A
    failure recorded under another one (or none, in ledgers from before) is read again."""
    import PIL  # noqa: PLC0415 - the workers' decoder, not needed to read a ledger

    from preprocess.decode import image  # noqa: PLC0415

    return f"Pillow {PIL.__version__}; decode {image.DECODE_VERSION}"


def failure_entry(error) -> list[dict]:
    """The ledger entry of a failed input that a re-run carries over (an errors.ErrorRecord with its input,
    of a reason in CARRIED_FAILURES), else none."""
    image = error.input
    if image is None or image.key is None or error.reason not in CARRIED_FAILURES:
        return []
    entry = {"key": image.key, "uri": image.uri, "label": image.label}
    entry["failed"] = {"reason": error.reason, "detail": error.detail, "decoder": decoder_version()}
    entry.update(facts_of(image))
    return [entry]


def is_failure(entry: dict) -> bool:
    return "failed" in entry


def read_all_entries(path: str):
    """Every entry of one ledger file, failures included."""
    with FileSystems.open(path) as handle:
        for line in handle:  # a line at a time: a ledger file holds up to every input's line
            if line.strip():
                yield json.loads(line)


def read_entries(path: str):
    """Every image entry of one ledger file (the images the version wrote)."""
    return (entry for entry in read_all_entries(path) if not is_failure(entry))


class ReadLedger(beam.PTransform):
    """PBegin -> (content key, entry) of every image (and failure) the ledger files list, read in parallel."""

    def __init__(self, paths):
        super().__init__()
        self._paths = list(paths)

    def expand(self, pbegin):
        return (
            pbegin
            | "Files" >> beam.Create(self._paths)
            | "Spread" >> beam.Reshuffle()
            | "Entries" >> beam.FlatMap(read_all_entries)
            | "ByKey" >> beam.Map(lambda entry: (entry["key"], entry))
        )


def write_index(paths, path: str, token: str = "") -> None:
    """Builds the quick check's index of the ledger files `paths` at `path`: a SQLite table {uri: (size,
    mtime_ns, content key)} of every entry that recorded its file's size and mtime, and `token` (which
    shared copy it is: shared_index.py)."""
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.executescript(
            "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;"
            "CREATE TABLE known (uri TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, key BLOB) WITHOUT ROWID;"
            "CREATE TABLE made (token TEXT);"
        )
        connection.execute("INSERT INTO made VALUES (?)", (token,))
        for ledger in paths:
            rows = _known_rows(read_all_entries(ledger))
            while batch := list(itertools.islice(rows, 10_000)):
                # A URI the ledgers list twice keeps its last entry, as a dict's update did.
                connection.executemany("INSERT OR REPLACE INTO known VALUES (?, ?, ?, ?)", batch)
        connection.commit()


def index_directory() -> str:
    """A new temporary directory for one index file, named by this process (`quick-check-<pid>-...`). A
    process killed while it writes the file (a build or a copy, before the file is open and unlinked) leaves
    it behind: the next process to make one removes those of processes that no longer run."""
    scratch = tempfile.gettempdir()
    for name in os.listdir(scratch):
        parts = name.split("-")
        if name.startswith("quick-check-") and len(parts) > 3 and parts[2].isdigit():
            if not _running(int(parts[2])):
                shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"quick-check-{os.getpid()}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


class KnownKeys:
    """{uri: (size, mtime_ns, content key)} of every entry of the ledger files that recorded its file's size
    and mtime (what the quick check compares a re-run's listing with, inputs/content.py), as an on-disk
    index: a SQLite table in a temporary file of this process, unlinked once open, read by key. Not a dict: a
    worker holds nothing that grows with the corpus (the dict took 384 MiB of RSS per million files; this
    index 3 MiB and its page cache, about 104 bytes a file on disk: benchmarks/RESULTS.md, issue 32).

    `shared`: the job's index, built once by the launcher (shared_index.SharedIndex): this process opens its
    machine's copy of it (made by the first process of the machine; `copied_from` says from where) instead of
    building it from `paths`, unless it cannot be read here.
    """

    # SQLite's page cache per connection (KiB): the index's pages beyond it are the OS's file cache.
    CACHE_KIB = 2048

    def __init__(self, paths, shared=None):
        self._lock = threading.Lock()
        self._held = self._connection = None
        self.copied_from = None
        if shared is not None and self._open_machine_copy(shared):
            return
        directory = index_directory()
        path = os.path.join(directory, "known.sqlite")
        try:
            write_index(paths, path)
            # The file is unlinked as soon as it is open: the OS frees it when the process ends, however it
            # ends (a Beam worker subprocess exits without running atexit hooks, which left indexes in /tmp).
            self._open(path)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _open(self, path: str, immutable: bool = False):
        # One read-only connection, shared by the runner's threads under a lock.
        self.bytes_on_disk = os.path.getsize(path)
        mode = "mode=ro&immutable=1" if immutable else "mode=ro"
        self._connection = sqlite3.connect(f"file:{path}?{mode}", uri=True, check_same_thread=False)
        self._connection.execute(f"PRAGMA cache_size = -{self.CACHE_KIB}")

    def _open_machine_copy(self, shared) -> bool:
        """Opens this machine's copy of the job's index (shared_index.py), made by this process or another of
        this machine, and holds it; False when there is none to be had (then it is built)."""
        made = shared.machine_copy()
        if made is None:
            return False
        path, self.copied_from = made
        try:
            self._held = hold(path)
            # Never written again once renamed into place: SQLite need not lock it.
            self._open(path, immutable=True)
        except (OSError, sqlite3.Error):
            # Removed meanwhile (its job had ended: remove_unused_copies); build it.
            self.remove()
            self._held, self.copied_from = None, None
            return False
        return True

    @property
    def built(self) -> bool:
        """Whether this process built it from the ledger files (not copied from the launcher's)."""
        return self.copied_from is None

    @property
    def outcome(self) -> str:
        """How this process came by it, as the job's metrics count it: built from the ledger, copied (this
        machine's copy, made by this process), or shared (that copy, made by another process)."""
        if self.copied_from is None:
            return "built"
        return "shared" if self.copied_from == MACHINE else "copied"

    def get(self, uri: str):
        """(size, mtime_ns, content key) recorded for `uri`, or None."""
        with self._lock:
            row = self._connection.execute(
                "SELECT size, mtime_ns, key FROM known WHERE uri = ?", (uri,)
            ).fetchone()
        return None if row is None else (row[0], row[1], row[2].hex())

    def remove(self):
        if self._connection is not None:
            self._connection.close()
        if self._held is not None:
            self._held.close()


def _known_rows(entries):
    for entry in entries:
        if entry.get("mtime_ns") is not None and entry.get("size") is not None:
            yield entry["uri"], entry["size"], entry["mtime_ns"], bytes.fromhex(entry["key"])


_known_lock = threading.Lock()
_known: dict = {}


def known_keys(source) -> KnownKeys:
    """The KnownKeys of `source`, once per process: the ledger files (a tuple of paths), or the job's shared
    index (a shared_index.SharedIndex, copied from the launcher's once per machine). The last one asked for is
    kept; its connection is closed when another replaces it. Counted in the job's metrics, per process, not per
    bundle: `quick_check_index_built`, `_copied` (made its machine's copy), `_shared` (opened that copy)."""
    paths, shared = (source.ledger_files, source) if hasattr(source, "copy_to") else (tuple(source), None)
    with _known_lock:  # the runner's threads share one index, built by the first to ask
        if source not in _known:
            for index in _known.values():
                index.remove()
            _known.clear()
            index = _known[source] = KnownKeys(paths, shared)
            Metrics.counter("preprocess", f"quick_check_index_{index.outcome}").inc()
        return _known[source]


def hold(path: str):
    """`path` opened and held with a shared lock while this process reads the copy: remove_unused_copies
    leaves it alone."""
    handle = open(path, "rb")  # noqa: SIM115 - held as long as the index is open (KnownKeys.remove)
    fcntl.flock(handle, fcntl.LOCK_SH)
    return handle
