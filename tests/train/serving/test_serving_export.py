"""The exported signature as a server runs it: adversarial files, per-image errors, TF Serving conventions.

One small model (the small CNN, untrained: these tests are about the bytes
path, not accuracy) is exported once for the module at 224x224 with the
default limits, as `train` exports it. The adversarial files are the
benchmark's (benchmarks/adversarial_images.py); their memory is measured in
benchmarks/serving_memory.py, not here: here each must come back as a
per-image error or a valid prediction, and never fail the batch it is in.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.adversarial_images import ADVERSARIAL_IMAGES, ordinary_jpeg
from train.data import dataset
from train.model import models
from train.serving import export, warmup

SIZE = 224
LABELS = ["cat", "dog", "fish"]
MANIFEST = {
    "image": {
        "height": SIZE,
        "width": SIZE,
        "channels": 3,
        "encoding": "uint8",
        "resize_method": "crop",
        "max_pixels": 100_000_000,
        "max_file_bytes": 64_000_000,  # stage 1's --max-file-mb 64, not the default
    },
    "labels": LABELS,
    "normalization": {"mean": [120.0] * 3, "std": [60.0] * 3},
}
# What each adversarial file must give: valid, or the reason its error starts with.
EXPECTED = {
    "png_1x1000": "valid",
    "png_1x3000": "valid",
    "jpeg_1x65500": "valid",
    "png_23000_rgba": "too_many_pixels: 23000x23000 = 529000000 pixels > 100000000",
    "gif_100_frames": "valid",
    "jpeg_progressive_10000": "too_many_pixels: decoding this 10000x10000 JPEG needs 305 MB, over the serving limit",
    "jpeg_cmyk": "valid",
}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    image_format = dataset.ImageFormat.from_manifest(MANIFEST)
    model = models.build_model_for_dataset(models.SMALL_CNN, image_format, len(LABELS))
    return export.export_serving_model(model, MANIFEST, str(tmp_path_factory.mktemp("export")))


@pytest.fixture(scope="module")
def serve(export_dir):
    return tf.saved_model.load(export_dir).signatures[export.SIGNATURE]


@pytest.fixture(scope="module")
def adversarial_files():
    return {name: ADVERSARIAL_IMAGES[name][1]() for name in EXPECTED}


def outcome(outputs, index):
    valid = bool(outputs["valid"].numpy()[index])
    error = outputs["error"].numpy()[index].decode()
    assert valid == (error == "")
    return "valid" if valid else error


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_adversarial_file_gets_a_valid_prediction_or_its_own_error(serve, adversarial_files, name):
    outputs = serve(image_bytes=tf.constant([adversarial_files[name]]))
    assert outcome(outputs, 0).startswith(EXPECTED[name])
    probabilities = outputs["probabilities"].numpy()[0]
    if EXPECTED[name] == "valid":
        np.testing.assert_allclose(probabilities.sum(), 1.0, atol=1e-5)
        assert outputs["label"].numpy()[0].decode() == LABELS[probabilities.argmax()]
    else:
        assert not probabilities.any() and outputs["label"].numpy()[0] == b""


def test_a_batch_of_good_and_bad_files_predicts_the_good_ones_and_names_each_bad_one(
    serve, adversarial_files
):
    photo = ordinary_jpeg()
    batch = {
        "photo": photo,
        "empty": b"",
        "text": b"just some text, not an image",
        "truncated_jpeg": photo[: len(photo) // 2],
        **adversarial_files,
        "photo_again": photo,
    }
    outputs = serve(image_bytes=tf.constant(list(batch.values())))
    outcomes = {name: outcome(outputs, index) for index, name in enumerate(batch)}
    assert outcomes["empty"] == "empty_file: the file is empty"
    assert outcomes["text"].startswith("not_an_image: unrecognised content")
    assert outcomes["truncated_jpeg"].startswith("truncated: ")
    for name, expected in EXPECTED.items():
        assert outcomes[name].startswith(expected), name
    # The good images get the same prediction as alone: a bad neighbour changes nothing.
    alone = serve(image_bytes=tf.constant([photo]))["probabilities"].numpy()[0]
    probabilities = outputs["probabilities"].numpy()
    names = list(batch)
    np.testing.assert_allclose(probabilities[names.index("photo")], alone, atol=1e-6)
    np.testing.assert_allclose(probabilities[names.index("photo_again")], alone, atol=1e-6)


def test_the_export_records_its_limits_and_image_size_for_clients(export_dir):
    loaded = tf.saved_model.load(export_dir)
    described = {
        key: value.numpy()
        for key, value in loaded.signatures[export.CONFIG_SIGNATURE](request=tf.constant(0)).items()
    }
    assert described["image_size"] == SIZE
    assert described["max_pixels"] == MANIFEST["image"]["max_pixels"]
    assert described["resize_method"] == b"crop"
    assert [label.decode() for label in described["labels"]] == LABELS
    with open(os.path.join(export_dir, export.EXTRA_ASSETS_DIR, export.CONFIG_FILE)) as handle:
        config = json.load(handle)
    assert config["max_pixels"] == MANIFEST["image"]["max_pixels"] == described["max_pixels"]
    assert config["max_decode_bytes"] == described["max_decode_bytes"] > 0
    assert config["image_size"] == SIZE and config["input"]["name"] == "image_bytes"
    assert config["error_reasons"] == [
        "empty_file",
        "not_an_image",
        "truncated",
        "decode_error",
        "too_many_pixels",
        "too_large",
    ]
    # The dataset's file size limit, not the default: serving refuses what stage 1 refused.
    assert config["max_file_bytes"] == MANIFEST["image"]["max_file_bytes"] == described["max_file_bytes"]


def test_the_limit_defaults_to_the_datasets_max_pixels():
    assert export.serving_limits({"image": {"max_pixels": 1234}}).max_pixels == 1234
    # A manifest written before image.max_pixels existed: stage 1's default.
    assert export.serving_limits({"image": {}}).max_pixels == 100_000_000


def test_the_file_size_limit_defaults_to_the_datasets_max_file_bytes():
    assert export.serving_limits({"image": {"max_file_bytes": 1234}}).max_file_bytes == 1234
    # A manifest written before image.max_file_bytes existed: stage 1's default --max-file-mb.
    assert export.serving_limits({"image": {}}).max_file_bytes == 256 * 10**6


def test_warmup_requests_are_real_requests_the_signature_answers(export_dir, serve):
    path = os.path.join(export_dir, export.EXTRA_ASSETS_DIR, warmup.WARMUP_FILE)
    requests = warmup.read_warmup_requests(path)
    assert 1 <= len(requests) <= 10
    for request in requests:
        assert request.model_spec.signature_name == export.SIGNATURE
        assert set(request.inputs) == {export.INPUT_KEY}
        batch = tf.make_ndarray(request.inputs[export.INPUT_KEY])
        outputs = serve(image_bytes=tf.constant(list(batch)))
        outcomes = [outcome(outputs, index) for index in range(len(batch))]
        # Every real image in the warmup is valid; the one non-image exercises the error path.
        assert all(o == "valid" for o, data in zip(outcomes, batch, strict=True) if data != b"not an image")
    assert any(b"not an image" in tf.make_ndarray(r.inputs[export.INPUT_KEY]).tolist() for r in requests)


def saved_model_cli(*args):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two processes importing TensorFlow: ~30 s
def test_saved_model_cli_shows_the_signatures_and_runs_one_on_a_real_image(export_dir, tmp_path):
    shown = saved_model_cli("show", "--dir", export_dir, "--all")
    assert shown.returncode == 0, shown.stderr[-2000:]
    default = shown.stdout[shown.stdout.index("signature_def['serving_default']") :]
    assert "inputs['image_bytes']" in default and "DT_STRING" in default
    for output in export.OUTPUT_KEYS:
        assert f"outputs['{output}']" in default

    inputs = tmp_path / "inputs.npy"
    np.save(inputs, np.array([ordinary_jpeg(), b"not an image"], dtype=object), allow_pickle=True)
    outdir = tmp_path / "outputs"
    ran = saved_model_cli(
        "run",
        "--dir",
        export_dir,
        "--tag_set",
        "serve",
        "--signature_def",
        export.SIGNATURE,
        "--inputs",
        f"image_bytes={inputs}",
        "--outdir",
        str(outdir),
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert np.load(outdir / "valid.npy").tolist() == [True, False]
    probabilities = np.load(outdir / "probabilities.npy")
    assert probabilities.shape == (2, len(LABELS))
    np.testing.assert_allclose(probabilities.sum(axis=1), [1.0, 0.0], atol=1e-5)
    errors = np.load(outdir / "error.npy", allow_pickle=True).tolist()
    assert errors[0] == b"" and errors[1].startswith(b"not_an_image: ")

    described = saved_model_cli(
        "run",
        "--dir",
        export_dir,
        "--tag_set",
        "serve",
        "--signature_def",
        export.CONFIG_SIGNATURE,
        "--input_exprs",
        "request=0",
    )
    assert described.returncode == 0, described.stderr[-2000:]
    assert "max_pixels" in described.stdout and "100000000" in described.stdout


def test_an_empty_batch_returns_empty_outputs(serve):
    outputs = serve(image_bytes=tf.constant([], tf.string))
    assert outputs["probabilities"].shape == (0, len(LABELS))
    assert outputs["valid"].shape == outputs["error"].shape == outputs["label"].shape == (0,)


@keras.saving.register_keras_serializable(package="tests")
class RefusesAnEmptyBatch(keras.layers.Layer):
    """Fails on a zero-size batch, as oneDNN's batch normalization does on AVX-512/AMX CPUs (issue 25)."""

    def call(self, inputs):
        batch = tf.shape(inputs)[0]
        with tf.control_dependencies(
            [tf.debugging.assert_positive(batch, message="model ran on an empty batch")]
        ):
            return tf.cast(inputs, tf.float32) / 255.0


