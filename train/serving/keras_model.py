"""MODEL_DIR/model.keras for plain Keras code: the class names and stage 1's geometry travel inside it.

    import train
    model = train.load_model("/tmp/run/model")              # keras.Model; model.class_names
    images = train.load_image(["cat.jpg", "dog.png"], "/tmp/run/model")
    probabilities = model.predict(images)                   # the export's numbers for the same files

The file's last layer is `DatasetInfo` (weightless, the identity on the probabilities), whose config holds
the class names and what stage 1 did to every image: the stored square, the resize method, the crop the
model sees, the encoding and the normalization. So a model file alone says what its outputs are and how to
make its inputs. `load_image` makes them the way the serving export does (train/serving/decode.py, the
in-graph twin of stage 1's decode, orientation and resize; then model_input's center crop and
normalization), not `keras.utils.load_img(target_size=...)`, which squashes the image to the square.
`load_model` imports the package's Keras classes first and says in one line what to import when a
`--model module:function` network's module is missing.
"""

import json
import zipfile

import keras
import numpy as np
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.data import augment, dataset
from train.errors import ConfigError, SetupError
from train.serving import decode

KERAS_FILE = "model.keras"

INFO_LAYER = "dataset_info"


@keras.saving.register_keras_serializable(package="train")
class DatasetInfo(keras.layers.Layer):
    """The identity, carrying what the model's outputs and inputs mean (module docstring) in its config."""

    def __init__(self, class_names, image_size, crop_size, resize_method, encoding, mean, std, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.class_names = [str(name) for name in class_names]
        self.image_size = int(image_size)
        self.crop_size = int(crop_size)
        self.resize_method = str(resize_method)
        self.encoding = str(encoding)
        self.mean = [float(value) for value in mean]
        self.std = [float(value) for value in std]

    def call(self, inputs):
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "class_names": self.class_names,
            "image_size": self.image_size,
            "crop_size": self.crop_size,
            "resize_method": self.resize_method,
            "encoding": self.encoding,
            "mean": self.mean,
            "std": self.std,
        }


def with_dataset_info(model: keras.Model, manifest: dict) -> keras.Model:
    """`model` with a DatasetInfo last layer for `manifest`'s dataset (for the .keras file only)."""
    image_format = dataset.ImageFormat.from_manifest(manifest)
    info = DatasetInfo(
        class_names=manifest["labels"],
        image_size=image_format.height,
        crop_size=image_format.input_shape[0],
        resize_method=manifest["image"]["resize_method"],
        encoding=image_format.encoding,
        mean=image_format.mean,
        std=image_format.std,
        name=INFO_LAYER,
    )
    return keras.Model(model.inputs, info(model.outputs[0]), name=model.name)


def _keras_file(model_dir: str) -> str:
    path = model_dir if model_dir.endswith(".keras") else manifest_lib.join(model_dir, KERAS_FILE)
    if not tf.io.gfile.exists(path):
        raise SetupError(
            f"{path}: not found; a finished `python -m train` run writes it (unless --no-export)"
        )
    return path


def dataset_info(model_dir: str) -> dict:
    """The DatasetInfo config of MODEL_DIR/model.keras, read from the file without building the model."""
    path = _keras_file(model_dir)
    with tf.io.gfile.GFile(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
        config = json.loads(archive.read("config.json"))
    for layer in config.get("config", {}).get("layers", []):
        if layer.get("config", {}).get("name") == INFO_LAYER:
            return layer["config"]
    raise SetupError(
        f"{path} has no {INFO_LAYER} layer (written before the class names and geometry went into it): "
        "train again, or give the dataset's images as load_dataset makes them"
    )


def load_model(model_dir: str) -> keras.Model:
    """MODEL_DIR/model.keras as a keras.Model, with `class_names`; SetupError in one line when a
    `--model module:function` network's module cannot be imported."""
    from train.model import models  # noqa: F401, PLC0415 - registers the package's layers with Keras

    path = _keras_file(model_dir)
    try:
        model = keras.models.load_model(path)
    except ConfigError as exc:
        raise SetupError(f"cannot load {path}: {exc}") from None
    model.class_names = list(model.get_layer(INFO_LAYER).class_names)
    return model


def load_image(paths, model_dir: str) -> np.ndarray:
    """Image files (a path or a list; local or gs://) -> the batch MODEL_DIR/model.keras takes, made as
    stage 1 and the serving export make it (decode, orientation, resize, center crop, normalization).

    ValueError naming the file when one cannot be used (not an image, truncated, too large).
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    info = dataset_info(model_dir)
    image_format = dataset.ImageFormat(
        height=info["image_size"],
        width=info["image_size"],
        encoding=info["encoding"],
        mean=tuple(info["mean"]),
        std=tuple(info["std"]),
        crop_size=info["crop_size"],
    )
    contents = [tf.io.gfile.GFile(path, "rb").read() for path in paths]
    decoded = decode.decode_batch(tf.constant(contents), info["image_size"], info["resize_method"])
    for path, valid, error in zip(paths, decoded.valid.numpy(), decoded.error.numpy(), strict=True):
        if not valid:
            raise ValueError(f"{path}: {error.decode('utf-8', 'replace')}")
    return model_input(decoded.pixels, image_format).numpy()


def model_input(pixels, image_format: dataset.ImageFormat):
    """uint8 [batch, size, size, 3] pixels -> what the evaluation pipeline feeds the model for this encoding.

    The center crop when the dataset has a crop margin (as evaluation takes it),
    then the normalization for the encodings stage 1 normalized. The model's own
    first layers do the rest (its input convention, models.py).
    """
    if image_format.has_crop_margin:
        pixels = augment.center_crop(pixels, image_format.input_shape[0])
    if image_format.normalized_offline:
        return tf.cast(dataset.normalize(pixels, image_format.mean, image_format.std), image_format.dtype)
    return pixels
