"""TPU-readiness of every model on CPU: a training step compiles with XLA, on the pipeline's batches."""

import keras
import numpy as np
import pytest

from tests.train.conftest import IMAGE_SIZE
from train import checks, dataset, models
from train.errors import ConfigError

BATCH = 4


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,policy",
    [
        (models.SMALL_CNN, "float32"),
        (models.SMALL_CNN, "mixed_bfloat16"),  # what a TPU runs
        (models.RESNET50, "float32"),
        (models.MOBILENET_V3_SMALL, "float32"),
    ],
)
def test_one_training_step_compiles_with_xla(stage1_dataset, name, policy):
    data_dir = stage1_dataset("bfloat16")  # bfloat16 input: the model must cast it to its compute dtype
    manifest = checks.read_manifest(data_dir)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    images, labels = next(iter(dataset.make_train_dataset(data_dir, manifest, BATCH)))
    model = models.build_model(
        name, image_format.shape, len(manifest["labels"]), input_dtype=image_format.dtype.name, policy=policy
    )
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
