"""The publishing protocol's shared vocabulary: reading the log's head, the run it publishes and the files
it names, retention promises, marker liveness, and the pause points kill tests stop at. The publisher
(commit) and the garbage collector (gc) both follow it."""

import datetime
import os
import time

from dataset_contract import commit_log
from dataset_contract import manifest as manifest_lib
from preprocess.publish import store as dataset_store

# A publish step writes its marker and commits within a few minutes; a marker this old belongs to a
# publisher that died.
PUBLISH_MARKER_TTL_SECONDS = 6 * 3600


# tf.Transform's temporary directory of a template's build is shared by its runs; it goes once idle this long.
TFT_TEMP_GRACE_SECONDS = 2 * 24 * 3600


# The manifest's list of the runs it superseded whose files are kept (docs/dataset_format.md, the retention period).
RETAINED_RUNS = "retained_runs"


# Test hook: PREPROCESS_PAUSE_AT=<point>:<flag file> makes the step that
# reaches <point> create <flag file> and wait until the test removes it (at
# most an hour), so that a test can kill the process there
# (tests/preprocess/behaviour/test_publish_kill.py) or let it go on at a moment of its
# choosing (tests/preprocess/publish/test_publish.py, tests/preprocess/publish/test_commit_log.py).
PAUSE_ENV = "PREPROCESS_PAUSE_AT"


_PAUSE_LIMIT_SECONDS = 3600


def pause_point(name: str, run_id: str):
    """Where a test may stop the publish step (see PAUSE_ENV), run `run_id` being published or removed."""
    setting = os.environ.get(PAUSE_ENV, "")
    point, _, flag = setting.partition(":")
    if point != name:
        return
    with open(flag, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + _PAUSE_LIMIT_SECONDS
    while os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)


class StoreFiles:
    """dataset_contract.commit_log's `Files` over a dataset_store (whose names are relative to its root);
    `listed`: the objects of its last listing."""

    listed = ()

    def __init__(self, store):
        self._store = store
        self._prefix = store.root.rstrip("/") + "/"

    def _relative(self, path: str) -> str:
        return path[len(self._prefix) :] if path.startswith(self._prefix) else path

    def list_names(self, directory: str) -> list[str]:
        prefix = self._relative(directory).rstrip("/") + "/"
        self.listed = self._store.list(prefix, delimiter=True).objects
        return [item.name[len(prefix) :] for item in self.listed]

    def read(self, path: str) -> bytes | None:
        return self._store.read(self._relative(path))


def read_published(output_dir: str, store=None) -> commit_log.Published | None:
    """The published manifest (commit_log.read_published), through the store of `output_dir`."""
    store = store or dataset_store.open_store(output_dir)
    return commit_log.read_published(store.root, StoreFiles(store))


def read_published_manifest(output_dir: str) -> dict | None:
    """commit_log.read_published_manifest through the store of `output_dir`."""
    store = dataset_store.open_store(output_dir)
    return commit_log.read_published_manifest(store.root, StoreFiles(store))


def published_run_id(manifest: dict | None) -> str:
    """The id of the run a manifest publishes; '' (older than any run) for none or a format 1 manifest."""
    if not manifest:
        return ""
    return (manifest.get("run") or {}).get("id", "") or ""


def named_files(manifest: dict) -> set[str]:
    """The files and directories (relative paths) a manifest names."""
    names = {shard["path"] for info in manifest["splits"].values() for shard in info["shards"]}
    names.update(manifest_lib.error_file_paths(manifest))
    names.update(manifest_lib.near_duplicate_file_paths(manifest))
    names.update(manifest_lib.ledger_file_paths(manifest))
    names.update((manifest.get("transform") or {}).values())
    return names


def referenced_runs(manifest: dict | None) -> list[str]:
    """The runs, other than its own, whose directories hold files a manifest names: the earlier runs whose
    shards an incremental version references as they are (preprocess/reuse/). Garbage collection keeps
    them while the version is kept."""
    if not manifest:
        return []
    prefix = manifest_lib.RUNS_DIR + "/"
    runs = {
        name.split("/")[1]
        for name in named_files(manifest)
        if name.startswith(prefix) and name.count("/") >= 2
    }
    return sorted(runs - {published_run_id(manifest)})


def is_named(relative: str, names: set[str]) -> bool:
    """Whether `relative` is one of `names` or inside one of them (a directory)."""
    return relative in names or any(relative.startswith(name + "/") for name in names)


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _timestamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)


def retain_until(entry: dict, retention_days: float) -> datetime.datetime:
    """Until when a `retained_runs` entry's files stay: the later of its recorded `retain_until` and
    `retention_days` after it was superseded (retention never shortens)."""
    superseded = _parse_timestamp(entry["superseded_at"])
    until = superseded + datetime.timedelta(days=retention_days)
    if entry.get("retain_until"):
        until = max(until, _parse_timestamp(entry["retain_until"]))
    return until


def marker_is_live(stored, now: float | None = None) -> bool:
    """Whether a publishing marker (a dataset_store.StoredObject) belongs to an attempt that may be alive."""
    return (now or time.time()) - stored.updated < PUBLISH_MARKER_TTL_SECONDS


def copy_head_to_dataset_json(store):
    """Best effort: `dataset.json` becomes a copy of the head's bytes, for people and older readers (the
    log's readers never need it)."""
    head = read_published(store.root, store)
    if head is None or head.sequence == 0 or store.read(commit_log.HINT_FILE) == head.data:
        return
    store.write(commit_log.HINT_FILE, head.data)
