"""Publishing a run: one commit in the log, created only if absent; what is no longer needed goes later."""

import datetime
import json
import logging
import time
import uuid

from dataset_contract import commit_log, leases
from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.config import DEFAULT_RETENTION_DAYS
from preprocess.publish import gc, protocol
from preprocess.publish import store as dataset_store
from preprocess.publish.protocol import (
    PUBLISH_MARKER_TTL_SECONDS,
    RETAINED_RUNS,
    _parse_timestamp,
    _timestamp,
    copy_head_to_dataset_json,
    is_named,
    named_files,
    published_run_id,
    read_published,
    read_published_manifest,  # noqa: F401 - callers and tests read it from here
    referenced_runs,
    retain_until,
)
from preprocess.publish.runs import PUBLISHING_MARKER, RunPaths

# Objects a publish lets its garbage collection delete, and runs it looks at (preprocess/publish/gc.py); the
# command does the rest.
PUBLISH_GC_BUDGET = 1000
PUBLISH_GC_RUNS = 10

# A running run asks at most this often whether a newer run has published (preprocess/publish/superseded.py).
SUPERSEDED_CHECK_SECONDS = 60.0
# A publisher that loses this many sequences in a row to older runs gives up (the runner retries the step).
_MAX_COMMIT_ATTEMPTS = 100


log = logging.getLogger(__name__)


class SupersededRunError(RuntimeError):
    """A newer run published (or is removing this run's files): this run must not publish."""


class PublishTooSlowError(RuntimeError):
    """The publish step took so long that its marker may count as dead; a retry starts over."""


def superseded_message(output_dir: str, run_id: str, newer_run_id: str) -> str:
    """The one message of a run that a newer one superseded (the same at every retry of a step)."""
    return (
        f"run {run_id} is superseded: run {newer_run_id}, which started later, has published into "
        f"{output_dir}; run {run_id} stops and publishes nothing (the dataset there is run {newer_run_id}, "
        "complete)"
    )


# ------------------------------------------------------------------ reading the log


def missing_run_files(output_dir: str, run_id: str, manifest: dict) -> list[str]:
    """What the manifest names that is absent or of the wrong size: in the run's directory, and in the
    earlier runs' whose shards it references (protocol.referenced_runs); one listing per run directory."""
    present = {}
    for run in [run_id, *referenced_runs(manifest)]:
        present.update(
            (_relative(output_dir, metadata.path), metadata.size_in_bytes)
            for metadata in filesystem.list_files(RunPaths(output_dir, run).run_dir)
        )
    problems = []
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            size = present.get(shard["path"])
            if size != shard["num_bytes"]:
                problems.append(f"{shard['path']} ({'absent' if size is None else f'{size} bytes'})")
    problems += [
        f"{name} (absent)" for name in manifest_lib.other_required_files(manifest) if name not in present
    ]
    return problems


def retained_runs(
    current: dict | None,
    run_id: str,
    now: datetime.datetime,
    retention_days: float,
    is_kept=lambda entry, within_retention: within_retention,
) -> list:
    """The `retained_runs` of the manifest that replaces `current` at `now`, newest first: the run `current`
    names and those it retains, while their retention lasts or `is_kept(entry)` says a lease holds them."""
    entries = []
    if published_run_id(current):
        entries.append(
            {
                "id": current["run"]["id"],
                "dir": current["run"]["dir"],
                "superseded_at": _timestamp(now),
                "retain_until": _timestamp(now + datetime.timedelta(days=retention_days)),
                # The earlier runs whose files it names: kept with it (preprocess/publish/gc.py).
                "references": referenced_runs(current),
            }
        )
    for entry in (current or {}).get(RETAINED_RUNS, []):
        if entry["id"] != run_id:
            entries.append({**entry, "retain_until": _timestamp(retain_until(entry, retention_days))})
    return [entry for entry in entries if is_kept(entry, _parse_timestamp(entry["retain_until"]) > now)]


def _relative(output_dir: str, path: str) -> str:
    prefix = output_dir.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {output_dir}")
    return path[len(prefix) :]


def _lease_names(store, run_id: str) -> list[str]:
    """The names in run `run_id`'s leases folder: training leases and removal markers (one listing)."""
    return [item.name for item in store.list(leases.run_leases_dir(run_id) + "/").objects]


def live_removal(store, run_id: str) -> bool:
    """Whether a remover has announced itself on run `run_id` (a live removal marker)."""
    return bool(leases.live_removals(_lease_names(store, run_id), protocol._utc_now()))


