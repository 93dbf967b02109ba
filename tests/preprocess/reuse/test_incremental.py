"""Incremental versions (issue 32), on real Beam runs of a tiny corpus listed in a CSV manifest: version 1,
then version 2 with images added, removed, relabelled, a published image moved by a named split, an exact
copy and an altered copy of published train images; then a change of --image-size. One fixture, three
runs; every test reads what they wrote."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dataset_contract import commit_log
from dataset_contract import manifest as manifest_lib
from tests.preprocess.reuse.manifest_rows import corpus_rows, near_jpeg_copy, write_manifest
from tests.stage1 import read_manifest, read_split, run_stage1, write_corpus

REPO = Path(__file__).resolve().parents[3]
IMAGE_SIZE = 24
SPLITS = ("train", "validation", "test")
MAX_MOVED = ("--near-duplicate-max-moved", "0.5")


def _records(output, manifest):
    return {
        row["uri"]: {**row, "split": split} for split in SPLITS for row in read_split(output, split, manifest)
    }


def _altered_copy_elsewhere(candidates, path):
    """(original, path): a JPEG re-encoding of one of `candidates` written to `path`, near it by the audit's
    signature, whose own content would put it in another split than train."""
    for original in candidates:
        if near_jpeg_copy(original, path, IMAGE_SIZE, lambda split: split != "train"):
            return original, path
    raise AssertionError("no train image of the corpus has a near-duplicate JPEG re-encoding")


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    base = tmp_path_factory.mktemp("incremental")
    corpus, output, new = base / "corpus", base / "dataset", base / "new"
    write_corpus(corpus, images_per_class=6, include_broken=False)
    new.mkdir()
    rows = corpus_rows(corpus)
    write_manifest(base / "v1.csv", rows)
    # One move in a dozen images is past the audit's default guard (5% of the images).
    first = run_stage1(base / "v1.csv", output, *MAX_MOVED, image_size=IMAGE_SIZE, encoding="uint8")
    v1 = _records(output, first)
    classes = sorted({label for _, label, _ in rows})
    rows = [row for row in rows if row[0] in v1]  # the exact copies of the corpus are not in the records
    removed = [row[0] for row in rows[:2]]
    rows = rows[2:]
    # Relabelled: the same file under another class.
    relabelled = rows[0][0]
    rows[0] = [relabelled, next(name for name in classes if name != rows[0][1]), ""]
    # A published image that the manifest now names a split for, another than its published one.
    moved = rows[1][0]
    moved_to = next(split for split in ("test", "validation") if split != v1[moved]["split"])
    rows[1] = [moved, rows[1][1], moved_to]
    # New images: fresh noise, one per class.
    rng = np.random.default_rng(7)
    added = []
    for name in classes:
        path = str(new / f"added-{name}.png")
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(path)
        added.append(path)
        rows.append([path, name, ""])
    # An exact copy of a published train image, and an altered copy whose own content would put it in
    # another split: it joins the original's near-duplicate group, so it takes the original's split.
    original, altered_copy = _altered_copy_elsewhere(
        [
            uri
            for uri, row in sorted(v1.items())
            if row["split"] == "train" and uri not in (relabelled, moved, *removed)
        ],
        str(new / "altered-copy.jpg"),
    )
    label = v1[original]["class_name"]
    exact_copy = str(new / "exact-copy.png")
    shutil.copyfile(original, exact_copy)
    rows += [[exact_copy, label, ""], [altered_copy, label, ""]]
    write_manifest(base / "v2.csv", rows)
    second = run_stage1(base / "v2.csv", output, *MAX_MOVED, image_size=IMAGE_SIZE, encoding="uint8")
    changes = {
        "removed": removed,
        "relabelled": relabelled,
        "relabelled_to": rows[0][1],
        "moved": moved,
        "moved_to": moved_to,
        "added": added,
        "original": original,
        "exact_copy": exact_copy,
        "altered_copy": altered_copy,
        "v2.csv": base / "v2.csv",
    }
    return first, second, changes, output


def test_version_2_decodes_only_new_and_changed_inputs(versions):
    first, second, changes, _ = versions
    inputs = second["inputs"]
    # Decoded: the added images, the relabelled one, the altered copy. The exact copy is a duplicate of
    # the published image; every other input, the moved one included, is carried over.
    assert inputs["num_decoded"] == len(changes["added"]) + 2
    assert inputs["num_reused"] == first["inputs"]["num_written"] - len(changes["removed"]) - 1
    assert inputs["num_duplicates"] == 1
    assert inputs["num_written"] == inputs["num_reused"] + inputs["num_decoded"] - inputs["num_failed"]
    assert inputs["num_found"] == (
        inputs["num_written"]
        + inputs["num_failed"]
        + inputs["num_duplicates"]
        + inputs["num_near_duplicates"]
    )
    assert second["run"]["built_from"] == first["run"]["id"] and second["run"]["full_rebuild"] is None
    assert first["run"]["built_from"] is None and first["inputs"]["num_reused"] == 0


def test_version_2_holds_what_its_inputs_say(versions, capsys):
    from preprocess import verify as verify_cli  # noqa: PLC0415

    first, second, changes, output = versions
    # Whole: every shard and the ledger as the manifest lists them, every record sound.
    assert verify_cli.main([str(output)]) == 0, capsys.readouterr().out
    v1, v2 = _records(output, first), _records(output, second)
    with open(changes["v2.csv"]) as handle:
        expected = {row["uri"]: row["label"] for row in csv.DictReader(handle)}
    kept_copy = min(changes["original"], changes["exact_copy"])
    del expected[max(changes["original"], changes["exact_copy"])]
    assert sorted(v2) == sorted(expected)
    for uri, row in v2.items():
        assert row["class_name"] == expected[uri], uri
        assert row["label"] == second["labels"].index(row["class_name"]), uri
    # A carried record is the published one, byte for byte (the pixels of the same content).
    for uri, row in v2.items():
        if uri in v1:
            np.testing.assert_array_equal(row["image"], v1[uri]["image"])
    assert v2[kept_copy]["sha256"] == v1[changes["original"]]["sha256"]
    assert not set(changes["removed"]) & set(v2)
    assert v2[changes["relabelled"]]["class_name"] == changes["relabelled_to"]


def test_statistics_equal_a_full_recompute_over_the_train_split(versions):
    _, second, _, output = versions
    means, squares = [], []
    for row in read_split(output, "train", second):
        pixels = row["image"].reshape(-1, 3).astype(np.float64)
        means.append(pixels.mean(axis=0))
        squares.append((pixels**2).mean(axis=0))
    mean = np.mean(means, axis=0)
    std = np.sqrt(np.mean(squares, axis=0) - mean**2)
    np.testing.assert_allclose(second["normalization"]["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(second["normalization"]["std"], std, rtol=1e-6)


def test_no_published_image_moves_but_for_a_named_split(versions):
    first, second, changes, output = versions
    v1, v2 = _records(output, first), _records(output, second)
    for uri, row in v2.items():
        if uri in v1 and uri != changes["moved"]:
            assert row["split"] == v1[uri]["split"], uri
    assert v2[changes["moved"]]["split"] == changes["moved_to"]
    assert second["inputs"]["num_moved_by_named_split"] == 1
    assert second["inputs"]["moved_by_named_split"] == [
        {"uri": changes["moved"], "from": v1[changes["moved"]]["split"], "to": changes["moved_to"]}
    ]


def test_a_new_altered_copy_of_a_published_image_takes_its_split(versions):
    first, second, changes, output = versions
    v2 = _records(output, second)
    assert v2[changes["altered_copy"]]["split"] == "train"  # its content alone would say another split
    groups = []
    for relative in manifest_lib.near_duplicate_file_paths(second):
        with open(os.path.join(output, relative)) as handle:
            groups += [json.loads(line) for line in handle]
    (group,) = [group for group in groups if changes["altered_copy"] in group["uris"]]
    assert min(changes["original"], changes["exact_copy"]) in group["uris"]


def test_the_summary_says_decoded_and_reused(versions):
    from preprocess.inspect.summary import format_summary  # noqa: PLC0415

    first, second, changes, output = versions
    text = format_summary(second, str(output))
    inputs = second["inputs"]
    assert (
        f"  {inputs['num_decoded']} decoded + {inputs['num_reused']} reused (carried over from run "
        f"{first['run']['id']}, neither read nor decoded)"
    ) in text
    assert f"1 published images moved to the split their input names: {changes['moved']}" in text


def test_a_rerun_at_the_same_size_reads_no_source_header_before_it_starts(versions, monkeypatch):
    """The launcher's check of --image-size against the sources (size_check) reads up to 24 headers: not
    again for a directory that holds a version of this size, whose sources it checked then."""
    from preprocess import options  # noqa: PLC0415
    from preprocess.inputs import size_check  # noqa: PLC0415

    _, _, changes, output = versions
    checked = []
    monkeypatch.setattr(size_check, "check_image_size", lambda *args: checked.append(args))
    argv = ["--input", str(changes["v2.csv"]), "--output", str(output), "--encoding", "uint8"]
    size_check.warn_if_upscaled(options.parse_args([*argv, "--image-size", str(IMAGE_SIZE)])[0])
    assert checked == []
    size_check.warn_if_upscaled(options.parse_args([*argv, "--image-size", str(IMAGE_SIZE + 8)])[0])
    size_check.warn_if_upscaled(options.parse_args([*argv, "--image-size", str(IMAGE_SIZE), "--rebuild"])[0])
    assert len(checked) == 2


def test_rebuild_and_a_template_decode_everything_and_say_why(versions):
    from preprocess import options  # noqa: PLC0415
    from preprocess.pipeline import job_config  # noqa: PLC0415
    from preprocess.reuse.previous import TEMPLATE, plan_reuse  # noqa: PLC0415

    _, second, changes, output = versions
    argv = ["--input", str(changes["v2.csv"]), "--output", str(output), "--encoding", "uint8"]
    config = job_config(options.parse_args([*argv, "--image-size", str(IMAGE_SIZE), "--rebuild"])[0], "b")
    assert plan_reuse(str(output), config, rebuild=False).incremental
    forced = plan_reuse(str(output), config, rebuild=True)
    assert (forced.incremental, forced.built_from) == (False, second["run"]["id"])
    assert forced.announcement() == "full rebuild, every input decoded again: --rebuild"
    assert plan_reuse(str(output), config, rebuild=False, template=True).full_rebuild == TEMPLATE


def test_a_change_of_image_size_is_a_full_rebuild_said_in_one_line(versions, capsys):
    _, second, changes, output = versions
    capsys.readouterr()
    manifest = run_stage1(changes["v2.csv"], output, *MAX_MOVED, image_size=IMAGE_SIZE + 8, encoding="uint8")
    said = [line for line in capsys.readouterr().out.splitlines() if "full rebuild" in line]
    assert said == [
        f"preprocess: full rebuild, every input decoded again: --image-size (the stored square) is "
        f"{IMAGE_SIZE + 8}, the published version's is {IMAGE_SIZE}"
    ]
    assert manifest["inputs"]["num_reused"] == 0
    assert manifest["inputs"]["num_decoded"] == second["inputs"]["num_written"]
    assert manifest["run"]["built_from"] == second["run"]["id"]


def test_source_image_sizes_count_the_carried_images_as_a_full_rebuild_does(versions):
    """Runs after the --image-size change above: a full rebuild of version 2's inputs (the source sizes do
    not depend on the stored size)."""
    _, second, _, output = versions
    rebuilt = read_manifest(output)
    assert rebuilt["run"]["built_from"] == second["run"]["id"] and rebuilt["inputs"]["num_reused"] == 0
    assert second["inputs"]["num_reused"] > 0
    assert second["source_image_sizes"] == rebuilt["source_image_sizes"]
    assert second["source_image_sizes"]["count"] == second["inputs"]["num_written"]


def test_kill_9_during_an_incremental_run_leaves_the_previous_version_whole(versions, tmp_path, capsys):
    """An incremental run on whichever version is newest (after the --image-size change above when the
    module runs whole): the same pixel settings, so it carries the other images over."""
    from preprocess import verify as verify_cli  # noqa: PLC0415

    _, _, changes, output = versions
    previous = read_manifest(output)
    previous_records = _records(output, previous)
    # One more image: the run carries the others over, and decodes it.
    added = tmp_path / "one-more.png"
    Image.fromarray(np.random.default_rng(11).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(added)
    with open(changes["v2.csv"]) as handle:
        rows = [line for line in handle.read().splitlines() if line][1:]
    manifest = tmp_path / "v4.csv"
    manifest.write_text("uri,label,split\n" + "\n".join([*rows, f"{added},circle,"]) + "\n")
    runs_before = set(os.listdir(output / "runs"))
    log_path = tmp_path / "stage1.log"
    argv = [sys.executable, "-m", "preprocess", "--input", str(manifest), "--output", str(output)]
    argv += [
        "--image-size",
        str(previous["image"]["height"]),
        "--encoding",
        "uint8",
        "--max-failed-fraction",
        "1",
        *MAX_MOVED,
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        # Killed once the incremental run writes into its own run directory (it has read the ledger).
        while not any(
            os.listdir(output / "runs" / name)
            for name in set(os.listdir(output / "runs")) - runs_before
            if os.path.isdir(output / "runs" / name)
        ):
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert "incremental:" in log_path.read_text()
    assert read_manifest(output) == previous
    assert verify_cli.main([str(output)]) == 0, capsys.readouterr().out
    # A reader of the previous version finishes: every record of every shard it names, as before.
    after = _records(output, previous)
    assert sorted(after) == sorted(previous_records)
    for uri, row in after.items():
        assert row["sha256"] == previous_records[uri]["sha256"]
        np.testing.assert_array_equal(row["image"], previous_records[uri]["image"])


def test_a_carried_record_gets_its_new_label_index_and_uri_and_keeps_its_pixels():
    """A class added or removed shifts the label indices; a renamed copy changes the URI: the record is
    rewritten, never decoded or encoded again (preprocess/reuse/stage.py)."""
    import tensorflow as tf  # noqa: PLC0415

    from dataset_contract import features  # noqa: PLC0415
    from preprocess.reuse.stage import rewritten  # noqa: PLC0415
    from preprocess.write.encode import serialize_example  # noqa: PLC0415

    record = serialize_example(b"\x01\x02\x03", 1, b"cat", b"ab" * 32, b"/a/cat/1.png")
    assert rewritten(record, 1, "/a/cat/1.png") is record
    feature = tf.train.Example.FromString(rewritten(record, 2, "/b/cat/1.png")).features.feature
    assert feature[features.LABEL].int64_list.value == [2]
    assert feature[features.URI].bytes_list.value == [b"/b/cat/1.png"]
    assert feature[features.IMAGE].bytes_list.value == [b"\x01\x02\x03"]
    assert feature[features.CLASS_NAME].bytes_list.value == [b"cat"]


def test_a_published_version_signed_by_another_signature_version_is_rebuilt(versions):
    """Carried signatures are compared with the ones this run takes: a version signed by an older signature
    (or by none recorded) cannot be carried over, and the run says why."""
    from preprocess import options  # noqa: PLC0415
    from preprocess.near_duplicates.signature import SIGNATURE_VERSION  # noqa: PLC0415
    from preprocess.pipeline import job_config  # noqa: PLC0415
    from preprocess.reuse.previous import plan_reuse  # noqa: PLC0415

    _, second, changes, output = versions
    assert second["near_duplicates"]["signature_version"] == SIGNATURE_VERSION
    argv = ["--input", str(changes["v2.csv"]), "--output", str(output), "--encoding", "uint8"]
    config = job_config(options.parse_args([*argv, "--image-size", str(IMAGE_SIZE)])[0], "b")
    older = json.loads(json.dumps(second))
    older["near_duplicates"]["signature_version"] = SIGNATURE_VERSION - 1
    copy = output.parent / "older-signature"
    shutil.copytree(output, copy)
    head = commit_log.head_of(os.listdir(copy / commit_log.MANIFESTS_DIR))[1]
    (copy / commit_log.MANIFESTS_DIR / head).write_text(json.dumps(older))
    plan = plan_reuse(str(copy), config, rebuild=False)
    assert not plan.incremental
    assert f"signature is version {SIGNATURE_VERSION}" in plan.announcement()
    (copy / commit_log.MANIFESTS_DIR / head).write_text(json.dumps(second))
    assert plan_reuse(
        str(copy), config, rebuild=False
    ).incremental  # the same version, signed as this run signs


@pytest.fixture(scope="module")
def drop_versions(tmp_path_factory):
    """`--near-duplicates drop`: version 1, then version 2 that adds an altered copy of a published train
    image (its own content would put it in another split): two Beam runs on a corpus of a few images."""
    base = tmp_path_factory.mktemp("incremental-drop")
    corpus, output = base / "corpus", base / "dataset"
    write_corpus(corpus, images_per_class=4, include_broken=False)
    rows = corpus_rows(corpus)
    write_manifest(base / "v1.csv", rows)
    drop = ("--near-duplicates", "drop", *MAX_MOVED)
    first = run_stage1(base / "v1.csv", output, *drop, image_size=IMAGE_SIZE, encoding="uint8")
    v1 = _records(output, first)
    original, altered_copy = _altered_copy_elsewhere(
        [uri for uri, row in sorted(v1.items()) if row["split"] == "train"], str(base / "altered-copy.jpg")
    )
    rows = [row for row in rows if row[0] in v1] + [[altered_copy, v1[original]["class_name"], ""]]
    write_manifest(base / "v2.csv", rows)
    second = run_stage1(base / "v2.csv", output, *drop, image_size=IMAGE_SIZE, encoding="uint8")
    return first, second, original, altered_copy, output


def test_drop_mode_keeps_the_published_image_and_drops_its_new_altered_copy(drop_versions):
    """A carried (published) record joins grouping in drop mode too: its group keeps it, never drops it,
    and drops the new copy, which would otherwise be written in another split than its original."""
    first, second, original, altered_copy, output = drop_versions
    v1, v2 = _records(output, first), _records(output, second)
    assert sorted(v2) == sorted(v1)  # the copy is not written; every published image is, in its split
    assert all(row["split"] == v1[uri]["split"] for uri, row in v2.items())
    inputs = second["inputs"]
    assert (inputs["num_reused"], inputs["num_decoded"], inputs["num_near_duplicates"]) == (len(v1), 1, 1)
    assert inputs["num_found"] == (
        inputs["num_written"]
        + inputs["num_failed"]
        + inputs["num_duplicates"]
        + inputs["num_near_duplicates"]
    )
    groups = []
    for relative in manifest_lib.near_duplicate_file_paths(second):
        with open(os.path.join(output, relative)) as handle:
            groups += [json.loads(line) for line in handle]
    (group,) = [group for group in groups if altered_copy in group["uris"]]
    kept = dict(zip(group["uris"], group["kept"], strict=True))
    assert kept == {original: True, altered_copy: False}
    assert group["splits"] == ["train", "train"]


def test_drop_mode_never_drops_a_carried_member_and_keeps_whole_a_group_that_outvotes_its_label():
    """Two carried members of one group are both kept (the new copy dropped); when the new copies outvote
    the carried member's label, no one is dropped and the group is flagged kept_whole (grouping.py)."""
    from preprocess.near_duplicates.grouping import Flood, SignedImage, decide_group  # noqa: PLC0415

    def image(key, label, carried=False):
        published = "train" if carried else None
        return SignedImage(key, 0, key, label, "test", False, published_split=published, carried=carried)

    def decide(images):
        decision = decide_group(min(i.key for i in images), "test", Flood.merge(map(Flood.of, images)), 50)
        return decision, {i.key: (m.kept, m.split) for i in images for m in [decision.member(i, drop=True)]}

    _, members = decide([image("a", "cat", True), image("b", "cat", True), image("c", "cat")])
    assert members == {"a": (True, "train"), "b": (True, "train"), "c": (False, "train")}
    decision, members = decide([image("a", "cat", True), image("b", "dog"), image("c", "dog")])
    assert decision.flags == ("kept_whole", "published_outvoted")
    assert members == {"a": (True, "train"), "b": (True, "train"), "c": (True, "train")}


def test_the_summary_says_how_many_groups_drop_mode_kept_whole_for_a_published_image():
    from preprocess.inspect.summary import format_near_duplicates  # noqa: PLC0415

    near = {"mode": "drop", "max_distance": 10, "groups": 3, "images_in_groups": 7, "dropped": 2}
    lines = format_near_duplicates(
        {"near_duplicates": {**near, "groups_kept_whole": 2, "groups_kept_whole_published": 1}}
    )
    assert (
        "    kept whole: 2 groups: 1 whose labels have no majority, 1 because they hold an image carried over from "
        "the published version (never dropped) whose label its new copies outvote"
    ) in lines
    lines = format_near_duplicates({"near_duplicates": {**near, "groups_kept_whole": 1}})
    assert "    kept whole: 1 group whose labels have no majority" in lines
