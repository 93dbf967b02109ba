"""The multi-replica path on CPU: MirroredStrategy over two logical CPU devices.

Logical devices must be configured before TensorFlow initializes its
devices, which any earlier test in this process has done, so the run
happens in a fresh subprocess.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dataset_contract import manifest as manifest_lib
from tests.train.conftest import IMAGE_SIZE
from train.data import checks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from tests.train.checkpoint_files import rewind_checkpoints
    from train.data import checks, dataset
    from train.device import strategy
    from train.config import TrainConfig
    from train.trainer import train_and_evaluate

    data_dir, model_dir = sys.argv[1], sys.argv[2]
    mirrored = strategy.resolve_strategy("mirrored")
    manifest = checks.read_manifest(data_dir)
    iterator = iter(dataset.distribute_train_dataset(mirrored, data_dir, manifest, 8))
    images, labels = next(iterator)
    per_replica = [
        {"shape": t.shape.as_list(), "device": t.device} for t in mirrored.experimental_local_results(images)
    ]
    # Every step gives every replica exactly one batch: count them over 20 steps.
    batches_per_replica = [0, 0]
    for _ in range(20):
        images, _ = next(iterator)
        for replica, batch in enumerate(mirrored.experimental_local_results(images)):
            batches_per_replica[replica] += int(batch.shape[0] == 4)
    config = TrainConfig(data_dir=data_dir, model_dir=model_dir, strategy="mirrored", global_batch_size=8,
                         epochs=2, steps_per_epoch=3, steps_per_execution=3, augment=True)
    metrics = train_and_evaluate(config)
    # As an interruption after the first epoch leaves it; the same run resumes from its Keras checkpoint.
    rewind_checkpoints(model_dir, 3)
    resumed = train_and_evaluate(config)
    print("RESULT " + json.dumps({"replicas": mirrored.num_replicas_in_sync, "per_replica": per_replica,
                                  "batches_per_replica": batches_per_replica, "metrics": metrics,
                                  "resumed": resumed}))
    """
)


@pytest.mark.slow
def test_training_under_mirrored_strategy_on_two_logical_cpus(stage1_dataset, tmp_path):
    data_dir = stage1_dataset("uint8")
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, data_dir, str(tmp_path / "model")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    report = json.loads(line[len("RESULT ") :])

    assert report["replicas"] == 2
    # Each replica gets its own per-replica batch (8 global / 2), on its own device.
    assert [r["shape"] for r in report["per_replica"]] == [[4, IMAGE_SIZE, IMAGE_SIZE, 3]] * 2
    assert len({r["device"] for r in report["per_replica"]}) == 2
    assert report["batches_per_replica"] == [20, 20]
    metrics = report["metrics"]
    assert metrics["strategy"] == "mirrored" and metrics["num_replicas"] == 2
    assert metrics["per_replica_batch_size"] == 4 and metrics["global_step"] == 6
    # Keras' own loop cannot run several steps per call under a multi-replica MirroredStrategy
    # (keras-team/keras#19246); train/loop/multi_step.py's tf.range loop runs the 3 asked for.
    assert metrics["steps_per_execution"] == 3
    assert (metrics["mixed_precision"], metrics["xla"]) == ("float32", "off")  # auto, on CPUs
    # Evaluation across both replicas, padded to static batches, still counts every example exactly once.
    manifest = checks.read_manifest(data_dir)
    assert (
        metrics["validation"]["num_examples"] == manifest["splits"][manifest_lib.VALIDATION]["num_examples"]
    )
    assert os.path.isdir(os.path.join(metrics["export_dir"], "variables"))
    # Resumed from the first epoch's checkpoint (Keras' weights file, written and read under the strategy).
    resumed = report["resumed"]
    assert (resumed["resumed_from_step"], resumed["steps_this_run"], resumed["global_step"]) == (3, 3, 6)
    assert sorted(os.listdir(tmp_path / "model" / "checkpoints")) == [
        "checkpoint.json",
        "ckpt-3.weights.h5",
        "ckpt-6.weights.h5",
    ]
