"""Records carried by reference (issue 32): a re-run lists a previous shard whose every record is unchanged
in its manifest as it is, in the earlier run's directory, and rewrites only the shards that changed; garbage
collection keeps a run while a kept version references its files. Three real Beam runs of a tiny corpus
(several shards a split): version 1, version 2 with one image added, version 3 with one image relabelled."""

import datetime
import json
import os
import shutil
import threading
import time

import pytest

from dataset_contract import leases
from dataset_contract import manifest as manifest_lib
from preprocess.publish import commit as publish
from preprocess.publish import gc
from preprocess.publish import store as dataset_store
from preprocess.publish.runs import new_run_id
from tests.preprocess.reuse.manifest_rows import corpus_rows, write_manifest
from tests.stage1 import read_split, run_stage1, write_corpus

IMAGE_SIZE = 16
# Retention 0: a superseded version is not kept for its readers, so only the references keep its run.
ARGS = ("--near-duplicates", "off", "--retention-days", "0")
SPLITS = ("train", "validation", "test")


def _shards(manifest) -> dict:
    return {shard["path"]: shard for info in manifest["splits"].values() for shard in info["shards"]}


def _own(manifest) -> dict:
    """The shards a version wrote itself (in its own run's directory)."""
    own = manifest["run"]["dir"] + "/"
    return {path: shard for path, shard in _shards(manifest).items() if path.startswith(own)}


def _ledger(output, manifest) -> dict:
    entries = {}
    for path in manifest_lib.ledger_file_paths(manifest):
        with open(os.path.join(output, path)) as handle:
            entries.update((entry["uri"], entry) for entry in map(json.loads, handle))
    return entries


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    base = tmp_path_factory.mktemp("by-reference")
    corpus, output = base / "corpus", base / "dataset"
    write_corpus(corpus, images_per_class=8, include_broken=False)
    rows = corpus_rows(corpus)
    # Left out of version 1: an image of the class with most images (its class is in version 1 too, so the
    # label vocabulary stays: a new class would move label indexes, and every record would be copied).
    labels = [label for _, label, _ in rows]
    added = next(row for row in rows if row[1] == max(labels, key=labels.count))
    write_manifest(base / "v1.csv", [row for row in rows if row is not added])
    first = run_stage1(base / "v1.csv", output, *ARGS, image_size=IMAGE_SIZE, encoding="uint8", min_shards=3)
    # Version 2: one image more (the one left out).
    write_manifest(base / "v2.csv", rows)
    second = run_stage1(base / "v2.csv", output, *ARGS, image_size=IMAGE_SIZE, encoding="uint8", min_shards=3)
    # Version 3: a train image of version 1 relabelled (another class that has train images).
    ledger = _ledger(output, second)
    train = [entry for entry in ledger.values() if entry["split"] == "train"]
    train_labels = sorted({entry["label"] for entry in train})
    # One of two train images of its class or more: the vocabulary stays.
    relabelled = next(
        entry["uri"]
        for entry in sorted(train, key=lambda entry: entry["uri"])
        if entry["uri"] != added[0] and sum(other["label"] == entry["label"] for other in train) > 1
    )
    old_label = ledger[relabelled]["label"]
    new_label = next(label for label in train_labels if label != old_label)
    rows3 = [[uri, new_label if uri == relabelled else label, split] for uri, label, split in rows]
    write_manifest(base / "v3.csv", rows3)
    third = run_stage1(base / "v3.csv", output, *ARGS, image_size=IMAGE_SIZE, encoding="uint8", min_shards=3)
    return {
        "output": output,
        "manifests": (first, second, third),
        "added": added[0],
        "relabelled": relabelled,
        "relabelled_shard": ledger[relabelled]["shard"],
    }


