"""A whole-recipe run (crop margin, label smoothing, EMA): what it records, and an export that serves the
EMA weights."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from tests.stage1 import read_split
from tests.train.conftest import CROP_MARGIN
from train import checks, dataset, export, models, pretrained, trainer
from train.config import TrainConfig

MODEL = models.SMALL_CNN


@pytest.mark.slow
def test_the_export_and_the_backbone_file_hold_the_ema_weights(stage1_dataset, tmp_path):
    data_dir = stage1_dataset("uint8", CROP_MARGIN)
    config = TrainConfig(
        data_dir=data_dir,
        model_dir=str(tmp_path / "model"),
        model=MODEL,
        epochs=3,
        global_batch_size=8,
        learning_rate=1e-2,  # large steps, so that the average is far from the last weights
        ema=True,
        ema_momentum=0.9,
        label_smoothing=0.1,
    )
    metrics = trainer.train_and_evaluate(config)
    with open(os.path.join(config.model_dir, trainer.METRICS_FILE)) as handle:
        recorded = json.load(handle)["recipe"]
    assert recorded["ema_momentum"] == 0.9 and recorded["label_smoothing"] == 0.1
    assert recorded["optimizer"] == "adamw" and recorded["peak_learning_rate"] == 1e-2

    # The raw weights and their average, from the last checkpoint (the optimizer holds the average).
    manifest = checks.read_manifest(data_dir)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    model = models.build_model_for_dataset(MODEL, image_format, len(manifest["labels"]))
    run = trainer.setup_run(config, manifest)
    trainer.compile_model(model, config, run.plan, run.choice)
    latest = tf.train.latest_checkpoint(os.path.join(config.model_dir, "checkpoints"))
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(latest).expect_partial()

    rows = read_split(data_dir, manifest_lib.VALIDATION, manifest)
    contents = []
    for row in rows:
        with open(row["uri"], "rb") as handle:
            contents.append(handle.read())
    images = export.serving_model_input(
        tf.constant(contents), image_format, manifest["image"]["resize_method"]
    )
    raw = model.predict_on_batch(images)
    model.optimizer.finalize_variable_values(model.trainable_variables)  # the average into the model
    averaged = model.predict_on_batch(images)
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
        np.testing.assert_array_equal(loaded.numpy(), expected.numpy())
