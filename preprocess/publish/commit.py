"""Publishing a run: one compare-and-swap of `dataset.json`, then removing what older runs left.

Every run writes its final files once, under `runs/<run id>/` of the output
directory, where they stay (preprocess/publish/runs.py). The manifest names them by
relative path. Publishing copies and moves no data: it replaces
`dataset.json` with the run's manifest in one atomic step, a compare-and-swap
(preprocess/publish/manifest_switch.py: a generation precondition on GCS, an flock'ed
read-check-rename on local disk). A reader that opens `dataset.json` before
that instant gets the old dataset, whose files are all still there; after
it, the new one, whose files were all complete before it.
On a bucket that refuses to replace objects (a retention policy, a default
event-based hold), the same compare-and-swap creates the next
`manifests/<sequence>-<run id>.json` instead, and `dataset.json` is a pointer
to the newest (format 3, manifest_switch.py); "dataset.json" below means the
published manifest in either layout.

**Readers keep their dataset.** A training job reads a dataset for days. So
the run a switch replaces is not removed at once: the new manifest lists it
in `retained_runs` with the instant it was superseded (the switch itself)
and its own `retain_until`, `retention_days` (`--retention-days`, default 7)
after that. The list is carried from manifest to manifest by every switch,
as part of the same atomic write, so no crash can lose it. **Retention never
shortens:** a later publish keeps each entry's `retain_until`, or makes it
later (its own `retention_days` after the instant the run was superseded),
never earlier, so a publish with `--retention-days 0` removes only the run it
supersedes itself, not the runs earlier publishes promised to keep. An
entry is carried only while its run's files exist and its `retain_until` has
not passed, or a training job holds a live lease on it
(dataset_contract/leases.py): **cleanup never removes a run with a live
lease**, whatever its age.

Runs that overlap (a template launched twice, a retry while the first
attempt is still alive) follow one rule: **the run that started later wins**.
Run ids sort by start time (runs.py), and:

1. A run publishes only if the published manifest names an older run (or
   none). The check is made inside the compare-and-swap, so it still holds
   at the instant of the write: an older run can never switch after a newer
   one, whatever the interleaving. A run that finds a newer one published is
   superseded: it publishes nothing and fails with SupersededRunError (and a
   running one stops early: `StopIfSupersededFn`).
2. After its switch, a run removes the files of every run that started
   before it, except the one the manifest names and those it retains: those
   runs can no longer publish (rule 1), whether they are dead or still
   running. It never touches a run that started after it: that run may still
   publish.
3. A run being removed must not publish, and a run about to publish must not
   be removed. Markers make this race-free, in the manner of Dekker's mutual
   exclusion, on any store that is strongly consistent (local disk, GCS):
   the publisher writes `runs/<id>.publishing.<attempt>` and then looks for
   `runs/<id>.deleting.*`; a remover writes `runs/<id>.deleting.<attempt>`
   and then looks for `runs/<id>.publishing.*` (and reads the manifest once
   more). Whichever writes second sees the other's marker and backs off, so
   they never both go ahead. A publisher that backs off fails; a remover
   that backs off leaves the run for a later cleanup. A publisher also
   checks that every file it names exists, so a run removed earlier (its
   markers gone) cannot publish either. An attempt removes only its own
   marker: a sibling attempt of the same run (a retry while the first is
   alive) that has passed its checks stays protected until it switches or
   fails. A publishing marker older than `PUBLISH_MARKER_TTL_SECONDS` counts
   as dead (its publisher crashed): a publisher gives up (PublishTooSlowError,
   and the runner retries) if half that time has passed since it wrote its
   marker and it has not switched.

**Cleanup is best effort.** Everything after the switch (the attempt's
marker, older runs, this run's staging, tf.Transform's temporary files,
format 1 leftovers) logs a warning when it fails (a retention policy's 403,
a 503 past its retries) and never fails the published run; the next publish
retries it. A retried publish step finds its own run published and goes
straight to the cleanup, which is idempotent too.
"""

