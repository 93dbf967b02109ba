"""Checkpoints at step boundaries, preemption (SIGTERM), and resuming from the latest checkpoint.

How saving, stopping on a signal and resuming work, and why: docs/internals.md.

One format on both Keras backends (KerasCheckpoints): Keras' own weights files with the
optimizer's state (`ckpt-<step>.weights.h5`), listed by a `checkpoint.json` index switched
last. Every process saves; only the chief publishes. A tf.train.Checkpoint directory that an
earlier version wrote is read once, on the TensorFlow backend, and replaced at the next save.
"""

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.config import CheckpointInterval
from train.device import strategy as strategy_lib
from train.errors import ConfigError
from train.loop import progress_file
from train.loop.plan import TrainingPlan

CHECKPOINT_DIR = "checkpoints"
# The checkpoints (KerasCheckpoints): the index and each step's Keras weights file.
KERAS_INDEX_FILE = "checkpoint.json"
KERAS_CHECKPOINT_SUFFIX = ".weights.h5"
# The exit status of a run stopped by SIGTERM (or SIGHUP) after saving its checkpoint (128 + SIGTERM,
# as a shell reports a process that SIGTERM ended): supervisors restart it rather than call it done.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# The exit status of a run stopped by Ctrl-C after saving its checkpoint (128 + SIGINT, as a shell reports it).
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT
# What stops training with a save: preemption and maintenance (SIGTERM), the controlling terminal
# going away (SIGHUP: an ssh session that closed), and Ctrl-C (SIGINT), whose second press stops at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
# The most steps between two agreements of the workers, whatever the step time.
MAX_STEPS_BETWEEN_AGREEMENTS = 1000

log = logging.getLogger(__name__)


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
        self._stepped = False

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch

    def on_train_batch_end(self, batch, logs=None):
        self._progress.step += batch - self._begin + 1
        if not self._stepped:
            # For train.tools.supervisor: this run got past the TPU's set-up (a failure now counts as no progress).
            self._stepped = True
            progress_file.record_first_step()


def sync_model_variables(model: keras.Model) -> None:
    """Make the model's variables hold the values training reached, before a callback reads them mid-fit.

    Keras' JAX trainer keeps the state in its own arrays during fit (the
    variables are even emptied, purge_model_variables) and writes it back
    at epoch ends; a checkpoint or an evaluation mid-epoch writes it back
    first. Nothing to do on TensorFlow, whose steps update the variables.
    """
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def keras_checkpoint_name(step: int) -> str:
    return f"ckpt-{step}{KERAS_CHECKPOINT_SUFFIX}"


