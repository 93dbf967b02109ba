"""Keras' backends: --backend set before Keras is imported, the devices chosen in one place, Keras-native
checkpoints, mixed precision to an export, and a multi-process JAX run stopped by a signal to one process.

The trainer's tests marked `jax` (here and elsewhere) run again on the JAX backend in scripts/test_jax.sh.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.train.loop.test_preemption import RunningTraining
from train.config import JAX, TENSORFLOW, TrainConfig, resolve_backend
from train.device.backend import resolve_devices
from train.errors import ConfigError
from train.loop import checkpoints
from train.loop.checkpoints import PREEMPTED_EXIT_CODE, KerasCheckpoints
from train.trainer import _final_weights_held_back, train_and_evaluate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_backend_is_the_flag_else_keras_backend_else_tensorflow():
    assert resolve_backend(None, {}) == TENSORFLOW
    assert resolve_backend(None, {"KERAS_BACKEND": "jax"}) == JAX
    assert resolve_backend("tensorflow", {"KERAS_BACKEND": "jax"}) == TENSORFLOW
    with pytest.raises(ConfigError, match="KERAS_BACKEND=torch"):
        resolve_backend(None, {"KERAS_BACKEND": "torch"})


def test_a_keras_backend_this_package_does_not_run_is_refused_before_anything_is_imported(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO, "KERAS_BACKEND": "torch"}
    command = [
        sys.executable,
        "-m",
        "train",
        "--data",
        str(tmp_path / "d"),
        "--model-dir",
        str(tmp_path / "m"),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(
        "error: KERAS_BACKEND=torch: this package trains on the tensorflow or jax"
    )
    assert "--backend tensorflow|jax" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.jax
def test_a_run_on_another_backend_than_the_one_keras_was_imported_with_is_refused(tmp_path):
    other = JAX if keras.backend.backend() == TENSORFLOW else TENSORFLOW
    config = TrainConfig(data_dir=str(tmp_path), model_dir=str(tmp_path / "m"), backend=other)
    with pytest.raises(ConfigError, match=f"set KERAS_BACKEND={other} before importing keras"):
        resolve_devices(config)


def _compiled_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    optimizer = keras.optimizers.AdamW(learning_rate=0.05, use_ema=True, ema_momentum=0.9)
    model.compile(optimizer=optimizer, loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _state(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v) for v in model.weights] + [np.array(v) for v in model.optimizer.variables]


@pytest.mark.jax
def test_keras_checkpoints_hold_the_weights_and_the_optimizer_state_and_resume_exactly(tmp_path):
    rng = np.random.default_rng(0)
    features, targets = rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")
    model = _compiled_model(seed=0)
    # As the trainer fits: the average stays in the optimizer (trainer.use_final_weights swaps it in once).
    with _final_weights_held_back(model):
        model.fit(features, targets, batch_size=8, epochs=3, verbose=0, shuffle=False)
    saver = KerasCheckpoints(model, str(tmp_path), keep=2)
    for step in (1, 2, 3):  # the last `keep` files stay; the index names the latest
        saver.save(step)
    directory = str(tmp_path / checkpoints.CHECKPOINT_DIR)
    assert checkpoints.checkpoint_steps(directory) == [2, 3]
    assert sorted(os.listdir(directory)) == ["checkpoint.json", "ckpt-2.weights.h5", "ckpt-3.weights.h5"]

    restored = _compiled_model(seed=1)  # other initial weights: everything must come from the file
    assert KerasCheckpoints(restored, str(tmp_path)).restore_latest() == 3
    for saved, loaded in zip(_state(model), _state(restored), strict=True):
        np.testing.assert_array_equal(saved, loaded)
    assert int(np.array(restored.optimizer.iterations)) == 3
    # Two more steps from the checkpoint are the two steps the original takes: moments, EMA and count included.
    for trained in (model, restored):
        with _final_weights_held_back(trained):
            trained.fit(features, targets, batch_size=8, epochs=2, verbose=0, shuffle=False)
    for original, resumed in zip(_state(model), _state(restored), strict=True):
        np.testing.assert_allclose(original, resumed, rtol=1e-6, atol=1e-7)


def _earlier_version_checkpoints(directory, steps, **objects) -> None:
    """Checkpoints as an earlier version of train wrote them: tf.train.Checkpoint through a CheckpointManager."""
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(global_step=global_step, **objects)
    manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=3)
    for step in steps:
        global_step.assign(step)
        manager.save(checkpoint_number=step)


@pytest.mark.skipif(
    keras.backend.backend() != TENSORFLOW, reason="tf.train.Checkpoint holds TensorFlow variables"
)
def test_an_earlier_versions_checkpoint_is_read_once_and_replaced_by_the_keras_format_at_the_next_save(
    tmp_path,
):
    rng = np.random.default_rng(0)
    features, targets = rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 2)).astype("float32")
    model = _compiled_model(seed=0)
    with _final_weights_held_back(model):
        model.fit(features, targets, batch_size=8, epochs=3, verbose=0, shuffle=False)
    directory = tmp_path / checkpoints.CHECKPOINT_DIR
    _earlier_version_checkpoints(directory, (2, 3), model=model, optimizer=model.optimizer)

    restored = _compiled_model(seed=1)
    saver = KerasCheckpoints(restored, str(tmp_path))
    assert saver.restore_latest() == 3  # the global step, weights, moments, EMA and the optimizer's count
    for saved, loaded in zip(_state(model), _state(restored), strict=True):
        np.testing.assert_array_equal(saved, loaded)
    assert saver.save(3) is None  # already saved at that step
    saver.save(4)
    assert sorted(os.listdir(directory)) == ["checkpoint.json", "ckpt-4.weights.h5"]  # the earlier files gone
    assert KerasCheckpoints(_compiled_model(seed=2), str(tmp_path)).restore_latest() == 4


@pytest.mark.jax
@pytest.mark.skipif(keras.backend.backend() != JAX, reason="the TensorFlow backend reads them")
def test_an_earlier_versions_checkpoint_is_refused_on_jax_with_the_flag_that_reads_it(tmp_path):
    _earlier_version_checkpoints(tmp_path / checkpoints.CHECKPOINT_DIR, (5,))
    with pytest.raises(ConfigError, match=r"earlier version of train.*ckpt-5.*--backend tensorflow"):
        KerasCheckpoints(_compiled_model(seed=0), str(tmp_path)).restore_latest()


@pytest.mark.slow
@pytest.mark.jax
def test_a_bfloat16_run_trains_to_an_export_that_serves_float32_probabilities(
    stage1_dataset, sample_corpus, tmp_path
):
    config = TrainConfig(
        data_dir=stage1_dataset("uint8"),
        model_dir=str(tmp_path / "model"),
        epochs=2,
        steps_per_epoch=3,
        global_batch_size=8,
        mixed_precision="bfloat16",
    )
    metrics = train_and_evaluate(config)
    assert metrics["backend"] == keras.backend.backend()
    assert metrics["mixed_precision"] == "mixed_bfloat16" and metrics["global_step"] == 6
    assert checkpoints.latest_checkpoint_step(os.path.join(config.model_dir, "checkpoints")) == 6
    counts = np.array(metrics["validation"]["confusion_matrix"])
    assert counts.sum() == metrics["validation"]["num_examples"]
    assert np.trace(counts) / counts.sum() == pytest.approx(metrics["validation"]["accuracy"], abs=1e-6)

    manifest = json.loads(open(os.path.join(config.model_dir, "dataset_pin.manifest.json")).read())
    files = [sample_corpus.uri(file) for file in sample_corpus.files if file.expected_error is None][:4]
    served = tf.saved_model.load(metrics["export_dir"]).signatures["serving_default"](
        image_bytes=tf.constant([open(path, "rb").read() for path in files])
    )
    probabilities = served["probabilities"].numpy()
    assert served["probabilities"].dtype == tf.float32 and served["valid"].numpy().all()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-3)
    labels = [label.decode() for label in served["label"].numpy()]
    assert labels == [manifest["labels"][i] for i in probabilities.argmax(axis=1)]
    reloaded = keras.saving.load_model(metrics["keras_model"], compile=False)
    assert reloaded.output_shape == (None, len(manifest["labels"]))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_jax_processes_stop_together_when_one_gets_sigterm_and_resume_at_the_saved_step(
    stage1_dataset, tmp_path
):
    # Two hosts of one JAX run (keras.distribution.initialize() from KERAS_DISTRIBUTION_*), one CPU
    # device each, on this machine. SIGTERM reaches the second process only; the agreement makes both
    # stop at one step, which the chief's checkpoint holds, and the same commands resume there.
    epochs, steps_per_epoch = 2, 20
    total = epochs * steps_per_epoch
    model_dir = tmp_path / "model"
    command = [
        sys.executable, "-m", "train", "--backend", "jax",
        "--data", stage1_dataset("uint8"), "--model-dir", str(model_dir),
        "--epochs", str(epochs), "--steps-per-epoch", str(steps_per_epoch), "--global-batch-size", "8",
        "--log-every", "1", "--checkpoint-every", "epoch", "--preemption-check-every", "1",
        "--shared-filesystem", "--no-export",
    ]  # fmt: skip

    def environments():
        port = _free_port()
        base = {key: value for key, value in os.environ.items() if not key.startswith("KERAS_DISTRIBUTION_")}
        base.update(
            PYTHONPATH=REPO,
            TF_CPP_MIN_LOG_LEVEL="2",
            JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
            KERAS_DISTRIBUTION_NUM_PROCESSES="2",
        )
        return [{**base, "KERAS_DISTRIBUTION_PROCESS_ID": str(index)} for index in (0, 1)]

    chief, other = (RunningTraining(command, tmp_path, env=env) for env in environments())
    other.wait_for_step(steps_per_epoch + 5, timeout=600)
    other.process.send_signal(signal.SIGTERM)
    (chief_code, chief_stderr), (other_code, other_stderr) = chief.finish(), other.finish()
    assert other_code == PREEMPTED_EXIT_CODE, other_stderr[-3000:]
    assert chief_code == PREEMPTED_EXIT_CODE, chief_stderr[-3000:]
    assert "a signal to another worker" in chief_stderr and "SIGTERM" in other_stderr
    saved = checkpoints.latest_checkpoint_step(str(model_dir / "checkpoints"))
    # Both stopped at the saved step: the last step each printed.
    assert chief.steps[-1] == other.steps[-1] == saved
    assert steps_per_epoch < saved < total and not (model_dir / "metrics.json").exists()

    chief, other = (RunningTraining(command, tmp_path, env=env) for env in environments())
    (chief_code, chief_stderr), (other_code, other_stderr) = chief.finish(), other.finish()
    assert chief_code == 0, chief_stderr[-3000:]
    assert other_code == 0, other_stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == saved and metrics["global_step"] == total
    assert metrics["num_replicas"] == 2 and metrics["backend"] == "jax"
    assert metrics["preemption_check"]["agreements"] > 0
    assert chief.steps[0] == other.steps[0] == saved + 1


@pytest.mark.jax
def test_freezing_the_backbone_is_refused_on_jax_before_anything_is_built(tmp_path):
    # Keras' JAX optimizer updates every variable it was built for: a frozen backbone fails at its first step.
    from train.device.jax_devices import JaxDevices

    config = TrainConfig(
        data_dir=str(tmp_path), model_dir=str(tmp_path / "m"), backend=JAX, freeze_backbone_epochs=1
    )
    with pytest.raises(ConfigError, match="--freeze-backbone-epochs is not supported on --backend jax"):
        JaxDevices.resolve(config)
