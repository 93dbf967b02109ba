"""Serialized tf.train.Examples, per encoding: from decoded images (one pass) or transformed batches."""

import io

import apache_beam as beam
import ml_dtypes
import numpy as np
from apache_beam.metrics import Metrics
from PIL import Image

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.decode.spill import SpillAndReload
from preprocess.launch.progress import ProgressCounter
from preprocess.reuse.ledger import entry_of
from preprocess.transform import ToRecordBatches, tensor_adapter_config

# Little-endian on every host: the reader's decode_raw assumes it.
_STORAGE_DTYPES = {
    features.BFLOAT16: np.dtype(ml_dtypes.bfloat16).newbyteorder("<"),
    features.FLOAT32: np.dtype("<f4"),
}


def encode_jpeg(pixels: bytes, image_size: int, quality: int) -> bytes:
    image = Image.frombuffer("RGB", (image_size, image_size), pixels, "raw", "RGB", 0, 1)
    out = io.BytesIO()
    # 4:4:4 chroma: at training resolutions 4:2:0 subsampling smears colour
    # edges over a visible share of a small image (mean error doubles at 32 px).
    image.save(out, format="JPEG", quality=quality, subsampling=0)
    return out.getvalue()


def serialize_example(payload: bytes, label: int, class_name: bytes, sha256: bytes, uri: bytes) -> bytes:
    """One record of the dataset (docs/dataset_format.md), serialized."""
    import tensorflow as tf  # already loaded after the first record: a dictionary lookup

    feature = {
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        for name, value in (
            (features.IMAGE, payload),
            (features.CLASS_NAME, class_name),
            (features.SHA256, sha256),
            (features.URI, uri),
        )
    }
    feature[features.LABEL] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def label_not_in_train(uri: str, class_name: str, split: str) -> errors.ErrorRecord:
    return errors.ErrorRecord(
        uri,
        errors.LABEL_NOT_IN_TRAIN,
        f"class {class_name!r} has no example in the train split, so this {split} example cannot be labelled",
    )


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
    """(RecordBatch, passthrough) of one split -> (split, serialized example, class name); 'errors': rows
    whose class has no train example (label -1: the vocabulary is learned on train)."""

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
        columns = (features.LABEL, features.CLASS_NAME, features.SHA256, features.URI)
        values = [batch.column(name).flatten().to_pylist() for name in columns]
        payloads = image_payloads(batch, self._encoding, self._image_size, self._jpeg_quality)
        for label, class_name, sha256, uri, payload in zip(*values, payloads, strict=True):
            if label < 0:
                self._progress_failed.inc()
                yield beam.pvalue.TaggedOutput(
                    "errors", label_not_in_train(uri.decode("utf-8"), class_name.decode("utf-8"), self._split)
                )
                continue
            self._encoded.inc()
            self._progress.inc()
            yield self._split, serialize_example(payload, label, class_name, sha256, uri), class_name.decode()


class EncodeDecodedFn(beam.DoFn):
    """Raw example dict (DecodeImagesFn) -> (split, serialized example, class name, ledger entry), for uint8
    and jpeg. `vocabulary` (a side input): the train split's sorted class names, a label's index its
    position; an image of a class without a train input goes to 'errors' (label_not_in_train)."""

    def __init__(self, encoding: str, image_size: int, jpeg_quality: int):
        if encoding in features.NORMALIZED_ENCODINGS:
            raise ValueError(f"{encoding} records hold normalized values: encode them after the transform")
        self._encoding = encoding
        self._image_size = image_size
        self._jpeg_quality = jpeg_quality
        self._encoded = {}
        self._progress = ProgressCounter("encoded")
        self._progress_failed = ProgressCounter("failed")
        self._indices = None

    def _index(self, vocabulary: list[str]) -> dict[str, int]:
        # A side input is the same object for a whole bundle: build its index once.
        if self._indices is None or self._indices[0] is not vocabulary:
            self._indices = (vocabulary, {name: index for index, name in enumerate(vocabulary)})
        return self._indices[1]

    def process(self, example: dict, vocabulary: list[str]):
        split, class_name = example["split"], example["label"]
        label = self._index(vocabulary).get(class_name)
        if label is None:
            self._progress_failed.inc()
            yield beam.pvalue.TaggedOutput("errors", label_not_in_train(example["uri"], class_name, split))
            return
        payload = example["image_raw"]
        if self._encoding == features.JPEG:
            payload = encode_jpeg(payload, self._image_size, self._jpeg_quality)
        if split not in self._encoded:
            self._encoded[split] = Metrics.counter("preprocess", f"encoded_{split}")
        self._encoded[split].inc()
        self._progress.inc()
        serialized = serialize_example(
            payload, label, class_name.encode(), example["sha256"].encode(), example["uri"].encode()
        )
        yield split, serialized, class_name, entry_of(example)


def encode_in_one_pass(decoded, vocabulary, args):
    """uint8 and jpeg: records encoded as the images are decoded (EncodeDecodedFn)."""
    return decoded | "Encode" >> beam.ParDo(
        EncodeDecodedFn(args.encoding, args.stored_size, args.jpeg_quality),
        beam.pvalue.AsSingleton(vocabulary),
    ).with_outputs("errors", main="examples")


def encode_after_transform(decoded, run_transform_fn, args, output_dir, run_id):
    """bfloat16 and float32: the decoded batches are spilled, then transformed with the statistics."""
    import tensorflow_transform.beam as tft_beam  # not at module level: see pipeline.build_pipeline

    adapter_config = tensor_adapter_config()
    by_split = decoded | "PartitionBySplit" >> beam.Partition(
        lambda example, _: manifest_lib.SPLITS.index(example["split"]), len(manifest_lib.SPLITS)
    )
    examples, errors_out = [], []
    for index, split in enumerate(manifest_lib.SPLITS):
        # Decoded once; the transform reads them back from disk (decode/spill.py).
        reloaded = (
            by_split[index]
            | f"ToRecordBatches[{split}]" >> ToRecordBatches(args.transform_batch_size)
            | f"Spill[{split}]" >> SpillAndReload(split, output_dir, run_id)
        )
        transformed, _ = ((reloaded, adapter_config), run_transform_fn) | f"Transform[{split}]" >> (
            tft_beam.TransformDataset(output_record_batches=True)
        )
        encoded = transformed | f"Encode[{split}]" >> beam.ParDo(
            EncodeExamplesFn(split, args.encoding, args.stored_size, args.jpeg_quality)
        ).with_outputs("errors", main="examples")
        examples.append(encoded.examples)
        errors_out.append(encoded.errors)
    return (
        examples | "AllEncoded" >> beam.Flatten(),
        errors_out | "AllEncodeErrors" >> beam.Flatten(),
    )
