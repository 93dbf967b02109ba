"""--parallel-files: how many shards each host's input pipeline reads at once, read off the tf.data graph."""

import tensorflow as tf

from train import trainer
from train.config import TrainConfig
from train.data import dataset
from train.device.device_defaults import TPU, device_defaults
from train.loop.plan import plan_training

NUM_SHARDS = 100


def _manifest() -> dict:
    """A split of many shards: building the pipeline opens none of them, so their paths need not exist."""
    shards = [{"path": f"train-{i:05d}.tfrecord", "num_examples": 10} for i in range(NUM_SHARDS)]
    return {
        "image": {"height": 8, "width": 8, "channels": 3, "encoding": "uint8"},
        "normalization": {"mean": [0.0] * 3, "std": [1.0] * 3},
        "splits": {"train": {"num_examples": 10 * NUM_SHARDS, "shards": shards}},
    }


def _cycle_length(data: tf.data.Dataset) -> int:
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(data._as_serialized_graph().numpy())
    nodes = {node.name: node for node in graph.node}
    (interleave,) = [node for node in graph.node if node.op.startswith("ParallelInterleaveDataset")]
    # Inputs: the file dataset, then (no captured arguments) cycle_length, block_length, ...
    const = nodes[interleave.input[1].split(":")[0]]
    return int(tf.make_ndarray(const.attr["value"].tensor))


def test_the_train_pipeline_reads_as_many_files_at_once_as_asked():
    manifest = _manifest()
    default = dataset.make_train_dataset("/nonexistent", manifest, 4)
    assert _cycle_length(default) == dataset.DEFAULT_PARALLEL_FILES
    assert _cycle_length(dataset.make_train_dataset("/nonexistent", manifest, 4, parallel_files=64)) == 64
    # Never more readers than the split has shards.
    assert (
        _cycle_length(dataset.make_train_dataset("/nonexistent", manifest, 4, parallel_files=500))
        == NUM_SHARDS
    )


def test_training_reads_a_tpu_hosts_default_of_64_files_at_once():
    manifest = _manifest()
    config = TrainConfig(data_dir="/nonexistent", model_dir="m", global_batch_size=4)
    plan = plan_training(config, 1000, 1, on_tpu=False, defaults=device_defaults(TPU, "resnet50", 224))
    assert plan.parallel_files == 64
    strategy = tf.distribute.get_strategy()  # one pipeline; its distributed dataset is the dataset itself
    data = trainer.distribute_train_input(strategy, config, manifest, plan)
    assert _cycle_length(data) == 64
