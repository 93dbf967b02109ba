"""Learning curves and the confusion matrix, drawn from what a run leaves behind."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from train.config import TrainConfig
from train.loop import plots
from train.loop.summaries import EpochSummaries, ScalarWriter
from train.trainer import train_and_evaluate


def _log_epochs(log_dir, epochs):
    """Write epoch scalars the way training does (EpochSummaries), with a stand-in model."""

    class _Optimizer:
        learning_rate = 0.01

    class _Model:
        optimizer = _Optimizer()

    writer = ScalarWriter(str(log_dir))
    callback = EpochSummaries(writer)
    callback.set_model(_Model())
    for epoch, (loss, accuracy) in epochs.items():
        callback.on_epoch_end(
            epoch, {"loss": loss, "accuracy": accuracy, "val_loss": loss + 1, "val_accuracy": accuracy / 2}
        )
    writer.close()


def test_scalars_are_read_back_per_epoch_and_a_rerun_epoch_keeps_the_last_value(tmp_path):
    _log_epochs(tmp_path, {0: (2.0, 0.25), 1: (1.5, 0.5)})
    _log_epochs(tmp_path, {1: (1.0, 0.75), 2: (0.5, 0.9)})  # a resumed run repeats epoch 2
    scalars = plots.read_epoch_scalars(str(tmp_path))
    assert scalars["train"]["loss"] == {1: 2.0, 2: 1.0, 3: 0.5}
    np.testing.assert_allclose(
        [scalars["validation"]["accuracy"][step] for step in (1, 2, 3)], [0.125, 0.375, 0.45]
    )


def test_learning_curves_png_has_the_expected_size(tmp_path):
    _log_epochs(tmp_path / "logs", {0: (2.0, 0.25), 1: (1.5, 0.5), 2: (1.0, 0.75)})
    path = tmp_path / "curves.png"
    plots.plot_learning_curves(plots.read_epoch_scalars(str(tmp_path / "logs")), str(path))
    with Image.open(path) as image:
        assert image.size == (1000, 400)


def test_confusion_matrix_counts_true_against_predicted_and_draws_it(tmp_path):
    counts = plots.confusion_matrix([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0], num_classes=3)
    np.testing.assert_array_equal(counts, [[1, 1, 0], [0, 1, 0], [1, 0, 2]])
    path = tmp_path / "confusion.png"
    plots.plot_confusion_matrix(counts, ["circle", "square", "star"], str(path))
    with Image.open(path) as image:
        assert image.size == (600, 600)
        # The diagonal's largest count is drawn darkest: the heat map is not blank.
        assert np.asarray(image.convert("L")).min() < 100
    assert tf.io.gfile.exists(str(path))


@pytest.mark.slow
def test_a_training_run_leaves_learning_curves_and_a_confusion_matrix(stage1_dataset, tmp_path):
    data_dir = stage1_dataset("uint8")
    model_dir = tmp_path / "model"
    metrics = train_and_evaluate(
        TrainConfig(data_dir=data_dir, model_dir=str(model_dir), epochs=2, global_batch_size=8, export=False)
    )
    with Image.open(model_dir / plots.LEARNING_CURVES_FILE) as image:
        assert image.size == (1000, 400)
    with Image.open(model_dir / plots.CONFUSION_MATRIX_FILE) as image:
        assert image.size == (600, 600)
    counts = np.array(metrics["validation"]["confusion_matrix"])
    assert counts.sum() == metrics["validation"]["num_examples"]
    np.testing.assert_allclose(np.trace(counts) / counts.sum(), metrics["validation"]["accuracy"], atol=1e-6)
