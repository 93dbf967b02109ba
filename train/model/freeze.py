"""--freeze-backbone-epochs N: train the new head alone first, then the whole model.

The phase follows the global step counted on the host, so a resumed run, even mid-epoch, is in the
right phase (why, above FreezeBackbone).
"""

import logging

import keras

from train.loop.checkpoints import TrainingProgress
from train.model.pretrained import BACKBONE

log = logging.getLogger(__name__)


# Why, and how the phase is kept.
#
# A pretrained backbone under a randomly initialized head gets large, noisy
# gradients in the first steps; training the head alone for a few epochs
# first keeps them from wrecking the pretrained features (the Keras transfer
# learning guide's recipe; the warmup of optimization.py does the same more
# gently, so N defaults to 0).
#
# While frozen, the backbone's `trainable` is False. In Keras 3 that also puts
# its BatchNormalization layers in inference mode: they normalize with their
# moving statistics and do not update them, so the pretrained statistics
# survive the head's training. Keras reads `trainable` when it traces the
# train step, so every change of phase re-makes the train function
# (make_train_function(force=True): the next call traces and, with XLA,
# compiles again, once per phase); steps_per_execution and jit_compile are the
# model's attributes and carry over.
#
# The phase is a function of the global step counted on the host
# (TrainingProgress, restored from the checkpoint; frozen while step < N x
# steps per epoch), read at the start of training and of every epoch, so a run
# resumed from a checkpoint, even mid-epoch, is in the right phase, and the
# backbone unfreezes at the first step of epoch N. Not of the optimizer's
# `iterations`: under float16 loss scaling (LossScaleOptimizer) that counter
# skips the steps whose gradients overflowed, so it lags the steps trained and
# the backbone would stay frozen for another epoch. The optimizer is built over every variable before the first freeze
# (optimization.build_optimizer), so its slots, its EMA and the checkpoints
# have the same variables in both phases.


class FreezeBackbone(keras.callbacks.Callback):
    """Keep the model's backbone frozen until the global step reaches `unfreeze_at_step`."""

    def __init__(self, unfreeze_at_step: int, progress: TrainingProgress):
        super().__init__()
        self.unfreeze_at_step = unfreeze_at_step
        self._progress = progress

    def _apply(self) -> None:
        backbone = self.model.get_layer(BACKBONE)
        step = self._progress.step
        trainable = step >= self.unfreeze_at_step
        if backbone.trainable == trainable:
            return
        backbone.trainable = trainable
        self.model.make_train_function(force=True)
        if trainable:
            log.info("step %d: backbone unfrozen, training the whole model", step)
        else:
            log.info(
                "step %d: backbone frozen (BatchNorm in inference mode) until step %d",
                step,
                self.unfreeze_at_step,
            )

    def on_train_begin(self, logs=None):
        self._apply()

    def on_epoch_begin(self, epoch, logs=None):
        self._apply()
