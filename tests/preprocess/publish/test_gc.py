"""Garbage collection (`python -m preprocess.gc`, preprocess/publish/gc.py) on real directories.

The starting point: a real stage 1 dataset (module scope) and, by copies of its run under other run ids,
a directory whose head (D) retains a run (B, for 30 days), whose oldest run (A) is past its retention but
held by a training job's lease, which holds two runs that started before D and never published (X, C),
and one that started after D (it may still publish): what must go, what must stay, and the windows
between a remover, a trainer and a publisher.
"""

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dataset_contract import leases
from preprocess.publish import commit as publish
from preprocess.publish import gc, protocol
from preprocess.publish import store as dataset_store
from preprocess.publish.runs import RunPaths, new_run_id
from tests.publishing import InjectedCrash, assert_complete_dataset, injected_faults, write_marker

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
# The dataset every test starts from, written once per session (shared with test_commit_log.py and
# test_publish_retention.py): the sample corpus, 3 images per class, any failures allowed.
PUBLISHED = {"images_per_class": 3, "image_size": 16, "encoding": "uint8", "min_shards": 1}


@dataclasses.dataclass
class Garbage:
    output: str
    head: str  # D
    retained: str  # B, retained for 30 days
    leased: str  # A, past its retention, leased
    never_published: tuple  # X and C, which started before D
    manifests: dict
    later: str  # started after D: may still publish


def clone(output: str, manifest: dict, run_id: str) -> dict:
    shutil.copytree(RunPaths(output, manifest["run"]["id"]).run_dir, RunPaths(output, run_id).run_dir)
    os.makedirs(RunPaths(output, run_id).staging("decoded"))
    with open(RunPaths(output, run_id).staging("decoded", "part-0"), "wb") as handle:
        handle.write(b"a spilled part")
    return json.loads(json.dumps(manifest).replace(manifest["run"]["id"], run_id))


def lease(output: str, run_id: str, model_dir: str = "/models/a"):
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    dataset_store.open_store(output).create_if_absent(
        leases.lease_name(run_id, leases.holder_id(model_dir), expiry), b"{}"
    )


@pytest.fixture(scope="module")
def garbage(tmp_path_factory, shared_stage1_datasets) -> Garbage:
    output = str(tmp_path_factory.mktemp("garbage") / "dataset")
    _, a = shared_stage1_datasets.copy(output, **PUBLISHED)
    a_id = a["run"]["id"]
    x_id, b_id, c_id, d_id, later_id = sorted(new_run_id() for _ in range(5))
    manifests = {a_id: a}
    for run_id in (x_id, b_id, c_id, d_id, later_id):
        manifests[run_id] = clone(output, a, run_id)
    # B supersedes A with no retention; D supersedes B keeping it 30 days; X and C, which started before
    # D, never publish; a run that started after D may still publish.
    publish.publish_run(output, b_id, manifests[b_id], retention_days=0, gc_budget=0)
    publish.publish_run(output, d_id, manifests[d_id], retention_days=30, gc_budget=0)
    lease(output, a_id)
    for run_id in (x_id, c_id):
        # A publish attempt of each that died long ago.
        marker = RunPaths(output, run_id).marker(publish.PUBLISHING_MARKER, "dead")
        write_marker(marker, run_id)
        long_ago = datetime.datetime.now().timestamp() - publish.PUBLISH_MARKER_TTL_SECONDS - 60
        os.utime(marker, (long_ago, long_ago))
    return Garbage(output, d_id, b_id, a_id, (x_id, c_id), manifests, later_id)


@pytest.fixture
def directory(garbage, tmp_path) -> Garbage:
    copy = str(tmp_path / "dataset")
    shutil.copytree(garbage.output, copy)
    return dataclasses.replace(garbage, output=copy)


def files_below(directory: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(root, name), directory)
        for root, _, names in os.walk(directory)
        for name in names
    }


def assert_needed_runs_are_whole(directory: Garbage):
    assert assert_complete_dataset(directory.output)["run"]["id"] == directory.head
    for run_id in (directory.retained, directory.leased):
        assert publish.missing_run_files(directory.output, run_id, directory.manifests[run_id]) == []


