"""tf.Transform: the analysis on the train split and the transform of every split."""

import functools
from typing import TYPE_CHECKING

import apache_beam as beam
import numpy as np
import pyarrow as pa

from dataset_contract import features

if TYPE_CHECKING:
    from tfx_bsl.public import tfxio

IMAGE_RAW = "image_raw"
# Each image's per-channel mean and mean square (6 float64, little-endian, as bytes): what the analysis
# averages over train. Computed once when the image is decoded (image_moments) and kept in the version's
# ledger, so that a record carried over into the next version (preprocess/reuse/) adds its exact share
# to the statistics without being decoded again.
IMAGE_MOMENTS = "image_moments"
MEAN = "normalization_mean"
STD = "normalization_std"
LABEL_VOCABULARY_FILE = "labels"


def raw_feature_spec() -> dict:
    """Raw features, all scalar strings: the resized uint8 pixels and the metadata."""
    import tensorflow as tf

    names = (IMAGE_RAW, IMAGE_MOMENTS, features.CLASS_NAME, features.SHA256, features.URI)
    return {name: tf.io.FixedLenFeature([], tf.string) for name in names}


# A std below this (a constant colour channel over the whole train split)
# would blow pixels up to infinity; treat such a channel as unscaled.
_MIN_STD = 1e-3


def tensor_adapter_config() -> "tfxio.TensorAdapterConfig":
    """How the record batches below map to the raw feature tensors."""
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx_bsl.public import tfxio

    schema = schema_utils.schema_from_feature_spec(raw_feature_spec())
    source = tfxio.TFExampleBeamRecord(
        physical_format="inmem", telemetry_descriptors=["preprocess"], schema=schema
    )
    return source.TensorAdapterConfig()


@functools.cache
def _arrow_schema() -> pa.Schema:
    """The Arrow schema TFXIO expects for raw_feature_spec() (its column order, its types)."""
    return tensor_adapter_config().arrow_schema


def _binary_column(values: list[bytes]) -> pa.Array:
    offsets = pa.array(np.arange(len(values) + 1, dtype=np.int64))
    return pa.LargeListArray.from_arrays(offsets, pa.array(values, type=pa.large_binary()))


_PIXEL_VALUES = np.arange(256, dtype=np.int64)
_PIXEL_SQUARES = _PIXEL_VALUES**2


def image_moments(pixels: bytes) -> bytes:
    """The per-channel mean and mean square of an image's uint8 RGB pixels: 6 float64 as bytes, the same on
    every worker (exact integer sums, correctly rounded quotients)."""
    flat = np.frombuffer(pixels, dtype=np.uint8).reshape(-1, features.CHANNELS)
    count = flat.shape[0]
    # From each channel's histogram: the same exact integer sums as summing the pixels and their squares,
    # without widening every pixel to 64 bits (0.2 ms instead of 0.7 at 224 px: paid once per image).
    sums, squares = [], []
    for channel in range(features.CHANNELS):
        histogram = np.bincount(flat[:, channel], minlength=256).astype(np.int64)
        sums.append(int(histogram @ _PIXEL_VALUES))
        squares.append(int(histogram @ _PIXEL_SQUARES))
    moments = [total / count for total in sums] + [total / count for total in squares]
    return np.asarray(moments, dtype="<f8").tobytes()


def moments_of(example: dict) -> bytes:
    """An example's moments: kept with it (decoded, or carried from the ledger), else from its pixels."""
    moments = example.get("moments")
    return moments if moments is not None else image_moments(example["image_raw"])


def analysis_example(example: dict) -> dict:
    """What the analysis reads of an example: its moments and metadata, not its pixels (preprocessing_fn
    takes the statistics from the moments). The runner may hold whatever reaches the analysis (the local
    runner holds a PCollection that crosses a stage boundary in memory), so that is a few hundred bytes
    per image instead of its pixels."""
    return {
        "image_raw": b"",
        "moments": moments_of(example),
        "label": example["label"],
        "sha256": example["sha256"],
        "uri": example["uri"],
    }


