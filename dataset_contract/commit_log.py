"""The commit log of a dataset directory, and the one reader of the published dataset."""

import dataclasses
import json
import logging
import posixpath
import re
from typing import Protocol

from dataset_contract import manifest as manifest_lib

MANIFESTS_DIR = manifest_lib.MANIFESTS_DIR
HINT_FILE = manifest_lib.MANIFEST_FILE
SEQUENCE_DIGITS = 20
_COMMIT = re.compile(r"(\d{20})\.json")
_FORMAT3_COMMIT = re.compile(r"(\d{12})-[^/]+\.json")
# A head listed and then gone when read (a garbage collection in between): list again this many times.
_READ_ATTEMPTS = 3

log = logging.getLogger(__name__)


class Files(Protocol):
    """The file access a reader brings: local paths and gs:// alike."""

    def list_names(self, directory: str) -> list[str]:
        """The base names of the files directly in `directory` ([] if there is none)."""

    def read(self, path: str) -> bytes | None:
        """The bytes of `path`, or None if it does not exist."""


def commit_name(sequence: int) -> str:
    """`manifests/00000000000000000042.json`, relative to the dataset directory."""
    return posixpath.join(MANIFESTS_DIR, f"{sequence:0{SEQUENCE_DIGITS}d}.json")


def commit_sequence(name: str) -> int | None:
    """The sequence of a commit's name (this layout's or format 3's), or None if it is not one."""
    base = posixpath.basename(name)
    match = _COMMIT.fullmatch(base) or _FORMAT3_COMMIT.fullmatch(base)
    return int(match.group(1)) if match else None


def head_of(names) -> tuple[int, str] | None:
    """Of the names listed in `manifests/`, the head: (sequence, name) with the highest sequence."""
    commits = [(commit_sequence(name), name) for name in names]
    commits = [(sequence, name) for sequence, name in commits if sequence is not None]
    return max(commits) if commits else None


# Whether a parsed `dataset.json` is format 3's pointer to the log rather than a manifest.
is_hint = manifest_lib.is_pointer


@dataclasses.dataclass(frozen=True)
class Published:
    """The published manifest: its exact bytes, where they were read, and its sequence (0: older layouts)."""

    data: bytes
    path: str
    sequence: int

    def manifest(self) -> dict | None:
        """The bytes parsed (None if they are not a JSON object); not checked."""
        try:
            document = json.loads(self.data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
        return document if isinstance(document, dict) else None


def read_head(data_dir: str, files: Files) -> Published | None:
    """The head of the log (one listing, one read), or None if `manifests/` holds no commit."""
    for _ in range(_READ_ATTEMPTS):
        commits = list_commits(data_dir, files)
        if not commits:
            return None
        head = read_commit(commits[-1][1], commits[-1][0], files)
        if head is not None:
            return head
    directory = manifest_lib.join(data_dir, MANIFESTS_DIR)
    raise manifest_lib.ManifestError(
        f"{directory}/: its newest commit vanished while it was read, three times"
    )


def list_commits(data_dir: str, files: Files) -> list[tuple[int, str]]:
    """Every commit of `manifests/` (one listing), oldest first: (sequence, path); [] when it holds none (a
    listed one can be gone when read: `read_commit` is then None)."""
    directory = manifest_lib.join(data_dir, MANIFESTS_DIR)
    commits = [(commit_sequence(name), name) for name in files.list_names(directory)]
    return sorted(
        (sequence, manifest_lib.join(directory, posixpath.basename(name)))
        for sequence, name in commits
        if sequence is not None
    )


def read_commit(path: str, sequence: int, files: Files) -> Published | None:
    """The commit at `path` (a `list_commits` entry), or None if it is gone."""
    data = files.read(path)
    return None if data is None else Published(data, path, sequence)


def read_published(data_dir: str, files: Files) -> Published | None:
    """The published manifest of `data_dir` (the head of `manifests/`, else a format 1 or 2 `dataset.json`),
    or None; ManifestError if `dataset.json` is format 3's pointer to a log that holds no commit."""
    head = read_head(data_dir, files)
    if head is not None:
        return head
    path = manifest_lib.join(data_dir, HINT_FILE)
    data = files.read(path)
    if data is None:
        return None
    published = Published(data, path, 0)
    if is_hint(published.manifest()):
        raise manifest_lib.ManifestError(
            f"{path} points to {manifest_lib.join(data_dir, MANIFESTS_DIR)}/, which holds no manifest: the "
            "first publish into this directory has not finished"
        )
    return published


def read_published_manifest(data_dir: str, files: Files) -> dict | None:
    """The published manifest parsed, or None: there is none, or it is not readable as one (logged)."""
    try:
        published = read_published(data_dir, files)
    except manifest_lib.ManifestError as exc:
        log.warning("%s", exc)
        return None
    return published.manifest() if published is not None else None


class TensorFlowFiles:
    """`Files` through `tf.io.gfile` (stage 2, verify, inspect)."""

    def __init__(self):
        import tensorflow as tf  # noqa: PLC0415 - only for readers that have it

        self._gfile = tf.io.gfile
        self._errors = tf.errors

    def list_names(self, directory: str) -> list[str]:
        try:
            return [name.rstrip("/") for name in self._gfile.listdir(directory) if not name.endswith("/")]
        except self._errors.NotFoundError:
            return []

    def read(self, path: str) -> bytes | None:
        try:
            with self._gfile.GFile(path, "rb") as handle:
                return handle.read()
        except self._errors.NotFoundError:
            return None