import datetime
import json
import logging
import os
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dataset_contract import leases
from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.config import DEFAULT_RETENTION_DAYS
from preprocess.publish import manifest_switch
from preprocess.publish.manifest_switch import swap_manifest
from preprocess.publish.runs import (
    DELETING_MARKER,
    PUBLISHING_MARKER,
    STAGING_DIR,
    TFT_TEMP_PREFIX,
    RunPaths,
    is_run_id,
    read_build,
    tft_temp_dir,
)

# A publish step writes its marker and switches within a few minutes; a
# marker this old belongs to a publisher that died.
PUBLISH_MARKER_TTL_SECONDS = 6 * 3600
# tf.Transform's temporary directory (runs.tft_temp_dir) is removed by the
# launcher when its run ends, or with the run's files (runs.record_build).
# Those of a template are shared by its runs and cannot be told apart by run;
# they are removed when nothing in them has changed for this long.
TFT_TEMP_GRACE_SECONDS = 2 * 24 * 3600

# The manifest's list of the runs it superseded whose files are kept (see the module docstring).
RETAINED_RUNS = "retained_runs"
# A running run asks at most this often whether a newer run has published (StopIfSupersededFn).
SUPERSEDED_CHECK_SECONDS = 60.0

# Test hook: PREPROCESS_PAUSE_AT=<point>:<flag file> makes the step that
# reaches <point> create <flag file> and wait until the test removes it (at
# most an hour), so that a test can kill the process there
# (tests/preprocess/behaviour/test_publish_kill.py) or let it go on at a moment of its
# choosing (the P1/P2 tests of tests/preprocess/publish/test_publish.py).
PAUSE_ENV = "PREPROCESS_PAUSE_AT"
_PAUSE_LIMIT_SECONDS = 3600

log = logging.getLogger(__name__)


class SupersededRunError(RuntimeError):
    """A newer run published (or is removing this run's files): this run must not publish."""


def superseded_message(output_dir: str, run_id: str, newer_run_id: str) -> str:
    """The one message of a run that a newer one superseded (the same at every retry of a step)."""
    return (
        f"run {run_id} is superseded: run {newer_run_id}, which started later, has published into "
        f"{output_dir}; run {run_id} stops and publishes nothing (dataset.json names run {newer_run_id}, "
        "complete)"
    )


def check_not_superseded(output_dir: str, run_id: str):
    """Raise SupersededRunError if `dataset.json` names a run that started after `run_id` (one read)."""
    current = published_run_id(read_published_manifest(output_dir))
    if current > run_id:
        raise SupersededRunError(superseded_message(output_dir, run_id, current))


class PublishTooSlowError(RuntimeError):
    """The publish step took so long that its marker may count as dead; a retry starts over."""


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


# ------------------------------------------------------------------ the switch


def read_published_manifest(output_dir: str) -> dict | None:
    """The published manifest now (`dataset.json`, or the newest of `manifests/` it points to), or None
    if there is none (or it is not JSON)."""
    return manifest_switch.read_published(output_dir)[0]


def published_run_id(manifest: dict | None) -> str:
    """The id of the run a manifest publishes; '' (older than any run) for none or a format 1 manifest."""
    if not manifest:
        return ""
    return (manifest.get("run") or {}).get("id", "")


def named_files(manifest: dict) -> set[str]:
    """The files and directories (relative paths) a manifest names."""
    names = {shard["path"] for info in manifest["splits"].values() for shard in info["shards"]}
    names.update(manifest_lib.error_file_paths(manifest))
    names.update(manifest_lib.near_duplicate_file_paths(manifest))
    names.update((manifest.get("transform") or {}).values())
    return names


def is_named(relative: str, names: set[str]) -> bool:
    """Whether `relative` is one of `names` or inside one of them (a directory)."""
    return relative in names or any(relative.startswith(name + "/") for name in names)


def missing_run_files(output_dir: str, run_id: str, manifest: dict) -> list[str]:
    """What the manifest names in the run's directory that is absent or of the wrong size (one listing)."""
    paths = RunPaths(output_dir, run_id)
    present = {
        _relative(output_dir, metadata.path): metadata.size_in_bytes
        for metadata in filesystem.list_files(paths.run_dir)
    }
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


def _marker_is_live(metadata) -> bool:
    return time.time() - metadata.last_updated_in_seconds < PUBLISH_MARKER_TTL_SECONDS


