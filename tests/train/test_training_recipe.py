"""A whole-recipe run (crop margin, label smoothing, EMA): what it records, and that what it reports and
what it ships are the EMA weights."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from tests.stage1 import read_split
from tests.train.checkpoint_files import restore_last_checkpoint as restore_last_checkpoint_of
from tests.train.conftest import CROP_MARGIN
from train import trainer
from train.config import TrainConfig
from train.data import checks, dataset
from train.loop import plots
from train.loop.evaluation import build_evaluation_model, exact_logs
from train.model import models, pretrained
from train.serving import export

# In the Python 3.10 leg's subset (scripts/test_py310.sh): the whole recipe (schedule, EMA, evaluation) through Keras'
# hooks; and in the JAX leg (scripts/test_jax.sh): EMA and the export on Keras' JAX backend.
pytestmark = [pytest.mark.py310, pytest.mark.jax]

MODEL = models.SMALL_CNN


@pytest.fixture(scope="module")
def ema_run(stage1_dataset, tmp_path_factory):
    """One real --ema run: (config, the returned metrics)."""
    config = TrainConfig(
        data_dir=stage1_dataset("uint8", CROP_MARGIN),
        model_dir=str(tmp_path_factory.mktemp("ema_run") / "model"),
        model=MODEL,
        epochs=3,
        global_batch_size=8,
        learning_rate=1e-2,  # large steps, so that the average is far from the last weights
        ema=True,
        ema_momentum=0.9,
        label_smoothing=0.1,
    )
    return config, trainer.train_and_evaluate(config)


def restore_last_checkpoint(config: TrainConfig):
    """The run's model, compiled with its recipe, with the last checkpoint's trained weights and average."""
    manifest = checks.read_manifest(config.data_dir)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    run = trainer.setup_run(config, manifest)  # first, as the trainer: on JAX it sets Keras' distribution
    with run.devices.scope():
        model = models.build_model_for_dataset(MODEL, image_format, len(manifest["labels"]))
        trainer.compile_model(model, config, run.plan, run.choice)
    restore_last_checkpoint_of(model, config.model_dir)
    return model, manifest, image_format


@pytest.mark.slow
def test_metrics_json_reports_the_evaluation_of_the_averaged_weights_that_ship(ema_run):
    config, _ = ema_run
    with open(os.path.join(config.model_dir, trainer.METRICS_FILE)) as handle:
        recorded = json.load(handle)
    model, manifest, _ = restore_last_checkpoint(config)
    eval_data, steps = trainer.setup_run(config, manifest).devices.eval_input(
        config.data_dir, manifest, manifest_lib.VALIDATION, 8
    )
    evaluation_model = build_evaluation_model(model, jit_compile=False)

    def evaluate() -> dict:
        return exact_logs(evaluation_model.evaluate(eval_data, steps=steps, return_dict=True, verbose=0))

    trained = evaluate()
    model.optimizer.finalize_variable_values(model.trainable_variables)  # the average into the model
    averaged = evaluate()
    assert abs(trained["cross_entropy"] - averaged["cross_entropy"]) > 1e-3, "the test needs them to differ"

    validation = recorded["validation"]
    assert validation["weights"] == "moving average"
    assert validation["accuracy"] == pytest.approx(averaged["accuracy"], abs=1e-6)
    assert validation["cross_entropy"] == pytest.approx(averaged["cross_entropy"], rel=1e-5)
    # The trained weights' figures are kept beside them, for comparison.
    assert recorded["validation_trained_weights"]["cross_entropy"] == pytest.approx(
        trained["cross_entropy"], rel=1e-5
    )
    # The confusion matrix and the learning curves' final point are of the same weights.
    counts = np.array(validation["confusion_matrix"])
    assert np.trace(counts) / counts.sum() == pytest.approx(validation["accuracy"], abs=1e-6)
    curves = plots.read_epoch_scalars(os.path.join(config.model_dir, "logs"))["validation"]
    assert curves["ema_accuracy"] == {config.epochs: pytest.approx(validation["accuracy"], abs=1e-6)}


@pytest.mark.slow
def test_the_export_and_the_backbone_file_hold_the_ema_weights(ema_run):
    config, metrics = ema_run
    data_dir = config.data_dir
    with open(os.path.join(config.model_dir, trainer.METRICS_FILE)) as handle:
        recorded = json.load(handle)["recipe"]
    assert recorded["ema_momentum"] == 0.9 and recorded["label_smoothing"] == 0.1
    assert recorded["optimizer"] == "adamw" and recorded["peak_learning_rate"] == 1e-2

    # The raw weights and their average, from the last checkpoint (the optimizer holds the average).
    model, manifest, image_format = restore_last_checkpoint(config)
    rows = read_split(data_dir, manifest_lib.VALIDATION, manifest)
    contents = []
    for row in rows:
        with open(row["uri"], "rb") as handle:
            contents.append(handle.read())
    images = export.serving_model_input(
        tf.constant(contents), image_format, manifest["image"]["resize_method"]
    )
    raw = model.predict_on_batch(images.numpy())
    model.optimizer.finalize_variable_values(model.trainable_variables)  # the average into the model
    averaged = model.predict_on_batch(images.numpy())
    assert np.abs(raw - averaged).max() > 0.05, "the test needs an average that differs from the weights"

    serve = tf.saved_model.load(metrics["export_dir"]).signatures["serving_default"]
    served = serve(image_bytes=tf.constant(contents))["probabilities"].numpy()
    np.testing.assert_allclose(served, averaged, atol=1e-5)

    reloaded = models.build_model_for_dataset(
        MODEL, image_format, len(manifest["labels"]), weights=metrics["backbone_weights"]
    )
    for loaded, expected in zip(
        reloaded.get_layer(pretrained.BACKBONE).weights,
        model.get_layer(pretrained.BACKBONE).weights,
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(loaded), np.asarray(expected))
