"""Publishing a run (preprocess/publish/commit.py) on real files: at every instant the directory holds a complete
dataset, the old or the new, whatever file operation a crash stops at, and overlapping runs follow the
rule "the run that started later wins" without removing a file a manifest names.

The starting point of every test is a real directory: a dataset written by stage 1 (the old run), and a
second real run of stage 1 into it, stopped just before its switch (the new run: its files complete in
runs/<run id>/, its staging there, not published). The old run is removed as soon as it is superseded
(retention 0): the retention period is held by test_publish_retention.py.
"""

import dataclasses
import datetime
import glob
import json
import logging
import os
import shutil
import subprocess
import time
import uuid

import pytest
from google.cloud import storage

from dataset_contract import manifest as manifest_lib
from preprocess.config import DEFAULT_RETENTION_DAYS
from preprocess.inspect.summary import format_summary
from preprocess.launch import launcher
from preprocess.publish import commit as publish
from preprocess.publish import gc, protocol
from preprocess.publish.commit import SupersededRunError, missing_run_files
from preprocess.publish.runs import RunPaths, new_run_id
from tests.gcs_emulator import ReadFaults
from tests.publishing import (
    InjectedCrash,
    assert_complete_dataset,
    injected_faults,
    published_dataset,
    run_stopped_before_switch,
    shard_digests,
    start_paused_publish,
    write_marker,
)

pytestmark = pytest.mark.slow


def publish_run(output_dir, run_id, manifest):
    """The real publish_run with no retention period: these tests hold which runs a cleanup may remove,
    and when; how long it waits (--retention-days) is held by test_publish_retention.py."""
    return publish.publish_run(output_dir, run_id, manifest, retention_days=0)


@dataclasses.dataclass
class Staged:
    output: str
    old: dict  # the published manifest
    new_run_id: str
    new: dict  # the manifest the stopped run would publish


@pytest.fixture(scope="module")
def staged(tmp_path_factory, shared_stage1_datasets):
    output = tmp_path_factory.mktemp("staged") / "dataset"
    # The old dataset, written once per session (test_publish_kill.py starts from it too).
    corpus_root, old = shared_stage1_datasets.copy(
        output, images_per_class=4, image_size=16, encoding="float32", min_shards=2
    )
    stopped = run_stopped_before_switch(corpus_root, output, image_size=16, encoding="uint8", min_shards=1)
    return Staged(str(output), old, stopped.run_id, stopped.manifest)


@pytest.fixture
def output(staged, tmp_path):
    """A private copy of the staged directory."""
    copy = tmp_path / "dataset"
    shutil.copytree(staged.output, copy)
    return str(copy)


def files_below(directory: str) -> set[str]:
    """Relative paths of every file below `directory`, tf.Transform's temporary directories left out."""
    found = set()
    for root, _, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if not relative.startswith("staging/tft-"):
                found.add(relative)
    return found


def named_files(data_dir: str, manifest: dict) -> set[str]:
    """Every file the manifest names (directories expanded), the log of commits and its hint."""
    names = publish.named_files(manifest)
    return {"dataset.json"} | {
        path
        for path in files_below(data_dir)
        if publish.is_named(path, names) or path.startswith(manifest_lib.MANIFESTS_DIR + "/")
    }


def assert_only_the_published_run_is_left(data_dir: str, crashed_attempts: int = 0):
    """Nothing but the files the manifest names, and the markers of `crashed_attempts` publish
    attempts of the published run (an attempt removes only its own marker; a dead one's expires)."""
    manifest = assert_complete_dataset(data_dir)
    markers = {path for path in files_below(data_dir) if ".publishing." in path}
    assert len(markers) == crashed_attempts, markers
    assert all(path.startswith(manifest["run"]["dir"] + ".publishing.") for path in markers)
    assert files_below(data_dir) - markers == named_files(data_dir, manifest)


def clone_run(data_dir: str, manifest: dict, run_id: str) -> dict:
    """Copy a run's files under another run id (real bytes, real sizes); returns its manifest."""
    source = RunPaths(data_dir, manifest["run"]["id"])
    target = RunPaths(data_dir, run_id)
    shutil.copytree(source.run_dir, target.run_dir)
    text = json.dumps(manifest).replace(manifest["run"]["id"], run_id)
    return json.loads(text)


