"""The decoded-image spill (preprocess/decode/spill.py): parts are kept only when their bundle commits them."""

import gc

import pyarrow as pa

from preprocess.decode.spill import WriteBatchPartsFn, read_batch_part

RUN_ID = "20261124T000000000000Z-00000000"


def _write_one_batch(output_dir: str, rows: int) -> WriteBatchPartsFn:
    write = WriteBatchPartsFn("train", output_dir, part_bytes=1 << 30)
    write.start_bundle()
    assert list(write.process(pa.RecordBatch.from_pydict({"x": list(range(rows))}), RUN_ID)) == []
    return write


def test_a_finished_bundles_part_reads_back_its_batches(tmp_path):
    write = _write_one_batch(str(tmp_path), 3)
    (path,) = [windowed.value for windowed in write.finish_bundle()]
    assert [batch.to_pydict() for batch in read_batch_part(path)] == [{"x": [0, 1, 2]}]


def test_on_gcs_a_finished_bundles_part_is_committed_whole(gcs_dir):
    write = _write_one_batch(gcs_dir, 1000)
    (path,) = [windowed.value for windowed in write.finish_bundle()]
    assert sum(batch.num_rows for batch in read_batch_part(path)) == 1000


def test_on_gcs_a_part_dropped_by_a_failed_bundle_never_appears(gcs_dir, gcs_emulator):
    # A bundle that fails before finish_bundle drops its writer; the garbage collector's close of
    # Beam's GCS writer would commit the partial upload.
    write = _write_one_batch(gcs_dir, 1000)
    del write
    gc.collect()
    prefix = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    assert [name for name in gcs_emulator.list_objects(prefix) if not name.endswith("/")] == []