def publish_run(
    output_dir: str,
    run_id: str,
    manifest: dict,
    tft_build_id: str | None = None,
    retention_days: float = DEFAULT_RETENTION_DAYS,
) -> dict:
    """Make `manifest` (run `run_id`, its files complete in runs/<run id>/) the published dataset.

    Then, best effort, removes what older runs left (those superseded within
    `retention_days` stay) and this run's staging. Returns the manifest
    `dataset.json` holds for the run (`manifest` with its `retained_runs`).
    Raises SupersededRunError if a run that started later has published, or
    is removing this run's files. Safe to call again after a crash at any
    point, and concurrently with itself or with other runs.
    """
    paths = RunPaths(output_dir, run_id)
    # One marker per attempt: two attempts of this step (a retry while the
    # first is still alive) must not remove each other's.
    marker = paths.marker(PUBLISHING_MARKER, uuid.uuid4().hex)
    write_marker(marker, run_id)
    marked_at = time.monotonic()
    try:
        pause_point("publish-marked", run_id)
        current = read_published_manifest(output_dir)
        if published_run_id(current) == run_id:
            log.info("run %s is already published in %s (a retry); cleaning up", run_id, output_dir)
            published = current
        elif run_id in {entry["id"] for entry in (current or {}).get(RETAINED_RUNS, [])}:
            # A retry of a publish step that switched, after a newer run published: this run did publish.
            # Failing now would fail a job that succeeded; the newer run's publish does the cleanup.
            log.info(
                "run %s published in %s, and run %s, which started later, has published since: nothing to do",
                run_id,
                output_dir,
                published_run_id(current),
            )
            _best_effort(f"remove the publishing marker {marker}", filesystem.delete_files, [marker])
            return manifest
        else:
            # Read after this attempt's marker is written: see rule 3 above.
            if filesystem.match(paths.marker_glob(DELETING_MARKER)):
                raise SupersededRunError(
                    f"run {run_id}: a newer run is removing this run's files from {output_dir}; "
                    "nothing published"
                )
            check_not_superseded(output_dir, run_id)
            missing = missing_run_files(output_dir, run_id, manifest)
            if missing:
                raise SupersededRunError(
                    f"run {run_id}: files it would publish are gone from {paths.run_dir} (removed by a newer "
                    f"run?): {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; nothing published"
                )
            if time.monotonic() - marked_at > PUBLISH_MARKER_TTL_SECONDS / 2:
                raise PublishTooSlowError(f"run {run_id}: publishing took too long; a retry starts over")
            pause_point("before-switch", run_id)
            published = switch_manifest(output_dir, run_id, manifest, retention_days)
    except BaseException as failure:
        # The failure is what the caller must see: a marker that cannot go (a retention policy's 403)
        # is logged, and expires (PUBLISH_MARKER_TTL_SECONDS).
        try:
            filesystem.delete_files([marker])
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
    # Published: from here on the manifest naming the run protects its files,
    # so this attempt's marker goes (only its own: a sibling attempt that is
    # still checking keeps its run protected until it fails or finds it
    # published). Markers of crashed attempts expire, and go with the run.
    _best_effort(f"remove the publishing marker {marker}", filesystem.delete_files, [marker])
    pause_point("switched", run_id)
    _best_effort(
        f"remove what runs older than {run_id} left in {output_dir}",
        remove_leftovers,
        output_dir,
        run_id,
        published,
        tft_build_id,
        retention_days,
    )
    return published


def write_marker(path: str, run_id: str):
    """A marker's content does not matter, only that it exists, so it is written directly."""
    with FileSystems.create(path) as handle:
        handle.write(json.dumps({"run_id": run_id}).encode("utf-8"))


_UTC = datetime.timezone.utc


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


def retention_expired(entry: dict, now: datetime.datetime, retention_days: float) -> bool:
    """Whether a `retained_runs` entry's retention has passed at `now` (see retain_until)."""
    return now >= retain_until(entry, retention_days)


def has_live_lease(output_dir: str, run_id: str, now: datetime.datetime) -> bool:
    """Whether a training job holds a lease on run `run_id` that has not expired (one listing)."""
    pattern = manifest_lib.join(output_dir, leases.run_leases_dir(run_id), "*.json")
    return bool(leases.live_holders((metadata.path for metadata in filesystem.match(pattern)), now))