def run_id_between(older: str, newer: str) -> str:
    """A run id that sorts between two others (a run that started in between)."""
    candidate = older[:-8] + "ffffffff"
    assert older < candidate < newer
    return candidate


def at_pause_point(monkeypatch, name: str, run_id: str, action):
    """Run `action` once, the first time a publish step reaches the pause point `name` for run `run_id`."""
    fired = []

    def pause(point, point_run_id):
        if point == name and point_run_id == run_id and not fired:
            fired.append(point)
            action()

    monkeypatch.setattr(protocol, "pause_point", pause)
    return fired


def test_the_staged_directory_holds_the_old_dataset_and_the_new_runs_complete_files(staged):
    assert assert_complete_dataset(staged.output)["run"]["id"] == staged.old["run"]["id"]
    assert staged.new_run_id > staged.old["run"]["id"]
    assert missing_run_files(staged.output, staged.new_run_id, staged.new) == []
    staging = RunPaths(staged.output, staged.new_run_id).staging_dir
    # The run's build record (a uint8 run, the default, spills no decoded pixels and writes its shards and
    # its error log in place): staging the publish step must remove.
    assert "build.json" in os.listdir(staging)


def test_publishing_switches_to_the_new_run_and_removes_everything_else(staged, output):
    publish_run(output, staged.new_run_id, staged.new)
    assert published_dataset(output) == staged.new
    assert_only_the_published_run_is_left(output)


def test_publishing_twice_changes_nothing_the_second_time(staged, output):
    publish_run(output, staged.new_run_id, staged.new)
    first = {path: open(os.path.join(output, path), "rb").read() for path in files_below(output)}
    publish_run(output, staged.new_run_id, staged.new)
    assert {path: open(os.path.join(output, path), "rb").read() for path in files_below(output)} == first


def count_file_calls(monkeypatch, staged, tmp_path) -> list[str]:
    scratch = tmp_path / "count"
    shutil.copytree(staged.output, scratch)
    with injected_faults(monkeypatch) as injector:
        publish_run(str(scratch), staged.new_run_id, staged.new)
    return injector.calls


def test_a_crash_at_any_file_operation_of_publishing_leaves_a_complete_dataset(staged, tmp_path, monkeypatch):
    calls = count_file_calls(monkeypatch, staged, tmp_path)
    assert len(calls) >= 10, calls
    outcomes = []
    for crash_at in range(len(calls)):
        output = tmp_path / f"crash-{crash_at}"
        shutil.copytree(staged.output, output)
        with injected_faults(monkeypatch, crash_at=crash_at), pytest.raises(InjectedCrash):
            publish_run(str(output), staged.new_run_id, staged.new)
        # Whatever the crash interrupted: one whole dataset, the old one or the new one.
        found = published_dataset(str(output))
        expected = staged.old if found["run"]["id"] == staged.old["run"]["id"] else staged.new
        assert found == expected, f"crash before call {crash_at} ({calls[crash_at]})"
        assert shard_digests(found) == shard_digests(expected)
        outcomes.append("old" if expected is staged.old else "new")
        crashed_markers = len(glob.glob(str(output / "runs" / "*.publishing.*")))
        # The retry publishes the new run and leaves nothing else (but the crashed attempt's marker).
        publish_run(str(output), staged.new_run_id, staged.new)
        assert published_dataset(str(output)) == staged.new
        assert_only_the_published_run_is_left(str(output), crashed_attempts=crashed_markers)
    # The switch is one call: old before it, new from it on.
    switch = outcomes.index("new")
    assert outcomes == ["old"] * switch + ["new"] * (len(calls) - switch)
    assert 0 < switch < len(calls) - 1


def test_a_newer_run_that_publishes_removes_an_older_unpublished_run_which_then_cannot_publish(
    staged, output
):
    older = clone_run(output, staged.new, run_id_between(staged.old["run"]["id"], staged.new_run_id))
    publish_run(output, staged.new_run_id, staged.new)
    assert not os.path.exists(RunPaths(output, older["run"]["id"]).run_dir)
    with pytest.raises(SupersededRunError, match="which started later, has published"):
        publish_run(output, older["run"]["id"], older)
    assert published_dataset(output) == staged.new
    assert_only_the_published_run_is_left(output)


