"""Reading a run's last checkpoint in a test, whichever backend wrote it (train/loop/checkpoints.py)."""

import os
import shutil
import tempfile

import tensorflow as tf

from train.loop import checkpoints


def restore_last_checkpoint(model, model_dir) -> int:
    """Load the latest checkpoint of MODEL_DIR into `model` (its optimizer too when compiled); its step."""
    directory = os.path.join(str(model_dir), checkpoints.CHECKPOINT_DIR)
    step = checkpoints.latest_checkpoint_step(directory)
    assert step is not None, f"no checkpoint in {directory}"
    if checkpoints.read_keras_index(directory) is not None:
        with tempfile.TemporaryDirectory() as scratch:
            local = os.path.join(scratch, checkpoints.keras_checkpoint_name(step))
            shutil.copy(os.path.join(directory, checkpoints.keras_checkpoint_name(step)), local)
            model.load_weights(local)
        return step
    parts = {"model": model}
    if getattr(model, "optimizer", None) is not None:
        parts["optimizer"] = model.optimizer
    tf.train.Checkpoint(**parts).restore(tf.train.latest_checkpoint(directory)).expect_partial()
    return step
