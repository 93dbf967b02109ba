"""Publishing a run: one atomic replacement of `dataset.json`, then removing what older runs left.

Every run writes its final files once, under `runs/<run id>/` of the output
directory, where they stay (preprocess/runs.py). The manifest names them by
relative path. Publishing copies and moves no data: it writes the new
manifest and replaces `dataset.json` with it in one atomic step (a rename on
local disk; one object write on GCS). A reader that opens `dataset.json`
before that instant gets the old dataset, whose files are all still there;
after it, the new one, whose files were all complete before it. Files of
older runs are removed only after the switch. So at every instant the
directory holds a complete dataset, whatever line a crash or a kill stops at.

Runs that overlap (a template launched twice, a retry while the first
attempt is still alive) follow one rule: **the run that started later wins**.
Run ids sort by start time (runs.py), and:

1. A run publishes only if the published manifest names an older run (or
   none). A run that finds a newer one published is superseded: it publishes
   nothing and fails with SupersededRunError. (If two runs pass this check at
   the same moment, the one that switches last wins; either way every file
   the manifest names exists.)
2. After its switch, a run removes the files of every run that started
   before it, except the one the manifest names: those runs can no longer
   publish (rule 1), whether they are dead or still running. It never touches
   a run that started after it: that run may still publish.
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
   markers gone) cannot publish either. A publishing marker older than
   `PUBLISH_MARKER_TTL_SECONDS` counts as dead (its publisher crashed): a
   publisher gives up (PublishTooSlowError, and the runner retries) if half
   that time has passed since it wrote its marker and it has not switched.
   The marker goes right after the switch: from then on the manifest naming
   the run is what protects its files.

A retried publish step finds its own run published and goes straight to the
cleanup, which is idempotent too. Leftovers of failed runs (their final
files, their staging, markers) are removed by the next run that publishes.
"""

import json
import logging
import os
import time
import uuid

