"""WorkerAgreement's schedule: every K steps, K fixed or derived from the chief's step time.

The collective itself runs in tests/train/test_multiworker.py (two real
worker processes); here `combine` is what one worker's sum would be.
"""

import pytest

from train.config import CheckpointInterval
from train.loop.checkpoints import MAX_STEPS_BETWEEN_AGREEMENTS, WorkerAgreement


def agreement_steps(agreement: WorkerAgreement, last_step: int, seconds_per_step: float = 0.01) -> list[int]:
    steps = []
    for step in range(1, last_step + 1):
        agreement.record_step_time(1, seconds_per_step)
        if agreement.due(step):
            agreement.agree([False], step)
            steps.append(step)
    return steps


def test_a_fixed_number_of_steps_agrees_at_its_multiples_only():
    sent = []
    agreement = WorkerAgreement(lambda values: sent.append(values) or values, CheckpointInterval(steps=4))
    assert agreement_steps(agreement, 20) == [4, 8, 12, 16, 20]
    assert agreement.count == 5
    # The flags, then the step time (the chief's measure: 4 steps of 0.01 s each).
    assert sent[-1] == [0.0, pytest.approx(0.01)]


def test_a_resumed_run_agrees_at_the_same_steps_as_the_others():
    agreement = WorkerAgreement(lambda values: values, CheckpointInterval(steps=4), start_step=6)
    assert not agreement.due(7) and agreement.due(8)


def test_a_time_makes_about_that_much_time_worth_of_steps_from_the_measured_step_time():
    agreement = WorkerAgreement(lambda values: values, CheckpointInterval(seconds=1.0))
    # The first agreement after one step (no measure yet), then every 1 s / 0.05 s = 20 steps.
    assert agreement_steps(agreement, 61, seconds_per_step=0.05) == [1, 20, 40, 60]
    assert agreement.describe() == {"every": "1 s of steps", "agreements": 4, "last_steps_between": 20}


def test_a_slow_step_agrees_after_every_step_and_a_fast_one_at_most_every_thousand():
    slow = WorkerAgreement(lambda values: values, CheckpointInterval(seconds=1.0))
    assert agreement_steps(slow, 5, seconds_per_step=3.0) == [1, 2, 3, 4, 5]
    fast = WorkerAgreement(lambda values: values, CheckpointInterval(seconds=1.0))
    agreement_steps(fast, 2, seconds_per_step=1e-6)
    assert fast.steps_between == MAX_STEPS_BETWEEN_AGREEMENTS


def test_any_worker_s_flag_is_everyone_s():
    # The second worker got the signal: the sum over workers is what combine returns.
    agreement = WorkerAgreement(
        lambda values: [values[0] + 1.0, values[1] + 0.0, values[2]], CheckpointInterval(steps=1)
    )
    assert agreement.agree([False, False], 1) == [True, False]


def test_a_single_process_decides_at_every_step_without_a_collective():
    agreement = WorkerAgreement(None, CheckpointInterval(seconds=1.0))
    assert all(agreement.due(step) for step in range(1, 10))
    assert agreement.agree([True, False], 3) == [True, False] and agreement.count == 0
