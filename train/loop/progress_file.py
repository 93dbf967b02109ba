"""What a supervised training run tells the supervisor: its last saved checkpoint step, and that it got to train.

`python -m train.tools.supervisor` names a small local file in the child's
environment (TRAIN_PROGRESS_FILE). train/loop/checkpoints.py records each saved
step there, and that the run completed its first training step. After a
failed run the supervisor reads both:
  - a run that advanced no checkpoint, however long it lasted, made no
    progress, and N of those in a row stop supervision (a truncated shard
    mid-epoch, an OOM at the epoch-end evaluation fail the same way each time);
  - a run that failed before its first step (no TPU yet, a slice's servers
    not answering) is the machine, not the training: it does not count
    towards that limit (the supervisor clears the mark before each run).

A local file, not the model dir: the supervisor is plain Python with no
gs:// client, and the file only has to outlive one child process. Plain
Python, no TensorFlow: the supervisor imports it.
"""

import dataclasses
import json
import os

PROGRESS_FILE_ENV = "TRAIN_PROGRESS_FILE"


@dataclasses.dataclass(frozen=True)
class Progress:
    saved_step: int | None = None  # the last checkpoint step saved, by any run
    stepped: bool = False  # whether the current (or last) run completed a training step


def read_progress(path: str) -> Progress:
    """What the file holds; an absent or unreadable file holds nothing."""
    try:
        with open(path) as handle:
            content = json.load(handle)
        step = content.get("saved_step")
        return Progress(None if step is None else int(step), bool(content.get("stepped", False)))
    except (OSError, ValueError, AttributeError, TypeError):
        return Progress()


def _write(path: str, progress: Progress) -> None:
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as handle:
        json.dump(dataclasses.asdict(progress), handle)
    os.replace(partial, path)  # a reader sees the old content or the new one, never half a file


def record_saved_step(step: int, path: str | None = None) -> None:
    """Record `step` in `path` (default: $TRAIN_PROGRESS_FILE; nothing when unset). A save follows a step."""
    path = path or os.environ.get(PROGRESS_FILE_ENV)
    if path:
        _write(path, Progress(int(step), True))


def record_first_step(path: str | None = None) -> None:
    """Record that this run completed a training step (default file: $TRAIN_PROGRESS_FILE)."""
    path = path or os.environ.get(PROGRESS_FILE_ENV)
    if path:
        _write(path, dataclasses.replace(read_progress(path), stepped=True))


def start_run(path: str) -> None:
    """The supervisor, before each run: keep the saved step, clear the mark of a completed step."""
    if os.path.exists(path):
        _write(path, dataclasses.replace(read_progress(path), stepped=False))


def read_saved_step(path: str) -> int | None:
    """The last recorded step, or None when nothing was recorded (or the file is unreadable)."""
    return read_progress(path).saved_step