from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.runs import (
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

# Test hook: PREPROCESS_PAUSE_AT=<point>:<flag file> makes the step that
# reaches <point> create <flag file> and sleep, so that a test can kill the
# process there (tests/preprocess/test_publish_kill.py).
PAUSE_ENV = "PREPROCESS_PAUSE_AT"

log = logging.getLogger(__name__)


class SupersededRunError(RuntimeError):
    """A newer run published (or is removing this run's files): this run must not publish."""


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
    time.sleep(3600)


# ------------------------------------------------------------------ the switch


def read_published_manifest(output_dir: str) -> dict | None:
    """The manifest `dataset.json` holds now, or None if there is none (or it is not JSON)."""
    path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    # Never deleted once written, only replaced: if it exists now, it can be read.
    if not FileSystems.exists(path):
        return None
    try:
        manifest = json.loads(filesystem.read_bytes(path).decode("utf-8"))
    except ValueError as exc:
        log.warning("%s is not valid JSON (%s); treating the directory as holding no dataset", path, exc)
        return None
    return manifest if isinstance(manifest, dict) else None


def published_run_id(manifest: dict | None) -> str:
    """The id of the run a manifest publishes; '' (older than any run) for none or a format 1 manifest."""
    if not manifest:
        return ""
    return (manifest.get("run") or {}).get("id", "")


def named_files(manifest: dict) -> set[str]:
    """The files and directories (relative paths) a manifest names."""
    names = {shard["path"] for info in manifest["splits"].values() for shard in info["shards"]}
    names.update(manifest_lib.error_file_paths(manifest))
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


def publish_run(output_dir: str, run_id: str, manifest: dict, tft_build_id: str | None = None) -> dict:
    """Make `manifest` (run `run_id`, its files complete in runs/<run id>/) the published dataset.

    Then removes the files of older runs and this run's staging. Returns the
    manifest. Raises SupersededRunError if a run that started later has
    published, or is removing this run's files. Safe to call again after a
    crash at any point, and concurrently with itself or with other runs.
    """
    paths = RunPaths(output_dir, run_id)
    # One marker per attempt: two attempts of this step (a retry while the
    # first is still alive) must not remove each other's.
    marker = paths.marker(PUBLISHING_MARKER, uuid.uuid4().hex)
    write_marker(marker, run_id)
    marked_at = time.monotonic()
    try:
        pause_point("publish-marked", run_id)
        current = published_run_id(read_published_manifest(output_dir))
        if current == run_id:
            log.info("run %s is already published in %s (a retry); cleaning up", run_id, output_dir)
        else:
            # Read after this attempt's marker is written: see rule 3 above.
            if filesystem.match(paths.marker_glob(DELETING_MARKER)):
                raise SupersededRunError(
                    f"run {run_id}: a newer run is removing this run's files from {output_dir}; "
                    "nothing published"
                )
            if current > run_id:
                raise SupersededRunError(
                    f"run {run_id}: run {current}, which started later, has already published into "
                    f"{output_dir}; this run publishes nothing (the directory holds run {current}'s dataset)"
                )
            missing = missing_run_files(output_dir, run_id, manifest)
            if missing:
                raise SupersededRunError(
                    f"run {run_id}: files it would publish are gone from {paths.run_dir} (removed by a newer "
                    f"run?): {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; nothing published"
                )
            if time.monotonic() - marked_at > PUBLISH_MARKER_TTL_SECONDS / 2:
                raise PublishTooSlowError(f"run {run_id}: publishing took too long; a retry starts over")
            pause_point("before-switch", run_id)
            switch_manifest(output_dir, run_id, manifest)
            log.info("published run %s in %s", run_id, output_dir)
    except BaseException:
        filesystem.delete_files([marker])
        raise
    # Published: from here on the manifest naming the run protects its files,
    # so this run's markers (this attempt's, and any left by a crashed one) go.
    filesystem.delete_files(
        [metadata.path for metadata in filesystem.match(paths.marker_glob(PUBLISHING_MARKER))]
    )
    pause_point("switched", run_id)
    remove_leftovers(output_dir, run_id, manifest, tft_build_id)
    return manifest


def write_marker(path: str, run_id: str):
    """A marker's content does not matter, only that it exists, so it is written directly."""
    with FileSystems.create(path) as handle:
        handle.write(json.dumps({"run_id": run_id}).encode("utf-8"))


def switch_manifest(output_dir: str, run_id: str, manifest: dict):
    """Replace `dataset.json` with `manifest` in one atomic step: the publish itself."""
    paths = RunPaths(output_dir, run_id)
    data = json.dumps(manifest, indent=2).encode("utf-8")
    # On local disk the file is written in the run's staging and renamed over
    # dataset.json; on GCS the upload of dataset.json is itself the switch.
    filesystem.write_bytes(manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE), data, paths.tmp_dir)


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
    """This run's staging, and anything in its directory its manifest does not name."""
    paths = RunPaths(output_dir, run_id)
    filesystem.delete_tree(paths.staging_dir)
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


def remove_leftovers(output_dir: str, run_id: str, manifest: dict, tft_build_id: str | None = None):
    """After run `run_id` switched: remove the files of older runs, its own staging, format 1 leftovers.

    Never a file of the published run, nor of a run that started after
    `run_id` (it may still publish), nor tf.Transform's directory of this
    pipeline build (`tft_build_id`: the launcher removes it when the job ends).
    """
    pause_point("cleanup-started", run_id)
    published = published_run_id(read_published_manifest(output_dir))
    runs = _entries(output_dir, manifest_lib.RUNS_DIR)
    staging = _entries(output_dir, STAGING_DIR)
    run_ids = {name.split(".")[0] for name in [*runs, *staging]}
    for older in sorted(other for other in run_ids if is_run_id(other)):
        if older < run_id and older != published:
            remove_run(output_dir, older)
    _remove_unnamed_files_of_run(output_dir, run_id, manifest)
    _remove_format1_files(output_dir)
    _remove_idle_tft_temp(output_dir, staging, tft_build_id)
    filesystem.remove_empty_directory(manifest_lib.join(output_dir, STAGING_DIR))
