"""Checkpoints at step boundaries, preemption (SIGTERM), and resuming from the latest checkpoint.

A tf.train.CheckpointManager holds the model, the optimizer (with its
iteration counter, so the learning-rate schedule resumes where it was) and
the global step (training steps completed, counted on the host by
StepCounter). Checkpoint numbers are global steps: `ckpt-1200`. The
manager writes each checkpoint's files first and switches the `checkpoint`
index file to it last, so a process killed mid-save leaves the previous
checkpoint as the latest, never a half-written one; it writes to gs:// as
well as to local disk.

When a checkpoint is written (SaveCheckpoints):
  - every `--checkpoint-every` steps or minutes, at the end of a step (an
    execution of `steps_per_execution` steps), mid-epoch included;
  - at every epoch end, after that epoch's evaluation;
  - on SIGTERM (how spot VMs, preemptible capacity and TPU maintenance
    events announce that the machine goes away, typically 30 s ahead): the
    signal handler only sets a flag (PreemptionNotice); at the next step
    boundary the callback saves a checkpoint at that step and stops
    training, and `python -m train` exits with status 143 (128 + SIGTERM),
    the code supervisors treat as "terminated, restart me". A SIGKILL loses
    at most one checkpoint interval.

Why not tf.distribute.experimental.PreemptionCheckpointHandler: in TF 2.21
it is a no-op on Google Cloud TPU and CPU VMs (its `run` and
`save_checkpoint_if_preempted` return at once there, with a warning), on
GCE GPU VMs it polls the metadata server for maintenance events instead of
catching SIGTERM, and Keras 3's `model.fit` has no hook for it (it wants to
wrap each step function). The protocol above is the same one, by hand:
flag on signal, save at the next step boundary, exit.

Under MultiWorkerMirroredStrategy a checkpoint save is a collective: every
worker must save at the same step. A SIGTERM may reach one worker only, and
time-based intervals depend on each worker's clock, so the workers agree at
every step boundary (a sum all-reduce of two flags) before deciding. Only
the chief's copy is kept; the others write to a scratch directory that is
deleted right after.

Resuming: the same command again restores the latest checkpoint and goes on
from its global step, mid-epoch included (trainer.fit_from_step).
"""

import logging
import signal
import threading
import time
from collections.abc import Callable

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train import strategy as strategy_lib
from train.config import CheckpointInterval, TrainingPlan
from train.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"
# The exit status of a run stopped by SIGTERM after saving its checkpoint (128 + SIGTERM, as a
# shell reports a process that SIGTERM ended): supervisors restart it rather than call it done.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM

log = logging.getLogger(__name__)


class _DropShardingCallbackLines(logging.Filter):
    """TF's checkpoint writer logs "Sharding callback duration: N microseconds" at INFO on every save."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Sharding callback duration")


_DROP_SHARDING_LINES = _DropShardingCallbackLines()


def silence_checkpoint_chatter() -> None:
    """Drop TF's per-save INFO line (tensorflow/python/checkpoint/functional_saver.py logs it through absl)."""
    absl_logger = logging.getLogger("absl")
    if _DROP_SHARDING_LINES not in absl_logger.filters:
        absl_logger.addFilter(_DROP_SHARDING_LINES)


class TrainingProgress:
    """The global step: training steps completed so far, counted on the host (no device read)."""

    def __init__(self, step: int = 0):
        self.step = step

    def epoch_completed(self, epoch: int, plan: TrainingPlan) -> bool:
        """Whether the epoch `epoch` (0-based) ran to its last step, rather than being stopped early."""
        return self.step == (epoch + 1) * plan.steps_per_epoch


class StepCounter(keras.callbacks.Callback):
    """Advance TrainingProgress by the steps of each execution. Put it first among the callbacks.

    Keras calls on_train_batch_begin/end once per execution of
    `steps_per_execution` steps, with the indexes of its first and last step.
    """

    def __init__(self, progress: TrainingProgress):
        super().__init__()
        self._progress = progress
        self._begin = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self._progress.step += batch - self._begin + 1


