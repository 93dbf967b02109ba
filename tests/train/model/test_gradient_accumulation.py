"""--gradient-accumulation-steps N: N steps of B images update the model as one step of N x B would, with
the learning rate of that batch and a schedule counted in updates; on both backends (the JAX leg too)."""

import keras
import numpy as np
import pytest

from train.config import TrainConfig
from train.errors import ConfigError
from train.loop.plan import TrainingPlan
from train.model import optimization, recipe
from train.trainer import _final_weights_held_back

pytestmark = pytest.mark.jax


def _plan(global_batch_size: int, steps_per_epoch: int, epochs: int = 10) -> TrainingPlan:
    return TrainingPlan(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        steps_per_execution=1,
        global_batch_size=global_batch_size,
        per_replica_batch_size=global_batch_size,
        num_replicas=1,
    )


def _config(**fields) -> TrainConfig:
    return TrainConfig(data_dir="d", model_dir="m", **fields)


def test_the_recipe_scales_the_learning_rate_to_an_update_and_counts_the_schedule_in_updates():
    plan = _plan(global_batch_size=16, steps_per_epoch=8)  # 80 steps
    accumulated = recipe.resolve_recipe(_config(gradient_accumulation_steps=4), plan)
    assert accumulated.gradient_accumulation_steps == 4
    # The batch of an update is 64 images: AdamW's base 1e-3 x 64 / 256.
    assert accumulated.peak_learning_rate == pytest.approx(1e-3 * 64 / 256)
    # 20 updates: one epoch's warmup (2 updates, at most a tenth of the run), the rest decays.
    assert (accumulated.warmup_steps, accumulated.decay_steps) == (2, 18)
    # The same run with four times the batch and a quarter of the steps has the same schedule.
    whole = recipe.resolve_recipe(_config(), _plan(global_batch_size=64, steps_per_epoch=2))
    assert (whole.peak_learning_rate, whole.warmup_steps, whole.decay_steps) == (
        accumulated.peak_learning_rate,
        accumulated.warmup_steps,
        accumulated.decay_steps,
    )
    assert recipe.resolve_recipe(_config(), plan).gradient_accumulation_steps == 1


def test_an_accumulation_that_does_not_divide_an_epoch_is_refused():
    with pytest.raises(ConfigError, match="does not divide an epoch's 6 steps"):
        recipe.resolve_recipe(
            _config(gradient_accumulation_steps=4), _plan(global_batch_size=8, steps_per_epoch=6)
        )


def _model(run_recipe: recipe.Recipe) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)]
    )
    model.compile(optimizer=optimization.build_optimizer(run_recipe, model), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("optimizer", recipe.OPTIMIZERS)
def test_n_steps_of_b_images_train_like_one_step_of_n_times_b(optimizer):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(32, 3)).astype("float32")
    targets = rng.normal(size=(32, 2)).astype("float32")
    common = {"optimizer": optimizer, "learning_rate": 0.05, "warmup_steps": 0, "ema": True}
    accumulated = _model(
        recipe.resolve_recipe(_config(gradient_accumulation_steps=2, **common), _plan(8, steps_per_epoch=4))
    )
    whole = _model(recipe.resolve_recipe(_config(**common), _plan(16, steps_per_epoch=2)))
    initial = whole.get_weights()
    for model, batch in ((accumulated, 8), (whole, 16)):  # two updates each: 4 steps of 8, 2 steps of 16
        with _final_weights_held_back(model):
            model.fit(features, targets, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(accumulated.get_weights(), whole.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(whole.get_weights()[0], initial[0])  # they did train
    # The optimizer counted 4 steps and 2 updates; the schedule is at update 2 (cosine decay over 2 x 10 updates).
    assert int(np.asarray(accumulated.optimizer.iterations)) == 2
    schedule = accumulated.optimizer._learning_rate
    assert float(np.asarray(schedule(4))) == pytest.approx(
        float(np.asarray(whole.optimizer._learning_rate(2)))
    )
