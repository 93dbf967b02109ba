"""A serving export as a Python object: files in, their top classes or their errors out."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from dataset_contract import features
from train.errors import ConfigError

SIGNATURE = (
    "serving_default"  # train.serving.export's names, repeated: this needs only the export and TensorFlow
)
CONFIG_SIGNATURE = "serving_config"
INPUT_KEY = "image_bytes"
EXPORT_DIR = "export"


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One file's result: its top (label, probability) pairs, or its error."""

    file: str
    top: tuple[tuple[str, float], ...] = ()
    error: str | None = None

    def as_dict(self) -> dict:
        if self.error is not None:
            return {"file": self.file, "error": self.error}
        return {"file": self.file, "top": [{"label": label, "probability": p} for label, p in self.top]}

    def as_line(self) -> str:
        if self.error is not None:
            return f"{self.file}\terror: {self.error}"
        return f"{self.file}\t" + ", ".join(f"{label} {probability:.4f}" for label, probability in self.top)


def export_dir_of(path: str) -> str:
    """`path` itself when it holds a SavedModel, else PATH/export; ConfigError when neither does."""
    for candidate in (path, os.path.join(path, EXPORT_DIR)):
        if tf.io.gfile.exists(os.path.join(candidate, "saved_model.pb")):
            return candidate
    raise ConfigError(
        f"{path}: no SavedModel there or in {os.path.join(path, EXPORT_DIR)}; pass the export of a "
        "`python -m train` run (MODEL_DIR/export) or its model dir"
    )


def expand_folders(paths: list[str]) -> list[str]:
    """`paths` with each folder replaced by the image files below it (any depth, sorted; hidden ones left
    out), as stage 1 takes images from a tree (features.SOURCE_IMAGE_EXTENSIONS); a folder with none stays,
    to be reported. Local or gs://."""
    expanded = []
    for path in paths:
        if not tf.io.gfile.isdir(path):
            expanded.append(path)
            continue
        found = []
        for directory, subdirectories, names in tf.io.gfile.walk(path):
            subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
            found += [
                os.path.join(directory, name)
                for name in sorted(names)
                if not name.startswith(".")
                and os.path.splitext(name)[1].lower() in features.SOURCE_IMAGE_EXTENSIONS
            ]
        expanded += sorted(found) or [path]
    return expanded


def read_file(path: str) -> tuple[bytes | None, str | None]:
    """(contents, None), or (None, why the file cannot be read)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read(), None
    except (tf.errors.OpError, OSError) as exc:
        if tf.io.gfile.isdir(path):
            return None, "a folder without image files (.jpg .jpeg .png .gif .bmp .webp)"
        reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return None, f"unreadable: {reason.strip().splitlines()[0]}"


class Predictor:
    """The export's serving signature, applied to files in batches."""

    def __init__(self, export_path: str):
        loaded = tf.saved_model.load(export_dir_of(export_path))
        if SIGNATURE not in loaded.signatures:
            raise ConfigError(f"{export_path}: the SavedModel has no {SIGNATURE!r} signature")
        self._loaded = loaded  # the signatures hold the loaded object's variables only while it lives
        self._serve = loaded.signatures[SIGNATURE]
        described = loaded.signatures[CONFIG_SIGNATURE](request=tf.constant(0))
        self.labels = [label.decode() for label in described["labels"].numpy()]

    def predict_files(self, paths: list[str], top_k: int, batch_size: int = 32):
        """Yield a Prediction per path, in order."""
        top_k = max(1, min(top_k, len(self.labels)))
        for start in range(0, len(paths), batch_size):
            batch = paths[start : start + batch_size]
            read = [read_file(path) for path in batch]
            readable = [data for data, problem in read if problem is None]
            outputs = self._serve(**{INPUT_KEY: tf.constant(readable, tf.string)})
            probabilities = outputs["probabilities"].numpy()
            errors = [error.decode() for error in outputs["error"].numpy()]
            valid = outputs["valid"].numpy()
            served = 0
            for path, (_, problem) in zip(batch, read, strict=True):
                if problem is not None:
                    yield Prediction(path, error=problem)
                    continue
                row, served = served, served + 1
                if not valid[row]:
                    yield Prediction(path, error=errors[row])
                    continue
                order = np.argsort(-probabilities[row], kind="stable")[:top_k]
                yield Prediction(
                    path, top=tuple((self.labels[i], float(probabilities[row][i])) for i in order)
                )
