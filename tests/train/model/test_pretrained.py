"""Pretrained weights: each application's input convention, ImageNet weights through Keras' own
mechanism (offline: only the download is replaced), weights from a file made by an earlier run, and
freezing the backbone."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.stage1 import run_stage1, write_corpus
from tests.train.checkpoint_files import restore_last_checkpoint
from tests.train.conftest import CROP_MARGIN, IMAGE_SIZE
from train.config import TrainConfig
from train.data import checks, dataset
from train.errors import ConfigError
from train.loop import plots
from train.model import models, pretrained
from train.trainer import train_and_evaluate

BATCH = 8
IMAGENET_MEAN_BGR = np.array([103.939, 116.779, 123.68])

# What each application's ImageNet weights expect, written out from the Keras sources (not through
# the code under test): the input of the backbone as a function of 0-255 RGB pixels, and the first
# layers inside the backbone that do the rest.
EXPECTED_BACKBONE_INPUT = {
    models.RESNET50: lambda pixels: pixels[..., ::-1] - IMAGENET_MEAN_BGR,  # caffe: BGR, minus the mean
    models.MOBILENET_V2: lambda pixels: pixels / 127.5 - 1.0,  # tf: [-1, 1]
    models.MOBILENET_V3_SMALL: lambda pixels: pixels,  # the model rescales itself
    models.MOBILENET_V3_LARGE: lambda pixels: pixels,
    models.EFFICIENTNET_B0: lambda pixels: pixels,
}
EXPECTED_BUILT_IN_RESCALING = {
    models.RESNET50: None,
    models.MOBILENET_V2: None,
    models.MOBILENET_V3_SMALL: (1 / 127.5, -1.0),
    models.MOBILENET_V3_LARGE: (1 / 127.5, -1.0),
    models.EFFICIENTNET_B0: (1 / 255, 0.0),
}


def _pipeline_batch(stage1_dataset, encoding, crop_margin=0.0):
    data_dir = stage1_dataset(encoding, crop_margin)
    manifest = checks.read_manifest(data_dir)
    images, _ = next(iter(dataset.make_train_dataset(data_dir, manifest, BATCH)))
    return manifest, dataset.ImageFormat.from_manifest(manifest), images


@pytest.mark.parametrize(
    "name,encoding",
    # Every application from uint8 pixels; from normalized bfloat16 values (turned back into pixels
    # first) for one application of each kind.
    [(name, "uint8") for name in pretrained.APPLICATIONS]
    + [(models.RESNET50, "bfloat16"), (models.MOBILENET_V3_SMALL, "bfloat16")],
)
def test_each_application_gets_pixels_the_way_its_imagenet_weights_expect(stage1_dataset, name, encoding):
    manifest, image_format, images = _pipeline_batch(stage1_dataset, encoding)
    model = models.build_model_for_dataset(
        name, image_format, len(manifest["labels"]), policy="mixed_bfloat16"
    )
    backbone = model.get_layer(pretrained.BACKBONE)
    fed = keras.Model(model.inputs, model.get_layer("application_preprocessing").output)(images)
    assert fed.dtype == "float32"  # whatever the policy: the mean subtraction must not round to bfloat16

    pixels = tf.cast(images, tf.float64).numpy()
    if image_format.normalized_offline:  # the stored values, back in 0-255 units
        pixels = pixels * np.array(image_format.std) + np.array(image_format.mean)
    np.testing.assert_allclose(fed.numpy(), EXPECTED_BACKBONE_INPUT[name](pixels), atol=2e-3, rtol=1e-5)

    first = backbone.layers[1]
    expected = EXPECTED_BUILT_IN_RESCALING[name]
    if expected is None:
        assert not isinstance(first, keras.layers.Rescaling), "the input would be scaled twice"
    else:
        assert isinstance(first, keras.layers.Rescaling)
        assert (float(first.scale), float(first.offset)) == pytest.approx(expected)


def test_the_small_cnn_keeps_the_datasets_own_standardization(stage1_dataset):
    manifest, image_format, images = _pipeline_batch(stage1_dataset, "uint8")
    model = models.build_model_for_dataset(models.SMALL_CNN, image_format, len(manifest["labels"]))
    normalized = keras.Model(model.inputs, model.get_layer("normalize").output)(images)
    expected = dataset.normalize(images, image_format.mean, image_format.std)
    np.testing.assert_allclose(normalized.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    assert "application_preprocessing" not in [layer.name for layer in model.layers]


@pytest.mark.parametrize(
    "name,published_file",
    [
        (models.MOBILENET_V3_SMALL, "weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5"),
        (models.RESNET50, "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"),
    ],
)
def test_imagenet_weights_come_through_keras_applications_own_download(
    stage1_dataset, monkeypatch, tmp_path, name, published_file
):
    manifest, image_format, images = _pipeline_batch(stage1_dataset, "uint8", CROP_MARGIN)
    application = pretrained.APPLICATIONS[name]
    # What the download would deliver: weights of the same application, made here (no internet).
    published = application.constructor(
        include_top=False,
        weights=None,
        input_shape=image_format.input_shape,
        pooling="avg",
        **dict(application.extra_kwargs),
    )
    rng = np.random.default_rng(0)
    for variable in published.weights:  # recognizable values (BatchNorm variances stay positive)
        variable.assign(variable.numpy() + rng.uniform(0.0, 0.01, size=variable.shape).astype(variable.dtype))
    published_path = str(tmp_path / "published.weights.h5")
    published.save_weights(published_path)
    downloads = []

    def download(fname=None, origin=None, **kwargs):  # keras.utils.get_file: the only thing replaced
        downloads.append((fname, origin, kwargs))
        return published_path

    monkeypatch.setattr(keras.src.utils.file_utils, "get_file", download)
    monkeypatch.setattr(pretrained, "origin_unreachable", lambda origin, timeout=0: None)  # "online"
    model = models.build_model_for_dataset(name, image_format, len(manifest["labels"]), weights="imagenet")

    [(fname, origin, kwargs)] = downloads
    assert fname == published_file  # the no-top ImageNet file of this application
    assert origin.startswith("https://storage.googleapis.com/tensorflow/keras-applications/")
    assert origin.endswith(published_file) and kwargs["cache_subdir"] == "models"
    backbone = model.get_layer(pretrained.BACKBONE)
    for loaded, expected in zip(backbone.weights, published.weights, strict=True):
        np.testing.assert_array_equal(loaded.numpy(), expected.numpy())
    # The model takes the dataset's crop (32), not its stored squares (36), through the application's
    # own preprocessing.
    assert image_format.shape[0] != image_format.input_shape[0]
    assert tuple(model.inputs[0].shape) == (None, *image_format.input_shape)
    assert model.get_layer("application_preprocessing").application == name
    assert np.all(np.isfinite(model(images).numpy()))


def test_imagenet_weights_for_the_small_cnn_are_refused():
    with pytest.raises(ConfigError, match="has no ImageNet weights"):
        models.build_model(models.SMALL_CNN, (32, 32, 3), 5, weights="imagenet")


def test_weights_that_do_not_fit_the_backbone_stop_with_a_clear_error(tmp_path):
    source = models.build_model(models.SMALL_CNN, (32, 32, 3), 5)
    path = tmp_path / "small_cnn.weights.h5"
    source.get_layer(pretrained.BACKBONE).save_weights(str(path))
    with pytest.raises(ConfigError, match="does not fit the backbone of --model mobilenetv3small"):
        models.build_model(models.MOBILENET_V3_SMALL, (32, 32, 3), 5, weights=str(path))
    with pytest.raises(ConfigError, match="no such file"):
        models.build_model(models.SMALL_CNN, (32, 32, 3), 5, weights=str(tmp_path / "missing.weights.h5"))
    with pytest.raises(ConfigError, match="a directory holding backbone.weights.h5"):
        models.build_model(models.SMALL_CNN, (32, 32, 3), 5, weights=str(tmp_path))


def _backbone_values(model) -> list[np.ndarray]:
    return [variable.numpy().copy() for variable in model.get_layer(pretrained.BACKBONE).weights]


def _restore(data_dir, model_dir, epoch) -> keras.Model:
    """The model as of the end of `epoch`, from its checkpoint (named by global step)."""
    manifest = checks.read_manifest(data_dir)
    model = models.build_model_for_dataset(
        models.SMALL_CNN, dataset.ImageFormat.from_manifest(manifest), len(manifest["labels"])
    )
    with open(os.path.join(model_dir, "metrics.json")) as handle:
        steps_per_epoch = json.load(handle)["steps_per_epoch"]
    restore_last_checkpoint(model, model_dir, step=epoch * steps_per_epoch)
    return model


@pytest.mark.slow
def test_weights_pretrained_on_another_corpus_start_a_fine_tuning_run_far_above_chance(
    stage1_dataset, tmp_path_factory
):
    # Pretraining: another generated corpus (other images, drawn with another seed), written by stage 1.
    corpus = write_corpus(
        tmp_path_factory.mktemp("other_corpus"), images_per_class=40, seed=1, include_broken=False
    )
    other = str(tmp_path_factory.mktemp("other_dataset"))
    run_stage1(
        corpus.root, other, "--split", "0.8,0.2,0.0", image_size=IMAGE_SIZE, encoding="uint8", min_shards=1
    )
    pretrain_dir = str(tmp_path_factory.mktemp("pretrain"))
    keras.utils.set_random_seed(0)
    pretrain = train_and_evaluate(
        TrainConfig(
            data_dir=other,
            model_dir=pretrain_dir,
            epochs=30,
            global_batch_size=16,
            learning_rate=3e-3,
            export=False,
        )
    )
    assert pretrain["backbone_weights"] == os.path.join(pretrain_dir, pretrained.BACKBONE_WEIGHTS_FILE)

    # Fine-tuning on the shared test corpus from the pretraining run's model dir, against the same run
    # from scratch: 2 epochs with the backbone frozen (only the new head trains), then 1 unfrozen.
    data_dir = stage1_dataset("uint8")
    manifest = checks.read_manifest(data_dir)
    chance = 1 / len(manifest["labels"])
    frozen_epochs, epochs = 2, 3
    accuracy_after_frozen = {}
    for start, weights in (("pretrained", pretrain_dir), ("scratch", None)):
        model_dir = str(tmp_path_factory.mktemp(start))
        keras.utils.set_random_seed(0)
        train_and_evaluate(
            TrainConfig(
                data_dir=data_dir,
                model_dir=model_dir,
                epochs=epochs,
                global_batch_size=BATCH,
                learning_rate=1e-2,
                weights=weights,
                freeze_backbone_epochs=frozen_epochs,
                export=False,
            )
        )
        accuracy = plots.read_epoch_scalars(os.path.join(model_dir, "logs"))["validation"]["accuracy"]
        accuracy_after_frozen[start] = accuracy[frozen_epochs]
        if start == "pretrained":
            fine_tuned_dir = model_dir

    # The head alone, on pretrained features: far above chance; on random features: not.
    assert accuracy_after_frozen["pretrained"] >= 2 * chance, accuracy_after_frozen
    assert accuracy_after_frozen["pretrained"] >= accuracy_after_frozen["scratch"] + 0.2, (
        accuracy_after_frozen
    )

    # While frozen, nothing of the backbone moved, BatchNorm's moving statistics included (inference mode),
    # while the head trained; unfrozen, the backbone trains too.
    reference = models.build_model_for_dataset(
        models.SMALL_CNN,
        dataset.ImageFormat.from_manifest(manifest),
        len(manifest["labels"]),
        weights=pretrain["backbone_weights"],
    )
    end_of_frozen = _restore(data_dir, fine_tuned_dir, frozen_epochs)
    for restored, expected in zip(_backbone_values(end_of_frozen), _backbone_values(reference), strict=True):
        np.testing.assert_array_equal(restored, expected)
    assert not np.array_equal(
        end_of_frozen.get_layer("logits").kernel.numpy(), reference.get_layer("logits").kernel.numpy()
    )
    last = _restore(data_dir, fine_tuned_dir, epochs)
    moved = [
        not np.array_equal(a, b)
        for a, b in zip(_backbone_values(last), _backbone_values(reference), strict=True)
    ]
    assert all(moved)
