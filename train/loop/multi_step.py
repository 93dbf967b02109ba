"""Several training steps per execution under a multi-replica strategy: a tf.range loop around strategy.run.

Keras' own K-step loop cannot run a cross-replica step (keras-team/keras#19246), so several replicas
run this one; the comment above multi_step_train_function says why and how.
"""

import tensorflow as tf
from keras.src.backend.tensorflow.trainer import reduce_per_replica

TF_RANGE_LOOP = "tf.range loop"


# Why a loop of our own, and what it is.
#
# Why: Keras' TensorFlow trainer (keras/src/backend/tensorflow/trainer.py,
# 3.15.1 as pinned) returns to Python after every execution of its train
# function, and waits for the device there twice: `function` reads
# `opt_outputs.has_value()` as a Python bool, and the CallbackList turns the
# step's logs into NumPy (`python_utils.pythonify_logs`) before any callback
# that overrides `on_train_batch_end` runs, and training has several (step
# counter, clock, checkpoints, telemetry), which also keeps Keras from
# dispatching them asynchronously. With one step per execution, every step
# ends in a device-to-host sync and the accelerators idle until Python sends
# the next one. `steps_per_execution=K` makes that once per K steps; but
# Keras builds its K-step loop as a tf.while_loop whose body calls the step
# inside a tf.cond, where MirroredStrategy's cross-replica merge_call cannot
# run ("You must feed a value for placeholder tensor ...",
# keras-team/keras#19246; reproduced on two logical CPU devices with Keras
# 3.15.1), so multi-replica strategies were held to one step per execution.
#
# What instead: the train function is replaced by the loop TensorFlow's own
# custom-training-loop libraries run (Orbit's StandardTrainer, tensorflow/models):
# one tf.function that runs `strategy.run(train_step, next(iterator))` K - 1
# times in a `tf.range` loop, with nothing carried from one step to the next
# but the iterator and the model's variables, then the K-th step, whose logs
# (the model's metric results, which the variables hold) it returns, reduced
# as Keras reduces them. Keras' fit keeps counting K steps per call
# (`model.steps_per_execution`), so callbacks, epochs and checkpoints see the
# same step numbers as with Keras' own loop. The training input is endless
# (dataset.make_train_dataset repeats), so no end-of-data check is needed.
# tests/train/loop/test_multi_step.py holds the equivalence: K steps in one
# execution leave the same weights as K executions of one step.


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