def read_keras_index(directory: str) -> dict | None:
    """The checkpoint index ({"latest": step, "steps": [...]}), or None without one."""
    path = manifest_lib.join(directory, KERAS_INDEX_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return json.load(handle)


def checkpoint_steps(directory: str) -> list[int]:
    """The global steps of the checkpoints kept in `directory` (or an earlier version's), oldest first."""
    index = read_keras_index(directory)
    if index is not None:
        return sorted(index["steps"])
    state = tf.train.get_checkpoint_state(directory)
    if not state:
        return []
    return sorted(int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths)


def latest_checkpoint_step(directory: str) -> int | None:
    """The global step of the latest checkpoint in `directory` (or an earlier version's), None without one."""
    index = read_keras_index(directory)
    if index is not None:
        return int(index["latest"])
    latest = tf.train.latest_checkpoint(directory)
    return int(latest.rsplit("-", 1)[1]) if latest else None


class KerasCheckpoints:
    """The checkpoints of one run, on either backend: Keras weights files (weights plus optimizer state).

    Restore the latest, save at a global step. Every process saves, into a
    local scratch file of its own, and only the chief publishes it to the model
    dir: Keras' saving has no notion of workers (keras/src/saving/saving_lib.py
    writes whatever file it is given), and on several JAX processes it runs a
    collective, so every process must call it; under MultiWorkerMirroredStrategy
    the non-chief workers' copies are the temporary files tf.distribute's
    multi-worker guide asks for. Every process restores the same file.
    `worker` names a process that is not the chief (Devices.worker_name: None
    for the chief and single-process runs); it names its scratch directories.
    """

    def __init__(self, model: keras.Model, model_dir: str, worker: str | None = None, keep: int = 3):
        self._model = model
        self._chief = worker is None
        self._scratch_prefix = f"checkpoint-scratch-{worker or 'chief'}-"
        self._keep = keep
        self.directory = manifest_lib.join(model_dir, CHECKPOINT_DIR)
        self.last_saved_step = None
        # An earlier version's tf.train.Checkpoint files this run restored from; removed after its first save.
        self._earlier_format = False

    def restore_latest(self) -> int:
        """Restore the latest checkpoint, if any; return its global step (0 without one)."""
        index = read_keras_index(self.directory)
        if index is None:
            latest = tf.train.latest_checkpoint(self.directory)
            return self._restore_earlier_format(latest) if latest else 0
        step = int(index["latest"])
        path = manifest_lib.join(self.directory, keras_checkpoint_name(step))
        with tempfile.TemporaryDirectory() as scratch:
            local = os.path.join(scratch, keras_checkpoint_name(step))
            try:
                tf.io.gfile.copy(path, local, overwrite=True)
                with _optimizer_mismatch_as_error():
                    self._model.load_weights(local)
            except (ValueError, tf.errors.OpError) as exc:
                raise ConfigError(
                    f"{path}: cannot restore this checkpoint into the model being trained ({exc}). Was the model "
                    "dir used for another --model or dataset? Use a fresh --model-dir"
                ) from exc
        self.last_saved_step = step
        return step

    def _restore_earlier_format(self, latest: str) -> int:
        """Read, once, the tf.train.Checkpoint an earlier version of train wrote on the TensorFlow backend.

        The next save writes the Keras format and removes the earlier files
        (docs/internals.md); the JAX backend cannot read them.
        """
        if keras.backend.backend() != "tensorflow":
            raise ConfigError(
                f"{self.directory} holds checkpoints of an earlier version of train (tf.train.Checkpoint, "
                f"{os.path.basename(latest)}), which only the TensorFlow backend reads. Resume it once with "
                "--backend tensorflow (its first checkpoint is in the format both backends read), or use a "
                "fresh --model-dir"
            )
        step_variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        checkpoint = tf.train.Checkpoint(
            model=self._model, optimizer=self._model.optimizer, global_step=step_variable
        )
        try:
            checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise ConfigError(
                f"{latest}: cannot restore this checkpoint of an earlier version of train into the model being "
                f"trained ({exc}). Was the model dir used for another --model or dataset? Use a fresh --model-dir"
            ) from exc
        step = int(step_variable.numpy())
        log.warning(
            "%s: read the checkpoint an earlier version of train wrote (tf.train.Checkpoint, step %d); the next "
            "checkpoint is a Keras weights file and the earlier files are then removed",
            self.directory,
            step,
        )
        self._earlier_format = True
        self.last_saved_step = step
        return step

    def save(self, step: int) -> str | None:
        """Save at global step `step` (once: a second save at the same step does nothing)."""
        if step == self.last_saved_step:
            return None
        sync_model_variables(self._model)
        path = manifest_lib.join(self.directory, keras_checkpoint_name(step))
        with tempfile.TemporaryDirectory(prefix=self._scratch_prefix) as scratch:  # local disk, gone after
            local = os.path.join(scratch, keras_checkpoint_name(step))
            self._model.save_weights(local)  # every process: see the class docstring
            if self._chief:
                tf.io.gfile.makedirs(self.directory)
                _publish(local, path)
        if self._chief:
            index = read_keras_index(self.directory) or {"steps": []}
            steps = sorted({*index["steps"], step})
            kept, dropped = steps[-self._keep :], steps[: -self._keep]
            _write_index(self.directory, {"latest": step, "steps": kept})  # switched last
            for old in dropped:
                with contextlib.suppress(tf.errors.NotFoundError):
                    tf.io.gfile.remove(manifest_lib.join(self.directory, keras_checkpoint_name(old)))
            if self._earlier_format:
                _remove_earlier_format(self.directory)
        self._earlier_format = False
        # Every process: each supervisor (train.tools.supervisor) counts its own child's saves.
        progress_file.record_saved_step(step)
        self.last_saved_step = step
        return path

    def close(self) -> None:
        pass


def _remove_earlier_format(directory: str) -> None:
    """Remove an earlier version's tf.train.Checkpoint files (`checkpoint`, `ckpt-N.index`, `ckpt-N.data-*`)."""
    earlier = [manifest_lib.join(directory, "checkpoint")]
    earlier += tf.io.gfile.glob(manifest_lib.join(directory, "ckpt-*.index"))
    earlier += tf.io.gfile.glob(manifest_lib.join(directory, "ckpt-*.data-*"))
    for path in earlier:
        with contextlib.suppress(tf.errors.NotFoundError):
            tf.io.gfile.remove(path)


@contextlib.contextmanager
def _optimizer_mismatch_as_error():
    """Keras only warns when a weights file's optimizer state does not fit the optimizer; a resume must not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if "Skipping variable loading for optimizer" in str(warning.message):
            raise ValueError(str(warning.message))
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _publish(local: str, destination: str) -> None:
    """Copy next to `destination`, then rename: a reader never sees half a file."""
    tf.io.gfile.copy(local, destination + ".tmp", overwrite=True)
    tf.io.gfile.rename(destination + ".tmp", destination, overwrite=True)


def _write_index(directory: str, index: dict) -> None:
    path = manifest_lib.join(directory, KERAS_INDEX_FILE)
    with tf.io.gfile.GFile(path + ".tmp", "w") as handle:
        handle.write(json.dumps(index) + "\n")
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


class PreemptionNotice:
    """SIGTERM, SIGHUP or SIGINT sets a flag; training acts on it at the next step boundary. A context manager.

    The handler does nothing else: a signal handler that saved a checkpoint
    itself would run in the middle of whatever TensorFlow call the main
    thread was in. Outside the `with` block the previous handler is back.

    The first SIGINT (Ctrl-C) also gives SIGINT back to the system's default
    action, so that a second Ctrl-C ends the process at once, even while the
    main thread waits inside TensorFlow (a Python handler would only run once
    that call returned). Nothing is lost that the first one did not already
    give up: the last checkpoint stays the latest (the index switches last).
    """

    def __init__(self, signals=STOP_SIGNALS):
        self._signals = signals
        self._event = threading.Event()
        self._previous = {}
        self.signal_name = None  # the first signal received, for the messages

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, signum=None, frame=None) -> None:
        if not self._event.is_set():
            self.signal_name = signal.Signals(signum).name if signum else "a stop request"
            again = " (Ctrl-C again to stop at once, without saving)" if signum == signal.SIGINT else ""
            log.warning(
                "%s received: saving a checkpoint at the next step boundary, then stopping%s",
                self.signal_name,
                again,
            )
        self._event.set()
        if signum == signal.SIGINT:
            # After the line above is out: the second Ctrl-C (see the class docstring) ends the process.
            signal.signal(signal.SIGINT, signal.SIG_DFL)

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "training runs outside the main thread: SIGTERM/SIGHUP/SIGINT will not save a checkpoint"
            )
            return self
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self.request)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False


class WorkerAgreement:
    """When the workers agree on what to do at a step boundary (stop for a signal, save on time), and how.

    `combine` sums a list of numbers over the workers (a collective; None for
    a single process, which needs no agreement and decides at every step).
    Under several workers the agreement comes every `every.steps` steps, or,
    with `every.seconds`, every "that much time's worth" of steps, K, derived
    from the step time the chief measured (record_step_time) and carried by
    the agreement itself: every worker computes the same K from the same sum,
    so they all call the collective at the same steps. The next agreement is
    at the next multiple of K. `count` is how many collectives ran.
    """

    def __init__(self, combine: Callable[[list[float]], list[float]] | None, every, start_step: int = 0):
        self._combine = combine
        self._every = every
        self.count = 0
        self.steps_between = every.steps or 1  # K
        self._next_step = self._next_multiple(start_step)
        self._steps_timed = 0
        self._seconds = 0.0

    @property
    def multi_worker(self) -> bool:
        return self._combine is not None

    def _next_multiple(self, step: int) -> int:
        return (step // self.steps_between + 1) * self.steps_between

    def record_step_time(self, steps: int, seconds: float) -> None:
        """Time spent in the train function for `steps` steps (only the chief's counts)."""
        self._steps_timed += steps
        self._seconds += seconds

    def due(self, step: int) -> bool:
        """Whether the workers agree at the end of global step `step`."""
        return not self.multi_worker or step >= self._next_step

    def agree(self, flags: list[bool], step: int) -> list[bool]:
        """The flags OR-ed over the workers; schedules the next agreement after `step`."""
        if not self.multi_worker:
            return [bool(flag) for flag in flags]
        seconds_per_step = self._seconds / self._steps_timed if self._steps_timed else 0.0
        totals = self._combine([1.0 if flag else 0.0 for flag in flags] + [seconds_per_step])
        self.count += 1
        self._steps_timed, self._seconds = 0, 0.0
        if self._every.seconds is not None:
            chief_seconds_per_step = totals[-1]
            steps = round(self._every.seconds / chief_seconds_per_step) if chief_seconds_per_step > 0 else 1
            self.steps_between = max(1, min(MAX_STEPS_BETWEEN_AGREEMENTS, steps))
        self._next_step = self._next_multiple(step)
        return [total > 0 for total in totals[:-1]]

    def describe(self) -> dict:
        every = f"{self._every.steps} steps" if self._every.steps else f"{self._every.seconds:g} s of steps"
        return {"every": every, "agreements": self.count, "last_steps_between": self.steps_between}


def make_worker_agreement(strategy, every, start_step: int = 0) -> WorkerAgreement:
    """The WorkerAgreement of `strategy`'s cluster: a sum all-reduce under MultiWorkerMirroredStrategy.

    `every` is a CheckpointInterval (config.parse_preemption_check). The last
    number summed is the step time, counted from the first replica only (the
    chief's): a sum with zeros is exact, so every worker reads the same value.
    """
    if strategy_lib.strategy_kind(strategy) != strategy_lib.MULTIWORKER:
        return WorkerAgreement(None, every, start_step)

    @tf.function
    def summed(values):
        def replica_values():
            first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
            # Flags from every replica; the step time from the first only.
            mask = tf.concat([tf.ones_like(values[:-1]), tf.where(first, 1.0, 0.0)[None]], axis=0)
            return values * mask

        per_replica = strategy.run(replica_values)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def combine(values: list[float]) -> list[float]:
        return [float(total) for total in summed(tf.constant(values, tf.float32)).numpy()]

    return WorkerAgreement(combine, every, start_step)


class SaveCheckpoints(keras.callbacks.Callback):
    """Save on the interval, at epoch ends, and on preemption (then stop); docs/internals.md says how.

    Put it after StepCounter and after the epoch-end evaluation.
    """

    def __init__(
        self,
        checkpoints: KerasCheckpoints,
        progress: TrainingProgress,
        plan: TrainingPlan,
        interval: CheckpointInterval,
        notice: PreemptionNotice,
        agreement: WorkerAgreement,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self._checkpoints = checkpoints
        self._progress = progress
        self._plan = plan
        self._interval = interval
        self._notice = notice
        self._agreement = agreement
        self._clock = clock
        self._last_save_time = clock()
        self._call = (0, 0.0)  # the first step index and the start time of the running execution
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
        # INFO: the command's own last line says it, with the command that resumes (train/__main__.py).
        log.info("stopped at step %d with a checkpoint there", self._progress.step)

    def on_train_batch_begin(self, batch, logs=None):
        self._call = (batch, time.perf_counter())

    def on_train_batch_end(self, batch, logs=None):
        if self.preempted_at_step is not None:
            return
        first, started = self._call
        self._agreement.record_step_time(batch - first + 1, time.perf_counter() - started)
        step = self._progress.step
        last = self._checkpoints.last_saved_step or 0
        if self._interval.steps is not None and self._interval.due(step - last, 0.0):
            self._save("interval")  # the same step on every worker: no agreement needed
        if not self._agreement.due(step):
            return
        time_due = self._interval.seconds is not None and self._interval.due(
            step - last, self._clock() - self._last_save_time
        )
        preempted, time_due = self._agreement.agree([self._notice.requested, time_due], step)
        if preempted:
            self._save("preemption")
            self._stop_for_preemption()
        elif time_due:
            self._save("interval")

    def on_epoch_end(self, epoch, logs=None):
        if self.preempted_at_step is not None or not self._progress.epoch_completed(epoch, self._plan):
            return
        self._save("epoch end")
        (preempted,) = self._agreement.agree([self._notice.requested], self._progress.step)
        if preempted:  # the signal came during the evaluation: the epoch's checkpoint is the one
            self._stop_for_preemption()
