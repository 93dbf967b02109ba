"""Stage 2 end to end on gs:// paths: dataset read from, and model dir written to, a GCS emulator.

Every file access of the train package goes through tf.io.gfile / tf.data /
tf.train / tf.saved_model, so TensorFlow's own gs:// filesystem is what this
holds; the emulator and the TLS proxy that TensorFlow reaches it through are
tests/gcs_emulator.py.
"""

import os

import pytest
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from tests.train.checkpoint_files import latest_step
from train.config import TrainConfig
from train.data import checks
from train.trainer import train_and_evaluate


@pytest.mark.slow
def test_trains_from_a_gcs_dataset_into_a_gcs_model_dir(stage1_dataset, gcs_dir, sample_corpus):
    local = stage1_dataset("uint8")
    manifest = checks.read_manifest(local)
    data_dir = f"{gcs_dir}/dataset"
    names = [manifest_lib.MANIFEST_FILE] + [
        shard["path"] for split in manifest["splits"].values() for shard in split["shards"]
    ]
    for name in names:
        tf.io.gfile.copy(os.path.join(local, name), f"{data_dir}/{name}")
    model_dir = f"{gcs_dir}/model"

    metrics = train_and_evaluate(
        TrainConfig(
            data_dir=data_dir,
            model_dir=model_dir,
            epochs=1,
            steps_per_epoch=2,
            global_batch_size=8,
            verify_data=True,
        )
    )

    assert (
        metrics["validation"]["num_examples"] == manifest["splits"][manifest_lib.VALIDATION]["num_examples"]
    )
    assert tf.io.gfile.exists(f"{model_dir}/metrics.json")
    assert latest_step(model_dir) == 2  # numbered by global step
    assert tf.io.gfile.exists(f"{model_dir}/checkpoints/ckpt-2.weights.h5")
    assert tf.io.gfile.glob(f"{model_dir}/logs/train/events.out.tfevents.*")
    serve = tf.saved_model.load(f"{model_dir}/export").signatures["serving_default"]
    image = sample_corpus.uri(next(f for f in sample_corpus.files if f.kind == "good"))
    with open(image, "rb") as handle:
        outputs = serve(image_bytes=tf.constant([handle.read()]))
    assert outputs["probabilities"].shape == (1, len(manifest["labels"]))
