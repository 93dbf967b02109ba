"""`python -m preprocess.inspect DIR --diff [RUN]` and the report's section, on two versions of one directory
written by the real stage 1 job (DirectRunner).

Version 2's inputs manifest, against version 1's: three images added, two removed, two relabelled (their
files moved to another class folder) and one moved by the manifest's split column. Both versions have a
ledger, which the diff reads; a copy whose manifests list none (written before ledgers) is read from its
shards.
"""

import json
import os
import shutil

import pytest
import tensorflow as tf

from dataset_contract import commit_log
from preprocess.inspect import contact_sheet as inspect_lib
from preprocess.inspect import diff
from preprocess.inspect.report import build as report_build
from tests import chromium
from tests.stage1 import read_manifest, read_split, run_stage1
from tests.user_mistakes import assert_refused, run_command, write_image

CLASSES = ("birds", "cats", "dogs")
PER_CLASS = 8
SPLIT_ARGS = ("--split", "0.5,0.25,0.25", "--near-duplicates", "off")


def write_csv(path, rows: list[tuple[str, str, str]]):
    path.write_text("uri,label,split\n" + "".join(f"{uri},{label},{split}\n" for uri, label, split in rows))


def publish(csv, output) -> dict:
    return run_stage1(csv, output, *SPLIT_ARGS, image_size=16, encoding="uint8", min_shards=1)


