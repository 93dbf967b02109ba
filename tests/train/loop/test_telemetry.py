"""Step-level telemetry of a real training run: TensorBoard scalars, a profile on CPU, exact validation loss."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.util import event_pb2

from tests.train.checkpoint_files import restore_last_checkpoint
from train import trainer
from train.config import TrainConfig
from train.data import checks, dataset
from train.loop import evaluation
from train.model import models

STEP_SCALARS = {
    "loss",
    "learning_rate",
    "seconds_per_step",
    "images_per_second",
    "images_per_second_per_replica",
}


def read_scalars(log_dir, run) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar event under log_dir/run."""
    scalars: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, run, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[int(event.step)] = float(tf.make_ndarray(value.tensor))
    return scalars


@pytest.fixture(scope="module")
def telemetry_run(stage1_dataset, tmp_path_factory):
    data_dir = stage1_dataset("uint8")
    model_dir = tmp_path_factory.mktemp("telemetry") / "model"
    config = TrainConfig(
        data_dir=data_dir,
        model_dir=str(model_dir),
        epochs=2,
        steps_per_epoch=6,
        global_batch_size=8,
        log_every=2,
        eval_every=4,
        profile_steps=(3, 4),
        export=False,
    )
    return data_dir, model_dir, trainer.train_and_evaluate(config)


@pytest.mark.slow
def test_every_log_every_steps_tensorboard_gets_loss_learning_rate_step_time_and_images_per_second(
    telemetry_run,
):
    _, model_dir, metrics = telemetry_run
    train = read_scalars(str(model_dir / "logs"), "train")
    for name in STEP_SCALARS:
        assert sorted(train[f"step_{name}"]) == [2, 4, 6, 8, 10, 12], name
    assert all(value > 0 for value in train["step_images_per_second"].values())
    np.testing.assert_allclose(  # one replica here: per replica = overall
        list(train["step_images_per_second_per_replica"].values()),
        list(train["step_images_per_second"].values()),
    )
    # The learning rate follows the cosine schedule down to 0 at the last step.
    rates = [train["step_learning_rate"][step] for step in sorted(train["step_learning_rate"])]
    assert rates == sorted(rates, reverse=True) and rates[-1] == pytest.approx(0.0, abs=1e-9)
    # The windowed losses average to the epoch's loss (Keras's running mean at the epoch end).
    for epoch, steps in ((1, (2, 4, 6)), (2, (8, 10, 12))):
        mean = np.mean([train["step_loss"][step] for step in steps])
        assert mean == pytest.approx(train["epoch_loss"][epoch], rel=1e-4)
    assert metrics["global_step"] == 12


@pytest.mark.slow
def test_profile_steps_write_a_tensorboard_profile_on_cpu(telemetry_run):
    _, model_dir, _ = telemetry_run
    traces = glob.glob(str(model_dir / "logs" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert traces and os.path.getsize(traces[0]) > 0


@pytest.mark.slow
def test_eval_every_evaluates_mid_epoch_without_disturbing_the_training_metrics(telemetry_run):
    _, model_dir, _ = telemetry_run
    validation = read_scalars(str(model_dir / "logs"), "validation")
    # --eval-every 4 (steps 4, 8, 12) and the epoch ends (6, 12), at their global steps.
    assert sorted(validation["step_loss"]) == [4, 6, 8, 12]
    train = read_scalars(str(model_dir / "logs"), "train")
    # The epoch's training accuracy is the training one, not the last evaluation's.
    assert train["epoch_num_examples"][1] == 6 * 8


@pytest.mark.slow
def test_validation_loss_logged_and_plotted_is_exact_not_kerass_loss_over_padded_batches(telemetry_run):
    data_dir, model_dir, metrics = telemetry_run
    validation = read_scalars(str(model_dir / "logs"), "validation")
    exact = metrics["validation"]["cross_entropy"]
    assert validation["epoch_loss"][2] == pytest.approx(exact, rel=1e-6)
    assert validation["step_loss"][12] == pytest.approx(exact, rel=1e-6)

    # Keras's own loss on the same padded evaluation reads low by the padding fraction.
    manifest = checks.read_manifest(data_dir)
    eval_data = dataset.make_eval_dataset(data_dir, manifest, "validation", 8)
    steps = dataset.eval_steps(manifest, "validation", 8)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    model = models.build_model_for_dataset("small_cnn", image_format, len(manifest["labels"]))
    restore_last_checkpoint(model, model_dir)
    judged = evaluation.build_evaluation_model(model, jit_compile=False)
    results = judged.evaluate(eval_data, steps=steps, return_dict=True, verbose=0)
    real = manifest["splits"]["validation"]["num_examples"]
    assert real % 8, "the validation split must not fill its batches exactly for this check"
    assert results["cross_entropy"] == pytest.approx(exact, rel=1e-4)
    assert results["loss"] == pytest.approx(exact * real / (steps * 8), rel=1e-3)  # diluted by the padding
    assert evaluation.exact_logs(results)["loss"] == results["cross_entropy"]
