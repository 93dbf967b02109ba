"""TPU-readiness of every model on CPU: a training step compiles with XLA, on the pipeline's batches."""

import keras
import numpy as np
import pytest

from tests.train.conftest import IMAGE_SIZE
from train.data import checks, dataset
from train.errors import ConfigError
from train.model import models, pretrained

BATCH = 4


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,policy,encoding",
    [
        # bfloat16 input: the model must cast it to its compute dtype.
        (models.SMALL_CNN, "float32", "bfloat16"),
        (models.SMALL_CNN, "mixed_bfloat16", "bfloat16"),  # what a TPU runs
        (models.RESNET50, "float32", "bfloat16"),
        (models.MOBILENET_V3_SMALL, "float32", "bfloat16"),
        # uint8 pixels: the model normalizes them in its first layer, inside the compiled step.
        (models.SMALL_CNN, "mixed_bfloat16", "uint8"),
        (models.SMALL_CNN, "float32", "jpeg"),
    ],
)
def test_one_training_step_compiles_with_xla(stage1_dataset, name, policy, encoding):
    data_dir = stage1_dataset(encoding)
    manifest = checks.read_manifest(data_dir)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    images, labels = next(iter(dataset.make_train_dataset(data_dir, manifest, BATCH)))
    model = models.build_model_for_dataset(name, image_format, len(manifest["labels"]), policy)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(), jit_compile=True)
    assert model.jit_compile is True
    loss = model.train_on_batch(images, labels)
    assert np.isfinite(loss)
    assert model.outputs[0].dtype == "float32"
    assert keras.config.dtype_policy().name == "float32", "building a model must not leak its policy"


def test_models_refuse_images_below_their_minimum_size():
    with pytest.raises(ConfigError, match="at least 32x32"):
        models.build_model(models.RESNET50, (16, 16, 3), 5)
    assert models.min_image_size(models.SMALL_CNN) <= IMAGE_SIZE


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_pixel_encodings_are_normalized_by_the_first_layer_in_float32(stage1_dataset, policy):
    data_dir = stage1_dataset("uint8")
    manifest = checks.read_manifest(data_dir)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    images, _ = next(iter(dataset.make_train_dataset(data_dir, manifest, BATCH)))
    assert images.dtype == "uint8"
    model = models.build_model_for_dataset(models.SMALL_CNN, image_format, len(manifest["labels"]), policy)
    assert model.inputs[0].dtype == "uint8"
    first = model.get_layer("normalize")
    normalized = keras.Model(model.inputs, first.output)(images)
    assert normalized.dtype == "float32"
    expected = dataset.normalize(images, image_format.mean, image_format.std)
    np.testing.assert_allclose(normalized.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_normalized_encodings_get_no_normalization_layer(stage1_dataset):
    manifest = checks.read_manifest(stage1_dataset("bfloat16"))
    image_format = dataset.ImageFormat.from_manifest(manifest)
    model = models.build_model_for_dataset(models.SMALL_CNN, image_format, len(manifest["labels"]))
    assert model.inputs[0].dtype == "bfloat16"
    assert "normalize" not in [layer.name for layer in model.layers]


def test_every_model_flag_name_is_the_small_cnn_or_a_known_application():
    # config.MODELS is what --model accepts (defined without importing Keras, for --help);
    # pretrained.APPLICATIONS is what builds them.
    assert set(models.MODELS) == {models.SMALL_CNN, *pretrained.APPLICATIONS}