def test_an_empty_batch_never_runs_the_model_and_batches_of_one_and_many_do(tmp_path):
    size = 32
    manifest = {**MANIFEST, "image": {**MANIFEST["image"], "height": size, "width": size}}
    inputs = keras.Input((size, size, 3), dtype="uint8")
    features = keras.layers.GlobalAveragePooling2D()(RefusesAnEmptyBatch()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(len(LABELS), activation="softmax")(features))
    serve = tf.saved_model.load(export.export_serving_model(model, manifest, str(tmp_path))).signatures[
        export.SIGNATURE
    ]
    empty = serve(image_bytes=tf.constant([], tf.string))
    assert empty["probabilities"].shape == (0, len(LABELS)) and empty["label"].shape == (0,)
    for count in (1, 3):
        outputs = serve(image_bytes=tf.constant([ordinary_jpeg()] * count))
        assert outputs["valid"].numpy().tolist() == [True] * count
        np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)


_SERVE_BATCHES = """
import sys
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
image = open(sys.argv[2], "rb").read()
for count in (0, 1, 5):
    outputs = serve(image_bytes=tf.constant([image] * count, tf.string))
    print("BATCH", count, outputs["probabilities"].shape.as_list(), sum(outputs["valid"].numpy().tolist()))
"""


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_empty_one_and_many_images_are_answered_with_onednn_on_and_off(export_dir, tmp_path, onednn):
    # oneDNN is chosen when TensorFlow is imported, so each setting needs a process of its own.
    image = tmp_path / "photo.jpg"
    image.write_bytes(ordinary_jpeg())
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TPU_LOAD_LIBRARY": "0"}
    result = subprocess.run(
        [sys.executable, "-c", _SERVE_BATCHES, export_dir, str(image)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    batches = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("BATCH ")]
    n = len(LABELS)
    assert batches == [f"0 [0, {n}] 0", f"1 [1, {n}] 1", f"5 [5, {n}] 5"]
