"""The training loss: cross-entropy, with label smoothing when asked.

Keras 3's SparseCategoricalCrossentropy has no label smoothing; the
categorical one has. The pipeline keeps integer labels (4 bytes per example
instead of num_classes floats on the host, and the metrics and confusion
matrix read them as they are), and the smoothed loss one-hots them inside the
loss, on the device, before CategoricalCrossentropy(label_smoothing=...):

    target = (1 - s) * one_hot(label) + s / num_classes
    loss   = -sum_k target_k * log p_k

The reported evaluation cross-entropy (metrics.py) stays the plain,
unsmoothed one, so runs with and without smoothing compare.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="train")
class SmoothedSparseCategoricalCrossentropy(keras.losses.Loss):
    """Cross-entropy of probabilities against integer labels smoothed by `label_smoothing`."""

    def __init__(self, label_smoothing: float, name: str = "smoothed_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        num_classes = y_pred.shape[-1]
        labels = ops.cast(ops.reshape(y_true, [-1]), "int32")
        one_hot = ops.one_hot(labels, num_classes, dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(one_hot, y_pred, label_smoothing=self.label_smoothing)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def training_loss(label_smoothing: float) -> keras.losses.Loss:
    """The loss to compile: plain sparse cross-entropy, or its smoothed version."""
    if label_smoothing:
        return SmoothedSparseCategoricalCrossentropy(label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy()
