"""Per-epoch checkpoints in the model dir, and resuming from the latest one.

A tf.train.CheckpointManager holds the model, the optimizer (with its step
counter, so the learning-rate schedule resumes where it was) and an epoch
counter. It writes each checkpoint's files first and switches the
`checkpoint` index file to it last, so a process killed mid-save leaves the
previous checkpoint as the latest, never a half-written one; it writes to
gs:// as well as to local disk. Running the same command again restores the
latest checkpoint and continues with the next epoch.

Under MultiWorkerMirroredStrategy every worker must take part in a save;
only the chief's copy is kept, the others write to a scratch directory that
is deleted right after.
"""

import logging

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"

log = logging.getLogger(__name__)


class EpochCheckpoints:
    """The checkpoints of one run: restore the latest, save after each epoch."""

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        epoch: tf.Variable,
        model_dir: str,
        worker: str | None,
        keep: int = 3,
    ):
        self._checkpoint = checkpoint
        self._epoch = epoch
        self.directory = manifest_lib.join(model_dir, CHECKPOINT_DIR)
        self._scratch = None if worker is None else manifest_lib.join(self.directory, f".scratch-{worker}")
        self._manager = tf.train.CheckpointManager(
            checkpoint, self._scratch or self.directory, max_to_keep=keep
        )

    def restore_latest(self) -> int:
        """Restore the latest checkpoint, if any; return the number of epochs it had completed."""
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            return 0
        try:
            self._checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise ConfigError(
                f"{latest}: cannot restore this checkpoint into the model being trained ({exc}). Was the model "
                "dir used for another --model or dataset? Use a fresh --model-dir"
            ) from exc
        return int(self._epoch.numpy())

    def save(self, epochs_done: int) -> str:
        self._epoch.assign(epochs_done)
        path = self._manager.save(checkpoint_number=epochs_done)
        if self._scratch is not None:
            tf.io.gfile.rmtree(self._scratch)
        return path


class SaveCheckpointEachEpoch(keras.callbacks.Callback):
    """Save a checkpoint at the end of every epoch (after its evaluation)."""

    def __init__(self, checkpoints: EpochCheckpoints):
        super().__init__()
        self._checkpoints = checkpoints

    def on_epoch_end(self, epoch, logs=None):
        path = self._checkpoints.save(epoch + 1)
        log.info("epoch %d done, checkpoint %s", epoch + 1, path)