def test_a_rerun_with_one_image_added_references_every_previous_shard_and_writes_only_the_new_one(versions):
    first, second, _ = versions["manifests"]
    assert len(_shards(first)) >= 3
    # Every shard of version 1, as version 1 lists it (path into its run's directory, size, checksum).
    for path, shard in _shards(first).items():
        assert _shards(second)[path] == shard
    own = _own(second)
    assert sum(shard["num_examples"] for shard in own.values()) == 1
    assert set(_shards(second)) == set(_shards(first)) | set(own)
    inputs = second["inputs"]
    assert (inputs["num_decoded"], inputs["num_reused"]) == (1, first["inputs"]["num_written"])
    # Nothing copied: the new run's directory holds one shard of one record.
    run_dir = versions["output"] / second["run"]["dir"]
    assert sorted(name for name in os.listdir(run_dir) if name.endswith(".tfrecord")) == sorted(
        os.path.basename(path) for path in own
    )
    # The ledger says where each record is: the referenced shard, or the new one.
    ledger = _ledger(versions["output"], second)
    assert ledger[versions["added"]]["shard"] in own
    assert {entry["shard"] for uri, entry in ledger.items() if uri != versions["added"]} <= set(
        _shards(first)
    )


def test_a_relabel_rewrites_only_the_shard_that_held_the_image(versions):
    _, second, third = versions["manifests"]
    old_shard = _shards(second)[versions["relabelled_shard"]]
    assert set(_shards(third)) == (set(_shards(second)) - {old_shard["path"]}) | set(_own(third))
    # The shard's other records, copied, and the relabelled image, decoded again: nothing else is written.
    assert sum(shard["num_examples"] for shard in _own(third).values()) == old_shard["num_examples"]
    assert (third["inputs"]["num_decoded"], third["inputs"]["num_reused"]) == (
        1,
        second["inputs"]["num_written"] - 1,
    )
    rows = {row["uri"]: row for split in SPLITS for row in read_split(versions["output"], split, third)}
    assert rows[versions["relabelled"]]["label"] == third["labels"].index(
        rows[versions["relabelled"]]["class_name"]
    )
    assert len(rows) == third["inputs"]["num_written"]


def test_verify_and_the_stage_2_loader_read_a_version_that_references_earlier_runs(versions, capsys):
    from preprocess import verify as verify_cli  # noqa: PLC0415
    from train import load_dataset  # noqa: PLC0415

    output, third = versions["output"], versions["manifests"][2]
    assert {path.split("/")[1] for path in _shards(third)} == {
        manifest["run"]["id"] for manifest in versions["manifests"]
    }
    assert verify_cli.main([str(output)]) == 0, capsys.readouterr().out
    for split in [split for split in SPLITS if third["splits"][split]["num_examples"]]:
        count = sum(
            int(batch[1].shape[0]) for batch in load_dataset(str(output), split, batch_size=4, training=False)
        )
        assert count == third["splits"][split]["num_examples"], split


def _whole_copy(output, manifest, own_only=False) -> dict:
    """A new version holding every file `manifest` names in a run directory of its own (as a full rebuild
    would): it references no other run. `own_only`: only the files of the manifest's own run are copied, the
    other runs' stay referenced (as an incremental version would)."""
    run_id = new_run_id()
    own = manifest["run"]["dir"] + "/"

    def moved(path):
        if own_only and not path.startswith(own):
            return path
        return manifest_lib.join(manifest_lib.run_dir(run_id), path.split("/", 2)[2])

    for path in publish.named_files(manifest):
        if moved(path) == path:
            continue
        source, destination = output / path, output / moved(path)
        destination.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, destination)
    copy = json.loads(json.dumps(manifest))
    copy.pop("retained_runs", None)
    copy["run"] = {**copy["run"], "id": run_id, "dir": manifest_lib.run_dir(run_id)}
    for info in copy["splits"].values():
        for shard in info["shards"]:
            shard["path"] = moved(shard["path"])
    for key in ("error_files", "near_duplicate_files", "ledger_files"):
        for entry in copy.get(key) or []:
            entry["path"] = moved(entry["path"])
    copy["transform"] = {name: moved(path) for name, path in copy["transform"].items()}
    return copy