def test_an_older_run_that_publishes_first_leaves_a_newer_run_alone(staged, output):
    older = clone_run(output, staged.new, run_id_between(staged.old["run"]["id"], staged.new_run_id))
    publish_run(output, older["run"]["id"], older)
    assert published_dataset(output) == older
    assert missing_run_files(output, staged.new_run_id, staged.new) == []
    assert os.path.isdir(RunPaths(output, staged.new_run_id).staging_dir)
    publish_run(output, staged.new_run_id, staged.new)
    assert published_dataset(output) == staged.new
    assert_only_the_published_run_is_left(output)


def test_a_run_does_not_publish_once_its_files_are_gone(staged, output):
    shutil.rmtree(os.path.join(output, staged.new["splits"]["train"]["shards"][0]["path"].rsplit("/", 1)[0]))
    with pytest.raises(SupersededRunError, match="files it would publish are gone"):
        publish_run(output, staged.new_run_id, staged.new)
    assert published_dataset(output) == staged.old


def test_a_run_being_removed_cannot_publish(staged, output, monkeypatch):
    """The remover's marker is written first: the publisher sees it and backs off."""
    older = clone_run(output, staged.new, run_id_between(staged.old["run"]["id"], staged.new_run_id))
    refused = []

    def older_tries_to_publish():
        with pytest.raises(SupersededRunError, match="removing this run's files") as caught:
            publish_run(output, older["run"]["id"], older)
        refused.append(caught.value)
        assert published_dataset(output) == staged.new

    fired = at_pause_point(monkeypatch, "removal-announced", older["run"]["id"], older_tries_to_publish)
    publish_run(output, staged.new_run_id, staged.new)
    assert fired and refused
    assert_only_the_published_run_is_left(output)


def test_a_run_about_to_publish_cannot_commit_after_a_newer_run(staged, output, monkeypatch):
    """It has passed its checks when a newer run commits (and, as no run older than the head can ever
    commit, its garbage collection may remove the older run's files at once). Its commit then finds the
    newer run published and refuses: an older run never commits after a newer one.
    """
    older = clone_run(output, staged.new, run_id_between(staged.old["run"]["id"], staged.new_run_id))

    def newer_publishes_meanwhile():
        publish_run(output, staged.new_run_id, staged.new)
        assert published_dataset(output) == staged.new

    fired = at_pause_point(monkeypatch, "before-switch", older["run"]["id"], newer_publishes_meanwhile)
    with pytest.raises(
        SupersededRunError, match=f"run {staged.new_run_id}, which started later, has published"
    ):
        publish_run(output, older["run"]["id"], older)
    assert fired
    assert published_dataset(output) == staged.new
    publish_run(output, staged.new_run_id, staged.new)
    assert_only_the_published_run_is_left(output)
    assert published_dataset(output) == staged.new


def test_p1_p2_then_a_newer_run_never_leave_dataset_json_naming_a_removed_run(staged, output, tmp_path):
    """Two attempts P1, P2 of run A both pass their checks; P1 switches; a newer run B publishes and
    cleans up (no retention); P2 goes on and tries to switch. Each through the real publish_run, P2 in a
    process of its own, paused by PREPROCESS_PAUSE_AT. At every step dataset.json names a run whose files
    all exist, and P2 cannot switch back to A."""
    run_a = clone_run(output, staged.new, run_id_between(staged.old["run"]["id"], staged.new_run_id))
    a_id, b_id = run_a["run"]["id"], staged.new_run_id
    p2 = start_paused_publish(output, run_a, "before-switch", tmp_path)
    assert published_dataset(output) == staged.old
    publish_run(output, a_id, run_a)  # P1
    assert published_dataset(output) == run_a
    publish_run(output, b_id, staged.new)  # B, and its cleanup
    assert published_dataset(output) == staged.new
    status = p2.resume()
    assert published_dataset(output) == staged.new
    assert status != 0
    assert f"run {a_id} is superseded: run {b_id}, which started later" in p2.output()
    # P2's marker kept A from removal while it could still switch; now it is gone, and so is A.
    publish_run(output, b_id, staged.new)
    assert_only_the_published_run_is_left(output)


def test_a_marked_publisher_that_finds_a_newer_run_published_backs_off_and_is_removed_later(
    staged, output, monkeypatch
):
    older = clone_run(output, staged.new, run_id_between(staged.old["run"]["id"], staged.new_run_id))
    at_pause_point(
        monkeypatch,
        "publish-marked",
        older["run"]["id"],
        lambda: publish_run(output, staged.new_run_id, staged.new),
    )
    with pytest.raises(SupersededRunError, match="started later"):
        publish_run(output, older["run"]["id"], older)
    publish_run(output, staged.new_run_id, staged.new)
    assert_only_the_published_run_is_left(output)


