"""tf.Transform's output (`transform_fn/`, `transformed_metadata/`) written into the run's directory."""

import json

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from google.protobuf import text_format

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import filesystem
from preprocess.publish.runs import RunPaths
from preprocess.transform import IMAGE_MOMENTS, IMAGE_RAW, LABEL_VOCABULARY_FILE, MEAN, STD, image_moments

SCHEMA_FILE = "schema.pbtxt"
# tf.Transform keeps its own metadata inside the SavedModel directory; its
# WriteTransformFn leaves it out of the published copy too.
_TFT_PRIVATE_DIR = ".tft_metadata"
# tf.Transform's name for the asset map file (TFTransformOutput.ASSET_MAP).
ASSET_MAP_FILE = "asset_map"


def copy_transform_fn(saved_model_dir: str, output_dir: str, run_id: str) -> str:
    """Copy tf.Transform's SavedModel into runs/<run id>/transform_fn/; returns that directory."""
    paths = RunPaths(output_dir, run_id)
    destination = paths.final(manifest_lib.TRANSFORM_FN_DIR)
    source_dir = saved_model_dir.rstrip("/")
    for metadata in filesystem.list_files(source_dir):
        relative = metadata.path[len(source_dir) + 1 :]
        if relative.split("/")[0] == _TFT_PRIVATE_DIR:
            continue
        filesystem.copy_file(metadata.path, manifest_lib.join(destination, relative), tmp_dir=paths.tmp_dir)
    return destination


def write_transformed_metadata(metadata, output_dir: str, run_id: str, asset_map: dict) -> str:
    """The transformed data's schema (and asset map) into runs/<run id>/transformed_metadata/."""
    paths = RunPaths(output_dir, run_id)
    destination = paths.final(manifest_lib.TRANSFORMED_METADATA_DIR)
    schema = text_format.MessageToString(metadata.schema).encode("utf-8")
    filesystem.write_bytes(manifest_lib.join(destination, SCHEMA_FILE), schema, tmp_dir=paths.tmp_dir)
    if asset_map:
        filesystem.write_bytes(
            manifest_lib.join(destination, ASSET_MAP_FILE),
            json.dumps(asset_map).encode("utf-8"),
            tmp_dir=paths.tmp_dir,
        )
    return destination


class WriteTransformOutput(beam.PTransform):
    """tf.Transform's transform_fn -> a PCollection of one path, `<output>/runs/<run id>/transform_fn`, made
    once the metadata is written too (whatever waits on it waits on both)."""

    def __init__(self, output_dir: str, run_id):
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id

    def _extract_input_pvalues(self, transform_fn):
        saved_model_dir, metadata = transform_fn
        return transform_fn, [saved_model_dir, metadata.deferred_metadata]

    def expand(self, transform_fn):
        saved_model_dir, metadata = transform_fn
        run_id = beam.pvalue.AsSingleton(self._run_id)
        metadata_written = metadata.deferred_metadata | "WriteMetadata" >> beam.Map(
            write_transformed_metadata,
            output_dir=self._output_dir,
            run_id=run_id,
            asset_map=getattr(metadata, "asset_map", None) or {},
        )
        # `written`: a side input only to order the copy after the metadata.
        return saved_model_dir | "CopyTransformFn" >> beam.Map(
            lambda saved_model, output_dir, run_id, written: copy_transform_fn(
                saved_model, output_dir, run_id
            ),
            output_dir=self._output_dir,
            run_id=run_id,
            written=beam.pvalue.AsList(metadata_written),
        )


def read_label_vocabulary(transform_fn_dir: str) -> list[str]:
    """The class names of the label vocabulary tf.Transform wrote, in index order."""
    path = manifest_lib.join(transform_fn_dir, "assets", LABEL_VOCABULARY_FILE)
    with FileSystems.open(path) as handle:
        return [line for line in handle.read().decode("utf-8").split("\n") if line]


def read_normalization(transform_fn_dir: str, image_size: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The per-channel (mean, std) the transform graph applies, read by running it on one black image (the
    statistics are constants inside the graph), as a trainer would see them."""
    import tensorflow as tf
    from tensorflow_transform.output_wrapper import TFTransformOutput

    run_dir = transform_fn_dir.rstrip("/").rsplit("/", 1)[0]
    output = TFTransformOutput(run_dir)
    black = bytes(image_size * image_size * features.CHANNELS)
    raw = {
        IMAGE_RAW: tf.constant([black]),
        IMAGE_MOMENTS: tf.constant([image_moments(black)]),
        features.CLASS_NAME: tf.constant([b""]),
        features.SHA256: tf.constant([b""]),
        features.URI: tf.constant([b""]),
    }
    transformed = output.transform_raw_features(raw)
    mean = np.asarray(transformed[MEAN])[0]
    std = np.asarray(transformed[STD])[0]
    return tuple(float(value) for value in mean), tuple(float(value) for value in std)
