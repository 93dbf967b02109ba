"""Per-replica defaults and several steps per execution, with two logical CPU devices standing in for replicas.

Logical devices must be configured before TensorFlow initializes its
devices, which an earlier test in this process may have done, so one
subprocess (shared by the tests below) runs everything and reports JSON.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Also in the Python 3.10 leg (scripts/test_py310.sh): the tf.range loop drives Keras' train step, whose
# internals differ with the Keras release pip resolves on 3.10.
pytestmark = pytest.mark.py310

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
K = 4
STEPS = 8

SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    import keras
    from train.device import accelerator, strategy as strategy_lib
    from train.model import models, recipe
    from train import trainer
    from train.config import SMALL_CNN, TrainConfig
    from train.data.dataset import ImageFormat

    K, STEPS = int(sys.argv[1]), int(sys.argv[2])
    report = {}
    mirrored = strategy_lib.resolve_strategy("mirrored")
    single = strategy_lib.resolve_strategy("default")

    # 1. The default batch and learning rate per replica count: setup_run as train_and_evaluate runs it,
    #    on a manifest of a large 224x224 split (only its numbers are read).
    manifest = {"image": {"height": 224, "width": 224, "crop_size": 224},
                "splits": {"train": {"num_examples": 100000}}}
    for name, strategy in (("one", single), ("two", mirrored)):
        config = TrainConfig(data_dir="d", model_dir="m", model="resnet50")
        run = trainer.setup_run(config, manifest, strategy)
        report[name] = {
            "replicas": run.plan.num_replicas, "global_batch": run.plan.global_batch_size,
            "per_replica": run.plan.per_replica_batch_size, "batch_line": run.plan.describe_batch(),
            "peak_learning_rate": recipe.resolve_recipe(config, run.plan).peak_learning_rate,
            "loop": run.choice.multi_step_loop,
        }

    # 2. K steps in one execution vs K executions of one step, under MirroredStrategy over the two devices.
    image_format = ImageFormat(height=8, width=8, encoding="uint8", mean=(120.0,) * 3, std=(60.0,) * 3)
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, size=(STEPS * 8, 8, 8, 3)).astype("uint8")
    labels = rng.randint(0, 3, size=(STEPS * 8,)).astype("int32")
    device = accelerator.DeviceDescription(accelerator.CPU, num_replicas=2, strategy="mirrored")

    class CountExecutions(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []
        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(batch)

    initial = None

    def train(steps_per_execution, loop):
        global initial
        config = TrainConfig(data_dir="d", model_dir="m", model=SMALL_CNN, global_batch_size=8,
                             steps=STEPS, steps_per_execution=steps_per_execution, optimizer="sgd")
        choice = dataclasses.replace(accelerator.choose_defaults(device), multi_step_loop=loop)
        run = trainer.setup_run(config, {"image": {"height": 8}, "splits": {"train": {"num_examples": 64}}},
                                mirrored)
        plan = run.plan
        with mirrored.scope():
            model = models.build_model_for_dataset(SMALL_CNN, image_format, 3, "float32")
            trainer.compile_model(model, config, plan, choice)
            trainer.build_from_shapes(model, mirrored, trainer._replica_batch(plan, image_format, weighted=False))
        if initial is None:
            initial = model.get_weights()
        model.set_weights(initial)
        data = mirrored.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((images, labels)).batch(8, drop_remainder=True).repeat())
        counter = CountExecutions()
        model.fit(data, epochs=1, steps_per_epoch=STEPS, callbacks=[counter], verbose=0, shuffle=False)
        return model, plan, counter

    multi, multi_plan, multi_count = train(K, accelerator.TF_RANGE_LOOP)
    single_step, single_plan, single_count = train(1, accelerator.KERAS_LOOP)
    differences = [float(np.abs(a - b).max()) for a, b in zip(multi.get_weights(), single_step.get_weights())]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(multi.get_weights(), initial))
    report["multi_step"] = {
        "steps_per_execution": [multi_plan.steps_per_execution, single_plan.steps_per_execution],
        "batch_ends": [multi_count.ends, single_count.ends],
        "iterations": [int(multi.optimizer.iterations.numpy()), int(single_step.optimizer.iterations.numpy())],
        "max_difference": max(differences), "moved": moved,
    }
    print("RESULT " + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", "TPU_LOAD_LIBRARY": "0"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(K), str(STEPS)],
        cwd=tmp_path_factory.mktemp("multi_step"),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_the_default_batch_and_learning_rate_follow_the_replica_count(report):
    one, two = report["one"], report["two"]
    assert (one["replicas"], one["global_batch"], one["per_replica"]) == (1, 32, 32)
    assert (two["replicas"], two["global_batch"], two["per_replica"]) == (2, 64, 32)
    assert "32 per replica" in two["batch_line"] and "x 2 replicas" in two["batch_line"]
    # AdamW's base 1e-3 per 256 images, linear below 256: the peak doubles with the replicas.
    assert one["peak_learning_rate"] == pytest.approx(1e-3 * 32 / 256)
    assert two["peak_learning_rate"] == pytest.approx(1e-3 * 64 / 256)
    assert (one["loop"], two["loop"]) == ("keras loop", "tf.range loop")


def test_k_steps_in_one_execution_give_the_weights_of_k_single_steps_under_mirrored_strategy(report):
    result = report["multi_step"]
    assert result["steps_per_execution"] == [K, 1]
    assert result["iterations"] == [STEPS, STEPS]
    assert result["moved"] > 1e-3  # the steps trained something
    assert result["max_difference"] <= 1e-6


def test_python_sees_one_execution_per_k_steps(report):
    # Keras calls on_train_batch_end (and syncs device to host for the logs) once per execution.
    multi_ends, single_ends = report["multi_step"]["batch_ends"]
    assert multi_ends == [K - 1, 2 * K - 1]
    assert single_ends == list(range(STEPS))