class Checkpoints:
    """The checkpoints of one run: restore the latest, save at a global step."""

    def __init__(self, checkpoint: tf.train.Checkpoint, step: tf.Variable, model_dir: str, worker, keep=3):
        silence_checkpoint_chatter()
        self._checkpoint = checkpoint
        self._step = step
        self.directory = manifest_lib.join(model_dir, CHECKPOINT_DIR)
        self._scratch = None if worker is None else manifest_lib.join(self.directory, f".scratch-{worker}")
        self._manager = tf.train.CheckpointManager(
            checkpoint, self._scratch or self.directory, max_to_keep=keep
        )
        self.last_saved_step = None

    def restore_latest(self) -> int:
        """Restore the latest checkpoint, if any; return its global step (0 without one)."""
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            return 0
        try:
            self._checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise ConfigError(
                f"{latest}: cannot restore this checkpoint into the model being trained ({exc}). Was the model "
                "dir used for another --model or dataset, or by an older version of train? Use a fresh --model-dir"
            ) from exc
        self.last_saved_step = int(self._step.numpy())
        return self.last_saved_step

    def save(self, step: int) -> str | None:
        """Save at global step `step` (once: a second save at the same step does nothing)."""
        if step == self.last_saved_step:
            return None
        self._step.assign(step)
        path = self._manager.save(checkpoint_number=step)
        if self._scratch is not None:
            tf.io.gfile.rmtree(self._scratch)
        self.last_saved_step = step
        return path


class PreemptionNotice:
    """SIGTERM sets a flag; training acts on it at the next step boundary. A context manager.

    The handler does nothing else: a signal handler that saved a checkpoint
    itself would run in the middle of whatever TensorFlow call the main
    thread was in. Outside the `with` block the previous handler is back.
    """

    def __init__(self, signals=(signal.SIGTERM,)):
        self._signals = signals
        self._event = threading.Event()
        self._previous = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, signum=None, frame=None) -> None:
        if not self._event.is_set():
            name = signal.Signals(signum).name if signum else "a stop request"
            log.warning("%s received: saving a checkpoint at the next step boundary, then stopping", name)
        self._event.set()

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            log.warning("training runs outside the main thread: SIGTERM will not save a checkpoint")
            return self
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self.request)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False


def make_worker_agreement(strategy) -> Callable[[list[bool]], list[bool]]:
    """flags -> the same flags OR-ed over every worker of the cluster (as is, with one worker)."""
    if strategy_lib.strategy_kind(strategy) != strategy_lib.MULTIWORKER:
        return lambda flags: [bool(flag) for flag in flags]

    @tf.function
    def summed(flags):
        per_replica = strategy.run(lambda: tf.identity(flags))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def agree(flags: list[bool]) -> list[bool]:
        totals = summed(tf.constant([1.0 if flag else 0.0 for flag in flags], tf.float32))
        return [bool(total > 0) for total in totals.numpy()]

    return agree


class SaveCheckpoints(keras.callbacks.Callback):
    """Save on the interval, at epoch ends, and on preemption (then stop); see the module docstring.

    Put it after StepCounter and after the epoch-end evaluation.
    """

    def __init__(
        self,
        checkpoints: Checkpoints,
        progress: TrainingProgress,
        plan: TrainingPlan,
        interval: CheckpointInterval,
        notice: PreemptionNotice,
        agree: Callable[[list[bool]], list[bool]],
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self._checkpoints = checkpoints
        self._progress = progress
        self._plan = plan
        self._interval = interval
        self._notice = notice
        self._agree = agree
        self._clock = clock
        self._last_save_time = clock()
        self.preempted_at_step = None

    def _save(self, why: str) -> None:
        step = self._progress.step
        path = self._checkpoints.save(step)
        self._last_save_time = self._clock()
        if path:
            log.debug("checkpoint at step %d (%s): %s", step, why, path)

    def _stop_for_preemption(self) -> None:
        self.preempted_at_step = self._progress.step
        self.model.stop_training = True
        log.warning(
            "stopped at step %d with a checkpoint there; run the same command to resume", self._progress.step
        )

    def on_train_batch_end(self, batch, logs=None):
        if self.preempted_at_step is not None:
            return
        last = self._checkpoints.last_saved_step or 0
        due = self._interval.due(self._progress.step - last, self._clock() - self._last_save_time)
        preempted, due = self._agree([self._notice.requested, due])
        if preempted:
            self._save("preemption")
            self._stop_for_preemption()
        elif due:
            self._save("interval")

    def on_epoch_end(self, epoch, logs=None):
        if self.preempted_at_step is not None or not self._progress.epoch_completed(epoch, self._plan):
            return
        self._save("epoch end")
        (preempted,) = self._agree([self._notice.requested])
        if preempted:  # the signal came during the evaluation: the epoch's checkpoint is the one
            self._stop_for_preemption()
