"""The serving SavedModel: bytes in, the same predictions as the training pipeline out.

Parity, for every validation image of every encoding, between
  serving:   original file bytes -> exported `serving_default` signature
  training:  stage 1 shards -> the training pipeline's parse + decode -> the trained Keras model
Tolerances (measured on this corpus: 32x32 images, a small CNN trained 6 epochs, mean top
probability ~0.55):
  - input tensors (serving decode+resize vs what the pipeline feeds the model), mean absolute difference per
    image in 0-255 levels: <= 1 for bfloat16/float32/uint8 (measured 0.27; PIL vs TF resize
    rounding and bfloat16 rounding), <= 8 for jpeg (measured 4.2: stage 1 stores a lossy
    quality-90 JPEG, serving sees the original);
  - probabilities, max absolute difference: <= 0.01 (measured 0.003), jpeg <= 0.1 (measured 0.046);
  - sensitivity: a near-constant model would pass the probability bound whatever the input,
    so the bound is also taken relative to how much the model's output changes between two
    validation images (median over pairs of the max absolute difference, measured 0.22-0.41):
    the median serving-vs-pipeline difference must be below 2% of it (measured 0.1-0.15%), 10%
    for jpeg (measured 1.7-2.0%). This holds for any model that learned something, however
    confident: a check on top-1 labels would either depend on how sure a 6-epoch model happens
    to be, or, restricted to images whose margin exceeds twice the probability bound, could not
    fail once the bound holds.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from tests.train.checkpoint_files import restore_last_checkpoint
from train.config import TrainConfig
from train.data import checks, dataset
from train.model import models
from train.serving import decode, export
from train.trainer import train_and_evaluate

# In the Python 3.10 leg's subset (scripts/test_py310.sh): training to a SavedModel export under the Keras pinned for 3.10;
# the tests marked `jax` also in the JAX leg (scripts/test_jax.sh): the export a TensorFlow process writes from
# JAX-trained weights (one training run there, the bfloat16 dataset's).
pytestmark = pytest.mark.py310

ENCODINGS = ("bfloat16", "float32", "uint8", "jpeg")
INPUT_MEAN_LEVELS = {"bfloat16": 1.0, "float32": 1.0, "uint8": 1.0, "jpeg": 8.0}
PROBABILITY_TOLERANCE = {"bfloat16": 0.01, "float32": 0.01, "uint8": 0.01, "jpeg": 0.1}
RELATIVE_TOLERANCE = {"bfloat16": 0.02, "float32": 0.02, "uint8": 0.02, "jpeg": 0.1}

_URI_SPEC = {features.URI: tf.io.FixedLenFeature([], tf.string)}


@pytest.fixture(scope="module")
def trained_run(stage1_dataset, tmp_path_factory):
    """trained_run(encoding) -> (data_dir, model_dir, metrics) of a short real training run, made once."""
    runs = {}

    def run(encoding):
        if encoding not in runs:
            data_dir = stage1_dataset(encoding)
            model_dir = str(tmp_path_factory.mktemp(f"model_{encoding}"))
            # An explicit peak learning rate: the default scales with the batch (1e-3 x 8 / 256), too low
            # for 36 steps to learn what the parity tolerances below are measured against.
            config = TrainConfig(
                data_dir=data_dir, model_dir=model_dir, epochs=6, global_batch_size=8, learning_rate=1e-3
            )
            runs[encoding] = (data_dir, model_dir, train_and_evaluate(config))
        return runs[encoding]

    return run


def restore_trained_model(data_dir, model_dir, manifest):
    """The Keras model of a finished run, from its last checkpoint."""
    image_format = dataset.ImageFormat.from_manifest(manifest)
    model = models.build_model_for_dataset(models.SMALL_CNN, image_format, len(manifest["labels"]))
    restore_last_checkpoint(model, model_dir)
    return model


def validation_through_the_training_pipeline(data_dir, manifest):
    """(uris, images) of every validation example, decoded by the training pipeline's own functions."""
    image_format = dataset.ImageFormat.from_manifest(manifest)
    paths = [
        manifest_lib.join(data_dir, s["path"]) for s in manifest["splits"][manifest_lib.VALIDATION]["shards"]
    ]
    uris, images = [], []
    for serialized in tf.data.TFRecordDataset(paths).batch(16):
        images.append(dataset.decode_images(dataset.parse_batch(serialized)[features.IMAGE], image_format))
        uris.extend(u.decode() for u in tf.io.parse_example(serialized, _URI_SPEC)[features.URI].numpy())
    return uris, tf.concat(images, axis=0)


def read_bytes(uris):
    contents = []
    for uri in uris:
        with open(uri, "rb") as handle:
            contents.append(handle.read())
    return tf.constant(contents)


