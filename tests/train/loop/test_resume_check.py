"""A resume keeps the checkpoint's plan: another batch size, length or schedule stops with the flags that
restore it (exit 2, nothing trained); a finished run is evaluated again, never trained further."""

import json
import os
import shutil

import pytest

from tests.train.checkpoint_files import latest_step, rewind_checkpoints
from train.__main__ import main as train_main
from train.config import TrainConfig
from train.errors import ConfigError
from train.loop import resume_check
from train.model import optimization
from train.model.recipe import Recipe
from train.trainer import train_and_evaluate

EPOCHS, STEPS_PER_EPOCH, BATCH = 2, 3, 8


def _config(data_dir, model_dir, **overrides) -> TrainConfig:
    fields = dict(
        data_dir=data_dir,
        model_dir=str(model_dir),
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        global_batch_size=BATCH,
        checkpoint_every="epoch",
        export=False,
    )
    return TrainConfig(**{**fields, **overrides})


def _latest_step(model_dir) -> int:
    return latest_step(model_dir)


@pytest.fixture(scope="module")
def finished_run(stage1_dataset, tmp_path_factory):
    data_dir = stage1_dataset("uint8")
    model_dir = tmp_path_factory.mktemp("finished")
    train_and_evaluate(_config(data_dir, model_dir))
    return data_dir, model_dir


def test_the_first_start_records_its_plan(finished_run):
    _, model_dir = finished_run
    with open(os.path.join(model_dir, resume_check.PLAN_FILE)) as handle:
        plan = json.load(handle)
    assert (plan["global_batch_size"], plan["epochs"], plan["steps_per_epoch"]) == (
        BATCH,
        EPOCHS,
        STEPS_PER_EPOCH,
    )
    assert plan["total_steps"] == EPOCHS * STEPS_PER_EPOCH and plan["optimizer"] == "adamw"


def test_another_batch_size_is_refused_with_exit_2_and_the_flags_that_restore_the_plan(finished_run, capsys):
    data_dir, model_dir = finished_run
    code = train_main(
        ["--data", data_dir, "--model-dir", str(model_dir), "--epochs", str(EPOCHS),
         "--steps-per-epoch", str(STEPS_PER_EPOCH), "--global-batch-size", str(2 * BATCH),
         "--checkpoint-every", "epoch", "--no-export"]
    )  # fmt: skip
    error = capsys.readouterr().err
    assert code == 2 and "Traceback" not in error
    assert f"finished (step {EPOCHS * STEPS_PER_EPOCH} of {EPOCHS * STEPS_PER_EPOCH})" in error
    assert f"global batch {2 * BATCH} (the checkpoint's run: global batch {BATCH})" in error
    assert f"To resume it: the same command with --global-batch-size {BATCH}" in error
    assert f"--weights {model_dir}" in error  # how to train on from it instead
    assert _latest_step(model_dir) == EPOCHS * STEPS_PER_EPOCH  # nothing trained


def test_more_epochs_on_a_finished_run_are_refused_not_trained(finished_run):
    data_dir, model_dir = finished_run
    with pytest.raises(ConfigError, match=rf"{EPOCHS + 1} epochs \(the checkpoint's run: {EPOCHS} epochs\)"):
        train_and_evaluate(_config(data_dir, model_dir, epochs=EPOCHS + 1))
    with pytest.raises(
        ConfigError, match="(?s)peak learning rate 0.5 .*the same command with --learning-rate"
    ):
        train_and_evaluate(_config(data_dir, model_dir, learning_rate=0.5))
    assert _latest_step(model_dir) == EPOCHS * STEPS_PER_EPOCH


def test_the_same_plan_on_a_finished_run_says_it_trains_nothing(finished_run, capsys):
    data_dir, model_dir = finished_run
    metrics = train_and_evaluate(_config(data_dir, model_dir))
    printed = capsys.readouterr().out
    assert (
        f"holds a finished run (step {EPOCHS * STEPS_PER_EPOCH} of {EPOCHS * STEPS_PER_EPOCH}): nothing to train"
        in printed
    )
    assert metrics["steps_this_run"] == 0
    assert (
        printed.strip().splitlines()[-1] == f"export: none (--no-export); metrics: {model_dir}/metrics.json"
    )


def test_more_epochs_continue_a_finished_run_with_a_restarted_schedule_and_resume_if_interrupted(
    finished_run, tmp_path, capsys
):
    data_dir, finished_dir = finished_run
    model_dir = tmp_path / "model"
    shutil.copytree(finished_dir, model_dir)  # the module's run stays finished for the other tests
    capsys.readouterr()
    done = EPOCHS * STEPS_PER_EPOCH
    metrics = train_and_evaluate(_config(data_dir, model_dir, more_epochs=2))
    printed = capsys.readouterr().out
    total = done + 2 * STEPS_PER_EPOCH
    assert (
        f"continuing the finished run for 2 more epochs (--more-epochs), steps {done + 1} to {total}"
        in printed
    )
    assert metrics["global_step"] == total and metrics["steps_this_run"] == 2 * STEPS_PER_EPOCH
    assert metrics["epochs"] == EPOCHS + 2 and _latest_step(model_dir) == total
    # The schedule of the added steps restarts: the run's peak after the warmup (none in 6 steps: a tenth
    # of the run at most), then down to 0 at the new last step.
    recipe = Recipe(**metrics["recipe"])
    schedule = optimization.learning_rate_schedule(recipe)
    assert recipe.schedule_offset == done and recipe.decay_steps == total - done - recipe.warmup_steps
    assert float(schedule(done + recipe.warmup_steps)) == pytest.approx(recipe.peak_learning_rate)
    assert float(schedule(total)) == pytest.approx(0.0, abs=1e-9)
    with open(os.path.join(model_dir, resume_check.PLAN_FILE)) as handle:
        assert json.load(handle)["continued"] == [{"from_step": done, "more_epochs": 2, "total_steps": total}]

    # Interrupted inside the continuation (its checkpoint of one epoch in): the same command resumes it.
    rewind_checkpoints(model_dir, done + STEPS_PER_EPOCH)
    again = train_and_evaluate(_config(data_dir, model_dir, more_epochs=2))
    assert again["global_step"] == total and again["steps_this_run"] == STEPS_PER_EPOCH

    # Without a finished run, --more-epochs is refused with what to do.
    with pytest.raises(ConfigError, match="train it first without --more-epochs"):
        train_and_evaluate(_config(data_dir, tmp_path / "empty", more_epochs=1))