def run_files_exist(output_dir: str, run_id: str) -> bool:
    """Whether run `run_id`'s files are still there (its transform graph, which every run has; one stat)."""
    graph = manifest_lib.join(manifest_lib.TRANSFORM_FN_DIR, "saved_model.pb")
    return filesystem.exists(RunPaths(output_dir, run_id).final(graph))


def retained_runs(
    current: dict | None,
    run_id: str,
    now: datetime.datetime,
    retention_days: float,
    is_kept=lambda entry, within_retention: within_retention,
) -> list:
    """The `retained_runs` of the manifest that replaces `current` at `now`, newest first.

    The run `current` names (superseded now, kept `retention_days`), then
    those `current` retains, each with its `retain_until` (never earlier than
    it was). An entry is listed only while its retention lasts or
    `is_kept(entry)` says a lease holds it, and only while `is_kept(entry)`
    says its files exist.
    """
    entries = []
    if published_run_id(current):
        entries.append(
            {
                "id": current["run"]["id"],
                "dir": current["run"]["dir"],
                "superseded_at": _timestamp(now),
                "retain_until": _timestamp(now + datetime.timedelta(days=retention_days)),
            }
        )
    for entry in (current or {}).get(RETAINED_RUNS, []):
        if entry["id"] != run_id:
            entries.append({**entry, "retain_until": _timestamp(retain_until(entry, retention_days))})
    return [entry for entry in entries if is_kept(entry, _parse_timestamp(entry["retain_until"]) > now)]


def switch_manifest(output_dir: str, run_id: str, manifest: dict, retention_days: float) -> dict:
    """Replace `dataset.json` with `manifest` if it names an older run (or none): the publish itself.

    A compare-and-swap (manifest_switch.py): the check that no newer run has
    published is made on the manifest that is replaced, at the instant it is
    replaced. Returns the manifest `dataset.json` then holds for this run (an
    attempt of this run that switched first: its manifest). Raises
    SupersededRunError if a run that started later has published.
    """
    outcome = {}

    def decide(current: dict | None) -> bytes | None:
        current_id = published_run_id(current)
        if current_id == run_id:
            # A sibling attempt of this run switched first: nothing to write.
            outcome["published"] = current
            return None
        if current_id > run_id:
            raise SupersededRunError(superseded_message(output_dir, run_id, current_id))
        now = _utc_now()

        def is_kept(entry: dict, within_retention: bool) -> bool:
            # A run whose files are gone has no reader left to keep; a lease keeps a run past its retention.
            if not within_retention and not has_live_lease(output_dir, entry["id"], now):
                return False
            return entry["id"] == current_id or run_files_exist(output_dir, entry["id"])

        retained = retained_runs(current, run_id, now, retention_days, is_kept)
        published = {**manifest, RETAINED_RUNS: retained} if retained else dict(manifest)
        outcome["published"] = published
        return json.dumps(published, indent=2).encode("utf-8")

    never_overwrite = manifest_switch.overwrite_refusal(output_dir)
    if swap_manifest(output_dir, decide, RunPaths(output_dir, run_id).tmp_dir, never_overwrite):
        log.info("published run %s in %s", run_id, output_dir)
    else:
        log.info("run %s was published in %s by another attempt of its publish step", run_id, output_dir)
    return outcome["published"]


# ------------------------------------------------------------------ cleanup


def _relative(output_dir: str, path: str) -> str:
    prefix = output_dir.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {output_dir}")
    return path[len(prefix) :]


def _entries(output_dir: str, top: str) -> dict[str, float]:
    """The entries below `output_dir/top` (`<run id>`, `<run id>.deleting.x`, `tft-...`), each with the
    time its newest file last changed."""
    newest: dict[str, float] = {}
    for metadata in filesystem.list_files(manifest_lib.join(output_dir, top)):
        first = _relative(output_dir, metadata.path).split("/")[1]
        newest[first] = max(newest.get(first, 0.0), metadata.last_updated_in_seconds)
    return newest