@pytest.mark.jax
def test_export_serves_encoded_bytes_in_a_fresh_process_without_project_code(
    trained_run, sample_corpus, tmp_path
):
    data_dir, model_dir, metrics = trained_run("bfloat16")
    manifest = checks.read_manifest(data_dir)
    export_dir = metrics["export_dir"]
    # One file of each kind stage 1 accepts: formats, grayscale, CMYK, alpha, EXIF rotation, PNG named .jpg.
    kinds = {}
    for corpus_file in sample_corpus.files:
        if corpus_file.expected_error is None and corpus_file.kind not in kinds:
            kinds[corpus_file.kind] = sample_corpus.uri(corpus_file)
    script = textwrap.dedent(
        """
        import json, sys
        import tensorflow as tf
        serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
        files = json.loads(sys.argv[2])
        outputs = serve(image_bytes=tf.constant([open(path, "rb").read() for path in files]))
        project = sorted(m for m in sys.modules if m.split(".")[0] in ("train", "preprocess", "dataset_contract",
                                                                      "pipelines", "tests"))
        print("RESULT " + json.dumps({
            "inputs": {k: [v.dtype.name, v.shape.as_list()] for k, v in serve.structured_input_signature[1].items()},
            "probabilities": outputs["probabilities"].numpy().tolist(),
            "probabilities_dtype": outputs["probabilities"].dtype.name,
            "labels": [label.decode() for label in outputs["label"].numpy()],
            "valid": outputs["valid"].numpy().tolist(),
            "errors": [error.decode() for error in outputs["error"].numpy()],
            "project_modules": project,
        }))
        """
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", script, export_dir, json.dumps(list(kinds.values()))],
        cwd=tmp_path,  # outside the repository: nothing of this project is importable
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert report["project_modules"] == []
    assert report["inputs"] == {"image_bytes": ["string", [None]]}
    probabilities = np.array(report["probabilities"])
    assert probabilities.shape == (len(kinds), len(manifest["labels"]))
    assert report["probabilities_dtype"] == "float32"
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert report["labels"] == [manifest["labels"][i] for i in probabilities.argmax(axis=1)]
    assert report["valid"] == [True] * len(kinds) and report["errors"] == [""] * len(kinds)


def test_the_export_refuses_above_the_max_pixels_stage_one_recorded(trained_run):
    data_dir, _, metrics = trained_run("bfloat16")
    manifest = checks.read_manifest(data_dir)
    assert manifest["image"]["max_pixels"] == 100_000_000  # stage 1's --max-pixels default
    described = tf.saved_model.load(metrics["export_dir"]).signatures[export.CONFIG_SIGNATURE](
        request=tf.constant(0)
    )
    assert described["max_pixels"].numpy() == manifest["image"]["max_pixels"]
    assert described["image_size"].numpy() == manifest["image"]["height"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "encoding", [pytest.param(e, marks=pytest.mark.jax) if e == "bfloat16" else e for e in ENCODINGS]
)
def test_serving_predictions_match_the_training_pipeline(trained_run, encoding):
    data_dir, model_dir, metrics = trained_run(encoding)
    manifest = checks.read_manifest(data_dir)
    uris, pipeline_images = validation_through_the_training_pipeline(data_dir, manifest)
    assert len(uris) == manifest["splits"][manifest_lib.VALIDATION]["num_examples"] > 0
    file_bytes = read_bytes(uris)

    # The input tensors, in 0-255 levels: serving's decode + resize against what the pipeline feeds
    # the model (de-normalized for the encodings stage 1 normalized; uint8 and jpeg are pixels).
    served_batch = decode.decode_batch(
        file_bytes, manifest["image"]["height"], manifest["image"]["resize_method"]
    )
    assert served_batch.valid.numpy().all(), served_batch.error.numpy()
    serving_pixels = served_batch.pixels
    pipeline_pixels = tf.cast(pipeline_images, tf.float32).numpy()
    if dataset.ImageFormat.from_manifest(manifest).normalized_offline:
        normalization = manifest["normalization"]
        pipeline_pixels = pipeline_pixels * np.array(normalization["std"]) + np.array(normalization["mean"])
    levels = np.abs(tf.cast(serving_pixels, tf.float32).numpy() - pipeline_pixels)
    assert levels.mean(axis=(1, 2, 3)).max() <= INPUT_MEAN_LEVELS[encoding]

    # The predictions.
    model = restore_trained_model(data_dir, model_dir, manifest)
    through_pipeline = np.asarray(model.predict_on_batch(pipeline_images.numpy()))
    serve = tf.saved_model.load(metrics["export_dir"]).signatures["serving_default"]
    served = serve(image_bytes=file_bytes)
    through_serving = served["probabilities"].numpy()
    tolerance = PROBABILITY_TOLERANCE[encoding]
    assert np.abs(through_pipeline - through_serving).max() <= tolerance
    pairs = np.triu_indices(len(uris), k=1)
    between_images = np.abs(through_pipeline[pairs[0]] - through_pipeline[pairs[1]]).max(axis=1)
    serving_vs_pipeline = np.abs(through_pipeline - through_serving).max(axis=1)
    relative = np.median(serving_vs_pipeline) / np.median(between_images)
    assert relative <= RELATIVE_TOLERANCE[encoding], (
        f"serving differs from the pipeline by {relative:.1%} of the difference between two images"
    )
    labels = [label.decode() for label in served["label"].numpy()]
    assert labels == [manifest["labels"][i] for i in through_serving.argmax(axis=1)]
