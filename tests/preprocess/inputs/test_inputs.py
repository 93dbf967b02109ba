"""Listing a class-per-folder tree and parsing CSV/JSONL manifests."""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from google.cloud import storage

from preprocess import errors
from preprocess.inputs.listing import (
    CSV,
    DIRECTORY,
    JSONL,
    MIX_GROUP_SIZE,
    InputRecord,
    ListingRange,
    ListInputs,
    SkippedFile,
    _in_mixed_order,
    _mix_group,
    filter_labels,
    input_kind,
    is_image_name,
    list_class_files,
    list_directory_tree,
    list_range,
    parse_manifest_rows,
    plan_listing_ranges,
)


def test_input_kind_is_taken_from_the_spec():
    assert input_kind("gs://bucket/raw") == DIRECTORY
    assert input_kind("/data/labels.CSV") == CSV
    assert input_kind("gs://bucket/labels.jsonl") == JSONL


def test_directory_tree_takes_the_class_from_the_folder_images_in_sub_folders_included(tmp_path):
    for name in (
        "cat/1.jpg",
        "cat/2.PNG",  # an extension in any case, as Keras
        "cat/meta.json",  # a sidecar: not an input
        "dog/1.jpg",
        "dog/.hidden",
        "dog/.DS_Store",
        "loose.jpg",  # at the root: no class
    ):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
    (tmp_path / "dog" / "nested").mkdir()
    (tmp_path / "dog" / "nested" / "deep.jpg").write_bytes(b"x")
    (tmp_path / "dog" / "nested" / "notes.txt").write_bytes(b"x")
    records = sorted(list_directory_tree(str(tmp_path)), key=lambda record: record.uri)
    assert records == [
        InputRecord(str(tmp_path / "cat" / "1.jpg"), "cat", size=1),
        InputRecord(str(tmp_path / "cat" / "2.PNG"), "cat", size=1),
        InputRecord(str(tmp_path / "dog" / "1.jpg"), "dog", size=1),
        InputRecord(str(tmp_path / "dog" / "nested" / "deep.jpg"), "dog", size=1),
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
        ("gs://bucket/lists/labels.csv", errors.BAD_MANIFEST_ROW),
    ]
    # A worker reading part of the manifest knows no line number: the row itself is quoted.
    assert rows[4].detail == "expected 'uri,label[,split]', got 1 fields: '/abs/e.jpg'"


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


# ------------------------------------------------------------------------------ ListInputs in a pipeline


def _assert_listed(spec, records, failed, labels=None, skipped=None):
    """ListInputs, run on the DirectRunner, lists exactly `records`, the errors (uri, reason) `failed` and,
    if given, the SkippedFiles `skipped`."""
    with TestPipeline() as pipeline:
        listed = pipeline | ListInputs(str(spec), labels)
        if skipped is not None:
            assert_that(
                listed.skipped | "SkippedTuples" >> beam.Map(dataclasses.astuple),
                equal_to([dataclasses.astuple(item) for item in skipped]),
                label="skipped",
            )
        # As tuples: equal_to sorts what it can sort, and compares every pair of what it cannot.
        assert_that(
            listed.records | beam.Map(dataclasses.astuple),
            equal_to([dataclasses.astuple(record) for record in records]),
            label="records",
        )
        assert_that(
            listed.errors | beam.Map(lambda error: (error.uri, error.reason)),
            equal_to(failed),
            label="errors",
        )


