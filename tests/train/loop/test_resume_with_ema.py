"""Resuming with --ema: mid-epoch, the rest of the plan trains on from the trained weights, and only the end
of training swaps in the moving average (trainer.fit_from_step, trainer.use_final_weights); after the last
step (a preemption during the final evaluation or the export), the restart ships the average too."""

import os
import signal
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from tests.stage1 import read_split
from tests.train.loop.test_preemption import RunningTraining, resume
from tests.train.test_training_recipe import restore_last_checkpoint
from train.config import TrainConfig
from train.loop import checkpoints
from train.loop.plan import TrainingPlan
from train.serving import export
from train.trainer import fit_from_step, use_final_weights

# In the Python 3.10 leg's subset (scripts/test_py310.sh): checkpoint, resume and EMA through Keras' own hooks;
# the mid-epoch resume in the JAX leg too (scripts/test_jax.sh; the restart after the last step is two more
# trainings, 4 min there, for logic that does not depend on the backend).
pytestmark = pytest.mark.py310

EPOCHS, STEPS_PER_EPOCH, BATCH = 2, 3, 4


class WeightRecorder(keras.callbacks.Callback):
    """The model's weights where each fit begins and where each epoch ends (before Keras finalizes)."""

    def __init__(self):
        super().__init__()
        self.fit_begins, self.epoch_ends = [], []

    def _weights(self):
        return [np.array(weight) for weight in self.model.get_weights()]

    def on_train_begin(self, logs=None):
        self.fit_begins.append(self._weights())

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(self._weights())


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(learning_rate=0.5, use_ema=True, ema_momentum=0.9)
    model.compile(optimizer=optimizer, loss="mse", steps_per_execution=1)
    return model


def _same(first, second) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.jax
def test_a_mid_epoch_resume_with_ema_continues_from_the_trained_weights_and_ends_on_the_average():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(BATCH * 8, 3)).astype("float32")
    targets = rng.normal(size=(BATCH * 8, 2)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((features, targets)).batch(BATCH).repeat()
    plan = TrainingPlan(
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        steps_per_execution=1,
        global_batch_size=BATCH,
        per_replica_batch_size=BATCH,
        num_replicas=1,
    )
    model, recorder = _model(), WeightRecorder()
    fit_from_step(model, data, plan, start_step=1, callbacks=[recorder], stopped=lambda: False)

    # Two fits: the rest of epoch 0, then epoch 1.
    assert len(recorder.fit_begins) == 2 and len(recorder.epoch_ends) == 2
    # The second fit starts where the first one's training left the weights, not from their average.
    assert _same(recorder.fit_begins[1], recorder.epoch_ends[0])
    # Training ends on the trained weights; use_final_weights then swaps the average in.
    assert _same(model.get_weights(), recorder.epoch_ends[1])
    use_final_weights(model)
    final = [np.array(weight) for weight in model.get_weights()]
    assert not _same(final, recorder.epoch_ends[1])
    averages = [np.array(variable) for variable in model.optimizer._model_variables_moving_average]
    assert _same(final, averages)


@pytest.mark.slow
def test_a_run_restarted_after_its_last_step_exports_the_moving_average_not_the_trained_weights(
    stage1_dataset, tmp_path
):
    config = TrainConfig(
        data_dir=stage1_dataset("uint8"),
        model_dir=str(tmp_path / "model"),
        epochs=2,
        steps_per_epoch=5,
        global_batch_size=8,
        learning_rate=1e-2,  # large steps: the average is far from the last weights
        ema=True,
        ema_momentum=0.9,
    )
    command = [
        sys.executable, "-m", "train",
        "--data", config.data_dir,
        "--model-dir", config.model_dir,
        "--epochs", "2",
        "--steps-per-epoch", "5",
        "--global-batch-size", "8",
        "--learning-rate", "1e-2",
        "--ema", "--ema-momentum", "0.9",
        "--checkpoint-every", "epoch",
    ]  # fmt: skip
    # Preempted once training is done: the last epoch's line comes after its checkpoint, before the
    # final evaluation and the export.
    run = RunningTraining(command, tmp_path)
    deadline = time.monotonic() + 300
    while not any(line.startswith("epoch 2/2:") for line in run.lines):
        assert run.process.poll() is None, "the run ended early: " + run.finish()[1][-3000:]
        assert time.monotonic() < deadline, "no end of training after 300 s"
        time.sleep(0.01)
    # A SIGTERM in the last moments of fit only sets the flag training no longer reads; once fit is over,
    # SIGTERM ends the process. Signal until it does (the final evaluation and the export take seconds).
    while run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    code, stderr = run.finish()
    assert code != 0, "the signal came too late: the run had finished"
    assert not os.path.exists(os.path.join(config.model_dir, "metrics.json"))
    assert checkpoints.latest_checkpoint_step(os.path.join(config.model_dir, "checkpoints")) == 10

    second, metrics = resume(command, tmp_path)
    assert "resuming from step 10 of 10" in second.stdout
    assert metrics["steps_this_run"] == 0 and metrics["validation"]["weights"] == "moving average"

    # What an uninterrupted run exports: the average the last checkpoint's optimizer holds.
    model, manifest, image_format = restore_last_checkpoint(config)
    contents = []
    for row in read_split(config.data_dir, manifest_lib.VALIDATION, manifest):
        with open(row["uri"], "rb") as handle:
            contents.append(handle.read())
    images = export.serving_model_input(
        tf.constant(contents), image_format, manifest["image"]["resize_method"]
    )
    trained = model.predict_on_batch(images.numpy())
    model.optimizer.finalize_variable_values(model.trainable_variables)
    averaged = model.predict_on_batch(images.numpy())
    assert np.abs(trained - averaged).max() > 0.05, "the test needs an average that differs from the weights"
    serve = tf.saved_model.load(metrics["export_dir"]).signatures["serving_default"]
    served = serve(image_bytes=tf.constant(contents))["probabilities"].numpy()
    np.testing.assert_allclose(served, averaged, atol=1e-5)
