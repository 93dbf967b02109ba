"""`--model module:function`: your own Keras network, trained and exported as the built-in models are.

    python -m train --data DATA --model-dir RUN --model my_models:tiny_net

The function gets (input_shape, num_classes) and returns a keras.Model from normalized float32 images
to logits (the contract: docs/internals.md, docs/library.md).
"""

import importlib
from collections.abc import Callable

import keras

from train.config import USER_MODEL_SEPARATOR, is_user_model
from train.errors import ConfigError
from train.model import pretrained

__all__ = ["UserNetwork", "build_network", "build_user_classifier", "is_user_model", "resolve_function"]


def resolve_function(spec: str) -> Callable:
    """The function `module:function` names; ConfigError saying what is wrong otherwise."""
    module_name, separator, function_name = spec.partition(USER_MODEL_SEPARATOR)
    if not separator or not module_name or not function_name:
        raise ConfigError(
            f"--model {spec!r}: expected a built-in model name or module:function (e.g. my_models:tiny_net)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"--model {spec}: cannot import module {module_name!r} ({exc}); put its directory on PYTHONPATH "
            "or install it"
        ) from exc
    function = getattr(module, function_name, None)
    if function is None or not callable(function):
        raise ConfigError(
            f"--model {spec}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function "
            f"{function_name!r}"
        )
    return function


def build_network(spec: str, input_shape: tuple[int, int, int], num_classes: int) -> keras.Model:
    """The user's network for `input_shape` images and `num_classes` logits, checked."""
    network = resolve_function(spec)(tuple(input_shape), num_classes)
    if not isinstance(network, keras.Model):
        raise ConfigError(
            f"--model {spec}: the function returned {type(network).__name__}, expected a keras.Model from "
            f"images of shape {tuple(input_shape)} to {num_classes} logits"
        )
    return network


@keras.saving.register_keras_serializable(package="train")
class UserNetwork(keras.Model):
    """A `module:function` network inside the package's classifier, rebuilt from its spec when loaded.

    Its config holds the spec, not the network's layers: the export's copy
    (export.py) and a loaded `.keras` file call the function again and take
    the weights, so a network with custom layers needs no Keras registration,
    only its module importable.
    """

    def __init__(self, spec: str, image_shape, num_classes: int, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec
        self.image_shape = tuple(image_shape)
        self.num_classes = int(num_classes)
        # Under the wrapper's dtype policy, so that its layers compute as the run asks (mixed precision).
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.dtype_policy)
        try:
            self.network = build_network(spec, self.image_shape, self.num_classes)
        finally:
            keras.config.set_dtype_policy(previous)

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def compute_output_shape(self, input_shape):
        return self.network.compute_output_shape(input_shape)

    def get_config(self):
        return {
            "name": self.name,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "trainable": self.trainable,
            "spec": self.spec,
            "image_shape": list(self.image_shape),
            "num_classes": self.num_classes,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


def build_user_classifier(
    spec: str,
    image_shape: tuple[int, int, int],
    num_classes: int,
    input_dtype: str,
    policy: str,
    normalization: tuple,
    input_normalized: bool,
    weights: str | None = None,
) -> keras.Model:
    """The classifier around `spec`'s network: input -> normalization -> network -> float32 softmax.

    The arguments mean what they mean for models.build_model; the network is
    the sub-model named pretrained.BACKBONE.
    """
    if weights == pretrained.IMAGENET:
        raise ConfigError(f"--weights imagenet: --model {spec} has no ImageNet weights; pass a file or none")
    mean, std = normalization
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        inputs = keras.Input(shape=image_shape, dtype=input_dtype, name="image")
        if input_normalized:  # stage 1 stored (pixel - mean) / std: only the dtype changes
            x = keras.layers.Activation("linear", dtype="float32", name="as_float32")(inputs)
        else:  # pixels, normalized on the device in float32 (bfloat16 would keep 3 significant digits)
            x = keras.layers.Normalization(
                mean=list(mean), variance=[s * s for s in std], dtype="float32", name="normalize"
            )(inputs)
        network = UserNetwork(spec, image_shape, num_classes, name=pretrained.BACKBONE, dtype=policy)
        logits = network(x)
        if tuple(logits.shape) != (None, num_classes):
            raise ConfigError(
                f"--model {spec}: the network's output has shape {tuple(logits.shape)}, expected "
                f"(None, {num_classes}): one logit per class"
            )
        if weights is not None:
            pretrained.load_backbone_weights(network, weights, spec)
        probabilities = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
        return keras.Model(inputs, probabilities, name=spec.rpartition(USER_MODEL_SEPARATOR)[2])
    finally:
        keras.config.set_dtype_policy(previous)