def test_gc_removes_what_no_commit_retention_or_lease_needs_and_a_second_call_does_nothing(directory):
    report = gc.collect_garbage(directory.output)
    assert sorted(report.removed_runs) == sorted(directory.never_published)
    assert_needed_runs_are_whole(directory)
    runs = {
        name.split("/")[1].split(".")[0] for name in files_below(directory.output) if name.startswith("runs/")
    }
    assert runs == {directory.head, directory.retained, directory.leased, directory.later}
    assert {name.split("/")[1] for name in files_below(directory.output) if name.startswith("staging/")} == {
        directory.later
    }
    assert f"run {directory.later}: it started after the published run and may still publish" in report.kept
    assert report.markers_written == 2  # one per run it removed
    assert any("a training job holds a live lease" in reason for reason in report.kept)
    assert any("stays for its readers until" in reason for reason in report.kept)
    before = files_below(directory.output)
    again = gc.collect_garbage(directory.output)
    assert (again.deleted, again.markers_written, again.removed_runs) == (0, 0, [])
    assert files_below(directory.output) == before


def test_a_dry_run_says_what_would_go_and_removes_nothing(directory):
    before = files_below(directory.output)
    report = gc.collect_garbage(directory.output, dry_run=True)
    assert sorted(report.removed_runs) == sorted(directory.never_published) and report.deleted > 0
    assert "would delete" in report.lines()[0]
    assert files_below(directory.output) == before


def test_a_crash_at_any_file_operation_of_gc_leaves_every_needed_run_and_the_next_call_finishes(
    garbage, tmp_path, monkeypatch
):
    reference = tmp_path / "reference"
    shutil.copytree(garbage.output, reference)
    with injected_faults(monkeypatch) as injector:
        gc.collect_garbage(str(reference))
    calls = injector.calls
    assert len(calls) > 20, calls
    finished = files_below(str(reference))
    for crash_at in range(len(calls)):
        output = tmp_path / f"crash-{crash_at}"
        shutil.copytree(garbage.output, output)
        with injected_faults(monkeypatch, crash_at=crash_at), pytest.raises(InjectedCrash):
            gc.collect_garbage(str(output))
        crashed = dataclasses.replace(garbage, output=str(output))
        assert_needed_runs_are_whole(crashed)
        # The next call finishes the work: the same directory as a call that was never interrupted
        # (a removal marker written before the crash may wait for its expiry, harmlessly).
        gc.collect_garbage(str(output))
        left = {name for name in files_below(str(output)) if "/removing." not in name}
        assert left == finished, f"crash before call {crash_at} ({calls[crash_at]})"
        shutil.rmtree(output)


def test_a_trainer_that_takes_a_lease_while_the_remover_announces_itself_keeps_its_run(
    directory, monkeypatch
):
    """The window: the collector checked the leases (none), a trainer writes its lease, the collector
    writes its removal marker. Looking again after its marker, the collector sees the lease and backs off."""
    victim = directory.never_published[0]
    real_pause = protocol.pause_point
    taken = threading.Event()

    def pause(point, run_id):
        if point == "removal-announced" and run_id == victim and not taken.is_set():
            lease(directory.output, victim, "/models/late-trainer")
            taken.set()
        real_pause(point, run_id)

    monkeypatch.setattr(protocol, "pause_point", pause)
    report = gc.collect_garbage(directory.output)
    assert taken.is_set()
    assert victim not in report.removed_runs
    assert f"run {victim}: a training job took a lease on it just now" in report.kept
    assert publish.missing_run_files(directory.output, victim, directory.manifests[victim]) == []
    # The trainer's side (issue 31, part B) sees the live removal marker next to its lease.
    names = os.listdir(os.path.join(directory.output, leases.run_leases_dir(victim)))
    assert leases.live_removals(names, datetime.datetime.now(datetime.timezone.utc))


