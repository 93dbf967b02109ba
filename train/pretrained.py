"""The keras.applications backbones, their input conventions, and pretrained weights for them.

Every keras.applications model was trained on ImageNet with its own input
scaling, and its published weights are only right for that scaling. Looked
up in Keras 3 (keras/src/applications/*.py as pinned), not guessed:

  resnet50          caffe: RGB -> BGR, minus the ImageNet mean per channel, no scaling
                    (resnet50.preprocess_input, mode "caffe")
  mobilenetv2       tf: pixel / 127.5 - 1, i.e. [-1, 1] (mobilenet_v2.preprocess_input, mode "tf")
  mobilenetv3small,
  mobilenetv3large  [0, 255] pixels; the model rescales them itself (include_preprocessing=True:
                    Rescaling(1/127.5, offset=-1) as its first layer); preprocess_input is a no-op
  efficientnetb0    [0, 255] pixels; the model rescales (1/255) and normalizes with the ImageNet
                    mean and variance itself (a Normalization layer whose statistics come with the
                    weights); preprocess_input is a no-op

So the classifier (models.py) feeds every application backbone RGB pixels in
0-255 units through that application's own `preprocess_input`, wrapped in
`ApplicationPreprocessing` (float32 whatever the mixed-precision policy),
and builds the applications that have the switch with their built-in
preprocessing on. The stored dataset's mean/std then only serve to turn
offline-normalized encodings (bfloat16, float32) back into pixels. This is
the same whether the weights are ImageNet's, a file, or random (training from
scratch): weights made by one run of this package fit the next.

Weights:
  --weights imagenet   keras.applications' own mechanism (`weights="imagenet"`: downloaded once into
                       ~/.keras/models, hash-checked); needs internet the first time
  --weights PATH       a `.weights.h5` file of the backbone (what a run writes as
                       MODEL_DIR/backbone.weights.h5, or `keras.applications.X(include_top=False,
                       weights=...).save_weights(...)`), or a directory holding backbone.weights.h5
                       (a finished run's --model-dir); local or gs://
Only the backbone is loaded: the head is new (the classes differ).
"""

import dataclasses
import logging
import os
import tempfile
import warnings
from collections.abc import Callable

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.errors import ConfigError

IMAGENET = "imagenet"
BACKBONE = "backbone"  # the name of the backbone sub-model inside every classifier
BACKBONE_WEIGHTS_FILE = "backbone.weights.h5"
WEIGHTS_SUFFIX = ".weights.h5"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Application:
    """One keras.applications model as a backbone: how to build it and what input it expects."""

    constructor: Callable[..., keras.Model]
    preprocess_input: Callable  # the application module's own preprocess_input
    convention: str  # what preprocess_input + the model's first layers do, for messages and docs
    extra_kwargs: tuple[tuple[str, object], ...] = ()
    pretrained_size: int = 224  # the input size its ImageNet weights were trained at
    min_size: int = 32  # keras.applications refuse smaller inputs


APPLICATIONS = {
    "resnet50": Application(
        keras.applications.ResNet50,
        keras.applications.resnet50.preprocess_input,
        "caffe: RGB->BGR, minus the ImageNet mean",
    ),
    "mobilenetv2": Application(
        keras.applications.MobileNetV2,
        keras.applications.mobilenet_v2.preprocess_input,
        "tf: pixel/127.5 - 1",
    ),
    "mobilenetv3small": Application(
        keras.applications.MobileNetV3Small,
        keras.applications.mobilenet_v3.preprocess_input,
        "0-255 pixels, rescaled to [-1, 1] by the model's own first layer",
        extra_kwargs=(("include_preprocessing", True),),
    ),
    "mobilenetv3large": Application(
        keras.applications.MobileNetV3Large,
        keras.applications.mobilenet_v3.preprocess_input,
        "0-255 pixels, rescaled to [-1, 1] by the model's own first layer",
        extra_kwargs=(("include_preprocessing", True),),
    ),
    "efficientnetb0": Application(
        keras.applications.EfficientNetB0,
        keras.applications.efficientnet.preprocess_input,
        "0-255 pixels, rescaled and normalized by the model's own first layers",
    ),
}


