"""The few object operations publishing and garbage collection need, on local disk and GCS alike."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import urllib.parse
import uuid

from preprocess import filesystem

NEVER = float("inf")
_GCS_BATCH = 100
_TMP_DIR = "staging/.tmp"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StoredObject:
    name: str  # relative to the dataset directory
    size: int
    updated: float  # seconds since the epoch
    deletable_at: float = 0.0  # when the bucket lets it be deleted (0: now; NEVER: held)


@dataclasses.dataclass
class Listing:
    objects: list[StoredObject]
    prefixes: list[str]  # with `delimiter`: the "folders" one level down, each ending in '/'
    truncated: bool = False  # `max_results` objects were listed and there are more


def open_store(root: str, tmp_dir: str = _TMP_DIR):
    """The store of dataset directory `root` (a local path or gs://bucket/prefix). `tmp_dir` (local disk,
    relative to `root`): where files are written before they are linked or renamed into place."""
    root = root.rstrip("/")
    if root.startswith("gs://"):
        return GcsStore(root)
    if filesystem.is_local(root):
        return LocalStore(root, tmp_dir)
    raise ValueError(f"{root}: publishing needs local disk or gs://")


# Each call removes the shared temporary folder when it leaves it empty, so a concurrent call (another
# publisher, the collector, a job record) can lose that folder, or the target's, between making it and
# writing into it; it makes them again, a few times at most.
_FOLDER_RACE_ATTEMPTS = 20


def _make_folder(path: str):
    """os.makedirs, whose FileExistsError when another call removes the folder at the same instant is
    FileNotFoundError here: the caller's cue to try again."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError as exc:
        raise FileNotFoundError(str(exc)) from exc


class LocalStore:
    def __init__(self, root: str, tmp_dir: str = _TMP_DIR):
        self.root = root
        self.tmp_dir = tmp_dir
        self.requests = 0

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _retried(self, name: str, what: str, attempt):
        """`attempt()`, again while another call removes a folder on its way (FileNotFoundError, or
        FileExistsError when makedirs lost its folder at once; see _FOLDER_RACE_ATTEMPTS)."""
        self.requests += 1
        for _ in range(_FOLDER_RACE_ATTEMPTS):
            with contextlib.suppress(FileNotFoundError, FileExistsError):
                return attempt()
        raise OSError(f"{self._path(name)}: its folders kept disappearing while it was {what}")

    def create_if_absent(self, name: str, data: bytes) -> bool:
        return self._retried(name, "created", lambda: self._create_if_absent_once(name, data))

    def _create_if_absent_once(self, name: str, data: bytes) -> bool:
        tmp_dir = self._path(self.tmp_dir)
        _make_folder(tmp_dir)
        temporary = os.path.join(tmp_dir, f"{os.path.basename(name)}.{uuid.uuid4().hex}")
        try:
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _make_folder(os.path.dirname(self._path(name)))
            os.link(temporary, self._path(name))
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            self._remove_empty_parents(f"{self.tmp_dir}/-")

    def write(self, name: str, data: bytes):
        """Replace `name` with `data` atomically (the copy in dataset.json; the log never needs it)."""

        def attempt():
            filesystem.write_bytes(self._path(name), data, tmp_dir=self._path(self.tmp_dir))
            self._remove_empty_parents(f"{self.tmp_dir}/-")

        self._retried(name, "written", attempt)

    def read(self, name: str) -> bytes | None:
        self.requests += 1
        try:
            with open(self._path(name), "rb") as handle:
                return handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def exists(self, name: str) -> bool:
        self.requests += 1
        return os.path.exists(self._path(name))

    def list(self, prefix: str, delimiter: bool = False, max_results: int | None = None) -> Listing:
        """The objects whose names start with `prefix` (a directory, ending in '/', or any name prefix)."""
        self.requests += 1
        directory, _, start = prefix.rpartition("/")
        directory = self._path(directory) if directory else self.root
        objects, prefixes = [], []
        try:
            entries = sorted(
                (entry for entry in os.scandir(directory) if entry.name.startswith(start)),
                key=lambda entry: entry.name,
            )
        except (FileNotFoundError, NotADirectoryError):
            return Listing([], [])
        base = prefix[: len(prefix) - len(start)]
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if delimiter:
                    prefixes.append(f"{base}{entry.name}/")
                    continue
                for top, dirs, names in os.walk(entry.path):
                    dirs.sort()
                    for name in sorted(names):
                        self._append(objects, os.path.join(top, name))
            else:
                self._append(objects, entry.path)
        truncated = max_results is not None and len(objects) > max_results
        return Listing(objects[:max_results] if truncated else objects, prefixes, truncated)

    def _append(self, objects: list, path: str):
        with contextlib.suppress(FileNotFoundError):
            stat = os.stat(path)
            objects.append(StoredObject(os.path.relpath(path, self.root), stat.st_size, stat.st_mtime))

    def delete(self, names: list[str]) -> dict[str, str]:
        refused = {}
        for name in names:
            self.requests += 1
            try:
                self._delete_one(name)
            except OSError as exc:
                refused[name] = str(exc)
        return refused

    def _delete_one(self, name: str):
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(name))
        self._remove_empty_parents(name)

    def _remove_empty_parents(self, name: str):
        parent = os.path.dirname(name)
        while parent:
            try:
                os.rmdir(self._path(parent))
            except OSError:
                return
            parent = os.path.dirname(parent)

    def delete_folder(self, prefix: str) -> bool:
        """Remove the directory `prefix` if it holds no file, with the empty directories in it (tf.Transform
        leaves some) and its parents that it leaves empty; True if it is gone."""
        top = self._path(prefix.rstrip("/"))
        for root, _, names in os.walk(top, topdown=False):
            if names:
                return False
            with contextlib.suppress(OSError):
                os.rmdir(root)
        self._remove_empty_parents(prefix.rstrip("/"))
        return not os.path.exists(top)