def test_a_dead_publishers_marker_protects_a_later_run_only_until_it_expires(staged, output):
    """A run that started after the published one may still commit: garbage collection leaves it while
    its publishing marker is live, even once the run looks abandoned, and removes it once the marker has
    expired. (A run that started before the published one can never commit: its markers protect nothing.)"""
    publish_run(output, staged.new_run_id, staged.new)
    later = clone_run(output, staged.new, new_run_id())
    marker = RunPaths(output, later["run"]["id"]).marker(publish.PUBLISHING_MARKER, "crashed")
    write_marker(marker, later["run"]["id"])
    week_later = time.time() + gc.ABANDONED_RUN_SECONDS + 3600
    os.utime(marker, (week_later - 60, week_later - 60))  # its publisher wrote it a minute before
    gc.collect_garbage(output, now=week_later)
    assert missing_run_files(output, later["run"]["id"], later) == []
    gc.collect_garbage(output, now=week_later + publish.PUBLISH_MARKER_TTL_SECONDS)
    assert not os.path.exists(RunPaths(output, later["run"]["id"]).run_dir)
    assert_only_the_published_run_is_left(output)


def test_an_attempt_removes_only_its_own_marker_and_a_dead_attempts_once_it_expires(staged, output):
    paths = RunPaths(output, staged.new_run_id)
    sibling, dead = (
        paths.marker(publish.PUBLISHING_MARKER, "sibling"),
        paths.marker(publish.PUBLISHING_MARKER, "dead"),
    )
    for marker in (sibling, dead):
        write_marker(marker, staged.new_run_id)
    expired = time.time() - publish.PUBLISH_MARKER_TTL_SECONDS - 60
    os.utime(dead, (expired, expired))
    publish_run(output, staged.new_run_id, staged.new)
    assert os.path.exists(sibling)
    assert not os.path.exists(dead)
    assert_only_the_published_run_is_left(output, crashed_attempts=1)


def test_a_superseded_run_stays_for_the_retention_period_and_goes_once_it_has_passed(
    staged, output, monkeypatch
):
    """Readers keep their dataset: a training job that opened the old manifest reads its files for days."""
    old_id, new_id = staged.old["run"]["id"], staged.new_run_id
    never_published = clone_run(output, staged.new, run_id_between(old_id, new_id))
    published = publish.publish_run(output, new_id, staged.new)  # the default retention period
    assert [entry["id"] for entry in published[publish.RETAINED_RUNS]] == [old_id]
    assert missing_run_files(output, old_id, staged.old) == []
    # A run that never published has no reader to keep: it goes at once.
    assert not os.path.exists(RunPaths(output, never_published["run"]["id"]).run_dir)
    # fromisoformat reads a trailing "Z" only from Python 3.11 on.
    stamp = published[publish.RETAINED_RUNS][0]["superseded_at"]
    superseded_at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert abs(datetime.datetime.now(datetime.timezone.utc) - superseded_at) < datetime.timedelta(minutes=5)

    # A later run publishes within the period: both earlier runs stay, recorded in its manifest.
    later = clone_run(output, staged.new, new_run_id())
    days = DEFAULT_RETENTION_DAYS
    monkeypatch.setattr(protocol, "_utc_now", lambda: superseded_at + datetime.timedelta(days=days - 1))
    third = publish.publish_run(output, later["run"]["id"], later)
    assert [entry["id"] for entry in third[publish.RETAINED_RUNS]] == [new_id, old_id]
    assert missing_run_files(output, old_id, staged.old) == []
    report = format_summary(third, output)
    assert f"kept for its readers: run {new_id}" in report and f"kept for its readers: run {old_id}" in report

    # Once the period has passed for the first run, the next cleanup (here a retried publish) removes it,
    # and keeps the run superseded since.
    monkeypatch.setattr(protocol, "_utc_now", lambda: superseded_at + datetime.timedelta(days=days + 0.01))
    publish.publish_run(output, later["run"]["id"], later)
    assert not os.path.exists(RunPaths(output, old_id).run_dir)
    assert missing_run_files(output, new_id, staged.new) == []
    assert published_dataset(output) == later


