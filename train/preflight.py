"""Checks `python -m train` makes after TensorFlow is imported and before train_and_evaluate starts.

Only what train_and_evaluate would otherwise find late, after the strategy came up and the model
dir was written to: whether `--weights` can be loaded (a gs:// file exists; the ImageNet file is in
Keras' cache or downloadable from here, pretrained.check_imagenet_available). A missing or unreadable
dataset is left to train_and_evaluate's own checks, which name it better.
"""

from train.config import TrainConfig
from train.data import checks
from train.errors import DatasetError
from train.model import pretrained
from train.model.weights_flag import normalize_weights_flag


def check_weights_before_training(config: TrainConfig) -> None:
    """ConfigError when `config.weights` cannot be loaded for the dataset's image size."""
    weights = normalize_weights_flag(config.weights)
    if weights is None:
        return
    try:
        manifest = checks.read_manifest(config.data_dir)
    except DatasetError:
        return  # train_and_evaluate says what is wrong with the dataset
    image = manifest["image"]
    crop = image.get("crop_size", image["height"])
    pretrained.check_weights(config.model, weights, (crop, crop, image.get("channels", 3)))