def publish_run(
    output_dir: str,
    run_id: str,
    manifest: dict,
    tft_build_id: str | None = None,
    retention_days: float = DEFAULT_RETENTION_DAYS,
    gc_budget: int = PUBLISH_GC_BUDGET,
) -> dict:
    """Commit `manifest` (run `run_id`, its files complete in runs/<run id>/), then clean up best effort;
    returns the committed manifest. SupersededRunError if a later run has published. Safe to call again."""
    # Temporary files of this step in the run's own staging, which goes with it once the run is published.
    store = dataset_store.open_store(
        output_dir, tmp_dir=_relative(output_dir, RunPaths(output_dir, run_id).tmp_dir)
    )
    # One marker per attempt: two attempts of this step (a retry while the first is still alive) must not
    # remove each other's.
    marker = _relative(output_dir, RunPaths(output_dir, run_id).marker(PUBLISHING_MARKER, uuid.uuid4().hex))
    store.create_if_absent(marker, json.dumps({"run_id": run_id}).encode("utf-8"))
    marked_at = time.monotonic()
    try:
        protocol.pause_point("publish-marked", run_id)
        head = read_published(output_dir, store)
        current = head.manifest() if head is not None else None
        if published_run_id(current) == run_id:
            log.info("run %s is already published in %s (a retry); cleaning up", run_id, output_dir)
            published = current
        elif run_id in {entry["id"] for entry in (current or {}).get(RETAINED_RUNS, [])}:
            # A retry of a publish step that committed, after a newer run published: this run did publish.
            log.info(
                "run %s published in %s, and run %s, which started later, has published since: nothing to do",
                run_id,
                output_dir,
                published_run_id(current),
            )
            _best_effort(f"remove the publishing marker {marker}", store.delete, [marker])
            return manifest
        else:
            # Read after this attempt's marker is written: see the module docstring.
            if live_removal(store, run_id):
                raise SupersededRunError(
                    f"run {run_id}: garbage collection is removing this run's files from {output_dir}; "
                    "nothing published"
                )
            # The earlier runs whose shards it references: a remover that announced itself first backs off
            # from none of them (gc.py looks for publishers after its marker; one of the two sees the other).
            removing = [run for run in referenced_runs(manifest) if live_removal(store, run)]
            if removing:
                raise SupersededRunError(
                    f"run {run_id}: garbage collection is removing run {removing[0]}'s files from {output_dir}, "
                    "whose shards this version references; nothing published (run again: it starts from the "
                    "version published now)"
                )
            if published_run_id(current) > run_id:
                raise SupersededRunError(superseded_message(output_dir, run_id, published_run_id(current)))
            missing = missing_run_files(output_dir, run_id, manifest)
            if missing:
                raise SupersededRunError(
                    f"run {run_id}: files it would publish are gone from {RunPaths(output_dir, run_id).run_dir} "
                    f"(removed by garbage collection?): {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
                    "nothing published"
                )
            if time.monotonic() - marked_at > PUBLISH_MARKER_TTL_SECONDS / 2:
                raise PublishTooSlowError(f"run {run_id}: publishing took too long; a retry starts over")
            protocol.pause_point("before-switch", run_id)
            published = commit_manifest(output_dir, run_id, manifest, retention_days, store)
    except BaseException as failure:
        # The failure is what the caller must see: a marker that cannot go (a retention policy's 403)
        # is logged, and expires (PUBLISH_MARKER_TTL_SECONDS).
        try:
            _delete(store, [marker])
        except Exception as cleanup:  # noqa: BLE001 - never hide the publish step's own failure
            log.warning(
                "run %s: could not remove the publishing marker %s after the publish failed (%s: %s); it "
                "expires after %d hours. The publish failed because of: %s: %s",
                run_id,
                marker,
                type(cleanup).__name__,
                cleanup,
                PUBLISH_MARKER_TTL_SECONDS // 3600,
                type(failure).__name__,
                failure,
            )
        raise
    # Committed: from here on the commit naming the run protects its files.
    _best_effort(f"remove the publishing marker {marker}", _delete, store, [marker])
    protocol.pause_point("switched", run_id)
    try:
        copy_head_to_dataset_json(store)
    except Exception as exc:  # noqa: BLE001 - a copy; a bucket that keeps it young refuses to replace it
        log.info(
            "could not copy the newest commit to %s (%s); readers never need it", commit_log.HINT_FILE, exc
        )
    _best_effort("collect garbage", gc.collect_garbage, output_dir, gc_budget, False, tft_build_id, None,
                 PUBLISH_GC_RUNS)  # fmt: skip
    # Its own staging last: its build record tells a later collection which tf.Transform directory goes
    # with the run, should this step die before the launcher removes that directory.
    what = f"remove the staging and unnamed files of run {run_id}"
    _best_effort(what, remove_unnamed_files_of_run, store, run_id, published)
    return published


