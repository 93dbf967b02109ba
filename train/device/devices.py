"""Where training runs, per Keras backend: the one seam between the trainer and TensorFlow or JAX.

`train.device.backend.resolve_devices` is the only place that picks one. The trainer, the model, the recipe, the callbacks
and the evaluation use `keras.*` only; what differs between the backends is here:

    TensorFlowDevices   (tensorflow_devices.py) a tf.distribute strategy (train/device/strategy.py: TPUStrategy, Mirrored,
                        MultiWorkerMirrored, default), per-host input through
                        distribute_datasets_from_function, Keras' private hooks the strategies need
                        (symbolic build, vector logs, the tf.range multi-step loop), and the
                        collective for the workers' agreement
    JaxDevices          (jax_devices.py) keras.distribution.DataParallel over the process's devices, the same tf.data
                        pipeline yielding this process's batches (train/device/jax_devices.py)

Both offer the same small interface (Devices): how many replicas and machines, who is chief, the
scope to build in, the train and evaluation input, the checkpoints, the workers' agreement, the
confusion matrix, and the serving export.
"""

import contextlib

import keras

from train.device import accelerator
from train.errors import ConfigError
from train.loop import checkpoints as checkpoints_lib


class Devices:
    """What the trainer asks of the backend. Subclasses: TensorFlowDevices, jax_devices.JaxDevices."""

    backend: str
    kind: str  # metrics.json's `strategy`: tpu, mirrored, multiworker, default, or jax data parallel
    strategy = None  # the TensorFlow backend's tf.distribute strategy; None on JAX

    def describe(self) -> accelerator.DeviceDescription:
        raise NotImplementedError

    @property
    def num_replicas(self) -> int:
        raise NotImplementedError

    def num_machines(self) -> int:
        raise NotImplementedError

    def worker_name(self) -> str | None:
        """A name for this process's lines when it is not the chief; None for the chief."""
        raise NotImplementedError

    def is_chief(self) -> bool:
        return self.worker_name() is None

    def scope(self):
        """Where the model, optimizer and metrics are built."""
        return contextlib.nullcontext()

    def training(self, choice: accelerator.AcceleratorChoice):
        """Process-wide settings while training runs."""
        return contextlib.nullcontext()

    def train_input(self, data_dir: str, manifest: dict, global_batch_size: int, **kwargs):
        raise NotImplementedError

    def eval_input(self, data_dir: str, manifest: dict, split: str, global_batch_size: int):
        """(input, steps): one pass over `split`, padded to static shapes, and the steps it takes."""
        raise NotImplementedError

    def prepare(self, model: keras.Model, evaluation_model: keras.Model, replica_batch, eval_batch) -> None:
        """After compile: whatever the backend needs before the first fit (placeholder batches of one replica)."""

    def checkpoints(self, model: keras.Model, model_dir: str, keep: int):
        """The run's checkpoints: one Keras-native format on both backends (train/loop/checkpoints.py)."""
        return checkpoints_lib.KerasCheckpoints(model, model_dir, worker=self.worker_name(), keep=keep)

    def worker_agreement(self, every, start_step: int):
        raise NotImplementedError

    def confusion_matrix(self, model: keras.Model, eval_data, steps: int, num_classes: int):
        raise NotImplementedError

    def export(
        self,
        model: keras.Model,
        manifest: dict,
        model_dir: str,
        lineage: dict,
        model_name: str,
        publish: bool,
    ) -> dict:
        """Write MODEL_DIR/export (the serving SavedModel) and MODEL_DIR/model.keras (train/serving/export.py).

        Called by every process; the one with `publish` (the chief) writes. Returns {"export_dir": path,
        "keras_model": path or None}, {} where nothing was written.
        """
        raise NotImplementedError


def check_keras_backend(backend: str) -> None:
    """Stop when Keras was imported on another backend than the run asks for (it cannot change afterwards)."""
    running = keras.backend.backend()
    if running != backend:
        raise ConfigError(
            f"--backend {backend}, but Keras was imported with the {running} backend. Keras reads KERAS_BACKEND "
            f"once, when it is first imported: set KERAS_BACKEND={backend} before importing keras (python -m train "
            "--backend does that itself)"
        )
