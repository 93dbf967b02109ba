"""TrainConfig's interval and step flags: what --checkpoint-every, --preemption-check-every and --profile-steps take."""

import pytest

from train.config import (
    CheckpointInterval,
    parse_checkpoint_interval,
    parse_preemption_check,
    parse_profile_steps,
)
from train.errors import ConfigError


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


def test_preemption_check_every_takes_steps_or_a_time_but_not_epoch_ends():
    assert parse_preemption_check("20") == CheckpointInterval(steps=20)
    assert parse_preemption_check("1s") == CheckpointInterval(seconds=1.0)
    with pytest.raises(ConfigError, match="--preemption-check-every"):
        parse_preemption_check("epoch")
    with pytest.raises(ConfigError, match="--preemption-check-every"):
        parse_preemption_check("often")