def _delete(store, names: list[str]):
    refused = store.delete(names)
    if refused:
        raise OSError("; ".join(f"{name}: {reason}" for name, reason in refused.items()))


def commit_manifest(output_dir: str, run_id: str, manifest: dict, retention_days: float, store) -> dict:
    """Create the next commit (head + 1, only if absent) with `manifest` in `store` unless a later run has
    published (SupersededRunError); returns the committed manifest."""
    head = read_published(output_dir, store)
    sequence = head.sequence if head is not None else 0
    current = head.manifest() if head is not None else None
    for _ in range(_MAX_COMMIT_ATTEMPTS):
        current_id = published_run_id(current)
        if current_id == run_id:
            log.info("run %s was published in %s by another attempt of its publish step", run_id, output_dir)
            return current
        if current_id > run_id:
            raise SupersededRunError(superseded_message(output_dir, run_id, current_id))
        now = protocol._utc_now()

        def is_kept(entry: dict, within_retention: bool, current_id=current_id, now=now) -> bool:
            # A run whose files are gone has no reader left to keep; a lease keeps a run past its retention.
            if not within_retention and not has_live_lease(store, entry["id"], now):
                return False
            return entry["id"] == current_id or run_files_exist(store, entry["id"])

        retained = retained_runs(current, run_id, now, retention_days, is_kept)
        committed = {**manifest, RETAINED_RUNS: retained} if retained else dict(manifest)
        name = commit_log.commit_name(sequence + 1)
        protocol.pause_point("before-commit", run_id)
        if store.create_if_absent(name, json.dumps(committed, indent=2).encode("utf-8")):
            log.info("published run %s in %s (commit %d)", run_id, output_dir, sequence + 1)
            return committed
        # Lost the sequence: read the winner and decide again on top of it.
        sequence += 1
        data = store.read(name)
        current = json.loads(data.decode("utf-8")) if data is not None else current
        log.info(
            "commit %d of %s went to run %s first; deciding again",
            sequence,
            output_dir,
            published_run_id(current),
        )
    raise PublishTooSlowError(
        f"run {run_id}: {_MAX_COMMIT_ATTEMPTS} commits in a row went to other runs; a retry starts over"
    )


def has_live_lease(store, run_id: str, now: datetime.datetime) -> bool:
    """Whether a training job holds a lease on run `run_id` that has not expired (one listing)."""
    return bool(leases.live_holders(_lease_names(store, run_id), now))


def run_files_exist(store, run_id: str) -> bool:
    """Whether run `run_id`'s files are still there (its transform graph, which every run has; one stat)."""
    graph = manifest_lib.join(manifest_lib.run_dir(run_id), manifest_lib.TRANSFORM_FN_DIR, "saved_model.pb")
    return store.exists(graph)


def remove_unnamed_files_of_run(store, run_id: str, manifest: dict):
    """This run's staging, and anything in its directory its manifest does not name (a discarded attempt's
    files, a packed shard's sources); objects the bucket keeps for its retention go later (preprocess/publish/gc.py)."""
    names = named_files(manifest)
    now = time.time()
    stray = [
        item.name
        for item in store.list(manifest_lib.run_dir(run_id) + "/").objects
        if not is_named(item.name, names) and item.deletable_at <= now
    ]
    staging = f"{RunPaths('', run_id).staging_dir.lstrip('/')}/"
    stray += [item.name for item in store.list(staging).objects if item.deletable_at <= now]
    if stray:
        _delete(store, stray)
    store.delete_folder(staging)  # emptied: its folders go too (hierarchical namespace; local disk)


def _best_effort(what: str, action, *args):
    """Run one cleanup action; a failure is logged, never raised (garbage collection retries it)."""
    try:
        return action(*args)
    except Exception as exc:  # noqa: BLE001 - cleanup after the commit must never fail a published run
        log.warning(
            "could not %s (%s: %s); the dataset is published, and garbage collection (python -m "
            "preprocess.gc) retries it",
            what,
            type(exc).__name__,
            exc,
        )
        return None