@keras.saving.register_keras_serializable(package="train")
class ApplicationPreprocessing(keras.layers.Layer):
    """RGB pixels in 0-255 units -> the input `application`'s weights were trained on.

    Calls the application module's own `preprocess_input` (APPLICATIONS), in
    float32: a bfloat16 mean subtraction would round the input of the first
    convolution to 3 significant digits.
    """

    def __init__(self, application: str, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if application not in APPLICATIONS:
            raise ValueError(f"unknown application {application!r}; expected one of {list(APPLICATIONS)}")
        self.application = application

    def call(self, pixels):
        return APPLICATIONS[self.application].preprocess_input(keras.ops.cast(pixels, "float32"))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "application": self.application}


def application_backbone(name: str, image_shape: tuple[int, int, int], weights: str | None) -> keras.Model:
    """keras.applications `name` without its top, average-pooled, named BACKBONE.

    `weights` is None (random), IMAGENET (Keras downloads and checks them) or
    a path, which is loaded after the build (load_backbone_weights).
    """
    application = APPLICATIONS[name]
    if weights == IMAGENET and image_shape[0] != application.pretrained_size:
        log.warning(
            "%s's ImageNet weights were trained on %dx%d images, the dataset's are %dx%d: they still load "
            "(convolutions do not depend on the size), but fine-tuning works best near the pretraining size; "
            "consider preprocess --image-size %d",
            name,
            application.pretrained_size,
            application.pretrained_size,
            image_shape[0],
            image_shape[1],
            application.pretrained_size,
        )
    backbone = application.constructor(
        include_top=False,
        weights=IMAGENET if weights == IMAGENET else None,
        input_shape=image_shape,
        pooling="avg",
        name=BACKBONE,
        **dict(application.extra_kwargs),
    )
    return backbone


def _local_copy(path: str, directory: str) -> str:
    """`path` itself when it is local, else a copy of it in `directory` (h5py reads local files only)."""
    if "://" not in path:
        return path
    local = os.path.join(directory, os.path.basename(path))
    tf.io.gfile.copy(path, local, overwrite=True)
    return local


def backbone_weights_file(path: str) -> str:
    """The weights file `--weights PATH` names: PATH itself (.weights.h5) or PATH/backbone.weights.h5."""
    if path.endswith(WEIGHTS_SUFFIX):
        if not tf.io.gfile.exists(path):
            raise ConfigError(f"--weights {path}: no such file")
        return path
    candidate = manifest_lib.join(path, BACKBONE_WEIGHTS_FILE)
    if tf.io.gfile.isdir(path) and tf.io.gfile.exists(candidate):
        return candidate
    raise ConfigError(
        f"--weights {path}: expected a {WEIGHTS_SUFFIX} file or a directory holding {BACKBONE_WEIGHTS_FILE} "
        "(the --model-dir of a finished training run), or 'imagenet'"
    )


def load_backbone_weights(backbone: keras.Model, path: str, model_name: str) -> str:
    """Load the weights `--weights PATH` names into `backbone`; returns the file read."""
    source = backbone_weights_file(path)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            # Keras only warns about parts of a file it skips ("... will retain their freshly-initialized
            # weights"): a backbone half loaded must stop the run like one not loaded at all.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                backbone.load_weights(_local_copy(source, scratch))
            skipped = [str(w.message) for w in caught if "skipping" in str(w.message).lower()]
            if skipped:
                raise ValueError(skipped[0])
        except (ValueError, KeyError, OSError) as exc:
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"--weights {path}: {source} does not fit the backbone of --model {model_name} ({reason}). "
                "The file must hold the weights of the same model without its top, as written to "
                f"MODEL_DIR/{BACKBONE_WEIGHTS_FILE} by a run with the same --model"
            ) from exc
    log.info("backbone weights loaded from %s", source)
    return source


def save_backbone_weights(model: keras.Model, model_dir: str) -> str:
    """Write the classifier's backbone weights to MODEL_DIR/backbone.weights.h5 (for --weights MODEL_DIR)."""
    destination = manifest_lib.join(model_dir, BACKBONE_WEIGHTS_FILE)
    backbone = model.get_layer(BACKBONE)
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, BACKBONE_WEIGHTS_FILE)
        backbone.save_weights(local)
        # Written next to the destination, then renamed: a reader never sees half a file.
        temporary = destination + ".tmp"
        tf.io.gfile.copy(local, temporary, overwrite=True)
        tf.io.gfile.rename(temporary, destination, overwrite=True)
    return destination
