"""One evaluation pass of a trained model over a split of the dataset run it was trained on."""

import json
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.data import checks, dataset, dataset_lease
from train.errors import ConfigError, DatasetError
from train.evaluate import scores
from train.serving import export

METRICS_FILE = "metrics.json"  # train.trainer.METRICS_FILE, without importing the trainer


def read_run_metrics(model_dir: str) -> dict:
    """MODEL_DIR/metrics.json: what a finished training run wrote (its data dir, its model)."""
    path = manifest_lib.join(model_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        raise ConfigError(
            f"{path}: not found. --model-dir must be the model dir of a finished `python -m train` run"
        )
    with tf.io.gfile.GFile(path) as handle:
        return json.load(handle)


def load_keras_model(model_dir: str) -> keras.Model:
    """MODEL_DIR/model.keras, the weights the run shipped (with --ema, the moving average)."""
    path = manifest_lib.join(model_dir, export.KERAS_FILE)
    if not tf.io.gfile.exists(path):
        raise ConfigError(
            f"{path}: not found. The run was trained with --no-export, before model.keras files existed, or "
            "with a model Keras could not save (its log says so)"
        )
    with tempfile.TemporaryDirectory() as scratch:
        local = path
        if "://" in path:  # Keras reads local files
            local = os.path.join(scratch, export.KERAS_FILE)
            tf.io.gfile.copy(path, local)
        try:
            return keras.models.load_model(local, compile=False)
        except (TypeError, ValueError) as exc:  # Keras wraps a layer it cannot rebuild in these
            reason = str(exc).strip().splitlines()[0][:300]
            raise ConfigError(
                f"{path}: Keras cannot load it ({reason}). A --model module:function run needs its module "
                "importable (PYTHONPATH)"
            ) from exc


def check_split(manifest: dict, split: str, data_dir: str) -> None:
    """DatasetError when the dataset has no example in `split`, naming the splits that have some."""
    info = manifest["splits"].get(split)
    if not info or not info["shards"] or info["num_examples"] < 1:
        present = [name for name, entry in manifest["splits"].items() if entry["num_examples"]]
        raise DatasetError(
            f"split {split!r} has no examples in {data_dir} (stage 1's --split gave it none); "
            f"evaluate one of {present} with --split, or re-run preprocess with a test fraction"
        )


def evaluate_split(model_dir: str, split: str, data_dir: str | None = None, batch_size: int = 64) -> dict:
    """The evaluation report (scores.report) of MODEL_DIR's model on `split`, with where it came from."""
    run = read_run_metrics(model_dir)
    data_dir = data_dir or run["data_dir"]
    # Leased before it is read, held while it is read: stage 1's cleanup leaves the run alone meanwhile.
    pinned, lease = dataset_lease.resolve_and_lease(data_dir, model_dir)
    try:
        return _evaluate_pinned(model_dir, split, data_dir, batch_size, pinned, run)
    finally:
        if lease is not None:
            lease.stop()


def _evaluate_pinned(model_dir, split, data_dir, batch_size, pinned, run) -> dict:
    manifest = pinned.manifest
    check_split(manifest, split, data_dir)
    checks.check_dataset(data_dir, manifest, splits=(split,))
    model = load_keras_model(model_dir)
    labels = list(manifest["labels"])
    predict = tf.function(lambda images: model(images, training=False))
    counts = np.zeros((len(labels), len(labels)), dtype=np.int64)
    loss_sum = 0.0
    for images, batch_labels, weights in dataset.make_eval_dataset(data_dir, manifest, split, batch_size):
        real = weights.numpy() > 0
        probabilities = predict(images).numpy()[real].astype(np.float64)
        truth = batch_labels.numpy()[real]
        np.add.at(counts, (truth, probabilities.argmax(axis=1)), 1)
        loss_sum += float(-np.log(np.maximum(probabilities[np.arange(len(truth)), truth], 1e-12)).sum())
    result = scores.report(counts, loss_sum, labels)
    result.update(split=split, data_dir=data_dir, model_dir=model_dir, model=run.get("model"))
    result["dataset"] = pinned.lineage
    return result
