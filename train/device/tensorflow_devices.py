"""The TensorFlow backend's devices: a tf.distribute strategy, and the private Keras hooks it needs.

The strategy itself is chosen by train/device/strategy.py (TPUStrategy, Mirrored, MultiWorkerMirrored,
default); this module adapts it to the Devices interface (train/device/devices.py).
"""

import keras
import tensorflow as tf

from train.config import TENSORFLOW
from train.data import dataset
from train.device import accelerator
from train.device import strategy as strategy_lib
from train.device.devices import Devices
from train.loop import checkpoints as checkpoints_lib
from train.loop import metrics


def build_from_shapes(model: keras.Model, strategy: tf.distribute.Strategy, batch: tuple) -> None:
    """Build the compiled model's metrics from the batch's shapes, instead of from a batch of data.

    Keras 3.15 (fit and evaluate, under any tf.distribute strategy) pulls one
    batch from the input and all-reduces it to build its metrics
    symbolically: under MultiWorkerMirroredStrategy that reduce fails on a
    structure of tensors ("Attempt to convert a value (PerReplica ...) to a
    Tensor"), and everywhere it consumes a batch. Only shapes and dtypes are
    needed, so the build is done here once and Keras's own is skipped.
    `batch` holds keras.KerasTensor placeholders of one replica's batch.
    """
    with strategy.scope():
        model._symbolic_build(data_batch=batch)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def reduce_logs_as_vectors(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    """Under MultiWorkerMirroredStrategy, return each step's logs as shape-[1] tensors.

    Keras 3.15 reduces a step's logs across workers with
    strategy.reduce("MEAN", log, axis=0), which fails on the scalar logs every
    compiled model returns ("Invalid reduction dimension 0 for input with 0
    dimensions", tensorflow/tensorflow#72388). A shape-[1] log reduces to the
    scalar Keras expects. Metric results are already global (their variables
    are aggregated on read), so the mean across workers is the value itself.
    """
    if strategy_lib.strategy_kind(strategy) != strategy_lib.MULTIWORKER:
        return

    def as_vectors(step):
        def vector_step(data):
            return {name: tf.reshape(value, [1]) for name, value in step(data).items()}

        return vector_step

    model.train_step = as_vectors(model.train_step)
    model.test_step = as_vectors(model.test_step)


class TensorFlowDevices(Devices):
    """The TensorFlow backend: a tf.distribute strategy and what Keras needs under it."""

    backend = TENSORFLOW

    def __init__(self, strategy: tf.distribute.Strategy):
        self.strategy = strategy
        self.kind = strategy_lib.strategy_kind(strategy)

    def describe(self) -> accelerator.DeviceDescription:
        return accelerator.describe_devices(self.strategy)

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def num_machines(self) -> int:
        return strategy_lib.num_machines(self.strategy)

    def worker_name(self) -> str | None:
        return strategy_lib.worker_name(self.strategy)

    def scope(self):
        return self.strategy.scope()

    def training(self, choice: accelerator.AcceleratorChoice):
        return accelerator.xla_autoclustering(choice.xla == accelerator.XLA_AUTOCLUSTERING)

    def train_input(self, data_dir: str, manifest: dict, global_batch_size: int, **kwargs):
        return dataset.distribute_train_dataset(
            self.strategy, data_dir, manifest, global_batch_size, **kwargs
        )

    def eval_input(self, data_dir: str, manifest: dict, split: str, global_batch_size: int):
        return dataset.distribute_eval_dataset(self.strategy, data_dir, manifest, split, global_batch_size)

    def prepare(self, model: keras.Model, evaluation_model: keras.Model, replica_batch, eval_batch) -> None:
        build_from_shapes(model, self.strategy, replica_batch)
        build_from_shapes(evaluation_model, self.strategy, eval_batch)
        reduce_logs_as_vectors(model, self.strategy)
        reduce_logs_as_vectors(evaluation_model, self.strategy)

    def worker_agreement(self, every, start_step: int):
        return checkpoints_lib.make_worker_agreement(self.strategy, every, start_step)

    def confusion_matrix(self, model: keras.Model, eval_data, steps: int, num_classes: int):
        return metrics.validation_confusion_matrix(self.strategy, model, eval_data, steps, num_classes)

    def export(
        self,
        model: keras.Model,
        manifest: dict,
        model_dir: str,
        lineage: dict,
        model_name: str,
        publish: bool,
    ) -> dict:
        from train.serving import export  # noqa: PLC0415

        if not publish:  # the chief's alone, as ever under MultiWorkerMirroredStrategy
            return {}
        return {
            "export_dir": export.export_serving_model(
                model, manifest, export.export_path(model_dir), lineage=lineage
            ),
            "keras_model": export.save_keras_model(model, model_dir, manifest),
        }
