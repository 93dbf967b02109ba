"""TensorBoard curves and profiles without the `tensorboard` package, and the progress lines.

keras.callbacks.TensorBoard calls tf.summary.scalar, which lives in the
`tensorboard` pip package; TensorFlow 2.21 no longer installs it, and a TPU
VM or a training container should not need it just to write logs. The
low-level `tf.summary.write` is part of TensorFlow: given the scalars
plugin's metadata it writes the same event files, which any TensorBoard
(`tensorboard --logdir MODEL_DIR/logs`, Vertex AI TensorBoard) displays.

Layout (Keras's): `logs/train` and `logs/validation`,
  epoch_<metric>   step = epoch number (EpochSummaries; what plots.py draws)
  step_<metric>    step = global step: every --log-every steps (StepTelemetry) loss, learning_rate,
                   seconds_per_step, images_per_second, images_per_second_per_replica; and the
                   validation metrics at every evaluation (evaluation.Evaluator)
  plugins/profile/ the --profile-steps trace (ProfileSteps), for TensorBoard's profile tab
"""

import logging
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from dataset_contract import manifest as manifest_lib
from train.loop.checkpoints import TrainingProgress, sync_model_variables
from train.loop.plan import TrainingPlan

TRAIN, VALIDATION = "train", "validation"

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
).SerializeToString()

log = logging.getLogger(__name__)


class ScalarWriter:
    """Scalars into `log_dir/train` and `log_dir/validation` event files."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self._writers = {}

    def write(self, run: str, prefix: str, values: dict, step: int) -> None:
        if run not in self._writers:
            self._writers[run] = tf.summary.create_file_writer(manifest_lib.join(self.log_dir, run))
        writer = self._writers[run]
        with writer.as_default():
            for name, value in values.items():
                tf.summary.write(
                    f"{prefix}_{name}",
                    tf.constant(float(value), tf.float32),
                    step=step,
                    metadata=_SCALAR_METADATA,
                )
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def current_learning_rate(optimizer, model: keras.Model | None = None) -> float:
    """The learning rate the optimizer applies at its current iteration (a schedule's value there).

    Mid-epoch on JAX the iteration count is read after `model`'s state is written back
    (sync_model_variables). The schedule is computed here, on the host, from the count read as a
    number: on JAX a computation over the replicated variable would be a program every process of a
    multi-host run must join, and only the chief writes the epoch summaries.
    """
    if model is not None:
        sync_model_variables(model)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's own
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        # Keras hands a schedule its step count (`_iterations`); `iterations` counts updates when it accumulates.
        steps = int(np.asarray(optimizer._iterations))
        return float(np.asarray(schedule(np.float32(steps))))
    return float(np.asarray(optimizer.learning_rate))


class EpochSummaries(keras.callbacks.Callback):
    """Write every epoch's train and validation metrics (and the learning rate) as `epoch_*` scalars.

    The validation values are the exact ones evaluation.exact_logs returns
    (weighted by real examples), put into the epoch's logs by EvaluateEachEpoch.
    """

    def __init__(self, writer: ScalarWriter):
        super().__init__()
        self._writer = writer

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        train = {name: value for name, value in logs.items() if not name.startswith("val_")}
        validation = {name[len("val_") :]: value for name, value in logs.items() if name.startswith("val_")}
        train["learning_rate"] = current_learning_rate(self.model.optimizer)
        self._writer.write(TRAIN, "epoch", train, epoch + 1)
        if validation:
            self._writer.write(VALIDATION, "epoch", validation, epoch + 1)


class StepTelemetry(keras.callbacks.Callback):
    """Every `every` steps: loss, learning rate, step time and images/s (overall and per replica).

    As TensorBoard `step_*` scalars (chief only: `writer` None elsewhere) and
    as a progress line (`printer`). The loss is the mean over the steps since
    the last line, derived exactly from Keras's running epoch mean (which
    Keras resets at each epoch start). The step time is the time spent in
    the train function itself, input wait included, but not in evaluations
    or checkpoint saves, so images/s is what the device sustains while
    training.
    """

    def __init__(
        self,
        writer: ScalarWriter | None,
        progress: TrainingProgress,
        plan: TrainingPlan,
        every: int,
        printer: Callable[[str], None] | None = print,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self._writer = writer
        self._progress = progress
        self._plan = plan
        self._every = max(1, every)
        self._printer = printer
        self._clock = clock
        self._epoch_start_step = progress.step
        self._window_step = progress.step
        self._window_loss_sum = 0.0
        self._window_seconds = 0.0
        self._call_start = None
        self.last_values: dict | None = None

    def on_epoch_begin(self, epoch, logs=None):
        # Keras resets its running loss here: a window never spans two epochs.
        self._epoch_start_step = self._window_step = self._progress.step
        self._window_loss_sum = self._window_seconds = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._call_start = self._clock()

    def on_train_batch_end(self, batch, logs=None):
        self._window_seconds += self._clock() - self._call_start
        step = self._progress.step
        if step // self._every == self._window_step // self._every or "loss" not in (logs or {}):
            return
        # Keras's `loss` is the mean since the epoch began: sum = mean x steps, exactly.
        loss_sum = float(logs["loss"]) * (step - self._epoch_start_step)
        steps = step - self._window_step
        seconds = max(self._window_seconds, 1e-9)
        images_per_second = steps * self._plan.global_batch_size / seconds
        values = {
            "loss": (loss_sum - self._window_loss_sum) / steps,
            "learning_rate": current_learning_rate(self.model.optimizer, self.model),
            "seconds_per_step": seconds / steps,
            "images_per_second": images_per_second,
            "images_per_second_per_replica": images_per_second / self._plan.num_replicas,
        }
        self.last_values = values
        if self._writer is not None:
            self._writer.write(TRAIN, "step", values, step)
        if self._printer is not None:
            epoch = step / self._plan.steps_per_epoch
            self._printer(
                f"step {step}/{self._plan.total_steps} (epoch {epoch:.2f}): loss {values['loss']:.4f}, "
                f"learning rate {values['learning_rate']:.3g}, {values['seconds_per_step'] * 1000:.1f} ms/step, "
                f"{images_per_second:,.1f} images/s ({values['images_per_second_per_replica']:,.1f} per replica)"
            )
        self._window_step, self._window_loss_sum, self._window_seconds = step, loss_sum, 0.0


class ProfileSteps(keras.callbacks.Callback):
    """Capture a TensorBoard profile from global step `first` to step `last` (into `log_dir`).

    Steps run `steps_per_execution` at a time, so the trace starts before
    the execution that contains `first` and stops after the one that
    contains `last`.
    """

    def __init__(self, log_dir: str, progress: TrainingProgress, first: int, last: int):
        super().__init__()
        self._log_dir = log_dir
        self._progress = progress
        self._first, self._last = first, last
        self._running = False
        self.captured = False

    def on_train_batch_begin(self, batch, logs=None):
        if not self._running and not self.captured and self._progress.step + 1 >= self._first:
            if self._progress.step + 1 > self._last:
                return
            tf.profiler.experimental.start(self._log_dir)
            self._running = True

    def on_train_batch_end(self, batch, logs=None):
        if self._running and self._progress.step >= self._last:
            self._stop()

    def on_train_end(self, logs=None):
        if self._running:
            self._stop()

    def _stop(self) -> None:
        tf.profiler.experimental.stop()
        self._running = False
        self.captured = True
        print(f"profile of steps {self._first}-{self._last} written under {self._log_dir}/plugins/profile")