def remove_run(output_dir: str, run_id: str) -> bool:
    """Remove every file of run `run_id`, unless it is publishing or published; True if removed.

    Only for a run that started before a run that has published (so it can
    no longer publish itself: rule 2 above).
    """
    paths = RunPaths(output_dir, run_id)
    tombstone = paths.marker(DELETING_MARKER, uuid.uuid4().hex)
    write_marker(tombstone, run_id)
    try:
        pause_point("tombstone-written", run_id)
        publishing = filesystem.match(paths.marker_glob(PUBLISHING_MARKER))
        if any(_marker_is_live(metadata) for metadata in publishing):
            log.info("run %s is publishing; its files stay for a later cleanup", run_id)
            return False
        # Read after the publishing markers: a run that switched before its
        # marker went away is named here.
        if published_run_id(read_published_manifest(output_dir)) == run_id:
            return False
        filesystem.delete_tree(paths.run_dir)
        pause_point("run-files-removed", run_id)
        build = read_build(output_dir, run_id)
        if build and not build["shared"]:
            filesystem.delete_tree(tft_temp_dir(output_dir, build["build_id"]))
        filesystem.delete_tree(paths.staging_dir)
        # Its expired leases, and in the never-overwrite layout the manifests that named it (superseded).
        filesystem.delete_tree(manifest_lib.join(output_dir, leases.run_leases_dir(run_id)))
        superseded_manifests = manifest_lib.join(output_dir, manifest_lib.MANIFESTS_DIR, f"*-{run_id}.json")
        filesystem.delete_files([metadata.path for metadata in filesystem.match(superseded_manifests)])
        # The run's markers last, every one (also those of crashed publishers
        # and removers): with its files gone it cannot publish, markers or not.
        markers = [
            metadata.path
            for kind in (PUBLISHING_MARKER, DELETING_MARKER)
            for metadata in filesystem.match(paths.marker_glob(kind))
        ]
        filesystem.delete_files(markers)
        log.info("removed the files of run %s from %s", run_id, output_dir)
        return True
    finally:
        filesystem.delete_files([tombstone])


def _remove_unnamed_files_of_run(output_dir: str, run_id: str, manifest: dict):
    """This run's staging, anything in its directory its manifest does not name, and the markers of
    its publish attempts that died (expired: a live one is a sibling attempt's, which removes its own)."""
    paths = RunPaths(output_dir, run_id)
    filesystem.delete_tree(paths.staging_dir)
    dead = [
        metadata.path
        for metadata in filesystem.match(paths.marker_glob(PUBLISHING_MARKER))
        if not _marker_is_live(metadata)
    ]
    if dead:
        filesystem.delete_files(dead)
    names = named_files(manifest)
    stray = [
        metadata.path
        for metadata in filesystem.list_files(paths.run_dir)
        if not is_named(_relative(output_dir, metadata.path), names)
    ]
    if stray:
        filesystem.delete_files(stray)


def _remove_format1_files(output_dir: str):
    """The top-level files of a format 1 dataset, and its `.staging-*` trees, once no manifest names them."""
    current = read_published_manifest(output_dir)
    if current is None or any("/" not in name for name in named_files(current)):
        return
    patterns = [
        manifest_lib.join(output_dir, manifest_lib.shard_glob(split)) for split in manifest_lib.SPLITS
    ]
    patterns += [manifest_lib.join(output_dir, manifest_lib.ERRORS_FILE)]
    stale = [metadata.path for pattern in patterns for metadata in filesystem.match(pattern)]
    if stale:
        filesystem.delete_files(stale)
    old_staging = {
        _relative(output_dir, metadata.path).split("/")[0]
        for metadata in filesystem.match(manifest_lib.join(output_dir, ".staging-*/**"))
    }
    for name in (manifest_lib.TRANSFORM_FN_DIR, manifest_lib.TRANSFORMED_METADATA_DIR, *sorted(old_staging)):
        filesystem.delete_tree(manifest_lib.join(output_dir, name))


def _remove_idle_tft_temp(output_dir: str, staging: dict[str, float], own_build_id: str | None):
    cutoff = time.time() - TFT_TEMP_GRACE_SECONDS
    for name, changed in staging.items():
        if (
            name.startswith(TFT_TEMP_PREFIX)
            and name != f"{TFT_TEMP_PREFIX}{own_build_id}"
            and changed < cutoff
        ):
            filesystem.delete_tree(manifest_lib.join(output_dir, STAGING_DIR, name))


