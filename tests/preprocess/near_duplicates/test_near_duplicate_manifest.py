"""The manifest's near-duplicate fields: checked like error_files, kept by publishing, summarized."""

import pytest

from dataset_contract import manifest as manifest_lib
from preprocess.inspect.summary import format_near_duplicates
from preprocess.publish.commit import named_files

RUN = "runs/20261126T120000000000Z-0a1b2c3d"


def _manifest(**fields) -> dict:
    return {
        "format_version": 2,
        "run": {"id": "20261126T120000000000Z-0a1b2c3d"},
        "image": {"height": 8, "width": 8, "channels": 3, "encoding": "uint8", "resize_method": "crop"},
        "labels": ["cat"],
        "normalization": {"mean": [0, 0, 0], "std": [1, 1, 1]},
        "splits": {"train": {"num_examples": 1, "num_examples_per_class": {"cat": 1}, "shards": []}},
        "inputs": {
            "num_found": 3,
            "num_written": 1,
            "num_failed": 0,
            "num_duplicates": 0,
            "num_near_duplicates": 2,
        },
        "error_files": [],
        **fields,
    }


GROUPS_FILE = {
    "path": f"{RUN}/near-duplicates-packed-1f2e3d4c5b6a.jsonl",
    "num_groups": 1,
    "num_bytes": 10,
    "sha256": "x",
}
DROP = {"mode": "drop", "max_distance": 8, "groups": 1, "images_in_groups": 3, "largest_group": 3,
        "split_changes": 1, "groups_with_several_labels": 1, "groups_across_splits": 0, "dropped": 2,
        "hot_buckets": 1, "hot_bucket_entries": 2040}  # fmt: skip


def test_the_groups_files_are_checked_required_and_kept_by_publishing():
    manifest = _manifest(near_duplicates=DROP, near_duplicate_files=[GROUPS_FILE])
    manifest_lib.check_manifest(manifest)
    assert manifest_lib.near_duplicate_file_paths(manifest) == [GROUPS_FILE["path"]]
    assert GROUPS_FILE["path"] in manifest_lib.other_required_files(manifest)
    assert GROUPS_FILE["path"] in named_files(manifest)
    with pytest.raises(manifest_lib.ManifestError, match="near_duplicate_files has no 'num_groups'"):
        manifest_lib.check_manifest(
            _manifest(near_duplicate_files=[{k: v for k, v in GROUPS_FILE.items() if k != "num_groups"}])
        )
    with pytest.raises(manifest_lib.ManifestError, match="near-duplicate file path"):
        manifest_lib.check_manifest(_manifest(near_duplicate_files=[{**GROUPS_FILE, "path": "../x.jsonl"}]))


def test_near_duplicates_dropped_count_in_the_accounting():
    manifest_lib.check_manifest(_manifest())
    unbalanced = _manifest()
    unbalanced["inputs"]["num_near_duplicates"] = 0
    with pytest.raises(manifest_lib.ManifestError, match="do not add up"):
        manifest_lib.check_manifest(unbalanced)


def test_the_summary_says_groups_label_errors_drops_and_hot_buckets():
    lines = format_near_duplicates(_manifest(near_duplicates=DROP, near_duplicate_files=[GROUPS_FILE]), "/d")
    assert lines == [
        "  near-duplicates (drop, distance <= 8): 1 group, 3 images in them, the largest 3; 1 moved between "
        "splits; each group is in one split",
        "    1 group with more than one label: likely label errors, look at them",
        "    dropped: 2 (all but one image of each group: the majority label's, then a named split's, then the "
        "largest)",
        "    hot buckets: 1 (2040 entries share a popular signature band, e.g. near-blank images; not compared "
        "there, still compared through their other bands)",
        f"    groups, one JSON line each: /d/{GROUPS_FILE['path']}",
        "    see them: python -m preprocess.inspect /d --report report.html",
    ]
    crossing = {**DROP, "mode": "keep", "groups_across_splits": 1}
    head = format_near_duplicates(
        _manifest(near_duplicates=crossing, near_duplicate_files=[GROUPS_FILE]), "/d"
    )
    assert head[0].endswith("; 1 group across splits") and "each group is in one split" not in "\n".join(head)
    withheld = {**DROP, "changes_withheld": 1, "would_move": 30, "images": 100, "max_moved": 0.05}
    withheld["realised_split_fractions"] = {"train": 0.8, "validation": 0.1, "test": 0.1}
    lines = format_near_duplicates(
        _manifest(near_duplicates=withheld, split_fractions={"train": 0.8, "validation": 0.1, "test": 0.1}),
        "/d",
    )
    assert lines[1].startswith(
        "    NOT APPLIED: the audit would have moved 30 of 100 images to another split, over "
        "--near-duplicate-max-moved 0.05"
    )
    assert (
        lines[2]
        == "    splits written: train 80.0% (asked 80%), validation 10.0% (asked 10%), test 10.0% (asked 10%)"
    )
    assert not any(line.startswith("    dropped:") or "one split" in line for line in lines)
    assert format_near_duplicates(_manifest(near_duplicates={"mode": "off"})) == [
        "  near-duplicates: not looked for (--near-duplicates off)"
    ]
    assert format_near_duplicates(_manifest()) == []  # written before the audit existed
