"""Resuming with --ema: mid-epoch, the rest of the plan trains on from the trained weights, and only the end
of training swaps in the moving average (trainer.fit_from_step, trainer.use_final_weights); after the last
step (a preemption during the final evaluation or the export), the restart ships the average too."""

import keras
import numpy as np
import tensorflow as tf

from train.config import TrainingPlan
from train.trainer import fit_from_step, use_final_weights

EPOCHS, STEPS_PER_EPOCH, BATCH = 2, 3, 4


class WeightRecorder(keras.callbacks.Callback):
    """The model's weights where each fit begins and where each epoch ends (before Keras finalizes)."""

    def __init__(self):
        super().__init__()
        self.fit_begins, self.epoch_ends = [], []

    def _weights(self):
        return [np.array(weight) for weight in self.model.get_weights()]

    def on_train_begin(self, logs=None):
        self.fit_begins.append(self._weights())

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(self._weights())


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(learning_rate=0.5, use_ema=True, ema_momentum=0.9)
    model.compile(optimizer=optimizer, loss="mse", steps_per_execution=1)
    return model


def _same(first, second) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_a_mid_epoch_resume_with_ema_continues_from_the_trained_weights_and_ends_on_the_average():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(BATCH * 8, 3)).astype("float32")
    targets = rng.normal(size=(BATCH * 8, 2)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((features, targets)).batch(BATCH).repeat()
    plan = TrainingPlan(
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        steps_per_execution=1,
        global_batch_size=BATCH,
        per_replica_batch_size=BATCH,
        num_replicas=1,
    )
    model, recorder = _model(), WeightRecorder()
    fit_from_step(model, data, plan, start_step=1, callbacks=[recorder], stopped=lambda: False)

    # Two fits: the rest of epoch 0, then epoch 1.
    assert len(recorder.fit_begins) == 2 and len(recorder.epoch_ends) == 2
    # The second fit starts where the first one's training left the weights, not from their average.
    assert _same(recorder.fit_begins[1], recorder.epoch_ends[0])
    # Training ends on the trained weights; use_final_weights then swaps the average in.
    assert _same(model.get_weights(), recorder.epoch_ends[1])
    use_final_weights(model)
    final = [np.array(weight) for weight in model.get_weights()]
    assert not _same(final, recorder.epoch_ends[1])
    averages = [np.array(variable) for variable in model.optimizer._model_variables_moving_average]
    assert _same(final, averages)
