"""TrainingPlan: epochs, steps and batch sizes resolved before anything is built."""

import pytest

from train.config import (
    TPU_STEPS_PER_EXECUTION,
    CheckpointInterval,
    TrainConfig,
    parse_checkpoint_interval,
    parse_preemption_check,
    parse_profile_steps,
    plan_training,
)
from train.errors import ConfigError


def config(**overrides) -> TrainConfig:
    return TrainConfig(data_dir="d", model_dir="m", **overrides)


def test_one_epoch_is_one_pass_over_the_train_split():
    plan = plan_training(
        config(epochs=3, global_batch_size=8), num_train_examples=41, num_replicas=2, on_tpu=False
    )
    assert (plan.epochs, plan.steps_per_epoch, plan.steps_per_execution) == (3, 5, 1)
    assert (plan.global_batch_size, plan.per_replica_batch_size, plan.num_replicas) == (8, 4, 2)
    assert plan.total_steps == 15


def test_tpu_runs_many_steps_per_execution_and_keeps_epochs_a_multiple_of_it():
    plan = plan_training(config(global_batch_size=8), num_train_examples=8 * 100, num_replicas=8, on_tpu=True)
    assert plan.steps_per_execution == TPU_STEPS_PER_EXECUTION
    # 100 steps is not a multiple of 32: a derived epoch length is rounded down, never trained past.
    assert plan.steps_per_epoch == 96
    assert plan.steps_per_epoch % plan.steps_per_execution == 0


def test_a_fixed_epoch_length_shrinks_steps_per_execution_to_a_divisor():
    plan = plan_training(
        config(steps_per_epoch=30, steps_per_execution=8),
        num_train_examples=1000,
        num_replicas=1,
        on_tpu=False,
    )
    assert (plan.steps_per_epoch, plan.steps_per_execution) == (30, 6)


def test_steps_are_split_into_equal_epochs_no_longer_than_one_pass():
    plan = plan_training(
        config(steps=25, global_batch_size=10), num_train_examples=100, num_replicas=1, on_tpu=False
    )
    assert plan.epochs == 3 and plan.steps_per_epoch == 9  # 27 steps: 25 rounded up to 3 equal epochs
    plan = plan_training(
        config(steps=4, global_batch_size=10), num_train_examples=100, num_replicas=1, on_tpu=False
    )
    assert (plan.epochs, plan.steps_per_epoch) == (1, 4)


@pytest.mark.parametrize(
    "overrides,examples,replicas,message",
    [
        ({"global_batch_size": 10}, 100, 4, "multiple of the number of replicas"),
        ({"global_batch_size": 64}, 50, 1, "fewer than one global batch"),
        ({"epochs": 0}, 100, 1, "--epochs must be positive"),
        ({"steps_per_execution": 0, "global_batch_size": 8}, 100, 1, "--steps-per-execution"),
    ],
)
def test_impossible_plans_stop_with_a_config_error(overrides, examples, replicas, message):
    with pytest.raises(ConfigError, match=message):
        plan_training(config(**overrides), num_train_examples=examples, num_replicas=replicas, on_tpu=False)


def test_one_step_per_execution_where_multi_step_is_unsupported():
    plan = plan_training(
        config(steps_per_execution=8, global_batch_size=8),
        num_train_examples=800,
        num_replicas=2,
        on_tpu=False,
        multi_step_supported=False,
    )
    assert (plan.steps_per_epoch, plan.steps_per_execution) == (100, 1)


@pytest.mark.parametrize(
    "text,steps,seconds",
    [
        ("500", 500, None),
        ("90s", None, 90.0),
        ("10m", None, 600.0),
        ("1.5h", None, 5400.0),
        ("epoch", None, None),
    ],
)
def test_checkpoint_every_takes_steps_or_a_time_with_its_unit(text, steps, seconds):
    interval = parse_checkpoint_interval(text)
    assert (interval.steps, interval.seconds) == (steps, seconds)


@pytest.mark.parametrize("text", ["0", "-5", "10x", "1.5", "ten minutes"])
def test_checkpoint_every_refuses_what_it_cannot_read(text):
    with pytest.raises(ConfigError, match="--checkpoint-every"):
        parse_checkpoint_interval(text)


def test_a_checkpoint_is_due_after_its_steps_or_its_time_whichever_the_interval_counts():
    assert CheckpointInterval(steps=5).due(steps_since_save=5, seconds_since_save=0.0)
    assert not CheckpointInterval(steps=5).due(steps_since_save=4, seconds_since_save=1e6)
    assert CheckpointInterval(seconds=600).due(steps_since_save=1, seconds_since_save=600.0)
    assert not CheckpointInterval(seconds=600).due(steps_since_save=10**6, seconds_since_save=599.0)
    assert not CheckpointInterval().due(steps_since_save=10**6, seconds_since_save=1e6)


def test_profile_steps_are_a_first_and_last_global_step():
    assert parse_profile_steps("10,12") == (10, 12)
    assert parse_profile_steps(None) is None
    for bad in ("12,10", "0,3", "5"):
        with pytest.raises(ConfigError, match="--profile-steps"):
            parse_profile_steps(bad)


def test_a_global_step_maps_to_its_epoch_and_the_step_within_it():
    plan = plan_training(
        config(epochs=3, steps_per_epoch=40), num_train_examples=1000, num_replicas=1, on_tpu=False
    )
    assert plan.position(0) == (0, 0)
    assert plan.position(53) == (1, 13)  # resumed mid-epoch: epoch 2 goes on at its step 13
    assert plan.position(80) == (2, 0)
    assert plan.position(500) == (3, 0)  # past the plan: nothing left


@pytest.mark.parametrize(
    "steps_per_epoch, expected",
    [(96, 32), (100, 25), (74, 37), (30, 30), (120, 30), (202, 2)],
)
def test_a_fixed_epoch_length_runs_the_divisor_nearest_the_tpu_default(steps_per_epoch, expected):
    # 74 = 2 x 37: the largest divisor below 32 is 2, but 37 keeps the TPU's steps per execution.
    # 202 = 2 x 101: no divisor between 16 and 64, the largest below 32 it is.
    plan = plan_training(
        config(steps_per_epoch=steps_per_epoch, global_batch_size=8),
        num_train_examples=8000,
        num_replicas=8,
        on_tpu=True,
        default_steps_per_execution=TPU_STEPS_PER_EXECUTION,
    )
    assert (plan.steps_per_epoch, plan.steps_per_execution) == (steps_per_epoch, expected)


def test_a_prime_epoch_length_can_only_run_one_step_per_execution():
    plan = plan_training(
        config(steps=101 * 3, steps_per_epoch=101, global_batch_size=8),
        num_train_examples=8000,
        num_replicas=8,
        on_tpu=True,
    )
    assert (plan.epochs, plan.steps_per_epoch, plan.steps_per_execution) == (3, 101, 1)


def test_preemption_check_every_takes_steps_or_a_time_but_not_epoch_ends():
    assert parse_preemption_check("20") == CheckpointInterval(steps=20)
    assert parse_preemption_check("1s") == CheckpointInterval(seconds=1.0)
    with pytest.raises(ConfigError, match="--preemption-check-every"):
        parse_preemption_check("epoch")
    with pytest.raises(ConfigError, match="--preemption-check-every"):
        parse_preemption_check("often")