def test_the_launcher_reports_its_own_runs_manifest_or_names_the_newer_run_that_superseded_it(staged, output):
    """python -m preprocess reads dataset.json after its job: it must not report another run's dataset."""
    old_id, new_id = staged.old["run"]["id"], staged.new_run_id
    assert launcher.own_manifest(output, old_id) == staged.old
    publish.publish_run(output, new_id, staged.new)
    assert launcher.own_manifest(output, new_id)["run"]["id"] == new_id
    with pytest.raises(SupersededRunError) as raised:
        launcher.own_manifest(output, old_id)
    message = str(raised.value)
    assert (
        f"run {old_id} published into {output}, but run {new_id}, which started later, has published"
        in message
    )
    assert f"runs/{old_id}/ for the retention period" in message
    never_published = run_id_between(old_id, new_id)
    with pytest.raises(SupersededRunError, match=f"run {never_published} is superseded: run {new_id}"):
        launcher.own_manifest(output, never_published)


@pytest.fixture
def immutable(tmp_path):
    """Make files immutable (`chattr +i`: not even root may delete them) for the test; undone after it."""
    made = []

    def make(path):
        result = subprocess.run(["chattr", "+i", path], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            pytest.skip(f"chattr +i is not available here: {result.stderr.strip()}")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", path], check=False)


def test_a_cleanup_that_fails_on_local_disk_warns_and_the_next_publish_removes_the_leftovers(
    staged, output, immutable, caplog
):
    old_id = staged.old["run"]["id"]
    stuck = os.path.join(output, staged.old["splits"]["train"]["shards"][0]["path"])
    immutable(stuck)
    with caplog.at_level(logging.WARNING, logger=gc.__name__):
        published = publish_run(output, staged.new_run_id, staged.new)
    assert published["run"]["id"] == staged.new_run_id
    assert published_dataset(output) == staged.new
    assert f"could not remove 1 objects of {output} (e.g. runs/{old_id}/" in caplog.text
    assert os.path.exists(stuck)
    subprocess.run(["chattr", "-i", stuck], check=True)
    publish_run(output, staged.new_run_id, staged.new)
    assert_only_the_published_run_is_left(output)


def test_a_newer_run_than_the_publisher_is_never_touched_by_its_cleanup(staged, output):
    """Even one with no files but staging (still decoding) and a leftover marker."""
    newer = RunPaths(output, new_run_id())
    os.makedirs(newer.staging("decoded"))
    with open(newer.staging("decoded", "train-0.arrow"), "wb") as handle:
        handle.write(b"still being written")
    publish_run(output, staged.new_run_id, staged.new)
    assert os.path.exists(newer.staging("decoded", "train-0.arrow"))


def test_tf_transform_temporary_directories_go_once_idle_for_the_grace_period(staged, output):
    idle = os.path.join(output, "staging", "tft-idle", "tftransform_tmp", "model", "saved_model.pb")
    busy = os.path.join(output, "staging", "tft-busy", "tftransform_tmp", "model", "saved_model.pb")
    for path in (idle, busy):
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as handle:
            handle.write(b"graph")
    long_ago = time.time() - protocol.TFT_TEMP_GRACE_SECONDS - 60
    os.utime(idle, (long_ago, long_ago))
    publish_run(output, staged.new_run_id, staged.new)
    assert not os.path.exists(os.path.join(output, "staging", "tft-idle"))
    assert os.path.exists(busy)


def test_publishing_over_a_format_1_dataset_removes_its_top_level_files_after_the_switch(staged, output):
    """Format 1 kept shards (named split-NNNNN-of-MMMMM), errors.jsonl and the transform dirs at the top,
    and staging in .staging-*/."""
    old_dir = os.path.join(output, staged.old["run"]["dir"])
    text = json.dumps(staged.old)
    for split, info in staged.old["splits"].items():
        for index, shard in enumerate(info["shards"]):
            format1_name = manifest_lib.shard_file_name(split, index, len(info["shards"]))
            os.rename(os.path.join(output, shard["path"]), os.path.join(old_dir, format1_name))
            text = text.replace(shard["path"], format1_name)
    # Format 1's error log: one errors.jsonl at the top, which its manifest does not name.
    with open(os.path.join(output, manifest_lib.ERRORS_FILE), "wb") as log:
        for path in manifest_lib.error_file_paths(staged.old):
            with open(os.path.join(output, path), "rb") as part:
                log.write(part.read())
            os.remove(os.path.join(output, path))
    for path in manifest_lib.ledger_file_paths(staged.old):  # format 1 had no ledger either
        os.remove(os.path.join(output, path))
    for entry in os.listdir(old_dir):
        shutil.move(os.path.join(old_dir, entry), os.path.join(output, entry))
    shutil.rmtree(old_dir)
    flat = json.loads(text.replace(staged.old["run"]["dir"] + "/", ""))
    flat["format_version"] = 1
    del flat["run"], flat["error_files"]
    flat.pop("ledger_files", None)
    shutil.rmtree(os.path.join(output, manifest_lib.MANIFESTS_DIR))  # format 1 had no log
    with open(os.path.join(output, "dataset.json"), "w") as handle:
        json.dump(flat, handle)
    os.makedirs(os.path.join(output, ".staging-0123abcd", "parts"))
    with open(os.path.join(output, ".staging-0123abcd", "parts", "train-x.part"), "wb") as handle:
        handle.write(b"a part of a format 1 run")
    with open(os.path.join(output, "notes.txt"), "w") as handle:
        handle.write("not the dataset's: stays")
    assert published_dataset(output) == flat

    publish_run(output, staged.new_run_id, staged.new)
    assert published_dataset(output) == staged.new
    assert sorted(os.listdir(output)) == ["dataset.json", "manifests", "notes.txt", "runs"]
    assert files_below(output) == named_files(output, staged.new) | {"notes.txt"}


def test_the_manifest_names_only_paths_inside_the_run_directory(staged):
    run_dir = manifest_lib.run_dir(staged.new_run_id)
    assert staged.new["run"]["dir"] == run_dir
    assert all(name.startswith(run_dir + "/") for name in publish.named_files(staged.new))


# ------------------------------------------------------------------ on gs://
#
# GCS has no rename (a copy plus a delete) and no directories; the same checks against the emulator.


@pytest.fixture(scope="module")
def staged_gcs(staged, gcs_emulator):
    """The staged directory, uploaded file by file: the same runs, on gs:// (stage 1's own writes to
    gs:// are held by tests/test_gcs_end_to_end.py)."""
    output = gcs_emulator.url(f"publish-staged-{uuid.uuid4().hex[:8]}")
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    for relative in _all_files(staged.output):
        name = output.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/" + relative
        bucket.blob(name).upload_from_filename(os.path.join(staged.output, relative))
    return Staged(output, staged.old, staged.new_run_id, staged.new)


def _all_files(directory: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(root, name), directory)
        for root, _, names in os.walk(directory)
        for name in names
    }


