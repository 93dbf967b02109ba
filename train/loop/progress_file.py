"""The last checkpoint step a supervised training run saved, in a small local file the supervisor reads.

`python -m train.tools.supervisor` names the file in the child's environment
(TRAIN_PROGRESS_FILE); train/loop/checkpoints.py records each saved step there.
After a failed run the supervisor compares the step with the one before the
run: a run that advanced no checkpoint, however long it lasted, made no
progress, and N of those in a row stop supervision (a truncated shard
mid-epoch, an OOM at the epoch-end evaluation fail the same way each time).

A local file, not the model dir: the supervisor is plain Python with no
gs:// client, and the file only has to outlive one child process. Plain
Python, no TensorFlow: the supervisor imports it.
"""

import json
import os

PROGRESS_FILE_ENV = "TRAIN_PROGRESS_FILE"


def record_saved_step(step: int, path: str | None = None) -> None:
    """Write `step` to `path` (default: $TRAIN_PROGRESS_FILE; nothing when unset), atomically."""
    path = path or os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as handle:
        json.dump({"saved_step": int(step)}, handle)
    os.replace(partial, path)  # a reader sees the old step or the new one, never half a file


def read_saved_step(path: str) -> int | None:
    """The last recorded step, or None when nothing was recorded (or the file is unreadable)."""
    try:
        with open(path) as handle:
            return int(json.load(handle)["saved_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