def test_the_command_reports_and_refuses_a_directory_that_holds_no_dataset(directory, tmp_path):
    def command(*args):
        return subprocess.run(
            [sys.executable, "-m", "preprocess.gc", *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    result = command(directory.output, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"{directory.output}: would delete" in result.stdout
    assert f"would remove run {directory.never_published[0]}" in result.stdout
    assert os.path.isdir(RunPaths(directory.output, directory.never_published[0]).run_dir)
    result = command(str(tmp_path / "not-a-dataset"))
    assert result.returncode == 2
    assert "holds no dataset" in result.stderr and "Traceback" not in result.stderr


def test_on_a_hierarchical_namespace_bucket_gc_deletes_the_folders_it_empties(
    garbage, gcs_emulator, gcs_dir, gcs_read_faults
):
    gcs_read_faults.hierarchical_namespace = True
    from google.cloud import storage  # noqa: PLC0415

    bucket = storage.Client().bucket(gcs_emulator.bucket)
    prefix = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
    for relative in files_below(garbage.output):
        bucket.blob(prefix + relative).upload_from_filename(os.path.join(garbage.output, relative))
    victim = garbage.never_published[0]
    assert f"{prefix}runs/{victim}/transform_fn/" in gcs_read_faults.folders
    report = gc.collect_garbage(gcs_dir)
    assert victim in report.removed_runs
    assert not [folder for folder in gcs_read_faults.folders if folder.startswith(f"{prefix}runs/{victim}/")]
    assert not [
        folder for folder in gcs_read_faults.folders if folder.startswith(f"{prefix}staging/{victim}/")
    ]
    assert f"{prefix}runs/{garbage.head}/transform_fn/" in gcs_read_faults.folders
    assert_complete_dataset(gcs_dir)
    # A publish removes its own staging, folders and all.
    bucket.blob(f"{prefix}staging/{garbage.head}/decoded/part-0").upload_from_string(b"spilled")
    publish.remove_unnamed_files_of_run(
        dataset_store.open_store(gcs_dir), garbage.head, garbage.manifests[garbage.head]
    )
    assert not [
        folder for folder in gcs_read_faults.folders if folder.startswith(f"{prefix}staging/{garbage.head}/")
    ]


def test_removing_one_run_by_name_spares_the_published_and_the_leased_ones(directory):
    assert gc.remove_run(directory.output, directory.retained)  # retention is the caller's to waive
    assert not os.path.exists(RunPaths(directory.output, directory.retained).run_dir)
    assert not gc.remove_run(directory.output, directory.head)
    assert not gc.remove_run(directory.output, directory.leased)
    assert_complete_dataset(directory.output)
    assert (
        publish.missing_run_files(directory.output, directory.leased, directory.manifests[directory.leased])
        == []
    )


def test_on_gcs_a_crash_at_any_file_operation_of_gc_leaves_every_needed_run_and_the_next_call_finishes(
    garbage, gcs_emulator, gcs_dir, monkeypatch
):
    from google.cloud import storage  # noqa: PLC0415

    bucket = storage.Client().bucket(gcs_emulator.bucket)

    def upload(url: str) -> Garbage:
        prefix = url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
        for relative in files_below(garbage.output):
            bucket.blob(prefix + relative).upload_from_filename(os.path.join(garbage.output, relative))
        return dataclasses.replace(garbage, output=url)

    def objects(url: str) -> set[str]:
        prefix = url.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
        return {name[len(prefix) :] for name in gcs_emulator.list_objects(prefix)}

    reference = upload(f"{gcs_dir}/reference")
    with injected_faults(monkeypatch) as injector:
        gc.collect_garbage(reference.output)
    calls = injector.calls
    assert any(call.startswith("delete_batch") for call in calls), calls
    finished = objects(reference.output)
    for crash_at in range(len(calls)):
        crashed = upload(f"{gcs_dir}/crash-{crash_at}")
        with injected_faults(monkeypatch, crash_at=crash_at), pytest.raises(InjectedCrash):
            gc.collect_garbage(crashed.output)
        assert_needed_runs_are_whole(crashed)
        gc.collect_garbage(crashed.output)
        left = {name for name in objects(crashed.output) if "/removing." not in name}
        assert left == finished, f"crash before call {crash_at} ({calls[crash_at]})"
