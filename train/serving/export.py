"""The serving SavedModel: encoded image bytes in, per-image class probabilities, names and errors out.

It runs stage 1's decode and the evaluation pipeline's input in-graph, then the model (the signatures and
files: docs/internals.md; how to serve it: docs/serving.md).
"""

import json
import logging
import os
import tempfile

import keras
import tensorflow as tf

from dataset_contract import image_errors
from dataset_contract import manifest as manifest_lib
from train.data import dataset
from train.serving import decode, image_header, keras_model, warmup
from train.serving.keras_model import KERAS_FILE, model_input

EXPORT_DIR = "export"
SIGNATURE = "serving_default"
CONFIG_SIGNATURE = "serving_config"
INPUT_KEY = "image_bytes"
CONFIG_INPUT_KEY = "request"
OUTPUT_KEYS = ("probabilities", "label", "valid", "error")
EXTRA_ASSETS_DIR = "assets.extra"
CONFIG_FILE = "serving_config.json"
LINEAGE_FILE = "dataset_lineage.json"

log = logging.getLogger(__name__)


def serving_limits(manifest: dict, **overrides) -> decode.ServingLimits:
    """The limits an export of this dataset enforces: the dataset's own --max-pixels and --max-file-mb
    unless overridden."""
    max_pixels = manifest["image"].get("max_pixels", image_errors.DEFAULT_MAX_PIXELS)
    max_file_bytes = manifest_lib.max_file_bytes(manifest["image"])
    return decode.ServingLimits(**{"max_pixels": max_pixels, "max_file_bytes": max_file_bytes, **overrides})


def export_serving_model(
    model: keras.Model,
    manifest: dict,
    export_dir: str,
    limits: decode.ServingLimits | None = None,
    lineage: dict | None = None,
) -> str:
    """Write `model` with a bytes-in signature to `export_dir`; returns the path.

    `limits` defaults to `serving_limits(manifest)`. `lineage`, the dataset run
    trained on (dataset_pin.PinnedDataset.lineage), goes to
    assets.extra/dataset_lineage.json. Called outside the training strategy's scope: the model is rebuilt there from its config and
    given the trained weights, so the SavedModel holds plain variables
    whatever strategy trained it (TPU, mirrored or multi-worker variables do
    not save into a serving graph as they are). The layers keep their dtype
    policy, so a mixed-precision model serves in the precision it was trained
    in; its outputs are float32.
    """
    limits = limits or serving_limits(manifest)
    serving_model = plain_copy(model)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    size, resize_method = image_format.height, manifest["image"]["resize_method"]
    labels = list(manifest["labels"])

    def serve(image_bytes):
        decoded = decode.decode_batch(image_bytes, size, resize_method, limits)
        probabilities = predict_unless_empty(
            serving_model, model_input(decoded.pixels, image_format), len(labels)
        )
        probabilities = tf.where(decoded.valid[:, None], probabilities, tf.zeros_like(probabilities))
        label = tf.gather(tf.constant(labels, tf.string), tf.argmax(probabilities, axis=-1))
        return {
            "probabilities": probabilities,
            "label": tf.where(decoded.valid, label, ""),
            "valid": decoded.valid,
            "error": decoded.error,
        }

    config = serving_config(size, resize_method, limits, labels)

    def describe(request):
        del request  # TF Serving cannot call a signature without inputs; any int32 scalar will do
        return {
            "image_size": tf.constant(size, tf.int64),
            "resize_method": tf.constant(resize_method),
            "max_pixels": tf.constant(limits.max_pixels, tf.int64),
            "max_decode_bytes": tf.constant(limits.max_decode_bytes, tf.int64),
            "max_file_bytes": tf.constant(limits.max_file_bytes, tf.int64),
            "labels": tf.constant(labels, tf.string),
        }

    # Traced here without autograph: the serving code is plain graph-building Python (no Python control
    # flow on tensors), and converting it would only cost export time.
    serve = tf.function(
        serve, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)], autograph=False
    )
    describe = tf.function(
        describe, input_signature=[tf.TensorSpec([], tf.int32, name=CONFIG_INPUT_KEY)], autograph=False
    )
    serve.get_concrete_function()
    describe.get_concrete_function()
    archive = keras.export.ExportArchive()
    archive.track(serving_model)
    archive.add_endpoint(name=SIGNATURE, fn=serve)
    archive.add_endpoint(name=CONFIG_SIGNATURE, fn=describe)
    archive.write_out(export_dir, verbose=False)
    extra_dir = manifest_lib.join(export_dir, EXTRA_ASSETS_DIR)
    tf.io.gfile.makedirs(extra_dir)
    with tf.io.gfile.GFile(manifest_lib.join(extra_dir, CONFIG_FILE), "w") as handle:
        json.dump(config, handle, indent=2)
    warmup.write_warmup_requests(manifest_lib.join(extra_dir, warmup.WARMUP_FILE), SIGNATURE, INPUT_KEY)
    if lineage is not None:
        with tf.io.gfile.GFile(manifest_lib.join(extra_dir, LINEAGE_FILE), "w") as handle:
            json.dump(lineage, handle, indent=2, sort_keys=True)
    return export_dir