class GcsStore:
    def __init__(self, root: str):
        from apache_beam.io.gcp.gcsio import parse_gcs_path  # noqa: PLC0415 - GCS only

        self.root = root
        bucket, self._prefix = parse_gcs_path(root + "/")
        self._gcs = filesystem.gcs_io(root)
        self.bucket = self._gcs.client.bucket(bucket)
        self.requests = 0
        self._hierarchical = None

    def _name(self, name: str) -> str:
        return self._prefix + name

    def create_if_absent(self, name: str, data: bytes) -> bool:
        from google.api_core import exceptions  # noqa: PLC0415 - GCS only

        self.requests += 1
        try:
            self.bucket.blob(self._name(name)).upload_from_string(
                data, content_type="application/json", if_generation_match=0
            )
        except exceptions.PreconditionFailed:
            return False
        except exceptions.Forbidden:
            # A bucket that keeps young objects may answer an upload onto one 403 (retentionPolicyNotMet)
            # rather than 412: the name is taken all the same.
            if self.exists(name):
                return False
            raise
        return True

    def write(self, name: str, data: bytes):
        self.requests += 1
        self.bucket.blob(self._name(name)).upload_from_string(data, content_type="application/json")

    def read(self, name: str) -> bytes | None:
        from google.api_core import exceptions  # noqa: PLC0415 - GCS only

        self.requests += 1
        try:
            return self.bucket.blob(self._name(name)).download_as_bytes()
        except exceptions.NotFound:
            return None

    def exists(self, name: str) -> bool:
        self.requests += 1
        return self.bucket.get_blob(self._name(name)) is not None

    def list(self, prefix: str, delimiter: bool = False, max_results: int | None = None) -> Listing:
        iterator = self.bucket.client.list_blobs(
            self.bucket,
            prefix=self._name(prefix),
            delimiter="/" if delimiter else None,
            max_results=None if max_results is None else max_results + 1,
            page_size=1000,
        )
        objects, prefixes = [], []
        for page in iterator.pages:
            self.requests += 1
            for blob in page:
                objects.append(self._stored(blob))
            prefixes.extend(page.prefixes)
        truncated = max_results is not None and len(objects) > max_results
        return Listing(
            objects[:max_results] if truncated else objects,
            sorted(name[len(self._prefix) :] for name in prefixes),
            truncated,
        )

    def _stored(self, blob) -> StoredObject:
        deletable_at = 0.0
        if blob.event_based_hold or blob.temporary_hold:
            deletable_at = NEVER
        elif blob.retention_expiration_time is not None:
            deletable_at = blob.retention_expiration_time.timestamp()
        updated = (
            blob.updated or blob.time_created or datetime.datetime.now(datetime.timezone.utc)
        ).timestamp()
        return StoredObject(blob.name[len(self._prefix) :], int(blob.size or 0), updated, deletable_at)

    def delete(self, names: list[str]) -> dict[str, str]:
        refused = {}
        paths = [f"gs://{self.bucket.name}/{self._name(name)}" for name in names]
        strip = len(f"gs://{self.bucket.name}/{self._prefix}")
        for start in range(0, len(paths), _GCS_BATCH):
            self.requests += 1
            batch = paths[start : start + _GCS_BATCH]
            try:
                results = self._gcs.delete_batch(batch)
            except Exception as exc:  # noqa: BLE001 - the batch as a whole refused: each of its objects stays
                results = [(path, f"{type(exc).__name__}: {exc}"[:200]) for path in batch]
            for path, code in results:
                if code is not None:
                    refused[path[strip:]] = code if isinstance(code, str) else f"HTTP {code}"
        return refused

    def hierarchical_namespace(self) -> bool:
        """Whether the bucket has hierarchical namespace (`storageLayout`: needs storage.objects.list only)."""
        if self._hierarchical is None:
            self.requests += 1
            try:
                layout = self.bucket.client._connection.api_request(  # noqa: SLF001 - no public call
                    method="GET", path=f"/b/{self.bucket.name}/storageLayout"
                )
            except Exception:  # noqa: BLE001 - an emulator or a refusal: treated as a flat bucket
                layout = {}
            self._hierarchical = bool((layout.get("hierarchicalNamespace") or {}).get("enabled"))
        return self._hierarchical

    def delete_folder(self, prefix: str) -> bool:
        """Delete the folder `prefix` (ending in '/') and the folders below it, all empty, on a bucket with
        hierarchical namespace; True if they are gone. A no-op elsewhere (False)."""
        from google.api_core import exceptions  # noqa: PLC0415 - GCS only

        if not self.hierarchical_namespace():
            return False
        connection = self.bucket.client._connection  # noqa: SLF001 - no public call for folders
        self.requests += 1
        listed = connection.api_request(
            method="GET", path=f"/b/{self.bucket.name}/folders", query_params={"prefix": self._name(prefix)}
        )
        folders = {item["name"] for item in listed.get("items", [])} | {self._name(prefix)}
        for folder in sorted(folders, key=lambda name: (-name.count("/"), name)):
            self.requests += 1
            try:
                connection.api_request(
                    method="DELETE",
                    path=f"/b/{self.bucket.name}/folders/{urllib.parse.quote(folder, safe='')}",
                )
            except exceptions.NotFound:
                continue
            except exceptions.GoogleAPICallError as exc:
                log.info("folder gs://%s/%s stays for now: %s", self.bucket.name, folder, exc)
                return False  # not empty (another writer), or refused: a later call tries again
        return True
