"""Stage 1's write side at scale (issue 20, item 7): attempt ids, abandoned GCS writers, the error log's files.

On real files and on the GCS emulator (tests/conftest.py's `gcs_dir`).
"""

import gc
import json
import os
import uuid

import pytest

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.inspect.summary import read_error_examples
from preprocess.publish.finalize import build_manifest
from preprocess.write.shards import (
    ERROR_FILE_BYTES,
    ERRORS,
    LINES,
    MAX_SOURCES_PER_ERROR_FILE,
    WriteShardFilesFn,
    WriteShardFn,
    error_file_entry,
    plan_error_files,
)
from tests.stage1 import read_errors

RUN_ID = "20260101T000000000000Z-0123abcd"
# A record of 984 bytes is 1,000 bytes framed as TFRecord (8 length + 4 + 4 CRC bytes).
RECORD_OF_1000_FRAMED_BYTES = b"x" * 984
TARGETS = {"train": 10**6}


def _attempt_of(path: str) -> str:
    # <split>-<attempt>-<index>.<suffix>
    _, attempt, _ = os.path.basename(path).rsplit(".", 1)[0].split("-")
    return attempt


def test_bundle_attempt_ids_are_full_uuid4s_and_all_distinct(tmp_path):
    attempts = []
    for _ in range(300):
        fn = WriteShardFilesFn(str(tmp_path))
        fn.start_bundle()
        list(fn.process(("train", b"record"), TARGETS, RUN_ID))
        (written,) = [windowed.value for windowed in fn.finish_bundle()]
        attempts.append(_attempt_of(written.path))
    assert all(len(attempt) == 32 and uuid.UUID(hex=attempt).version == 4 for attempt in attempts)
    assert len(set(attempts)) == len(attempts)


# ------------------------------------------------------------ abandoned GCS writers


def _object_prefix(gcs_emulator, gcs_dir: str) -> str:
    return gcs_dir[len(gcs_emulator.url("")) :]


def _bundle_with_an_open_file(gcs_dir: str) -> WriteShardFilesFn:
    fn = WriteShardFilesFn(gcs_dir)
    fn.start_bundle()
    assert list(fn.process(("train", RECORD_OF_1000_FRAMED_BYTES), TARGETS, RUN_ID)) == []
    return fn


def test_a_gcs_file_of_a_bundle_that_raised_is_never_committed_even_when_collected(gcs_emulator, gcs_dir):
    fn = _bundle_with_an_open_file(gcs_dir)
    # The next element fails inside the writer's own code path (a split with no target size).
    with pytest.raises(ValueError, match="no target file size"):
        list(fn.process(("unknown-split", b"y"), TARGETS, RUN_ID))
    del fn  # the runner drops the failed bundle's DoFn
    gc.collect()
    assert gcs_emulator.list_objects(_object_prefix(gcs_emulator, gcs_dir)) == {}


def test_a_gcs_file_of_a_bundle_that_failed_elsewhere_is_never_committed_when_dropped(gcs_emulator, gcs_dir):
    # Another step of the fused stage raised: this DoFn sees no exception and no finish_bundle.
    fn = _bundle_with_an_open_file(gcs_dir)
    # In a reference cycle (as a failed bundle's traceback holds its frames), so that the collector, not
    # the reference count, finalizes the writer, in any order with the objects around it.
    fn.cycle = fn
    del fn
    gc.collect()
    assert gcs_emulator.list_objects(_object_prefix(gcs_emulator, gcs_dir)) == {}


def test_the_next_bundle_on_the_same_instance_discards_the_failed_ones_files(gcs_emulator, gcs_dir):
    fn = _bundle_with_an_open_file(gcs_dir)
    fn.start_bundle()  # the runner reuses the DoFn after a bundle that never finished
    gc.collect()
    assert gcs_emulator.list_objects(_object_prefix(gcs_emulator, gcs_dir)) == {}
    fn.teardown()


def test_a_committed_gcs_file_is_there_whole(gcs_emulator, gcs_dir):
    fn = _bundle_with_an_open_file(gcs_dir)
    (written,) = [windowed.value for windowed in fn.finish_bundle()]
    del fn
    gc.collect()
    objects = gcs_emulator.list_objects(_object_prefix(gcs_emulator, gcs_dir))
    assert list(objects.values()) == [1000] == [written.num_bytes]


def test_an_aborted_gcs_upload_that_had_sent_chunks_leaves_no_object(gcs_emulator, gcs_dir):
    """Past the first 16 MiB chunk the resumable upload session exists: aborting cancels it."""
    path = f"{gcs_dir}/big.bin"
    handle = filesystem.UncommittedFile(path)
    handle.write(os.urandom((16 << 20) + 1000))
    handle.abort()
    del handle
    gc.collect()
    assert gcs_emulator.list_objects(_object_prefix(gcs_emulator, gcs_dir)) == {}


def test_an_aborted_local_file_is_removed(tmp_path):
    handle = filesystem.UncommittedFile(str(tmp_path / "part.tfrecord"))
    handle.write(b"partial")
    handle.abort()
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------ the error log's files


def _error_line(index: int) -> bytes:
    return json.dumps({"uri": f"/in/{index}.jpg", "reason": "truncated", "detail": "cut"}).encode()


def _write_error_bundles(output_dir: str, bundles: list[list[int]]):
    files = []
    for indices in bundles:
        fn = WriteShardFilesFn(output_dir, framing=LINES)
        fn.start_bundle()
        for index in indices:
            files += fn.process((ERRORS, _error_line(index)), {ERRORS: ERROR_FILE_BYTES}, RUN_ID)
        files += [windowed.value for windowed in fn.finish_bundle()]
    return files


