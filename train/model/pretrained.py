"""The keras.applications backbones, their input conventions, and pretrained weights for them (--weights).

Each backbone gets RGB pixels through its own application's preprocess_input, so published weights and a
run's own weights fit it alike (the conventions, as looked up in Keras: docs/internals.md).
"""

import contextlib
import dataclasses
import logging
import os
import tempfile
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.errors import ConfigError
from train.model.weights_flag import BACKBONE_WEIGHTS_FILE, IMAGENET, WEIGHTS_FILE_SUFFIXES, is_weights_file

BACKBONE = "backbone"  # the name of the backbone sub-model inside every classifier
WEIGHTS_SUFFIX = ".weights.h5"
# How long the ImageNet file's origin may take to answer before this machine counts as offline.
ORIGIN_PROBE_SECONDS = 10.0

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
    build = lambda: application.constructor(  # noqa: E731 - one call, made under two interceptions
        include_top=False,
        weights=IMAGENET if weights == IMAGENET else None,
        input_shape=image_shape,
        pooling="avg",
        **dict(application.extra_kwargs),
    )
    if weights == IMAGENET:
        with _intercepted_get_file(
            lambda real, *args, **kwargs: _download_if_reachable(name, real, *args, **kwargs)
        ):
            backbone = build()
    else:
        backbone = build()
    # Keras' own name until here: EfficientNet names its download after it (docs/internals.md).
    backbone.name = BACKBONE
    return backbone


