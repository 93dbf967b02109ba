"""Listing a class-per-folder tree and parsing CSV/JSONL manifests."""

import json

from preprocess import errors
from preprocess.inputs import (
    CSV,
    DIRECTORY,
    JSONL,
    InputRecord,
    filter_labels,
    input_kind,
    list_directory_tree,
    parse_manifest_rows,
)


def test_input_kind_is_taken_from_the_spec():
    assert input_kind("gs://bucket/raw") == DIRECTORY
    assert input_kind("/data/labels.CSV") == CSV
    assert input_kind("gs://bucket/labels.jsonl") == JSONL


def test_directory_tree_takes_the_class_from_the_folder(tmp_path):
    for name in ("cat/1.jpg", "cat/2.png", "dog/1.jpg", "dog/.hidden", "dog/.DS_Store", "loose.jpg"):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
    (tmp_path / "dog" / "nested").mkdir()
    (tmp_path / "dog" / "nested" / "deep.jpg").write_bytes(b"x")
    records = sorted(list_directory_tree(str(tmp_path)), key=lambda record: record.uri)
    assert records == [
        InputRecord(str(tmp_path / "cat" / "1.jpg"), "cat"),
        InputRecord(str(tmp_path / "cat" / "2.png"), "cat"),
        InputRecord(str(tmp_path / "dog" / "1.jpg"), "dog"),
    ]


def test_csv_manifest_rows_become_records_or_errors():
    text = "\n".join(
        [
            "uri,label,split",
            "/abs/a.jpg,cat,",
            "rel/b.jpg,dog,validation",
            "/abs/c.jpg,,train",
            "/abs/d.jpg,cat,holdout",
            "/abs/e.jpg",
            "",
        ]
    )
    rows = list(parse_manifest_rows(text, CSV, "gs://bucket/lists/labels.csv"))
    assert rows[0] == InputRecord("/abs/a.jpg", "cat", None)
    assert rows[1] == InputRecord("gs://bucket/lists/rel/b.jpg", "dog", "validation")
    assert [(row.uri, row.reason) for row in rows[2:]] == [
        ("/abs/c.jpg", errors.MISSING_LABEL),
        ("/abs/d.jpg", errors.UNKNOWN_SPLIT),
        ("gs://bucket/lists/labels.csv:6", errors.BAD_MANIFEST_ROW),
    ]


def test_jsonl_manifest_rows_become_records_or_errors():
    lines = [
        json.dumps({"uri": "/a.jpg", "label": "cat"}),
        json.dumps({"uri": "/b.jpg", "label": "dog", "split": "test"}),
        "{not json",
        json.dumps({"label": "cat"}),
    ]
    rows = list(parse_manifest_rows("\n".join(lines), JSONL, "/lists/m.jsonl"))
    assert rows[:2] == [InputRecord("/a.jpg", "cat"), InputRecord("/b.jpg", "dog", "test")]
    assert [row.reason for row in rows[2:]] == [errors.BAD_MANIFEST_ROW, errors.BAD_MANIFEST_ROW]


def test_labels_outside_the_given_list_are_unknown_label_errors():
    items = [InputRecord("/a.jpg", "cat"), InputRecord("/b.jpg", "zebra")]
    result = list(filter_labels(items, ["cat", "dog"]))
    assert result[0] == items[0]
    assert (result[1].uri, result[1].reason) == ("/b.jpg", errors.UNKNOWN_LABEL)
