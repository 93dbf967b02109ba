"""The optimizer of a run, from its Recipe (recipe.py): schedule, decoupled weight decay, weight EMA.

schedule             linear warmup from 0 to the peak learning rate, then cosine decay to 0 at
                     the last step (keras CosineDecay with warmup_target). A function of the
                     optimizer's step counter only, which the checkpoints hold: a resumed run
                     continues the schedule where it stopped, mid-epoch included. With
                     --gradient-accumulation-steps N it counts optimizer updates (Keras hands
                     a schedule the steps, so UpdateSchedule divides them by N); the
                     accumulated gradients are optimizer variables, checkpointed too
adamw / sgd          keras.optimizers.AdamW / SGD(momentum=0.9, nesterov=True); Keras applies
                     the weight decay decoupled from the gradient, as variable -= lr * wd * variable
weight decay         on weights only: biases and normalization parameters (BatchNormalization's
                     gamma and beta, LayerNormalization's, ...) are excluded, the practice since
                     Goyal et al.
EMA                  an exponential moving average of the trainable weights, kept by the optimizer
                     (Keras' use_ema, ema_momentum) and checkpointed with it. The trainer swaps
                     it into the model once training is done (trainer.use_final_weights, also in
                     a run resumed after its last step), so the final evaluation that
                     metrics.json reports, the export and backbone.weights.h5 use the averaged
                     weights; per-epoch validation during training sees the raw ones.
"""

import keras

from train.model.recipe import ADAMW, SGD_MOMENTUM, Recipe


@keras.saving.register_keras_serializable(package="train")
class UpdateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule` of the optimizer's updates, given its steps: with N steps per update, schedule(step // N)."""

    def __init__(self, schedule, steps_per_update: int):
        self.schedule = schedule
        self.steps_per_update = steps_per_update

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.steps_per_update))

    def get_config(self):
        return {
            "schedule": keras.saving.serialize_keras_object(self.schedule),
            "steps_per_update": self.steps_per_update,
        }

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["steps_per_update"])


def learning_rate_schedule(recipe: Recipe) -> keras.optimizers.schedules.LearningRateSchedule:
    """Linear warmup from 0 to the peak, then cosine decay to 0, as a function of the step counter
    (from `recipe.schedule_offset` on, for a run continued with --more-epochs); with
    --gradient-accumulation-steps N, of the optimizer's updates (step // N)."""
    steps_per_update = recipe.gradient_accumulation_steps
    if recipe.warmup_steps == 0:
        schedule = keras.optimizers.schedules.CosineDecay(
            recipe.peak_learning_rate, decay_steps=recipe.decay_steps
        )
    else:
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0,
            decay_steps=recipe.decay_steps,
            warmup_target=recipe.peak_learning_rate,
            warmup_steps=recipe.warmup_steps,
        )
    if recipe.schedule_offset:
        schedule = OffsetSchedule(schedule, recipe.schedule_offset // steps_per_update)
    if steps_per_update > 1:
        return UpdateSchedule(schedule, steps_per_update)
    return schedule


@keras.saving.register_keras_serializable(package="train")
class OffsetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`schedule` started at step `offset`: the learning rate of the steps a continued run adds (before the
    offset, which a continued run never trains again, the schedule's first value)."""

    def __init__(self, schedule, offset: int):
        self.schedule = schedule
        self.offset = int(offset)

    def __call__(self, step):
        return self.schedule(keras.ops.maximum(keras.ops.cast(step, "float32") - self.offset, 0.0))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule), "offset": self.offset}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["offset"])


_NORMALIZATION_LAYERS = (
    keras.layers.BatchNormalization,
    keras.layers.LayerNormalization,
    keras.layers.GroupNormalization,
    keras.layers.UnitNormalization,
)


def _nested_layers(layer):
    for child in getattr(layer, "layers", ()):
        yield child
        yield from _nested_layers(child)


def variables_without_weight_decay(model: keras.Model) -> list:
    """The trainable variables weight decay must not touch: biases and normalization parameters.

    Normalization layers' variables by type, anything else of rank <= 1 by
    shape (Dense/Conv biases, per-channel scales): decaying them toward zero
    only fights the normalization, it does not regularize.
    """
    excluded = {}
    for layer in _nested_layers(model):
        if isinstance(layer, _NORMALIZATION_LAYERS):
            for variable in layer.trainable_variables:
                excluded[id(variable)] = variable
    for variable in model.trainable_variables:
        if len(variable.shape) <= 1:
            excluded[id(variable)] = variable
    return list(excluded.values())


def build_optimizer(recipe: Recipe, model: keras.Model) -> keras.optimizers.Optimizer:
    """The (unbuilt) optimizer of `recipe` for `model`, its biases and norm parameters excluded from decay.

    Build it (optimizer.build(model.trainable_variables)) while every layer is
    trainable, so that it holds slots for the whole model even when training
    starts with a frozen backbone.
    """
    schedule = learning_rate_schedule(recipe)
    ema = {"use_ema": recipe.ema_momentum is not None}
    if recipe.gradient_accumulation_steps > 1:  # an option of every Keras optimizer, as EMA is
        ema["gradient_accumulation_steps"] = recipe.gradient_accumulation_steps
    if recipe.ema_momentum is not None:
        ema["ema_momentum"] = recipe.ema_momentum
    if recipe.optimizer == ADAMW:
        optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=recipe.weight_decay, **ema)
    else:
        optimizer = keras.optimizers.SGD(
            learning_rate=schedule,
            momentum=SGD_MOMENTUM,
            nesterov=True,
            # None, not 0: Keras then skips the decay pass entirely.
            weight_decay=recipe.weight_decay or None,
            **ema,
        )
    if recipe.weight_decay:
        optimizer.exclude_from_weight_decay(var_list=variables_without_weight_decay(model))
    return optimizer
