"""Choosing the backend's devices, once: TensorFlowDevices or JaxDevices (train/device/devices.py)."""

import keras
import tensorflow as tf

from train.config import JAX, TrainConfig, resolve_backend
from train.device import strategy as strategy_lib
from train.device.devices import Devices, check_keras_backend
from train.errors import ConfigError


def resolve_devices(config: TrainConfig, strategy: tf.distribute.Strategy | None = None) -> Devices:
    """The devices of this run, on the backend Keras runs on (`--backend`, checked against it)."""
    backend = resolve_backend(config.backend or keras.backend.backend())
    check_keras_backend(backend)
    if backend == JAX:
        if strategy is not None:
            raise ConfigError("a tf.distribute strategy was given, but this run trains on the jax backend")
        from train.device import jax_devices  # noqa: PLC0415 - imports jax

        return jax_devices.JaxDevices.resolve(config)
    from train.device.tensorflow_devices import TensorFlowDevices  # noqa: PLC0415

    if strategy is None:
        strategy = strategy_lib.resolve_strategy(config.strategy, config.tpu, config.allow_cpu)
    return TensorFlowDevices(strategy)