def _manifest(output_dir: str, error_files: list[dict], num_failed: int) -> dict:
    config = {
        "output": output_dir,
        "input": "/in",
        "input_kind": "directory",
        "image_size": 8,
        "encoding": "uint8",
        "resize_method": "bilinear",
        "max_pixels": 100,
        "jpeg_quality": 90,
        "split_fractions": {"train": 1.0},
    }
    shard = {"split": "train", "path": f"runs/{RUN_ID}/train.tfrecord", "num_examples": 1, "num_bytes": 1}
    return build_manifest(
        config=config,
        run_id=RUN_ID,
        labels=["a"],
        stats=([0.0] * 3, [1.0] * 3),
        shards=[{**shard, "sha256": "0" * 64}],
        class_counts=[(("train", "a"), 1)],
        num_found=1 + num_failed,
        failures={"truncated": num_failed},
        num_duplicates=0,
        error_files=error_files,
    )


def test_errors_of_many_bundles_are_several_files_named_in_the_manifest_each_input_once(tmp_path):
    # 100 bundles with errors: more than one packed file can take (32 sources each), none copied whole
    # into one; every failed input is in exactly one line of the files the manifest lists.
    bundles = [list(range(start, start + 3)) for start in range(0, 300, 3)]
    files = _write_error_bundles(str(tmp_path), bundles)
    plans = plan_error_files(files)
    assert len(plans) == 4 and all(len(plan.sources) <= MAX_SOURCES_PER_ERROR_FILE for plan in plans)
    entries = [
        error_file_entry(entry)
        for plan in plans
        for entry in WriteShardFn(str(tmp_path)).process(plan, RUN_ID)
    ]
    manifest = _manifest(str(tmp_path), entries, num_failed=300)
    manifest_lib.check_manifest(manifest)
    (tmp_path / manifest_lib.MANIFEST_FILE).write_text(json.dumps(manifest))

    paths = manifest_lib.error_file_paths(manifest)
    assert len(paths) == 4 and all(path.startswith(f"runs/{RUN_ID}/errors-") for path in paths)
    assert sum(entry["num_errors"] for entry in manifest["error_files"]) == manifest["inputs"]["num_failed"]
    uris = [error["uri"] for error in read_errors(tmp_path)]
    assert sorted(uris) == sorted(f"/in/{index}.jpg" for index in range(300))
    # The other readers follow the manifest: the summary's examples, the files a complete dataset has.
    assert read_error_examples(str(tmp_path), manifest, per_reason=2) == {"truncated": uris[:2]}
    assert set(paths) <= set(manifest_lib.other_required_files(manifest))
    assert "4 files" in manifest_lib.describe_error_files(manifest)


def test_a_run_without_errors_lists_no_error_file(tmp_path):
    manifest = _manifest(str(tmp_path), [], num_failed=0)
    manifest_lib.check_manifest(manifest)
    assert manifest["error_files"] == [] and manifest_lib.error_file_paths(manifest) == []


def test_the_error_log_transform_lists_files_holding_every_line_once(tmp_path):
    """WriteErrorLog in a real pipeline (2 worker threads): its singleton is the manifest's error_files."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from preprocess.write.shards import WriteErrorLog

    lines = [_error_line(index) for index in range(500)]
    options = PipelineOptions(["--direct_running_mode=multi_threading", "--direct_num_workers=2"])
    with beam.Pipeline(options=options) as pipeline:
        run_id = pipeline | "RunId" >> beam.Create([RUN_ID])
        entries = pipeline | beam.Create(lines) | WriteErrorLog(str(tmp_path), run_id)
        _ = entries | beam.Map(lambda listed: (tmp_path / "entries.json").write_text(json.dumps(listed)))
    listed = json.loads((tmp_path / "entries.json").read_text())
    assert listed and [entry["path"] for entry in listed] == sorted(entry["path"] for entry in listed)
    assert sum(entry["num_errors"] for entry in listed) == 500
    written = [
        line for entry in listed for line in (tmp_path / entry["path"]).read_bytes().splitlines() if line
    ]
    assert sorted(written) == sorted(lines)


def test_logs_sharing_one_writer_each_list_their_own_files(tmp_path):
    """WriteJsonLogs with two logs (the errors and the near-duplicate groups, as stage 1 writes them), one of
    them empty: each gets its own files, named by its prefix, with its count key."""
    import apache_beam as beam

    from preprocess.write.shards import ERRORS, NEAR_DUPLICATES, WriteJsonLogs

    lines = [_error_line(index) for index in range(40)]
    count_keys = {ERRORS: "num_errors", NEAR_DUPLICATES: "num_groups", "empty": "num_empty"}
    with beam.Pipeline() as pipeline:
        run_id = pipeline | "RunId" >> beam.Create([RUN_ID])
        keyed = [(ERRORS if index % 4 else NEAR_DUPLICATES, line) for index, line in enumerate(lines)]
        logs = pipeline | beam.Create(keyed) | WriteJsonLogs(str(tmp_path), run_id, count_keys)
        _ = logs | beam.Map(lambda listed: (tmp_path / "logs.json").write_text(json.dumps(listed)))
    listed = json.loads((tmp_path / "logs.json").read_text())
    assert sorted(listed) == sorted(count_keys) and listed["empty"] == []
    for prefix, count_key in [(ERRORS, "num_errors"), (NEAR_DUPLICATES, "num_groups")]:
        expected = sorted(line for key, line in keyed if key == prefix)
        entries = listed[prefix]
        assert all(entry["path"].split("/")[-1].startswith(f"{prefix}-") for entry in entries)
        assert sum(entry[count_key] for entry in entries) == len(expected)
        written = [line for entry in entries for line in (tmp_path / entry["path"]).read_bytes().splitlines()]
        assert sorted(written) == expected
