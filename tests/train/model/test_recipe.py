"""The optimization numbers of a run: learning-rate scaling, warmup + cosine schedule, EMA, checks."""

import keras
import pytest

from train.config import TrainConfig
from train.errors import ConfigError
from train.loop.plan import plan_training
from train.model import optimization, recipe


def config(**overrides) -> TrainConfig:
    return TrainConfig(data_dir="d", model_dir="m", **overrides)


def resolve(examples=6400, **overrides):
    run = config(**overrides)
    plan = plan_training(run, num_train_examples=examples, num_replicas=1, on_tpu=False)
    return recipe.resolve_recipe(run, plan), plan


def test_learning_rate_follows_the_batch_linearly_for_sgd_and_by_the_square_root_above_256_for_adamw():
    small, _ = resolve(global_batch_size=64)
    large, _ = resolve(global_batch_size=1024, examples=102400)
    assert small.peak_learning_rate == pytest.approx(1e-3 * 64 / 256)  # AdamW's base rate per 256 images
    assert small.learning_rate_scaling == "linear"
    assert large.peak_learning_rate == pytest.approx(1e-3 * (1024 / 256) ** 0.5)
    assert large.learning_rate_scaling == "sqrt" and "sqrt(batch / 256)" in recipe.describe(large)
    sgd, _ = resolve(global_batch_size=512, optimizer="sgd", examples=51200)
    assert sgd.peak_learning_rate == pytest.approx(0.1 * 512 / 256) and sgd.learning_rate_scaling == "linear"
    base, _ = resolve(global_batch_size=128, base_learning_rate=0.4)
    assert base.peak_learning_rate == pytest.approx(0.2) and base.base_learning_rate == 0.4
    linear, _ = resolve(global_batch_size=1024, examples=102400, learning_rate_scaling="linear")
    assert linear.peak_learning_rate == pytest.approx(1e-3 * 1024 / 256)


def test_an_explicit_learning_rate_is_the_peak_whatever_the_batch():
    fixed, _ = resolve(global_batch_size=1024, examples=102400, learning_rate=0.01)
    assert fixed.peak_learning_rate == 0.01 and fixed.base_learning_rate is None


def test_schedule_warms_up_linearly_to_the_peak_then_decays_to_zero_at_the_last_step():
    run, plan = resolve(global_batch_size=64, epochs=10, warmup_epochs=2)  # 100 steps per epoch
    assert (run.warmup_steps, plan.total_steps, run.decay_steps) == (200, 1000, 800)
    schedule = optimization.learning_rate_schedule(run)
    peak = run.peak_learning_rate

    def at(step):
        return float(schedule(step))

    assert at(0) == 0.0
    assert at(100) == pytest.approx(peak / 2)
    assert at(200) == pytest.approx(peak)  # the end of the warmup
    assert at(600) == pytest.approx(peak / 2)  # halfway through the cosine
    assert at(1000) == pytest.approx(0.0, abs=1e-12)  # the end
    assert at(1200) == pytest.approx(0.0, abs=1e-12)  # past the plan it stays there
    values = [at(step) for step in range(200, 1001, 50)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_the_optimizer_learning_rate_follows_its_step_counter_so_a_resumed_run_continues_the_schedule():
    run, _ = resolve(global_batch_size=64, epochs=10, warmup_steps=50)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = optimization.build_optimizer(run, model)
    optimizer.build(model.trainable_variables)
    schedule = optimization.learning_rate_schedule(run)
    for step in (0, 25, 50, 377, 999):
        optimizer.iterations.assign(step)  # what restoring a checkpoint of that step does
        assert float(optimizer.learning_rate) == pytest.approx(float(schedule(step)))


def test_default_warmup_is_one_epoch_but_at_most_a_tenth_of_the_run():
    long_run, plan = resolve(global_batch_size=64, epochs=20)
    assert long_run.warmup_steps == plan.steps_per_epoch == 100
    short_run, plan = resolve(global_batch_size=64, epochs=3)
    assert short_run.warmup_steps == 30  # 10% of 300 steps, not a whole epoch


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"warmup_epochs": 10}, "leaves nothing"),
        ({"freeze_backbone_epochs": 10}, "--freeze-backbone-epochs 10"),
        ({"optimizer": "adam"}, "unknown --optimizer"),
        ({"label_smoothing": 1.0}, "--label-smoothing"),
        ({"ema": True, "ema_momentum": 1.0}, "--ema-momentum"),
        ({"learning_rate": -1.0}, "--learning-rate"),
    ],
)
def test_impossible_recipes_stop_with_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(global_batch_size=64, epochs=10, **overrides)


def test_ema_momentum_defaults_to_an_average_over_the_last_tenth_of_the_run():
    assert resolve(global_batch_size=64, epochs=10)[0].ema_momentum is None
    assert resolve(global_batch_size=64, epochs=10, ema=True)[0].ema_momentum == pytest.approx(1 - 10 / 1000)
    assert resolve(global_batch_size=64, epochs=1, ema=True, examples=640)[0].ema_momentum == 0.9
    assert resolve(global_batch_size=64, epochs=10, ema=True, ema_momentum=0.5)[0].ema_momentum == 0.5


def test_freezing_is_counted_in_steps_of_the_plan():
    run, plan = resolve(global_batch_size=64, epochs=5, freeze_backbone_epochs=2)
    assert run.freeze_backbone_steps == 2 * plan.steps_per_epoch
    assert resolve(global_batch_size=64)[0].freeze_backbone_steps == 0