def gcs_copy(gcs_emulator, source_url: str, target_url: str) -> str:
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    source = source_url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
    target = target_url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
    for blob in bucket.list_blobs(prefix=source):
        bucket.copy_blob(blob, bucket, target + blob.name[len(source) :])
    return target_url


def gcs_files(gcs_emulator, url: str) -> set[str]:
    prefix = url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
    return {
        name[len(prefix) :]
        for name in gcs_emulator.list_objects(prefix)
        if not name.endswith("/") and not name[len(prefix) :].startswith("staging/tft-")
    }


def assert_only_the_published_run_is_left_on_gcs(gcs_emulator, url: str, crashed_attempts: int = 0):
    manifest = assert_complete_dataset(url)
    files = gcs_files(gcs_emulator, url)
    markers = {path for path in files if ".publishing." in path}
    assert len(markers) == crashed_attempts, markers
    assert all(path.startswith(manifest["run"]["dir"] + ".publishing.") for path in markers)
    files -= markers
    commits = {path for path in files if path.startswith(manifest_lib.MANIFESTS_DIR + "/")}
    files -= commits
    names = publish.named_files(manifest)
    assert files == {"dataset.json"} | {path for path in files if publish.is_named(path, names)}
    assert all(path == "dataset.json" or path.startswith(manifest["run"]["dir"] + "/") for path in files)


