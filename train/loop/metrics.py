"""Evaluation metrics that count real examples only.

The evaluation pipeline pads its last batches with blank images of weight 0
(see dataset.make_eval_dataset), so every metric is given to Keras as a
*weighted* metric: a weight-0 example then adds nothing. Keras's own `loss`
does not follow this rule (it averages per-batch losses weighted by the
batch size, padding included), which is why the run reports
`cross_entropy`, a weighted metric, as the evaluation loss.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="train")
class ExampleCount(keras.metrics.Metric):
    """How many examples (sum of sample weights) the metric has seen.

    Proves that an evaluation covered the split exactly once. A float32
    counter is exact up to 2**24 (16.7 million) examples; TPUs have no float64.
    """

    def __init__(self, name: str = "num_examples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        if sample_weight is None:
            seen = ops.cast(ops.shape(y_true)[0], "float32")
        else:
            seen = ops.sum(ops.cast(sample_weight, "float32"))
        self.count.assign_add(seen)

    def result(self):
        # A snapshot, not the variable: Keras keeps epoch results around
        # while the same metric object is reset and reused for validation.
        # (convert_to_tensor would hand back the variable itself).
        return ops.add(self.count, 0.0)


def evaluation_metrics() -> list[keras.metrics.Metric]:
    """The weighted metrics every run compiles: accuracy, cross-entropy, example count."""
    return [
        keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
        keras.metrics.SparseCategoricalCrossentropy(name="cross_entropy"),
        ExampleCount(name="num_examples"),
    ]


def validation_confusion_matrix(strategy, model: keras.Model, eval_data, steps: int, num_classes: int):
    """counts[true, predicted] over one pass of the (distributed, padded) evaluation data.

    Runs on the replicas like evaluation does (TPU included) and sums the
    per-replica matrices; padding examples have weight 0 and count for nothing.
    """
    import numpy as np
    import tensorflow as tf

    def replica_counts(images, labels, weights):
        predicted = tf.argmax(model(images, training=False), axis=-1, output_type=tf.int32)
        return tf.math.confusion_matrix(labels, predicted, num_classes, weights=weights, dtype=tf.float32)

    @tf.function
    def step(iterator):
        per_replica = strategy.run(replica_counts, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    iterator = iter(eval_data)
    total = np.zeros((num_classes, num_classes), dtype=np.float64)
    for _ in range(steps):
        total += step(iterator).numpy()
    return np.rint(total).astype(np.int64)


@keras.saving.register_keras_serializable(package="train")
class ConfusionCounts(keras.metrics.Metric):
    """counts[true, predicted], weighted by the sample weights (padding, of weight 0, counts for nothing).

    A metric, so that evaluate() sums it over every device and process, on any backend.
    """

    def __init__(self, num_classes: int, name: str = "confusion_counts", **kwargs):
        super().__init__(name=name, **kwargs)
        self.num_classes = num_classes
        self.counts = self.add_variable(
            shape=(num_classes, num_classes), initializer="zeros", dtype="float32", name="counts"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.reshape(ops.cast(y_true, "int32"), (-1,))
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        weights = (
            ops.ones_like(labels, "float32") if sample_weight is None else ops.cast(sample_weight, "float32")
        )
        pairs = ops.one_hot(labels * self.num_classes + predicted, self.num_classes * self.num_classes)
        summed = ops.sum(pairs * ops.reshape(weights, (-1, 1)), axis=0)
        self.counts.assign_add(ops.reshape(summed, (self.num_classes, self.num_classes)))

    def result(self):
        return ops.add(self.counts, 0.0)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes}
