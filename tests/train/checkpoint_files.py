"""A run's checkpoints in a test (train/loop/checkpoints.py): the latest step, a restore, a rewind."""

import json
import os
import tempfile

import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.loop import checkpoints


def checkpoint_dir(model_dir) -> str:
    return manifest_lib.join(str(model_dir), checkpoints.CHECKPOINT_DIR)


def latest_step(model_dir) -> int | None:
    """The global step of MODEL_DIR's latest checkpoint (local or gs://), None without one."""
    return checkpoints.latest_checkpoint_step(checkpoint_dir(model_dir))


def restore_last_checkpoint(model, model_dir, step: int | None = None) -> int:
    """Load MODEL_DIR's latest checkpoint (or the one of `step`) into `model`, its optimizer too when compiled."""
    step = latest_step(model_dir) if step is None else step
    assert step is not None, f"no checkpoint in {checkpoint_dir(model_dir)}"
    with tempfile.TemporaryDirectory() as scratch:
        local = os.path.join(scratch, checkpoints.keras_checkpoint_name(step))
        tf.io.gfile.copy(manifest_lib.join(checkpoint_dir(model_dir), os.path.basename(local)), local)
        model.load_weights(local)
    return step


def rewind_checkpoints(model_dir, step: int) -> None:
    """Leave MODEL_DIR as an interruption right after `step`'s checkpoint would: that checkpoint the latest."""
    directory = checkpoint_dir(model_dir)
    index = checkpoints.read_keras_index(directory)
    assert index is not None and step in index["steps"], (
        f"no checkpoint of step {step} in {directory}: {index}"
    )
    kept = [saved for saved in index["steps"] if saved <= step]
    with tf.io.gfile.GFile(manifest_lib.join(directory, checkpoints.KERAS_INDEX_FILE), "w") as handle:
        handle.write(json.dumps({"latest": step, "steps": kept}) + "\n")
