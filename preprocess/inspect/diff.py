"""What changed between two published versions of a dataset directory (`python -m preprocess.inspect DIR
--diff [RUN] [--limit N]`): images matched by sha256, as each version's ledger (or shards) says them."""

import concurrent.futures
import dataclasses
import heapq
import sys
from typing import NamedTuple

import tensorflow as tf

from dataset_contract import commit_log, verification
from dataset_contract import manifest as manifest_lib
from preprocess.inspect.summary import format_bytes, plural
from preprocess.reuse import ledger as ledger_lib

DEFAULT_LIMIT = 20
# Files read at once: reads of GCS objects overlap; the images of one file at a time per thread in memory.
_READ_THREADS = 8
# Versions named when a RUN is not found.
_VERSIONS_NAMED = 5


class DiffRefused(ValueError):
    """The comparison asked for cannot be made (one version, an unknown RUN): the user's to fix."""


class VersionUnreadable(RuntimeError):
    """A version's files cannot be read (garbage collection removed them, or they are damaged)."""


@dataclasses.dataclass(frozen=True)
class Version:
    """One commit of the log: its sequence and its checked manifest."""

    sequence: int
    manifest: dict

    @property
    def run_id(self) -> str:
        return manifest_lib.manifest_run_id(self.manifest) or "?"

    def describe(self) -> str:
        created = self.manifest.get("created_at")
        return f"version {self.sequence} (run {self.run_id}" + (f", {created})" if created else ")")


class Image(NamedTuple):
    """What one version says of an image."""

    uri: str
    class_name: str
    split: str


class Change(NamedTuple):
    """An image that was added, removed, relabelled or moved: its file, and its class and split before and
    after (None on the side where it is absent)."""

    uri: str
    before: Image | None
    after: Image | None


@dataclasses.dataclass(frozen=True)
class Category:
    """One kind of change: how many, and the first `limit` by URI."""

    count: int
    first: list[Change]


@dataclasses.dataclass(frozen=True)
class VersionDiff:
    old: Version
    new: Version
    old_images: int
    new_images: int
    added: Category
    removed: Category
    relabelled: Category
    moved: Category
    ledger_files_read: int
    shards_read: int
    bytes_read: int

    @property
    def in_both(self) -> int:
        return self.new_images - self.added.count


def _read_version(path: str, sequence: int, files) -> Version | None:
    published = commit_log.read_commit(path, sequence, files)
    if published is None:
        return None
    manifest = published.manifest()
    if manifest is None:
        raise VersionUnreadable(f"{path}: not a JSON object")
    try:
        manifest_lib.check_manifest(manifest, where=path)
    except manifest_lib.ManifestError as exc:
        raise VersionUnreadable(str(exc)) from exc
    return Version(sequence, manifest)


def _older_versions(commits: list[tuple[int, str]], files):
    """The versions of `commits` (list_commits entries), newest first, each read when reached; those
    gone meanwhile (garbage collection) passed over."""
    for sequence, path in reversed(commits):
        version = _read_version(path, sequence, files)
        if version is not None:
            yield version


