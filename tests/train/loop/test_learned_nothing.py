"""A model that learned nothing gets a plain warning in the run's summary (and metrics.json), with the
likely cause and what to try; a model that learned does not. The rule on confusion matrices worked out
by hand, and a real from-scratch run that learns nothing."""

import json
import math

import pytest

from tests.user_mistakes import run_command
from train.loop.learned_nothing import learned_nothing_warning

CLASSES = ["cat", "dog", "fish"]


def _warning(matrix, loss, **kwargs):
    options = {"weights": None, "steps": 24, "model": "mobilenetv3small", **kwargs}
    return learned_nothing_warning(matrix, loss, CLASSES, **options)


def test_one_class_predicted_for_nearly_every_image_is_flagged_with_cause_and_what_to_try():
    # 10 images per class, all predicted "dog"; the loss of a uniform guess, ln 3.
    warning = _warning([[0, 10, 0], [0, 10, 0], [0, 10, 0]], math.log(3))
    assert warning.startswith(
        "warning: the model predicts 'dog' for 30 of the 30 validation images (100%; 10 are)"
    )
    assert f"its validation loss {math.log(3):.3f} is a uniform guess's (ln 3 = {math.log(3):.3f})" in warning
    assert "mobilenetv3small trained from scratch (--weights none) for 24 steps" in warning
    assert "--weights imagenet" in warning and "--model small_cnn" in warning


def test_a_uniform_guess_alone_is_flagged():
    warning = _warning([[4, 3, 3], [3, 4, 3], [3, 3, 4]], math.log(3) * 1.02, weights="imagenet")
    assert warning.startswith(
        f"warning: the model's validation loss {math.log(3) * 1.02:.3f} is a uniform guess's"
    )
    assert "predicts" not in warning and "lower --learning-rate" in warning


def test_a_model_that_learned_is_not_flagged():
    assert _warning([[9, 1, 0], [1, 8, 1], [0, 2, 8]], 0.45) is None


def test_predicting_a_class_that_nearly_every_image_has_is_not_flagged_for_it():
    # 95% of the images are cats: predicting cat everywhere is a poor model, not a collapsed one.
    assert _warning([[57, 0, 0], [2, 0, 0], [1, 0, 0]], 0.3) is None


def test_a_from_scratch_run_that_learns_nothing_gets_the_warning(stage1_dataset, tmp_path):
    # mobilenetv3small from scratch for 4 steps: BatchNorm's statistics have not settled, so every image
    # gets the same output (the README's offline fallback did this for 24-120 steps).
    data_dir = stage1_dataset("uint8")
    model_dir = tmp_path / "model"
    args = ["--data", data_dir, "--model-dir", model_dir, "--model", "mobilenetv3small", "--weights", "none"]
    result = run_command(
        "train", [*args, "--steps", "4", "--global-batch-size", "8", "--no-export"], tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    validation = json.loads((model_dir / "metrics.json").read_text())["validation"]
    assert "warning: the model predicts" in validation["warning"], validation
    assert validation["warning"] in result.stdout + result.stderr
    assert "Try --weights imagenet (pretrained)" in validation["warning"]


@pytest.mark.parametrize("loss", [0.2, 5.0])
def test_a_loss_far_from_a_uniform_guess_with_spread_predictions_is_not_flagged(loss):
    assert _warning([[5, 3, 2], [2, 5, 3], [3, 2, 5]], loss) is None
