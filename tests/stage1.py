"""Test support: generate a corpus, run the real stage 1 job on it, read shards back.

Shared by the preprocess, train and pipelines tests. Reading uses plain
tf.data on the files the manifest lists, nothing from `train`.
"""

import json
import os

import numpy as np
import tensorflow as tf

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from pipelines.sample_corpus import write_sample_corpus
from preprocess import pipeline as preprocess_pipeline


def write_corpus(root, images_per_class=10, seed=0, include_broken=True):
    return write_sample_corpus(
        str(root), images_per_class=images_per_class, seed=seed, include_broken=include_broken
    )


# The sample corpus is a few images per class plus six broken files: a quarter or more of it fails at
# the sizes tests use, far above --max-failed-fraction's default, which tests/preprocess/test_publish_guards.py
# holds on its own.
ALLOW_ANY_FAILURES = ("--max-failed-fraction", "1")


def run_stage1(input_spec, output_dir, *extra_args, image_size=32, encoding="float32", min_shards=2):
    """Runs `python -m preprocess` in process (DirectRunner); returns the manifest.

    Any share of failed inputs is accepted unless `extra_args` sets --max-failed-fraction.
    """
    if "--max-failed-fraction" not in extra_args:
        extra_args = (*extra_args, *ALLOW_ANY_FAILURES)
    argv = [
        "--input",
        str(input_spec),
        "--output",
        str(output_dir),
        "--image-size",
        str(image_size),
        "--encoding",
        encoding,
        "--min-shards",
        str(min_shards),
        *extra_args,
    ]
    return preprocess_pipeline.run(argv)


def read_manifest(dataset_dir):
    with open(os.path.join(dataset_dir, manifest_lib.MANIFEST_FILE)) as handle:
        return json.load(handle)


def read_errors(dataset_dir):
    path = os.path.join(dataset_dir, manifest_lib.errors_path(read_manifest(dataset_dir)))
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


_PARSE_SPEC = {
    features.IMAGE: tf.io.FixedLenFeature([], tf.string),
    features.LABEL: tf.io.FixedLenFeature([], tf.int64),
    features.CLASS_NAME: tf.io.FixedLenFeature([], tf.string),
    features.SHA256: tf.io.FixedLenFeature([], tf.string),
    features.URI: tf.io.FixedLenFeature([], tf.string),
}


def decode_image_feature(payload: bytes, manifest) -> np.ndarray:
    """The stored image as float32 [H, W, 3] in the stored units (normalized or 0-255)."""
    image = manifest["image"]
    shape = (image["height"], image["width"], image["channels"])
    encoding = image["encoding"]
    if encoding == features.JPEG:
        return tf.io.decode_jpeg(payload, channels=3).numpy().astype(np.float32)
    dtype = {features.BFLOAT16: tf.bfloat16, features.FLOAT32: tf.float32, features.UINT8: tf.uint8}[encoding]
    return tf.cast(tf.reshape(tf.io.decode_raw(payload, dtype), shape), tf.float32).numpy()


def read_split(dataset_dir, split, manifest=None):
    """Every example of a split, as dicts with the image decoded per the manifest."""
    manifest = manifest or read_manifest(dataset_dir)
    paths = [os.path.join(dataset_dir, shard["path"]) for shard in manifest["splits"][split]["shards"]]
    rows = []
    for record in tf.data.TFRecordDataset(paths):
        parsed = tf.io.parse_single_example(record, _PARSE_SPEC)
        rows.append(
            {
                "image": decode_image_feature(parsed[features.IMAGE].numpy(), manifest),
                "label": int(parsed[features.LABEL]),
                "class_name": parsed[features.CLASS_NAME].numpy().decode(),
                "sha256": parsed[features.SHA256].numpy().decode(),
                "uri": parsed[features.URI].numpy().decode(),
            }
        )
    return rows