def choose_versions(data_dir: str, run: str | None = None) -> tuple[Version, Version]:
    """(older, newest) of `data_dir`'s commit log: the version before the newest, or the one `run` names
    (a run id, its `runs/<id>` directory or a version number). DiffRefused when there is no such pair."""
    files = commit_log.TensorFlowFiles()
    commits = commit_log.list_commits(data_dir, files)
    newest = None
    while commits and newest is None:  # a commit removed between the listing and the read: the one below
        newest = _read_version(commits[-1][1], commits[-1][0], files)
        if newest is None:
            commits.pop()
    if newest is None or len(commits) < 2:
        held = (
            f"no commit in {manifest_lib.MANIFESTS_DIR}/ (written before the commit log, it holds one version)"
            if newest is None
            else f"one published version in its commit log ({manifest_lib.MANIFESTS_DIR}/)"
        )
        raise DiffRefused(
            f"{data_dir} holds {held}: nothing to compare. "
            f"Each run of `python -m preprocess --output {data_dir}` publishes the next version"
        )
    older = commits[:-1]
    if run is None:
        # The version the newest was built from: the run its manifest names (`run.built_from`, an
        # incremental run's lineage) while the log still holds it, else the commit before it.
        built_from = (newest.manifest.get("run") or {}).get("built_from")
        previous = None
        for version in _older_versions(older, files):
            previous = previous or version
            if not built_from or version.run_id == built_from:
                return version, newest
        if previous is not None:
            return previous, newest
        raise DiffRefused(f"{data_dir}: the versions before version {newest.sequence} were removed meanwhile")
    wanted = run.strip().rstrip("/").rsplit("/", 1)[-1]  # a run id, or its directory (`runs/<id>/`)
    if wanted in (newest.run_id, str(newest.sequence)):
        raise DiffRefused(
            f"{run} is the newest version ({newest.describe()}): give an older run to compare it with, "
            "or leave RUN out for the version before it"
        )
    seen = []
    for version in _older_versions(older, files):
        if wanted in (version.run_id, str(version.sequence)):
            return version, newest
        seen.append(f"{version.sequence} ({version.run_id})")
    listed = ", ".join(seen[:_VERSIONS_NAMED]) + (", ..." if len(seen) > _VERSIONS_NAMED else "")
    raise DiffRefused(
        f"no version of {data_dir} was built by run {run!r}. Older versions in its commit log, newest first: "
        f"{listed}; give a run id or a version number"
    )


class Source(NamedTuple):
    """One file a version's images are read from: a file of its ledger, or one of its shards."""

    path: str
    num_bytes: int
    split: str | None  # the shard's split; None for a ledger file, whose lines each name theirs


def sources(data_dir: str, manifest: dict) -> list[Source]:
    """The files the diff reads of a version: its ledger when the manifest lists one (a short JSON line per
    image, a fraction of the shards' bytes), else its shards (a version written before ledgers, issue 32)."""
    ledger = manifest.get("ledger_files") or []
    if ledger:
        return [Source(manifest_lib.join(data_dir, e["path"]), int(e["num_bytes"]), None) for e in ledger]
    return [
        Source(manifest_lib.join(data_dir, shard["path"]), int(shard.get("num_bytes", 0)), split)
        for split, info in sorted(manifest["splits"].items())
        for shard in info["shards"]
    ]


def read_cost(data_dir: str, versions: tuple[Version, Version]) -> tuple[int, int, int]:
    """(ledger files, shards, bytes) that comparing the two versions reads (from their manifests)."""
    read = [source for version in versions for source in sources(data_dir, version.manifest)]
    ledgers = sum(source.split is None for source in read)
    return ledgers, len(read) - ledgers, sum(source.num_bytes for source in read)


def _rows(source: Source):
    """(sha256, uri, class name, split) of every image of one file of a version."""
    if source.split is None:
        for entry in ledger_lib.read_entries(source.path):
            yield entry["sha256"], entry["uri"], entry["label"], entry["split"]
    else:
        for sha256, uri, class_name in verification.read_identities(source.path):
            yield sha256, uri, class_name, source.split


def read_images(data_dir: str, version: Version) -> dict[str, Image]:
    """sha256 -> Image of every image of the version: from its ledger, else its shards' records (the image
    itself is not parsed)."""

    def read(source: Source):
        try:
            return list(_rows(source))
        except (tf.errors.OpError, verification.RecordError, OSError, ValueError, KeyError) as exc:
            # A ledger read through Beam's FileSystems raises an OSError (BeamIOError) where TensorFlow's
            # says NotFoundError: whether the file is there says which it was.
            gone = isinstance(exc, tf.errors.NotFoundError) or (
                isinstance(exc, OSError) and not tf.io.gfile.exists(source.path)
            )
            raise VersionUnreadable(
                f"{version.describe()}: {source.path}: "
                + (
                    "not found (garbage collection removes a superseded run's files once its retention ends)"
                    if gone
                    else (str(exc).splitlines() or [repr(exc)])[0]
                )
            ) from exc

    images = {}
    with concurrent.futures.ThreadPoolExecutor(_READ_THREADS) as pool:
        for rows in pool.map(read, sources(data_dir, version.manifest)):
            for sha256, uri, class_name, split in rows:
                # One string per class and split, not per image.
                images[sha256] = Image(uri, sys.intern(class_name), sys.intern(split))
    return images