def test_gc_keeps_every_run_a_kept_version_references_and_removes_it_once_none_does(versions, tmp_path):
    output = tmp_path / "dataset"
    shutil.copytree(versions["output"], output)
    third = versions["manifests"][2]
    runs = [manifest["run"]["id"] for manifest in versions["manifests"]]
    # Superseded with no retention, yet every one referenced by the newest version: all stay.
    report = gc.collect_garbage(str(output))
    assert report.removed_runs == [] and all((output / "runs" / run).is_dir() for run in runs)
    assert any(
        f"run {runs[0]}: the newest version (run {runs[2]}) references its files" == r for r in report.kept
    )
    # A training job leases version 3; a version that references nothing supersedes it, with no retention.
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    lease = leases.lease_name(runs[2], leases.holder_id("/models/a"), expiry)
    dataset_store.open_store(str(output)).create_if_absent(lease, b"{}")
    whole = _whole_copy(output, third)
    fourth_id = whole["run"]["id"]
    published = publish.publish_run(str(output), fourth_id, whole, retention_days=0, gc_budget=0)
    assert [entry["id"] for entry in published["retained_runs"]] == [runs[2]]
    assert published["retained_runs"][0]["references"] == runs[:2]
    # The leased version 3 stays, and with it the runs whose shards it names.
    report = gc.collect_garbage(str(output))
    assert report.removed_runs == [] and all((output / "runs" / run).is_dir() for run in runs)
    assert publish.missing_run_files(str(output), runs[2], third) == []
    # Once nothing keeps version 3, its run and those it referenced go.
    (output / lease).unlink()
    report = gc.collect_garbage(str(output))
    assert sorted(report.removed_runs) == sorted(runs)
    assert publish.missing_run_files(str(output), fourth_id, whole) == []


def test_the_ledger_records_each_files_size_and_mtime_beside_its_key(versions):
    """What the next re-run's quick check compares (tests/preprocess/reuse/test_quick_check.py): every entry of
    version 3 (its files were written long enough before it was listed) and its source size."""
    output, third = versions["output"], versions["manifests"][2]
    ledger = _ledger(output, third)
    assert len(ledger) == third["inputs"]["num_written"]
    for uri, entry in ledger.items():
        stat = os.stat(uri)
        assert (entry["size"], entry["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns), uri
        assert len(entry["source_size"]) == 2 and min(entry["source_size"]) > 0


def test_gc_racing_a_publish_that_references_earlier_runs_leaves_them_whole(versions, tmp_path, monkeypatch):
    """A run that started after the published one references earlier runs' shards; while its publish step is
    between its checks and its commit, garbage collection runs with a head that references none of them (a
    full rebuild that started before it, with no retention): the referenced runs must survive."""
    from preprocess.publish import protocol  # noqa: PLC0415

    output = tmp_path / "dataset"
    shutil.copytree(versions["output"], output)
    third = versions["manifests"][2]
    runs = [manifest["run"]["id"] for manifest in versions["manifests"]]
    rebuild = _whole_copy(output, third)  # started first
    later = _whole_copy(output, third, own_only=True)  # started after it: references runs 1 and 2
    assert protocol.referenced_runs(later) == runs[:2] and later["run"]["id"] > rebuild["run"]["id"]
    publish.publish_run(str(output), rebuild["run"]["id"], rebuild, retention_days=0, gc_budget=0)
    flag = tmp_path / "paused"
    monkeypatch.setenv(protocol.PAUSE_ENV, f"before-switch:{flag}")
    published = {}
    thread = threading.Thread(
        target=lambda: published.update(
            publish.publish_run(str(output), later["run"]["id"], later, retention_days=0, gc_budget=0)
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), "the publish step never reached its commit"
        report = gc.collect_garbage(str(output))
    finally:
        flag.unlink(missing_ok=True)
        thread.join(60)
    assert all((output / "runs" / run).is_dir() for run in runs[:2]), report.removed_runs
    assert published["run"]["id"] == later["run"]["id"]
    assert publish.missing_run_files(str(output), later["run"]["id"], later) == []
    # Once it is published, the head keeps the runs it references; the others go.
    monkeypatch.delenv(protocol.PAUSE_ENV)
    report = gc.collect_garbage(str(output))
    assert sorted(report.removed_runs) == sorted([runs[2], rebuild["run"]["id"]])
    assert publish.missing_run_files(str(output), later["run"]["id"], later) == []
