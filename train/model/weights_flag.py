"""What `--weights` may name, checked before TensorFlow is imported: 'imagenet', 'none', or a file.

    imagenet      keras.applications' published ImageNet weights (pretrained.py finds the file Keras
                  wants, in ~/.keras/models or for download, before anything is built)
    none          random initialization (the default)
    PATH          a weights file of the backbone, local or gs://: a run's backbone.weights.h5, the
                  `*_notop.h5` / `*_no_top*.h5` file Keras publishes for that backbone, or the
                  --model-dir of a finished run (its backbone.weights.h5)

The commands call `check_weights_flag` right after parsing, so that a typo in
a local path or `imagenet` asked of the small CNN is a two-line error, not
something found after stage 1 or after the strategy came up. gs:// paths are
checked once TensorFlow (and its GCS filesystem) is loaded (pretrained.py).
"""

import os

from train.config import MODELS, SMALL_CNN

IMAGENET = "imagenet"
NONE = "none"
# The suffixes of the files a backbone's weights load from: Keras 3's own format (.weights.h5) and the
# legacy HDF5 layout keras.applications publishes its ImageNet files in (.h5, by topology).
WEIGHTS_FILE_SUFFIXES = (".h5", ".hdf5")
BACKBONE_WEIGHTS_FILE = "backbone.weights.h5"
# The --model names with ImageNet weights (pretrained.APPLICATIONS, which imports Keras; a test keeps them equal).
APPLICATION_MODELS = tuple(name for name in MODELS if name != SMALL_CNN)


class WeightsFlagError(ValueError):
    """--weights names something that cannot be loaded; the message says what to pass instead."""


def normalize_weights_flag(value: str | None) -> str | None:
    """None for 'none' (any case) or nothing; 'imagenet' for 'imagenet' (any case); else the path as given."""
    if value is None or value.strip().lower() in (NONE, ""):
        return None
    if value.strip().lower() == IMAGENET:
        return IMAGENET
    return value


def is_weights_file(path: str) -> bool:
    return path.lower().endswith(WEIGHTS_FILE_SUFFIXES)


def check_weights_flag(value: str | None, model: str, applications=APPLICATION_MODELS) -> str | None:
    """The normalized --weights value; WeightsFlagError for what can be refused without TensorFlow.

    `applications` are the --model names that have ImageNet weights.
    """
    weights = normalize_weights_flag(value)
    if weights is None:
        return None
    if weights == IMAGENET:
        if model not in applications:
            raise WeightsFlagError(
                f"--weights imagenet: --model {model} has no ImageNet weights; use one of "
                f"{', '.join(applications)}, or --weights none"
            )
        return weights
    if "://" in weights:
        return weights  # checked where its filesystem is loaded (pretrained.backbone_weights_file)
    if os.path.isdir(weights):
        if not os.path.isfile(os.path.join(weights, BACKBONE_WEIGHTS_FILE)):
            raise WeightsFlagError(
                f"--weights {weights}: a directory without {BACKBONE_WEIGHTS_FILE}; expected the --model-dir of "
                f"a finished run, a weights file ({' or '.join(WEIGHTS_FILE_SUFFIXES)}), 'imagenet' or 'none'"
            )
        return weights
    if not os.path.exists(weights):
        raise WeightsFlagError(
            f"--weights {weights}: no such file; expected 'imagenet', 'none', a backbone weights file "
            f"({' or '.join(WEIGHTS_FILE_SUFFIXES)}: a run's {BACKBONE_WEIGHTS_FILE}, or the no-top .h5 file "
            "Keras publishes for the backbone) or a finished run's --model-dir"
        )
    if not is_weights_file(weights):
        raise WeightsFlagError(
            f"--weights {weights}: not a weights file; expected a {' or '.join(WEIGHTS_FILE_SUFFIXES)} file "
            f"(a run's {BACKBONE_WEIGHTS_FILE}, or the no-top .h5 file Keras publishes for the backbone)"
        )
    return weights
