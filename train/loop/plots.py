"""Pictures of a training run: learning curves and the validation confusion matrix.

Both are PNGs in the model directory beside metrics.json. The learning curves
are drawn from the TensorBoard event files under MODEL_DIR/logs, not from the
Keras History of this process: a run that was preempted and resumed has its
earlier epochs only there. Files are written through tf.io.gfile, so gs://
model directories work like local ones.
"""

import io

import matplotlib

matplotlib.use("Agg")  # no display on a TPU VM or in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.util import event_pb2  # noqa: E402

from dataset_contract import manifest as manifest_lib  # noqa: E402

LEARNING_CURVES_FILE = "learning_curves.png"
CONFUSION_MATRIX_FILE = "confusion_matrix.png"
_PANELS = (("loss", "loss"), ("accuracy", "accuracy"))
_DPI = 100


def read_epoch_scalars(log_dir: str) -> dict[str, dict[str, dict[int, float]]]:
    """{'train'|'validation': {metric: {epoch: value}}} from the event files under `log_dir`.

    When an epoch was logged twice (a run killed after logging, before its
    checkpoint), the later value wins: it is the one the resumed run trained on.
    """
    scalars: dict[str, dict[str, dict[int, float]]] = {}
    for run in ("train", "validation"):
        paths = sorted(tf.io.gfile.glob(manifest_lib.join(log_dir, run, "events.out.tfevents.*")))
        series: dict[str, dict[int, float]] = {}
        for path in paths:
            for record in tf.data.TFRecordDataset(path):
                event = event_pb2.Event.FromString(record.numpy())
                for value in event.summary.value:
                    if not value.tag.startswith("epoch_"):
                        continue
                    number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                    series.setdefault(value.tag[len("epoch_") :], {})[int(event.step)] = float(number)
        scalars[run] = series
    return scalars


def _save_png(figure, path: str) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_DPI)
    plt.close(figure)
    with tf.io.gfile.GFile(path, "wb") as handle:
        handle.write(buffer.getvalue())


def plot_learning_curves(scalars: dict, path: str) -> None:
    """Loss and accuracy per epoch, train and validation, side by side (1000x400 px)."""
    figure, axes = plt.subplots(1, len(_PANELS), figsize=(10, 4))
    for axis, (metric, title) in zip(axes, _PANELS, strict=True):
        for run, style in (("train", "-o"), ("validation", "-s")):
            values = scalars.get(run, {}).get(metric, {})
            if values:
                epochs = sorted(values)
                axis.plot(epochs, [values[epoch] for epoch in epochs], style, markersize=3, label=run)
        # With --ema: the moving average's evaluation at the end, the weights metrics.json reports and
        # the export holds (the curves are the trained weights').
        averaged = scalars.get("validation", {}).get(f"ema_{metric}", {})
        if averaged:
            epoch = max(averaged)
            axis.plot([epoch], [averaged[epoch]], "*", markersize=10, label="validation, moving average")
        axis.set_title(title)
        axis.set_xlabel("epoch")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    _save_png(figure, path)


def confusion_matrix(labels, predictions, num_classes: int) -> np.ndarray:
    """counts[true, predicted] over the given integer labels and predictions."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (np.asarray(labels, np.int64), np.asarray(predictions, np.int64)), 1)
    return counts


def plot_confusion_matrix(counts: np.ndarray, class_names: list[str], path: str) -> None:
    """A heat map of counts[true, predicted] with the counts written in (600x600 px)."""
    figure, axis = plt.subplots(figsize=(6, 6))
    axis.imshow(counts, cmap="Blues")
    ticks = np.arange(len(class_names))
    axis.set_xticks(ticks, class_names, rotation=45, ha="right")
    axis.set_yticks(ticks, class_names)
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    total = counts.sum()
    accuracy = np.trace(counts) / total if total else 0.0
    axis.set_title(f"validation: {accuracy:.1%} of {total}")
    if len(class_names) <= 30:  # beyond that the numbers are unreadable; the colours still tell
        threshold = counts.max() / 2 if counts.size else 0
        for (row, column), value in np.ndenumerate(counts):
            axis.text(
                column,
                row,
                str(value),
                ha="center",
                va="center",
                color="white" if value > threshold else "black",
                fontsize=8,
            )
    figure.tight_layout()
    _save_png(figure, path)