class TwoVersions:
    """The directory, its one-version copy (before version 2), and what version 2 changed."""

    def __init__(self, root):
        self.root = root
        self.images = root / "images"
        self.csv = root / "labels.csv"
        self.output = root / "dataset"
        self.one_version = root / "one_version"


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Version 1: 8 images in each of 3 classes. Version 2: added, removed, relabelled, moved (see the
    module docstring); everything else as it was."""
    built = TwoVersions(tmp_path_factory.mktemp("two_versions"))
    rows = {}
    for class_index, label in enumerate(CLASSES):
        for index in range(PER_CLASS):
            relative = f"{label}/{index}.png"
            write_image(built.images / relative, class_index * PER_CLASS + index)
            rows[relative] = (label, "")
    write_csv(built.csv, [(f"images/{uri}", label, split) for uri, (label, split) in rows.items()])
    built.first = publish(built.csv, built.output)
    shutil.copytree(built.output, built.one_version)

    split_of = {
        row["uri"]: split
        for split in ("train", "validation", "test")
        for row in read_split(built.output, split)
    }
    uri = lambda relative: str(built.images / relative)  # noqa: E731
    built.removed = ["cats/1.png", "dogs/1.png"]
    for relative in built.removed:
        (built.images / relative).unlink()
        del rows[relative]
    built.relabelled = {"cats/2.png": "dogs/from_cats_2.png", "birds/3.png": "cats/from_birds_3.png"}
    for before, after in built.relabelled.items():
        (built.images / before).rename(built.images / after)
        del rows[before]
        rows[after] = (after.split("/")[0], "")
    built.added = ["birds/new_0.png", "cats/new_1.png", "dogs/new_2.png"]
    for index, relative in enumerate(built.added):
        write_image(built.images / relative, 100 + index)
        rows[relative] = (relative.split("/")[0], "")
    # One image that version 1 put in validation or test, named train by version 2's manifest.
    built.moved = next(
        relative for relative in sorted(rows) if split_of.get(uri(relative), "train") != "train"
    )
    built.moved_from = split_of[uri(built.moved)]
    rows[built.moved] = (rows[built.moved][0], "train")
    write_csv(built.csv, [(f"images/{relative}", label, split) for relative, (label, split) in rows.items()])
    built.second = publish(built.csv, built.output)
    built.uri = uri
    return built


def test_the_default_compares_the_newest_with_the_version_before_and_names_each_change(versions):
    old, new = diff.choose_versions(str(versions.output))
    assert (old.run_id, new.run_id) == (versions.first["run"]["id"], versions.second["run"]["id"])
    assert new.sequence == old.sequence + 1
    changes = diff.diff_versions(str(versions.output), old, new)
    uri = versions.uri
    assert (changes.old_images, changes.new_images, changes.in_both) == (24, 25, 22)
    assert [change.uri for change in changes.added.first] == sorted(uri(name) for name in versions.added)
    assert [change.uri for change in changes.removed.first] == sorted(uri(name) for name in versions.removed)
    assert {(change.before.uri, change.uri) for change in changes.relabelled.first} == {
        (uri(before), uri(after)) for before, after in versions.relabelled.items()
    }
    assert {(c.before.class_name, c.after.class_name) for c in changes.relabelled.first} == {
        ("cats", "dogs"),
        ("birds", "cats"),
    }
    assert [(c.uri, c.before.split, c.after.split) for c in changes.moved.first] == [
        (uri(versions.moved), versions.moved_from, "train")
    ]
    assert [changes.added.count, changes.removed.count, changes.relabelled.count, changes.moved.count] == [
        3,
        2,
        2,
        1,
    ]


def test_the_cli_prints_counts_and_files_and_limit_cuts_the_lists(versions, capsys):
    first_run = versions.first["run"]["id"]
    assert inspect_lib.main([str(versions.output), "--diff", first_run, "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "images: 24 -> 25 (22 in both); inputs that failed: 0 -> 0\n" in out
    assert "added 3, removed 2, relabelled 2, moved to another split 1" in out
    assert f"from version 1 (run {first_run}" in out
    assert "  ... and 2 more (--limit)" in out  # added: 3, one listed
    assert f"{versions.uri(versions.moved)}  {versions.moved_from} -> train" in out
    assert "Examples per split" not in out and "contact sheet" not in out  # --diff prints the diff alone


def test_an_unknown_run_and_a_directory_with_one_version_are_refused_in_a_few_lines(
    versions, tmp_path, capsys
):
    # As a user runs it: one process start (TensorFlow's import is most of this test's time).
    unknown = run_command(
        "preprocess.inspect", [versions.output, "--diff", "20990101T000000Z-nope"], tmp_path
    )
    assert_refused(unknown, "no version", "20990101T000000Z-nope", versions.first["run"]["id"])
    # The same way out (print_diff's DiffRefused), in process.
    assert inspect_lib.main([str(versions.one_version), "--diff"]) == 2
    said = capsys.readouterr()
    assert "one published version" in said.err and "nothing to compare" in said.err and not said.out
    with pytest.raises(diff.DiffRefused, match="is the newest version"):
        diff.choose_versions(str(versions.output), versions.second["run"]["id"])


def test_the_run_a_version_was_built_from_is_preferred_to_the_commit_before_it(versions, tmp_path):
    """A third commit, version 2's manifest built from run 1 (an incremental run's `run.built_from`): the
    default compares it with version 1; with a run the log no longer holds, with the commit before it."""
    copy = tmp_path / "copy"
    shutil.copytree(versions.output, copy)
    third = dict(versions.second, run={**versions.second["run"], "built_from": versions.first["run"]["id"]})
    (copy / commit_log.commit_name(3)).write_text(json.dumps(third))
    old, new = diff.choose_versions(str(copy))
    assert (old.sequence, new.sequence) == (1, 3)
    assert diff.diff_versions(str(copy), old, new).added.count == 3
    third["run"]["built_from"] = "20200101T000000000000Z-collected"
    (copy / commit_log.commit_name(4)).write_text(json.dumps(third))
    old, new = diff.choose_versions(str(copy))
    assert (old.sequence, new.sequence) == (3, 4)


def test_a_version_whose_shards_are_gone_is_not_compared(versions, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(versions.output, copy)
    shutil.rmtree(copy / versions.first["run"]["dir"])
    assert inspect_lib.main([str(copy), "--diff"]) == 1
    assert "not found (garbage collection removes" in capsys.readouterr().err


def without_ledgers(source, copy):
    """A copy of the directory as versions written before ledgers are: no `ledger_files`, no ledger file."""
    shutil.copytree(source, copy)
    for path in (copy / "manifests").glob("*.json"):
        manifest = json.loads(path.read_text())
        manifest.pop("ledger_files")
        path.write_text(json.dumps(manifest))
    for path in copy.glob("runs/*/ledger-*"):
        path.unlink()
    return copy


def ledger_bytes(manifest: dict) -> int:
    return sum(entry["num_bytes"] for entry in manifest["ledger_files"])


def test_the_diff_reads_each_versions_ledger_not_its_shards(versions, capsys):
    ledgers = ledger_bytes(versions.first) + ledger_bytes(versions.second)
    old, new = diff.choose_versions(str(versions.output))
    changes = diff.diff_versions(str(versions.output), old, new)
    assert (changes.ledger_files_read, changes.shards_read, changes.bytes_read) == (2, 0, ledgers)
    # Its bytes are the ledgers' files' own sizes, not the manifest's say-so.
    assert ledgers == sum(path.stat().st_size for path in versions.output.glob("runs/*/ledger-*"))
    assert inspect_lib.main([str(versions.output), "--diff"]) == 0
    assert "\nread 2 ledger files (" in capsys.readouterr().out


def test_a_version_without_a_ledger_is_read_from_its_shards_with_the_same_changes(versions, tmp_path):
    output = str(versions.output)
    with_ledgers = diff.diff_versions(output, *diff.choose_versions(output))
    copy = str(without_ledgers(versions.output, tmp_path / "copy"))
    old, new = diff.choose_versions(copy)
    from_shards = diff.diff_versions(copy, old, new)
    shards = [
        shard
        for version in (old, new)
        for info in version.manifest["splits"].values()
        for shard in info["shards"]
    ]
    assert (from_shards.ledger_files_read, from_shards.shards_read) == (0, len(shards))
    assert from_shards.bytes_read == sum(shard["num_bytes"] for shard in shards) > with_ledgers.bytes_read
    for _, attribute, _ in diff.CATEGORIES:
        assert getattr(from_shards, attribute) == getattr(with_ledgers, attribute), attribute
    assert (from_shards.old_images, from_shards.new_images) == (
        with_ledgers.old_images,
        with_ledgers.new_images,
    )


def test_the_report_compares_within_its_read_budget(versions):
    changes, note = report_build.gather_changes(str(versions.output), max_read_bytes=0, limit=5)
    assert changes is None and "over --max-read-mb" in note and "--diff` reads them all" in note
    assert "2 ledger files are" in note
    # The budget is the ledgers' bytes: one that holds them and not the shards compares.
    ledgers = ledger_bytes(versions.first) + ledger_bytes(versions.second)
    changes, note = report_build.gather_changes(str(versions.output), max_read_bytes=ledgers, limit=5)
    assert changes is not None and changes.added.count == 3 and note == ""
    assert report_build.gather_changes(str(versions.one_version), 1 << 30, 5) == (None, "")


PAGE_STATE = """JSON.stringify({
  headings: Array.from(document.querySelectorAll('h2')).map(h => h.textContent),
  nav: Array.from(document.querySelectorAll('nav a')).map(a => a.textContent),
  changes: (document.getElementById('changes') || {}).innerText,
})"""


def test_the_report_has_the_same_section_in_chromium(versions, tmp_path, capsys):
    try:
        binary = chromium.chromium_binary()
    except chromium.ChromiumMissing as exc:
        pytest.fail(str(exc))  # never a silent pass: the report's test needs a real browser
    page = tmp_path / "report.html"
    assert inspect_lib.main([str(versions.output), "--report", str(page), "--limit", "2"]) == 0
    (tmp_path / "chromium-profile").mkdir()
    browser = chromium.Browser(tmp_path / "chromium-profile", binary)
    try:
        browser.open(str(page))
        state = json.loads(browser.evaluate(PAGE_STATE))
        assert not browser.problems()
    finally:
        browser.close()
    assert "Changes between versions" in state["headings"] and "Changes between versions" in state["nav"]
    section = state["changes"]
    assert f"From version 1 (run {versions.first['run']['id']}" in section
    for count, title in ((3, "Added"), (2, "Removed"), (2, "Relabelled"), (1, "Moved to another split")):
        assert f"{title} ({count})" in section
    assert "and 1 more (--limit)" in section  # added: 3, two listed
    assert versions.uri(versions.moved) in section


def test_commits_are_listed_oldest_first_and_a_gone_one_reads_as_none(versions):
    files = commit_log.TensorFlowFiles()
    commits = commit_log.list_commits(str(versions.output), files)
    assert [sequence for sequence, _ in commits] == [1, 2]
    assert json.loads(commit_log.read_commit(commits[0][1], 1, files).data) == read_manifest(
        versions.one_version
    )
    assert commit_log.read_commit(commits[0][1] + ".gone", 1, files) is None


def test_the_diff_reads_a_directory_on_gcs(versions, gcs_dir, capsys):
    for folder, _, names in os.walk(versions.output):
        relative = os.path.relpath(folder, versions.output)
        for name in names:
            if relative == "manifests" or name.endswith((".tfrecord", ".jsonl")):
                tf.io.gfile.copy(os.path.join(folder, name), f"{gcs_dir}/{relative}/{name}")
    assert inspect_lib.main([gcs_dir, "--diff"]) == 0
    assert "added 3, removed 2, relabelled 2, moved to another split 1" in capsys.readouterr().out
