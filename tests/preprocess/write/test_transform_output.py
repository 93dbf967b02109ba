"""tf.Transform's output written into the run's directory: loadable by tft, and the same files when a step
runs twice."""

import os

import apache_beam as beam
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from apache_beam.testing import test_pipeline

from preprocess.transform import make_preprocessing_fn, tensor_adapter_config, to_record_batch
from preprocess.write.transform_output import (
    ASSET_MAP_FILE,
    WriteTransformOutput,
    copy_transform_fn,
    write_transformed_metadata,
)

RUN_ID = "20260101T000000000000Z-0123abcd"
SIZE = 2


def _example(value, label):
    pixels = np.full((SIZE, SIZE, 3), value, dtype=np.uint8)
    return {"image_raw": pixels.tobytes(), "label": label, "sha256": label * 8, "uri": f"/corpus/{label}.png"}


def _snapshot(directory):
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                files[os.path.relpath(path, directory)] = handle.read()
    return files


def test_the_run_copy_loads_with_tft_and_copying_again_gives_the_same_files(tmp_path):
    output = str(tmp_path / "out")
    source_record = tmp_path / "source.txt"
    with test_pipeline.TestPipeline() as pipeline, tft_beam.Context(temp_dir=str(tmp_path / "tft")):
        batches = pipeline | "Batches" >> beam.Create(
            [to_record_batch([_example(10, "b"), _example(30, "a")])]
        )
        transform_fn = (batches, tensor_adapter_config()) | tft_beam.AnalyzeDataset(
            make_preprocessing_fn(SIZE, "float32")
        )
        run_id = pipeline | "RunId" >> beam.Create([RUN_ID])
        _ = transform_fn | WriteTransformOutput(output, run_id)
        _ = transform_fn[0] | beam.Map(source_record.write_text)

    run_dir = os.path.join(output, "runs", RUN_ID)
    loaded = tft.TFTransformOutput(run_dir)
    assert loaded.vocabulary_by_name("labels") == [b"a", b"b"]
    assert "image" in loaded.transformed_feature_spec()
    first = _snapshot(run_dir)
    assert "transform_fn/saved_model.pb" in first and "transformed_metadata/schema.pbtxt" in first
    assert not any(".tft_metadata" in name for name in first)

    # The copy step once more (a retried bundle), from the same SavedModel, to the same names.
    copy_transform_fn(source_record.read_text(), output, RUN_ID)
    write_transformed_metadata(loaded.transformed_metadata, output, RUN_ID, asset_map={})
    assert _snapshot(run_dir) == first
    assert not os.listdir(os.path.join(output, "staging", RUN_ID, "tmp"))
    assert tf.io.gfile.exists(os.path.join(run_dir, "transform_fn", "assets", "labels"))


def test_the_asset_map_is_written_under_the_name_tf_transform_reads():
    # transform_output names it without importing tf.Transform (a worker's finalize step stays lean).
    assert ASSET_MAP_FILE == tft.TFTransformOutput.ASSET_MAP
