"""The models `--model` can name, all with the same input and head.

Every classifier is the input layer -> the model's input convention -> a backbone sub-model named
"backbone" -> a Dense head -> float32 probabilities (the conventions per model: docs/internals.md).
"""

import contextlib
from collections.abc import Sequence

import keras

from train.config import (  # noqa: F401 - the names --model takes, for callers of this module
    EFFICIENTNET_B0,
    MOBILENET_V2,
    MOBILENET_V3_LARGE,
    MOBILENET_V3_SMALL,
    MODELS,
    RESNET50,
    SMALL_CNN,
)
from train.data.dataset import ImageFormat
from train.errors import ConfigError
from train.model import pretrained, user_model
from train.model.weights_flag import normalize_weights_flag

# The small CNN halves the resolution three times, so 8x8 leaves it one pixel to pool.
_MIN_IMAGE_SIZE = {SMALL_CNN: 8, **{name: app.min_size for name, app in pretrained.APPLICATIONS.items()}}

_SMALL_CNN_FILTERS = (32, 64, 128, 256)


def min_image_size(name: str) -> int:
    """The smallest height and width `name` accepts (1 for `module:function`, once it imports)."""
    if user_model.is_user_model(name):
        user_model.resolve_function(name)  # an import error fails here, before anything is built
        return 1
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


def _small_cnn_backbone(image_shape: tuple[int, int, int], input_dtype: str) -> keras.Model:
    """Four Conv-BN-ReLU stages with max pooling in between, average-pooled; sized for 32-64 px inputs."""
    inputs = keras.Input(shape=image_shape, dtype=input_dtype, name="features_input")
    x = inputs
    for stage, filters in enumerate(_SMALL_CNN_FILTERS):
        if stage:
            x = keras.layers.MaxPooling2D(2, name=f"stage{stage}_pool")(x)
        x = _conv_bn_relu(x, filters, name=f"stage{stage}")
    features = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, features, name=pretrained.BACKBONE)


def build_model(
    name: str,
    image_shape: tuple[int, int, int],
    num_classes: int,
    input_dtype: str = "float32",
    policy: str = "float32",
    normalization: tuple[Sequence[float], Sequence[float]] | None = None,
    input_normalized: bool = False,
    weights: str | None = None,
) -> keras.Model:
    """An uncompiled classifier `name` for `image_shape` images under the dtype policy `policy`.

    `normalization` = (mean, std) per channel of the dataset, in 0-255 units.
    With `input_normalized`, the inputs are (pixel - mean) / std (the
    bfloat16/float32 encodings), else pixels (uint8/jpeg, or any 0-255
    floats). The first layers turn them into the model's input convention
    (docs/internals.md), in float32. `weights`: None (random), "imagenet"
    (keras.applications only) or a path (pretrained.load_backbone_weights).
    """
    weights = normalize_weights_flag(weights)  # 'none' is random, any case of 'imagenet' is ImageNet
    min_size = min_image_size(name)
    if min(image_shape[:2]) < min_size:
        raise ConfigError(f"model {name!r} needs images of at least {min_size}x{min_size}, got {image_shape}")
    if weights == pretrained.IMAGENET and name not in pretrained.APPLICATIONS:
        raise ConfigError(
            f"--weights imagenet: {name!r} has no ImageNet weights; choose one of {', '.join(pretrained.APPLICATIONS)}"
        )
    if input_normalized and normalization is None and name in pretrained.APPLICATIONS:
        raise ValueError(f"{name} takes pixels: normalized inputs need the (mean, std) to undo")
    with dtype_policy(policy):
        inputs = keras.Input(shape=image_shape, dtype=input_dtype, name="image")
        x = inputs
        if name == SMALL_CNN:
            if normalization is not None and not input_normalized:
                mean, std = normalization
                # float32 whatever the policy: (pixel - mean) / std in bfloat16
                # would round to 3 significant digits before the first convolution.
                x = keras.layers.Normalization(
                    mean=list(mean), variance=[s * s for s in std], dtype="float32", name="normalize"
                )(x)
            backbone = _small_cnn_backbone(image_shape, x.dtype)
        else:
            if input_normalized:
                mean, std = normalization
                x = keras.layers.Rescaling(
                    scale=list(std), offset=list(mean), dtype="float32", name="denormalize"
                )(x)
            x = pretrained.ApplicationPreprocessing(name, name="application_preprocessing")(x)
            backbone = pretrained.application_backbone(name, image_shape, weights)
        if weights not in (None, pretrained.IMAGENET):
            pretrained.load_backbone_weights(backbone, weights, name)
        features = backbone(x)
        logits = keras.layers.Dense(num_classes, name="logits")(features)
        # Softmax in float32 whatever the policy: bfloat16 probabilities have
        # 3 significant digits, too few for the loss and for serving.
        probabilities = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
        return keras.Model(inputs, probabilities, name=name)


def build_model_for_dataset(
    name: str,
    image_format: ImageFormat,
    num_classes: int,
    policy: str = "float32",
    weights: str | None = None,
) -> keras.Model:
    """build_model for what the input pipeline yields for this dataset (its crop shape, dtype, normalization).

    `name` may also be a user's `module:function` (train/model/user_model.py).
    """
    build = user_model.build_user_classifier if user_model.is_user_model(name) else build_model
    return build(
        name,
        image_format.input_shape,
        num_classes,
        input_dtype=image_format.dtype.name,
        policy=policy,
        normalization=(image_format.mean, image_format.std),
        input_normalized=image_format.normalized_offline,
        weights=weights,
    )