def test_a_local_tree_is_listed_class_by_class_in_parallel_sidecars_and_root_files_skipped(tmp_path):
    for name in (
        "cat/1.jpg",
        "cat/2.png",
        "cat/README",
        "dog/1.jpg",
        "dog/.DS_Store",
        "dog/meta.json",
        "bird/only.jpg",
        "loose.jpg",
    ):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
    (tmp_path / "empty-class").mkdir()
    (tmp_path / "dog" / "nested").mkdir()
    (tmp_path / "dog" / "nested" / "deep.jpg").write_bytes(b"x")
    (tmp_path / "cat" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    _assert_listed(
        tmp_path,
        [
            InputRecord(str(tmp_path / "cat" / "1.jpg"), "cat", size=1),
            InputRecord(str(tmp_path / "cat" / "2.png"), "cat", size=1),
            InputRecord(str(tmp_path / "dog" / "1.jpg"), "dog", size=1),
            InputRecord(str(tmp_path / "dog" / "nested" / "deep.jpg"), "dog", size=1),
        ],
        [(str(tmp_path / "bird" / "only.jpg"), errors.UNKNOWN_LABEL)],
        labels=["cat", "dog"],
        skipped=[
            SkippedFile(str(tmp_path / "cat" / "README"), ""),
            SkippedFile(str(tmp_path / "dog" / "meta.json"), ".json"),
            SkippedFile(str(tmp_path / "loose.jpg"), ".jpg", at_root=True),
        ],
    )


def test_a_gcs_tree_is_listed_by_folder_with_nested_images_without_neighbours(gcs_emulator, gcs_dir):
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    root = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    for name in (
        "raw/cat/1.jpg",
        "raw/cat/2.jpg",
        "raw/cat/",  # a folder placeholder object, as the console's "create folder" makes
        "raw/cat/nested/3.jpg",
        "raw/dog/1.jpg",
        "raw/dog/.DS_Store",
        "raw/loose.jpg",
        "raw-old/cat/9.jpg",  # next to the tree, sharing its name's first characters
    ):
        bucket.blob(f"{root}/{name}").upload_from_string(b"x")
    _assert_listed(
        f"{gcs_dir}/raw/",
        [
            InputRecord(f"{gcs_dir}/raw/cat/1.jpg", "cat", size=1, md5=hashlib.md5(b"x").hexdigest()),
            InputRecord(f"{gcs_dir}/raw/cat/2.jpg", "cat", size=1, md5=hashlib.md5(b"x").hexdigest()),
            InputRecord(f"{gcs_dir}/raw/cat/nested/3.jpg", "cat", size=1, md5=hashlib.md5(b"x").hexdigest()),
            InputRecord(f"{gcs_dir}/raw/dog/1.jpg", "dog", size=1, md5=hashlib.md5(b"x").hexdigest()),
        ],
        [],
        skipped=[SkippedFile(f"{gcs_dir}/raw/loose.jpg", ".jpg", at_root=True)],
    )


def test_a_pre_split_gcs_tree_gives_each_image_its_split_folders_split(gcs_emulator, gcs_dir):
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    root = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    for name in (
        "split/train/cat/1.jpg",
        "split/train/dog/1.jpg",
        "split/val/cat/2.jpg",
        "split/train/notes.txt",
    ):
        bucket.blob(f"{root}/{name}").upload_from_string(b"x")
    md5 = hashlib.md5(b"x").hexdigest()
    _assert_listed(
        f"{gcs_dir}/split/",
        [
            InputRecord(f"{gcs_dir}/split/train/cat/1.jpg", "cat", split="train", size=1, md5=md5),
            InputRecord(f"{gcs_dir}/split/train/dog/1.jpg", "dog", split="train", size=1, md5=md5),
            InputRecord(f"{gcs_dir}/split/val/cat/2.jpg", "cat", split="validation", size=1, md5=md5),
        ],
        [],
        skipped=[SkippedFile(f"{gcs_dir}/split/train/notes.txt", ".txt", at_root=True)],
    )


def test_a_csv_manifest_is_read_with_beams_text_io(tmp_path):
    manifest = tmp_path / "lists" / "labels.csv"
    manifest.parent.mkdir()
    rows = [
        "uri,label,split",
        "/abs/a.jpg,cat,",
        '"/abs/with, comma.jpg","dog",train',  # quoting within a row
        "",
        "rel/b.jpg,dog,validation",
        "/abs/c.jpg,,train",
        "/abs/d.jpg",
    ]
    # A byte order mark and Windows line ends, as spreadsheet programs write them.
    manifest.write_bytes(("\ufeff" + "\r\n".join(rows) + "\r\n").encode("utf-8"))
    _assert_listed(
        manifest,
        [
            InputRecord("/abs/a.jpg", "cat"),
            InputRecord("/abs/with, comma.jpg", "dog", "train"),
            InputRecord(str(tmp_path / "lists" / "rel" / "b.jpg"), "dog", "validation"),
        ],
        [("/abs/c.jpg", errors.MISSING_LABEL), (str(manifest), errors.BAD_MANIFEST_ROW)],
    )


def test_a_jsonl_manifest_is_read_with_beams_text_io(tmp_path):
    manifest = tmp_path / "labels.jsonl"
    lines = [json.dumps({"uri": f"/corpus/{i:04d}.jpg", "label": f"class{i % 7}"}) for i in range(2_000)]
    manifest.write_text("\n".join(lines[:1000] + ["[1, 2]", ""] + lines[1000:]) + "\n")
    _assert_listed(
        manifest,
        [InputRecord(f"/corpus/{i:04d}.jpg", f"class{i % 7}") for i in range(2_000)],
        [(str(manifest), errors.BAD_MANIFEST_ROW)],
    )


def test_mixing_groups_hold_a_handful_of_records_whatever_the_corpus_size():
    for count in (10, 1_000, 100_000):
        records = [InputRecord(f"/corpus/class{i % 5}/{i}.jpg", f"class{i % 5}") for i in range(count)]
        groups = collections.Counter(_mix_group(record, count)[0] for record in records)
        assert len(groups) <= max(1, count // MIX_GROUP_SIZE)
        assert max(groups.values()) <= max(4 * MIX_GROUP_SIZE, 10)


def test_mixing_puts_every_class_in_most_groups_of_a_class_ordered_listing():
    # Listed class by class (as a tree or a manifest written class by class is), each group is still a
    # cross-section of the whole listing: the local runner's shards follow the groups.
    count = 5_000
    records = [
        InputRecord(f"/corpus/class{i * 5 // count}/{i}.jpg", f"class{i * 5 // count}") for i in range(count)
    ]
    groups = collections.defaultdict(list)
    for record in records:
        key, _ = _mix_group(record, count)
        groups[key].append(record)
    runs = 0
    for group in groups.values():
        labels = [record.label for record in _in_mixed_order((None, group))]
        runs += 1 + sum(1 for a, b in zip(labels, labels[1:], strict=False) if a != b)
    # 5 classes in equal shares, random order: about 0.8 * count runs; class-ordered groups would give ~5 a group.
    assert runs > 0.6 * count


def test_a_missing_manifest_fails_the_job_with_a_message(tmp_path):
    with pytest.raises(Exception, match="no such manifest file"):
        with TestPipeline() as pipeline:
            pipeline | ListInputs(str(tmp_path / "labels.csv"))


# ------------------------------------------------------------------------------ large folders, in ranges


def _varied_names(count: int) -> list[str]:
    """File names as corpora have them: numbered, hashed, and a few that are a prefix of another."""
    numbered = [f"img_{index:05d}.jpg" for index in range(count * 2 // 3)]
    hashed = [
        hashlib.sha256(str(index).encode()).hexdigest()[:20] + ".png"
        for index in range(count - len(numbered) - 8)
    ]
    odd = ["x", "x1", "x10", "x1~", "Z.jpg", "~tilde.jpg", "\u00e9t\u00e9.jpg", "\u65e5\u672c.jpg"]
    return numbered + hashed + odd


def _listed_in_ranges(ranges) -> list[InputRecord]:
    """The images the ranges list (each range's SkippedFiles left out)."""
    return sorted(
        (
            record
            for listing_range in ranges
            for record in list_range(listing_range)
            if isinstance(record, InputRecord)
        ),
        key=lambda r: r.uri,
    )


def test_a_large_local_folder_is_listed_in_ranges_that_together_list_each_file_once(tmp_path):
    folder = tmp_path / "cat"
    folder.mkdir()
    for name in _varied_names(3000):
        (folder / name).write_bytes(b"x")
    ranges = list(plan_listing_ranges(("cat", str(folder)), split_above=1000))
    assert len(ranges) >= 4
    whole = sorted(list_class_files(("cat", str(folder))), key=lambda record: record.uri)
    assert len(whole) == 3000 - 4  # x, x1, x10, x1~: no image extension
    assert _listed_in_ranges(ranges) == whole
    # A folder under the threshold is one range.
    assert list(plan_listing_ranges(("cat", str(folder)), split_above=3000)) == [
        ListingRange("cat", str(folder))
    ]


def _upload_many(gcs_emulator, urls):
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda url: bucket.blob(url.removeprefix(f"gs://{gcs_emulator.bucket}/")).upload_from_string(
                    b"x"
                ),
                urls,
            )
        )


def test_a_large_gcs_folder_is_listed_in_ranges_by_separate_elements_each_file_once(gcs_emulator, gcs_dir):
    root = f"{gcs_dir}/raw"
    names = _varied_names(300)  # the emulator slows with every upload: a few thousand would take minutes
    _upload_many(
        gcs_emulator,
        # With the folder's placeholder object ("create folder" in the console) and a subfolder, not listed.
        [f"{root}/cat/{name}" for name in names]
        + [f"{root}/dog/1.jpg", f"{root}/cat/sub/deep.jpg", f"{root}/cat/"],
    )
    folder = f"{root}/cat"
    ranges = list(plan_listing_ranges(("cat", folder), split_above=50))
    assert len(ranges) >= 8
    whole = sorted(list_class_files(("cat", folder)), key=lambda record: record.uri)
    # x, x1, x10, x1~ have no image extension; sub/ is a sub-folder of the class, listed with it.
    assert [record.uri for record in whole] == sorted(
        [f"{folder}/{name}" for name in names if is_image_name(name)] + [f"{folder}/sub/deep.jpg"]
    )
    assert _listed_in_ranges(ranges) == whole
    # The job lists each range as an element of its own.
    pipeline = TestPipeline()
    listed = pipeline | ListInputs(root, split_listing_above=50)
    assert_that(
        listed.records | beam.Map(lambda record: record.uri),
        equal_to([r.uri for r in whole] + [f"{root}/dog/1.jpg"]),
    )
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("listing_ranges"))["counters"]
    assert sum(counter.committed for counter in counters) == len(ranges) + 1  # and dog's one range