def to_record_batch(examples: list[dict]) -> pa.RecordBatch:
    """A batch of raw example dicts (from DecodeImagesFn, or carried over) as one Arrow record batch."""
    columns = {
        IMAGE_RAW: [example["image_raw"] for example in examples],
        IMAGE_MOMENTS: [moments_of(example) for example in examples],
        **{
            name: [example[key].encode("utf-8") for example in examples]
            for name, key in (
                (features.CLASS_NAME, "label"),
                (features.SHA256, "sha256"),
                (features.URI, "uri"),
            )
        },
    }
    schema = _arrow_schema()
    return pa.RecordBatch.from_arrays([_binary_column(columns[name]) for name in schema.names], schema=schema)


class ToRecordBatches(beam.PTransform):
    """Raw example dicts -> Arrow record batches of at most `max_batch_size` rows (which bounds memory)."""

    def __init__(self, max_batch_size: int):
        super().__init__()
        self._max_batch_size = max_batch_size

    def expand(self, examples):
        return (
            examples
            | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._max_batch_size)
            | "ToArrow" >> beam.Map(to_record_batch)
        )


def make_preprocessing_fn(image_size: int, encoding: str):
    """The tf.Transform preprocessing_fn for square `image_size` images."""
    import tensorflow as tf
    import tensorflow_transform as tft

    from preprocess.label_vocabulary import SortedLabelVocabulary

    num_values = image_size * image_size * features.CHANNELS

    def preprocessing_fn(inputs):
        # Each image's moments come with it (image_moments: exact, computed once per image), so the
        # analysis never needs pixels, and a carried-over record (no pixels in this run) counts the same.
        moments = tf.reshape(tf.io.decode_raw(inputs[IMAGE_MOMENTS], tf.float64), [-1, 2 * features.CHANNELS])
        image_mean = moments[:, : features.CHANNELS]
        image_mean_square = moments[:, features.CHANNELS :]
        mean64 = tft.mean(image_mean, reduce_instance_dims=False, output_dtype=tf.float64)
        mean_square64 = tft.mean(image_mean_square, reduce_instance_dims=False, output_dtype=tf.float64)
        std64 = tf.sqrt(tf.maximum(mean_square64 - tf.square(mean64), 0.0))
        std64 = tf.where(std64 < _MIN_STD, tf.ones_like(std64), std64)
        mean = tf.cast(mean64, tf.float32)
        std = tf.cast(std64, tf.float32)

        vocabulary_path = tft.experimental.ptransform_analyzer(
            inputs=[inputs[features.CLASS_NAME]],
            ptransform=SortedLabelVocabulary(LABEL_VOCABULARY_FILE),
            output_dtypes=[tf.string],
            output_shapes=[[]],
            output_asset_default_values=[LABEL_VOCABULARY_FILE.encode()],
            name="sorted_label_vocabulary",
        )[0]
        labels = tft.apply_vocabulary(inputs[features.CLASS_NAME], vocabulary_path, default_value=-1)

        batch_size = tf.shape(moments)[0]
        outputs = {
            features.LABEL: tf.cast(labels, tf.int64),
            features.CLASS_NAME: inputs[features.CLASS_NAME],
            features.SHA256: inputs[features.SHA256],
            features.URI: inputs[features.URI],
            MEAN: tf.broadcast_to(mean, [batch_size, features.CHANNELS]),
            STD: tf.broadcast_to(std, [batch_size, features.CHANNELS]),
        }
        if encoding in features.NORMALIZED_ENCODINGS:
            pixels = tf.io.decode_raw(inputs[IMAGE_RAW], tf.uint8)
            pixels = tf.reshape(pixels, [-1, image_size * image_size, features.CHANNELS])
            normalized = (tf.cast(pixels, tf.float32) - mean) / std
            outputs[features.IMAGE] = tf.reshape(normalized, [-1, num_values])
        else:
            outputs[features.IMAGE] = inputs[IMAGE_RAW]
        return outputs

    return preprocessing_fn
