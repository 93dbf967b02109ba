"""TrainingPlan: epochs, steps and batch sizes resolved before anything is built."""

import pytest

from train.config import (
    TrainConfig,
)
from train.errors import ConfigError
from train.loop.plan import TPU_STEPS_PER_EXECUTION, plan_training


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