@dataclasses.dataclass(frozen=True)
class PublishedFile:
    """The ImageNet weights file an application asks keras.utils.get_file for."""

    fname: str
    origin: str
    file_hash: str | None
    cache_subdir: str

    def cache_path(self) -> str:
        """Where keras.utils.get_file looks for it (and would download it to)."""
        from keras.src.backend import config as keras_config  # noqa: PLC0415 - Keras' own cache root

        base = os.path.expanduser(keras_config.keras_home())
        if not os.access(base, os.W_OK):  # get_file's own fallback
            base = os.path.join("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir(), ".keras")
        return os.path.join(base, self.cache_subdir, self.fname)

    def cached(self) -> bool:
        """Whether Keras' cache holds it, intact (get_file would download it again otherwise)."""
        from keras.src.utils import file_utils  # noqa: PLC0415

        path = self.cache_path()
        if not os.path.isfile(path):
            return False
        return self.file_hash is None or file_utils.validate_file(path, self.file_hash)


class _Requested(Exception):
    """Raised by the get_file stand-in to stop a build once the file it asks for is known."""

    def __init__(self, published: PublishedFile):
        super().__init__(published.fname)
        self.published = published


def _published_file(
    fname=None, origin=None, file_hash=None, cache_subdir="datasets", **kwargs
) -> PublishedFile:
    return PublishedFile(
        fname=fname, origin=origin, file_hash=file_hash or kwargs.get("md5_hash"), cache_subdir=cache_subdir
    )


@contextlib.contextmanager
def _intercepted_get_file(stand_in: Callable):
    """Route keras.applications' calls to keras.utils.get_file through `stand_in(real, *args, **kwargs)`.

    The application modules call `file_utils.get_file(...)` through the module, so replacing the
    module's attribute is enough, and nothing else of Keras changes.
    """
    from keras.src.utils import file_utils  # noqa: PLC0415

    real = file_utils.get_file
    file_utils.get_file = lambda *args, **kwargs: stand_in(real, *args, **kwargs)
    try:
        yield
    finally:
        file_utils.get_file = real


def requested_imagenet_file(name: str, image_shape: tuple[int, int, int]) -> PublishedFile:
    """The file keras.applications asks for when `name` is built with ImageNet weights at `image_shape`.

    Found by building the application with get_file intercepted (no network, no weights loaded):
    the name comes from Keras' own code, whatever its version computes it from.
    """
    application = APPLICATIONS[name]

    def stop(real, *args, **kwargs):
        raise _Requested(_published_file(*args, **kwargs))

    with _intercepted_get_file(stop), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. MobileNet's "input shape not in [96, ..., 224]"
        try:
            application.constructor(
                include_top=False,
                weights=IMAGENET,
                input_shape=image_shape,
                pooling="avg",
                **dict(application.extra_kwargs),
            )
        except _Requested as requested:
            return requested.published
    raise RuntimeError(f"keras.applications built {name} with ImageNet weights without asking for a file")


def origin_unreachable(origin: str, timeout: float = ORIGIN_PROBE_SECONDS) -> str | None:
    """Why `origin` cannot be reached from here (None when it answers): the offline test.

    A HEAD request, through the proxy the environment names (https_proxy), as Keras' download would go.
    """
    try:
        with urllib.request.urlopen(urllib.request.Request(origin, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError as exc:
        return None if exc.code < 500 else f"HTTP {exc.code}"  # the server answered: the network is there
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc)) or type(exc).__name__


def imagenet_unavailable_message(name: str, published: PublishedFile, reason: str) -> str:
    return (
        f"--weights imagenet: --model {name} needs {published.fname}, which is not in Keras' cache "
        f"({os.path.dirname(published.cache_path())}) and cannot be downloaded from here ({reason}).\n"
        f"  Download {published.origin} on a machine that can, then either put it in "
        f"{os.path.dirname(published.cache_path())}/ (the same command then finds it), or pass it with "
        f"--weights PATH/{published.fname}"
    )


def check_imagenet_available(name: str, image_shape: tuple[int, int, int]) -> PublishedFile:
    """ConfigError, before anything is trained, when `name`'s ImageNet file is neither cached nor reachable."""
    published = requested_imagenet_file(name, image_shape)
    if not published.cached():
        reason = origin_unreachable(published.origin)
        if reason is not None:
            raise ConfigError(imagenet_unavailable_message(name, published, reason))
    return published


def _download_if_reachable(name: str, real, *args, **kwargs):
    """The get_file of a real ImageNet build: the cached file, or a download, or a ConfigError offline."""
    published = _published_file(*args, **kwargs)
    if not published.cached():
        reason = origin_unreachable(published.origin)
        if reason is not None:
            raise ConfigError(imagenet_unavailable_message(name, published, reason))
    return real(*args, **kwargs)


def check_weights(model_name: str, weights: str | None, image_shape: tuple[int, int, int]) -> None:
    """Everything about --weights that can fail, checked before stage 1 or training spends anything.

    `weights` is already normalized (weights_flag.normalize_weights_flag). A path must name a file
    (gs:// included); 'imagenet' must be in Keras' cache or downloadable from here.
    """
    if weights is None:
        return
    if weights == IMAGENET:
        if model_name not in APPLICATIONS:
            raise ConfigError(
                f"--weights imagenet: --model {model_name} has no ImageNet weights; use one of "
                f"{', '.join(APPLICATIONS)}, or --weights none"
            )
        check_imagenet_available(model_name, image_shape)
        return
    backbone_weights_file(weights)


def _local_copy(path: str, directory: str) -> str:
    """`path` itself when it is local, else a copy of it in `directory` (h5py reads local files only)."""
    if "://" not in path:
        return path
    local = os.path.join(directory, os.path.basename(path))
    tf.io.gfile.copy(path, local, overwrite=True)
    return local


def backbone_weights_file(path: str) -> str:
    """The weights file `--weights PATH` names: PATH itself (.weights.h5, or a published .h5) or
    PATH/backbone.weights.h5."""
    if is_weights_file(path):
        if not tf.io.gfile.exists(path):
            raise ConfigError(f"--weights {path}: no such file")
        return path
    candidate = manifest_lib.join(path, BACKBONE_WEIGHTS_FILE)
    if tf.io.gfile.isdir(path) and tf.io.gfile.exists(candidate):
        return candidate
    raise ConfigError(
        f"--weights {path}: expected a weights file ({' or '.join(WEIGHTS_FILE_SUFFIXES)}: a run's "
        f"{BACKBONE_WEIGHTS_FILE} or the no-top .h5 Keras publishes for the backbone), a directory holding "
        f"{BACKBONE_WEIGHTS_FILE} (the --model-dir of a finished training run), 'imagenet' or 'none'"
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
                "The file must hold the weights of the same model without its top: as written to "
                f"MODEL_DIR/{BACKBONE_WEIGHTS_FILE} by a run with the same --model, or the no-top .h5 file "
                "Keras publishes for it"
            ) from exc
    log.info("backbone weights loaded from %s", source)
    return source


def save_backbone_weights(model: keras.Model, model_dir: str, publish: bool = True) -> str:
    """Write the classifier's backbone weights to MODEL_DIR/backbone.weights.h5 (for --weights MODEL_DIR).

    Every process of a multi-host JAX run calls it (Keras' saving runs a collective there); only the one
    with `publish` writes the file.
    """
    destination = manifest_lib.join(model_dir, BACKBONE_WEIGHTS_FILE)
    backbone = model.get_layer(BACKBONE)
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, BACKBONE_WEIGHTS_FILE)
        backbone.save_weights(local)
        if not publish:
            return destination
        # Written next to the destination, then renamed: a reader never sees half a file.
        temporary = destination + ".tmp"
        tf.io.gfile.copy(local, temporary, overwrite=True)
        tf.io.gfile.rename(temporary, destination, overwrite=True)
    return destination
