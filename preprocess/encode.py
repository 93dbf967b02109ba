"""Transformed record batches -> serialized tf.train.Examples, per encoding.

Works a record batch at a time: the float image column is converted to the
target dtype for the whole batch in one numpy call, and only the final
`tf.train.Example` assembly is per row.
"""

import io

import apache_beam as beam
import ml_dtypes
import numpy as np
import tensorflow as tf
from apache_beam.metrics import Metrics
from PIL import Image

from dataset_contract import features
from preprocess import errors
from preprocess.progress import ProgressCounter
from preprocess.transform import MEAN, STD

# Little-endian on every host: the reader's decode_raw assumes it.
_STORAGE_DTYPES = {
    features.BFLOAT16: np.dtype(ml_dtypes.bfloat16).newbyteorder("<"),
    features.FLOAT32: np.dtype("<f4"),
}


def _bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _column_values(batch, name) -> list:
    return batch.column(name).flatten().to_pylist()


def encode_jpeg(pixels: bytes, image_size: int, quality: int) -> bytes:
    image = Image.frombuffer("RGB", (image_size, image_size), pixels, "raw", "RGB", 0, 1)
    out = io.BytesIO()
    # 4:4:4 chroma: at training resolutions 4:2:0 subsampling smears colour
    # edges over a visible share of a small image (mean error doubles at 32 px).
    image.save(out, format="JPEG", quality=quality, subsampling=0)
    return out.getvalue()


def image_payloads(batch, encoding: str, image_size: int, jpeg_quality: int) -> list[bytes]:
    """The `image` feature of every row of a transformed record batch."""
    column = batch.column(features.IMAGE)
    if encoding in features.NORMALIZED_ENCODINGS:
        values = column.flatten().to_numpy(zero_copy_only=False).reshape(batch.num_rows, -1)
        stored = values.astype(_STORAGE_DTYPES[encoding])
        return [row.tobytes() for row in stored]
    raw = column.flatten().to_pylist()
    if encoding == features.UINT8:
        return raw
    return [encode_jpeg(pixels, image_size, jpeg_quality) for pixels in raw]


class EncodeExamplesFn(beam.DoFn):
    """(RecordBatch, passthrough) of one split -> EncodedExample tuples.

    Main output: (serialized example, class name). 'errors': rows whose class
    has no training example (the vocabulary is learned on train, so such a row
    has label -1 and nothing to learn it from). 'stats': the (mean, std) the
    transform applied, once per batch (all equal), for the manifest.
    """

    def __init__(self, split: str, encoding: str, image_size: int, jpeg_quality: int):
        self._split = split
        self._encoding = encoding
        self._image_size = image_size
        self._jpeg_quality = jpeg_quality
        self._encoded = Metrics.counter("preprocess", f"encoded_{split}")
        self._progress = ProgressCounter("encoded")
        self._progress_failed = ProgressCounter("failed")

    def process(self, element):
        batch = element[0] if isinstance(element, tuple) else element
        if batch.num_rows == 0:
            return
        labels = _column_values(batch, features.LABEL)
        class_names = _column_values(batch, features.CLASS_NAME)
        hashes = _column_values(batch, features.SHA256)
        uris = _column_values(batch, features.URI)
        mean = batch.column(MEAN).flatten().to_numpy()[: features.CHANNELS]
        std = batch.column(STD).flatten().to_numpy()[: features.CHANNELS]
        yield beam.pvalue.TaggedOutput("stats", (tuple(float(v) for v in mean), tuple(float(v) for v in std)))
        payloads = image_payloads(batch, self._encoding, self._image_size, self._jpeg_quality)
        for label, class_name, sha256, uri, payload in zip(
            labels, class_names, hashes, uris, payloads, strict=True
        ):
            if label < 0:
                self._progress_failed.inc()
                yield beam.pvalue.TaggedOutput(
                    "errors",
                    errors.ErrorRecord(
                        uri.decode("utf-8"),
                        errors.LABEL_NOT_IN_TRAIN,
                        f"class {class_name.decode('utf-8')!r} has no example in the train split, "
                        f"so this {self._split} example cannot be labelled",
                    ),
                )
                continue
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        features.IMAGE: _bytes_feature(payload),
                        features.LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                        features.CLASS_NAME: _bytes_feature(class_name),
                        features.SHA256: _bytes_feature(sha256),
                        features.URI: _bytes_feature(uri),
                    }
                )
            )
            self._encoded.inc()
            self._progress.inc()
            yield example.SerializeToString(), class_name.decode("utf-8")
