"""Several training steps per execution under a multi-replica strategy: a tf.range loop around strategy.run.

Keras' own K-step loop cannot run a cross-replica step (keras-team/keras#19246), so several replicas run
this one (why and how: docs/internals.md).
"""

import tensorflow as tf
from keras.src.backend.tensorflow.trainer import reduce_per_replica

TF_RANGE_LOOP = "tf.range loop"


def multi_step_train_function(model):
    """The train function of `model`: model.steps_per_execution steps per call, in one tf.function."""
    strategy = model.distribute_strategy
    steps = model.steps_per_execution
    train_step = model.train_step

    @tf.function(reduce_retracing=True)
    def train_function(iterator):
        for _ in tf.range(steps - 1):
            strategy.run(train_step, args=(next(iterator),))
        outputs = strategy.run(train_step, args=(next(iterator),))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    return train_function


def use_tf_range_loop(model) -> None:
    """Make `model` (compiled) train with multi_step_train_function from its next fit on.

    The train function is rebuilt now and then (trainer._steps_per_execution
    for a resumed epoch's remainder, freeze.FreezeBackbone's
    make_train_function(force=True) when the backbone thaws, a recompile);
    replacing make_train_function, not the function, makes every rebuild use
    the loop, with the steps per execution of that moment.
    """

    def make_train_function(force=False):
        if model.train_function is not None and not force:
            return model.train_function
        model.train_function = multi_step_train_function(model)
        return model.train_function

    model.make_train_function = make_train_function
    model.train_function = None
