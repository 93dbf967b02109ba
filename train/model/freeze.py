"""--freeze-backbone-epochs N: train the new head alone first, then the whole model.

The phase follows the global step counted on the host, so a resumed run, even mid-epoch, is in the right
phase (why: docs/internals.md).
"""

import logging

import keras

from train.loop.checkpoints import TrainingProgress
from train.model.pretrained import BACKBONE

log = logging.getLogger(__name__)


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