def plain_copy(model: keras.Model) -> keras.Model:
    """`model` rebuilt from its config with its weights: plain variables, whatever strategy trained it."""
    copy = keras.Model.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    return copy


def save_keras_model(model: keras.Model, model_dir: str, manifest: dict) -> str | None:
    """Write `model` (a plain copy, uncompiled) to MODEL_DIR/model.keras; returns the path, or None.

    The serving SavedModel stays the main export; this is the file for Keras
    code (`train.load_model`, `keras.models.load_model`), with the class names
    and stage 1's geometry inside it (keras_model.DatasetInfo). None, with a
    warning, where Keras cannot save the model (a layer it cannot serialize).
    """
    destination = manifest_lib.join(model_dir, KERAS_FILE)
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, KERAS_FILE)
        try:
            keras_model.with_dataset_info(plain_copy(model), manifest).save(local)
        except (TypeError, ValueError, NotImplementedError) as exc:
            log.warning(
                "no %s: Keras cannot save this model (%s); the SavedModel export is complete", KERAS_FILE, exc
            )
            return None
        # Written next to the destination, then renamed: a reader never sees half a file.
        tf.io.gfile.copy(local, destination + ".tmp", overwrite=True)
        tf.io.gfile.rename(destination + ".tmp", destination, overwrite=True)
    return destination


def predict_unless_empty(model: keras.Model, inputs: tf.Tensor, num_classes: int) -> tf.Tensor:
    """float32 [batch, num_classes] probabilities of `model`; for an empty batch, [0, num_classes] without
    running the model.

    TensorFlow's oneDNN kernels (on by default on AVX-512/AMX CPUs such as Sapphire Rapids, or with
    TF_ENABLE_ONEDNN_OPTS=1) fail a zero-size batch inside batch normalization ("Incompatible shapes:
    [32] vs. [0,224,224,3]"), so an empty request would be an error on those machines only. A cond on
    the batch size keeps every model op out of the empty case, whatever the CPU or the model.
    """
    return tf.cond(
        tf.shape(inputs)[0] > 0,
        lambda: tf.cast(model(inputs, training=False), tf.float32),
        lambda: tf.zeros([0, num_classes], tf.float32),
    )


def serving_model_input(
    image_bytes: tf.Tensor,
    image_format: dataset.ImageFormat,
    resize_method: str,
    limits: decode.ServingLimits | None = None,
):
    """A batch of encoded images -> what the evaluation pipeline feeds the model (zeros for invalid images)."""
    limits = limits or decode.ServingLimits()
    decoded = decode.decode_batch(image_bytes, image_format.height, resize_method, limits)
    return model_input(decoded.pixels, image_format)


def serving_config(size: int, resize_method: str, limits: decode.ServingLimits, labels) -> dict:
    """What a client needs to know about an export (assets.extra/serving_config.json)."""
    return {
        "signature": SIGNATURE,
        "input": {
            "name": INPUT_KEY,
            "dtype": "string",
            "shape": [-1],
            "formats": list(image_header.FORMAT_NAMES[:-1]),
        },
        "outputs": {
            "probabilities": "float32 [-1, num_classes], zeros where not valid",
            "label": "string [-1], the most probable class name, empty where not valid",
            "valid": "bool [-1]",
            "error": "string [-1], empty where valid, else '<reason>: <detail>'",
        },
        "error_reasons": [reason for reason in image_header.PROBLEMS if reason],
        "image_size": size,
        "resize_method": resize_method,
        "max_pixels": limits.max_pixels,
        "max_decode_bytes": limits.max_decode_bytes,
        "max_file_bytes": limits.max_file_bytes,
        "labels": list(labels),
        "warmup_requests": f"{EXTRA_ASSETS_DIR}/{warmup.WARMUP_FILE}",
    }


def export_path(model_dir: str) -> str:
    return manifest_lib.join(model_dir, EXPORT_DIR)
