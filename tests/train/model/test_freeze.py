"""--freeze-backbone-epochs under float16 loss scaling: the phase follows the host's global step.

A real Keras fit under the mixed_float16 policy (Keras wraps the optimizer in
a LossScaleOptimizer, as the trainer's compile does for --mixed-precision
float16), with one batch whose input overflows float16: that step's
gradients are not finite, the LossScaleOptimizer skips it, and the
optimizer's `iterations` ends up one behind the steps trained.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from train.loop.checkpoints import StepCounter, TrainingProgress
from train.model.freeze import FreezeBackbone
from train.model.pretrained import BACKBONE

# In the Python 3.10 leg's subset (scripts/test_py310.sh): it drives Keras' make_train_function, which differs between Keras releases.
pytestmark = pytest.mark.py310

STEPS_PER_EPOCH, FROZEN_EPOCHS, EPOCHS, BATCH = 4, 1, 3, 4
OVERFLOW_STEP = 2  # the second step of the first epoch: its input is 1e30, infinite in float16


class PhaseRecorder(keras.callbacks.Callback):
    """Whether the backbone is trainable as each step begins, and the optimizer's count at each epoch begin."""

    def __init__(self):
        super().__init__()
        self.trainable, self.iterations_at_epoch_begin = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.iterations_at_epoch_begin.append(int(self.model.optimizer.iterations.numpy()))

    def on_train_batch_begin(self, batch, logs=None):
        self.trainable.append(self.model.get_layer(BACKBONE).trainable)


def _mixed_float16_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((3,))
        backbone = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)], name=BACKBONE)
        outputs = keras.layers.Dense(2, dtype="float32", name="logits")(backbone(inputs))
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=1,
        )
    finally:
        keras.config.set_dtype_policy(previous)
    model.optimizer.build(model.trainable_variables)  # as compile_model does, before the first freeze
    return model


def test_under_float16_loss_scaling_the_backbone_unfreezes_at_the_first_step_of_epoch_n():
    model = _mixed_float16_model()
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    total = EPOCHS * STEPS_PER_EPOCH
    features = np.random.default_rng(0).normal(size=(total * BATCH, 3)).astype("float32")
    features[(OVERFLOW_STEP - 1) * BATCH] = 1e30
    labels = np.zeros(total * BATCH, "int32")
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)

    progress, recorder = TrainingProgress(), PhaseRecorder()
    callbacks = [FreezeBackbone(FROZEN_EPOCHS * STEPS_PER_EPOCH, progress), StepCounter(progress), recorder]
    model.fit(
        data, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, callbacks=callbacks, shuffle=False, verbose=0
    )

    # The overflowed step was skipped: the optimizer counts one step less than were trained.
    assert progress.step == total
    assert int(model.optimizer.iterations.numpy()) == total - 1
    assert recorder.iterations_at_epoch_begin[FROZEN_EPOCHS] == FROZEN_EPOCHS * STEPS_PER_EPOCH - 1
    # Frozen for exactly FROZEN_EPOCHS epochs of steps, trainable from the first step of the next one.
    frozen_steps = FROZEN_EPOCHS * STEPS_PER_EPOCH
    assert recorder.trainable == [False] * frozen_steps + [True] * (total - frozen_steps)
