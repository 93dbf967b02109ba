"""The models `--model` can name, all with the same input and head.

Every model takes a batch of images of the dataset's shape in the pipeline's
dtype (dataset.ImageFormat.dtype) and returns float32 class probabilities:
  - bfloat16 / float32 encodings: the normalized values stage 1 stored.
    Keras casts a floating input to each layer's compute dtype, so the
    bfloat16 -> compute-dtype cast happens once, on the device, in the first
    layer;
  - uint8 / jpeg encodings: uint8 pixels, normalized by the model's first
    layer (a Normalization layer holding the manifest's mean and std, in
    float32), on the device.
The backbones come from `keras.applications` with `weights=None`: nothing is
downloaded, and their own input preprocessing is off because the pixels are
normalized before they reach them.
"""

import contextlib
from collections.abc import Sequence

import keras

from train.config import MOBILENET_V3_SMALL, MODELS, RESNET50, SMALL_CNN
from train.dataset import ImageFormat
from train.errors import ConfigError

# keras.applications refuse inputs below 32x32; the small CNN halves the
# resolution three times, so 8x8 leaves it one pixel to pool.
_MIN_IMAGE_SIZE = {SMALL_CNN: 8, RESNET50: 32, MOBILENET_V3_SMALL: 32}

_SMALL_CNN_FILTERS = (32, 64, 128, 256)


def min_image_size(name: str) -> int:
    """The smallest height and width `name` accepts."""
    if name not in _MIN_IMAGE_SIZE:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return _MIN_IMAGE_SIZE[name]


@contextlib.contextmanager
def dtype_policy(name: str):
    """Build layers under the dtype policy `name`, then restore the previous global policy.

    Layers keep the policy they were built with, so the global setting only
    needs to hold while the model is constructed; restoring it keeps one
    train_and_evaluate call from leaking its policy into the next.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _conv_bn_relu(x, filters: int, name: str):
    # No conv bias: the batch norm's offset right after it does the same job.
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn", momentum=0.9)(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def _small_cnn_features(inputs):
    """Four Conv-BN-ReLU stages with max pooling in between; sized for 32-64 px inputs."""
    x = inputs
    for stage, filters in enumerate(_SMALL_CNN_FILTERS):
        if stage:
            x = keras.layers.MaxPooling2D(2, name=f"stage{stage}_pool")(x)
        x = _conv_bn_relu(x, filters, name=f"stage{stage}")
    return keras.layers.GlobalAveragePooling2D(name="pool")(x)


def _backbone(name: str, image_shape: tuple[int, int, int]) -> keras.Model:
    if name == RESNET50:
        return keras.applications.ResNet50(
            include_top=False, weights=None, input_shape=image_shape, pooling="avg"
        )
    if name == MOBILENET_V3_SMALL:
        return keras.applications.MobileNetV3Small(
            include_top=False,
            weights=None,
            input_shape=image_shape,
            pooling="avg",
            include_preprocessing=False,  # the pixels arrive normalized
        )
    raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def build_model(
    name: str,
    image_shape: tuple[int, int, int],
    num_classes: int,
    input_dtype: str = "float32",
    policy: str = "float32",
    normalization: tuple[Sequence[float], Sequence[float]] | None = None,
) -> keras.Model:
    """An uncompiled classifier `name` for `image_shape` images under the dtype policy `policy`.

    With `normalization` = (mean, std) per channel, the first layer computes
    (pixel - mean) / std in float32 from inputs of any dtype (uint8 pixels).
    """
    min_size = min_image_size(name)
    if min(image_shape[:2]) < min_size:
        raise ConfigError(f"model {name!r} needs images of at least {min_size}x{min_size}, got {image_shape}")
    with dtype_policy(policy):
        inputs = keras.Input(shape=image_shape, dtype=input_dtype, name="image")
        x = inputs
        if normalization is not None:
            mean, std = normalization
            # float32 whatever the policy: (pixel - mean) / std in bfloat16
            # would round to 3 significant digits before the first convolution.
            x = keras.layers.Normalization(
                mean=list(mean), variance=[s * s for s in std], dtype="float32", name="normalize"
            )(x)
        if name == SMALL_CNN:
            features = _small_cnn_features(x)
        else:
            features = _backbone(name, image_shape)(x)
        logits = keras.layers.Dense(num_classes, name="logits")(features)
        # Softmax in float32 whatever the policy: bfloat16 probabilities have
        # 3 significant digits, too few for the loss and for serving.
        probabilities = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
        return keras.Model(inputs, probabilities, name=name)


def build_model_for_dataset(
    name: str, image_format: ImageFormat, num_classes: int, policy: str = "float32"
) -> keras.Model:
    """build_model for the images the input pipeline yields for this dataset (its shape, dtype, normalization)."""
    return build_model(
        name,
        image_format.shape,
        num_classes,
        input_dtype=image_format.dtype.name,
        policy=policy,
        normalization=image_format.device_normalization,
    )