def _category(changes, limit: int) -> Category:
    changes = list(changes)
    return Category(len(changes), heapq.nsmallest(limit, changes))


def diff_images(old: dict[str, Image], new: dict[str, Image], limit: int):
    """(added, removed, relabelled, moved) Categories between two versions' images. An image both
    relabelled and moved is in both."""
    both = [(old[key], image) for key, image in new.items() if key in old]
    return (
        _category((Change(image.uri, None, image) for key, image in new.items() if key not in old), limit),
        _category((Change(image.uri, image, None) for key, image in old.items() if key not in new), limit),
        *(
            _category((Change(a.uri, b, a) for b, a in both if getattr(b, field) != getattr(a, field)), limit)
            for field in ("class_name", "split")
        ),
    )


def diff_versions(data_dir: str, old: Version, new: Version, limit: int = DEFAULT_LIMIT) -> VersionDiff:
    """Read both versions' ledgers (or shards, for a version without one) and say what changed."""
    old_images, new_images = read_images(data_dir, old), read_images(data_dir, new)
    return VersionDiff(
        old,
        new,
        len(old_images),
        len(new_images),
        *diff_images(old_images, new_images, limit),
        *read_cost(data_dir, (old, new)),
    )


def _was(change: Change) -> str:
    """The file's earlier name, when it changed (a file moved to another class folder)."""
    return f" (was {change.before.uri})" if change.before.uri != change.uri else ""


# (title, attribute, what a line says after the URI)
CATEGORIES = (
    ("added", "added", lambda c: f"{c.after.class_name}, {c.after.split}"),
    ("removed", "removed", lambda c: f"{c.before.class_name}, {c.before.split}"),
    ("relabelled", "relabelled", lambda c: f"{c.before.class_name} -> {c.after.class_name}{_was(c)}"),
    ("moved to another split", "moved", lambda c: f"{c.before.split} -> {c.after.split}{_was(c)}"),
)


def describe_files(ledger_files: int, shards: int) -> str:
    """Files a diff reads, for a person: "2 ledger files", "9 shards", or both."""
    parts = [plural(ledger_files, "ledger file")] if ledger_files else []
    parts += [plural(shards, "shard")] if shards or not parts else []
    return " and ".join(parts)


def format_diff(diff: VersionDiff) -> str:
    """The text `--diff` prints: counts, then up to the limit of files of each kind of change."""
    lines = [
        f"from {diff.old.describe()}",
        f"  to {diff.new.describe()}",
        f"images: {diff.old_images} -> {diff.new_images} ({diff.in_both} in both); inputs that failed: "
        + " -> ".join(
            str(version.manifest["inputs"].get("num_failed", 0)) for version in (diff.old, diff.new)
        ),
        ", ".join(f"{title} {getattr(diff, attribute).count}" for title, attribute, _ in CATEGORIES),
    ]
    for title, attribute, what in CATEGORIES:
        category = getattr(diff, attribute)
        if not category.count:
            continue
        lines.append(f"\n{title} ({category.count}):")
        lines += [f"  {change.uri}  {what(change)}" for change in category.first]
        if category.count > len(category.first):
            lines.append(f"  ... and {category.count - len(category.first)} more (--limit)")
    lines.append(
        f"\nread {describe_files(diff.ledger_files_read, diff.shards_read)} ({format_bytes(diff.bytes_read)}) of the two versions; an image is "
        "the same image when its source file's sha256 is"
    )
    return "\n".join(lines)