def test_on_gcs_a_crash_at_any_file_operation_of_publishing_leaves_a_complete_dataset(
    staged_gcs, gcs_emulator, gcs_dir, monkeypatch
):
    scratch = gcs_copy(gcs_emulator, staged_gcs.output, f"{gcs_dir}/count")
    with injected_faults(monkeypatch) as injector:
        publish_run(scratch, staged_gcs.new_run_id, staged_gcs.new)
    calls = injector.calls
    assert any(call.startswith("delete_batch") for call in calls), calls
    assert any(call.startswith("upload_from_string") for call in calls), calls  # the commit
    outcomes = []
    for crash_at in range(len(calls)):
        output = gcs_copy(gcs_emulator, staged_gcs.output, f"{gcs_dir}/crash-{crash_at}")
        with injected_faults(monkeypatch, crash_at=crash_at), pytest.raises(InjectedCrash):
            publish_run(output, staged_gcs.new_run_id, staged_gcs.new)
        found = published_dataset(output)
        expected = staged_gcs.old if found["run"]["id"] == staged_gcs.old["run"]["id"] else staged_gcs.new
        assert found == expected, f"crash before call {crash_at} ({calls[crash_at]})"
        outcomes.append("old" if expected is staged_gcs.old else "new")
        crashed_markers = len([path for path in gcs_files(gcs_emulator, output) if ".publishing." in path])
        publish_run(output, staged_gcs.new_run_id, staged_gcs.new)
        assert published_dataset(output) == staged_gcs.new
        assert_only_the_published_run_is_left_on_gcs(gcs_emulator, output, crashed_attempts=crashed_markers)
    switch = outcomes.index("new")
    assert outcomes == ["old"] * switch + ["new"] * (len(calls) - switch)


def gcs_clone_run(gcs_emulator, url: str, manifest: dict, run_id: str) -> dict:
    """clone_run on gs://: the run's objects copied under another run id; returns its manifest."""
    old_id = manifest["run"]["id"]
    gcs_copy(gcs_emulator, f"{url}/runs/{old_id}", f"{url}/runs/{run_id}")
    return json.loads(json.dumps(manifest).replace(old_id, run_id))


def test_on_gcs_p1_p2_then_a_newer_run_never_leave_dataset_json_naming_a_removed_run(
    staged_gcs, gcs_emulator, gcs_dir, tmp_path
):
    output = gcs_copy(gcs_emulator, staged_gcs.output, gcs_dir)
    a_id = run_id_between(staged_gcs.old["run"]["id"], staged_gcs.new_run_id)
    run_a = gcs_clone_run(gcs_emulator, output, staged_gcs.new, a_id)
    b_id = staged_gcs.new_run_id
    p2 = start_paused_publish(output, run_a, "before-switch", tmp_path, env=gcs_emulator.subprocess_env())
    assert published_dataset(output) == staged_gcs.old
    publish_run(output, a_id, run_a)  # P1
    assert published_dataset(output) == run_a
    publish_run(output, b_id, staged_gcs.new)  # B, and its cleanup
    assert published_dataset(output) == staged_gcs.new
    status = p2.resume()
    assert published_dataset(output) == staged_gcs.new
    assert status != 0
    assert f"run {a_id} is superseded: run {b_id}, which started later" in p2.output()
    publish_run(output, b_id, staged_gcs.new)
    assert_only_the_published_run_is_left_on_gcs(gcs_emulator, output)


@pytest.mark.parametrize("status", [403, 503])
def test_on_gcs_a_cleanup_that_fails_after_the_switch_warns_and_the_next_publish_removes_the_leftovers(
    staged_gcs, gcs_emulator, gcs_dir, gcs_read_faults, short_gcs_retries, caplog, status
):
    """A bucket retention policy (403 on every young object) or a 503 past its retries: the run is
    published all the same, and the cleanup is retried by the next publish."""
    output = gcs_copy(gcs_emulator, staged_gcs.output, gcs_dir)
    old_id = staged_gcs.old["run"]["id"]
    old_run = output.removeprefix(f"gs://{gcs_emulator.bucket}/") + f"/runs/{old_id}/"
    gcs_read_faults.faults = ReadFaults(deletes={old_run: status})
    with caplog.at_level(logging.WARNING, logger=gc.__name__):
        published = publish_run(output, staged_gcs.new_run_id, staged_gcs.new)
    assert published_dataset(output) == staged_gcs.new
    assert published["run"]["id"] == staged_gcs.new_run_id
    assert gcs_read_faults.injected_deletes
    assert f"(e.g. runs/{old_id}/" in caplog.text
    assert any(path.startswith(f"runs/{old_id}/") for path in gcs_files(gcs_emulator, output))

    gcs_read_faults.faults = ReadFaults()
    publish_run(output, staged_gcs.new_run_id, staged_gcs.new)
    assert_only_the_published_run_is_left_on_gcs(gcs_emulator, output)