def _best_effort(what: str, action, *args):
    """Run one cleanup action; a failure is logged, never raised (the next publish retries it)."""
    try:
        return action(*args)
    except Exception as exc:  # noqa: BLE001 - cleanup after the switch must never fail a published run
        log.warning(
            "could not %s (%s: %s); the dataset is published, and the next publish into this directory "
            "retries the cleanup",
            what,
            type(exc).__name__,
            exc,
        )
        return None


def remove_leftovers(
    output_dir: str,
    run_id: str,
    manifest: dict,
    tft_build_id: str | None = None,
    retention_days: float = DEFAULT_RETENTION_DAYS,
):
    """After run `run_id` switched: remove the files of older runs, its own staging, format 1 leftovers.

    Never a file of the published run, nor of a run it retains for less than
    `retention_days` since it was superseded, nor of a run that started
    after `run_id` (it may still publish), nor tf.Transform's directory of
    this pipeline build (`tft_build_id`: the launcher removes it when the job
    ends). Each removal is best effort: a failure is logged and the next
    publish retries it.
    """
    pause_point("cleanup-started", run_id)
    current = read_published_manifest(output_dir)
    published = published_run_id(current)
    retained = {entry["id"]: entry for entry in (current or {}).get(RETAINED_RUNS, [])}
    now = _utc_now()
    runs = _entries(output_dir, manifest_lib.RUNS_DIR)
    staging = _entries(output_dir, STAGING_DIR)
    run_ids = {name.split(".")[0] for name in [*runs, *staging]}
    for older in sorted(other for other in run_ids if is_run_id(other)):
        if older >= run_id or older == published:
            continue
        entry = retained.get(older)
        if entry is not None and not retention_expired(entry, now, retention_days):
            log.info(
                "run %s, superseded at %s, stays for its readers until %s",
                older,
                entry["superseded_at"],
                _timestamp(retain_until(entry, retention_days)),
            )
            continue
        if has_live_lease(output_dir, older, now):
            log.info("run %s stays: a training job holds a live lease on it (%s/)", older, leases.LEASES_DIR)
            continue
        _best_effort(f"remove the files of run {older}", remove_run, output_dir, older)
    _best_effort(
        f"remove the staging and unnamed files of run {run_id}",
        _remove_unnamed_files_of_run,
        output_dir,
        run_id,
        manifest,
    )
    _best_effort("remove the files of a format 1 dataset", _remove_format1_files, output_dir)
    _best_effort(
        "remove idle tf.Transform temporary directories",
        _remove_idle_tft_temp,
        output_dir,
        staging,
        tft_build_id,
    )
    _best_effort(
        "remove the empty staging directory",
        filesystem.remove_empty_directory,
        manifest_lib.join(output_dir, STAGING_DIR),
    )


# ------------------------------------------------------------------ a superseded run stops early


class StopIfSupersededFn(beam.DoFn):
    """Passes elements through; raises SupersededRunError once a newer run has published.

    A run that a newer one superseded can never publish (rule 1), so there is
    no point in its decoding millions of images for hours. Each instance
    reads `dataset.json` at its first element and then at most every
    `check_seconds`: a small read, rare next to the work of the elements
    that pass. Once superseded it raises on every element with the same
    message, so the runner's retries of the bundle (4 on Dataflow) fail at
    once, the same way, and the job stops.
    """

    def __init__(self, output_dir: str, check_seconds: float = SUPERSEDED_CHECK_SECONDS):
        self._output_dir = output_dir
        self._check_seconds = check_seconds
        self._checked_at = None
        self._superseded = None

    def process(self, element, run_id):
        if self._superseded is None and (
            self._checked_at is None or time.monotonic() - self._checked_at >= self._check_seconds
        ):
            self._checked_at = time.monotonic()
            try:
                check_not_superseded(self._output_dir, run_id)
            except SupersededRunError as exc:
                self._superseded = str(exc)
        if self._superseded is not None:
            raise SupersededRunError(self._superseded)
        yield element
