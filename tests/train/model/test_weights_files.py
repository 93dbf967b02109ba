"""--weights: the file each backbone asks Keras for, Keras' published no-top .h5 files given as a path, and
'imagenet' offline (a real `python -m train` process whose HTTPS goes to a closed local port: no traffic
leaves the machine)."""

import hashlib
import os
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest
from keras.src.applications import efficientnet, mobilenet_v2, mobilenet_v3, resnet
from keras.src.legacy.saving import legacy_h5_format

from train.errors import ConfigError
from train.model import models, pretrained

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHAPE = (96, 96, 3)  # a size every application builds quickly at; MobileNetV2 names its file after it


def keras_published_name(model: str) -> tuple[str, str, str | None]:
    """(file name, URL, hash) of the no-top ImageNet file, from the constants of Keras' own modules.

    Written out from keras/src/applications/*.py (Keras 3), independently of train/model/pretrained.py.
    """
    if model == models.RESNET50:
        name = "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
        return name, resnet.BASE_WEIGHTS_PATH + name, resnet.WEIGHTS_HASHES["resnet50"][1]
    if model == models.MOBILENET_V2:
        name = f"mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{SHAPE[0]}_no_top.h5"  # float(alpha) with alpha 1.0
        return name, mobilenet_v2.BASE_WEIGHT_PATH + name, None
    if model in (models.MOBILENET_V3_SMALL, models.MOBILENET_V3_LARGE):
        kind = "small" if model == models.MOBILENET_V3_SMALL else "large"
        key = f"{kind}_224_1.0_float"
        name = f"weights_mobilenet_v3_{key}_no_top_v2.h5"
        return name, mobilenet_v3.BASE_WEIGHT_PATH + name, mobilenet_v3.WEIGHTS_HASHES[key][1]
    assert model == models.EFFICIENTNET_B0
    name = "efficientnetb0_notop.h5"  # Keras: the model's default name + "_notop.h5"
    return name, efficientnet.BASE_WEIGHTS_PATH + name, efficientnet.WEIGHTS_HASHES["b0"][1]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("model", list(pretrained.APPLICATIONS))
def test_every_backbone_asks_for_the_file_keras_publishes_for_it(model, monkeypatch):
    name, origin, file_hash = keras_published_name(model)
    # The offline check's answer (the application's own get_file call, intercepted).
    published = pretrained.requested_imagenet_file(model, SHAPE)
    assert (published.fname, published.origin, published.file_hash) == (name, origin, file_hash)
    assert published.cache_subdir == "models"

    # And what the real build asks for: the download itself is the only thing replaced (no network).
    asked = []

    def get_file(fname=None, origin=None, **kwargs):
        asked.append((fname, origin))
        raise _Stop

    monkeypatch.setattr(keras.src.utils.file_utils, "get_file", get_file)
    monkeypatch.setattr(pretrained, "origin_unreachable", lambda origin, timeout=0: None)  # "online"
    with pytest.raises(_Stop):
        models.build_model(model, SHAPE, 5, weights="imagenet")
    assert asked == [(name, origin)]


def _published_notop_file(model: str, shape, path: str) -> list[np.ndarray]:
    """A no-top file laid out as Keras publishes them (legacy HDF5, layer by layer), with random values."""
    application = pretrained.APPLICATIONS[model]
    source = application.constructor(
        include_top=False, weights=None, input_shape=shape, pooling="avg", **dict(application.extra_kwargs)
    )
    rng = np.random.default_rng(0)
    for variable in source.weights:  # recognizable values (variances stay positive)
        variable.assign(variable.numpy() + rng.uniform(0.0, 0.01, size=variable.shape).astype(variable.dtype))
    with h5py.File(path, "w") as handle:
        legacy_h5_format.save_weights_to_hdf5_group(handle, source)
    return [variable.numpy() for variable in source.weights]


@pytest.mark.parametrize("model", [models.MOBILENET_V3_SMALL, models.EFFICIENTNET_B0])
def test_the_no_top_h5_keras_publishes_loads_as_weights_path(model, tmp_path):
    name = keras_published_name(model)[0]
    path = str(tmp_path / name)
    expected = _published_notop_file(model, (32, 32, 3), path)
    with h5py.File(path, "r") as handle:  # the published layout: layer names at the top, no Keras 3 "vars"
        assert "layer_names" in handle.attrs
    classifier = models.build_model(model, (32, 32, 3), 5, weights=path)
    loaded = classifier.get_layer(pretrained.BACKBONE).weights
    for got, want in zip(loaded, expected, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    # Another backbone's file does not fit, and says so.
    with pytest.raises(ConfigError, match="does not fit the backbone"):
        models.build_model(models.RESNET50, (32, 32, 3), 5, weights=path)


def test_imagenet_weights_already_in_keras_cache_are_used_without_asking_the_network(tmp_path, monkeypatch):
    name, _, _ = keras_published_name(models.RESNET50)
    cached = tmp_path / "keras" / "models" / name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"stand-in for the published file")
    # Keras checks a cached file against its hash; the stand-in's hash is made the expected one.
    hashes = dict(resnet.WEIGHTS_HASHES)
    hashes["resnet50"] = (hashes["resnet50"][0], hashlib.sha256(cached.read_bytes()).hexdigest())
    monkeypatch.setattr(resnet, "WEIGHTS_HASHES", hashes)
    monkeypatch.setattr(keras.src.backend.config, "_KERAS_DIR", str(tmp_path / "keras"))

    def no_network(origin, timeout=0):
        raise AssertionError(f"asked the network for {origin}")

    monkeypatch.setattr(pretrained, "origin_unreachable", no_network)
    published = pretrained.check_imagenet_available(models.RESNET50, SHAPE)
    assert published.cache_path() == str(cached)


OFFLINE_ENV = {
    **os.environ,
    "PYTHONPATH": REPO,
    # Nothing listens on port 9 here: the HTTPS probe fails at once, on this machine.
    "https_proxy": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "no_proxy": "",
    "NO_PROXY": "",
}


def _train(args, env, cwd):
    return subprocess.run(
        [sys.executable, "-m", "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_imagenet_offline_stops_before_training_naming_the_file_and_how_to_provide_it(
    stage1_dataset, tmp_path
):
    env = {**OFFLINE_ENV, "KERAS_HOME": str(tmp_path / "empty_keras_home")}
    model_dir = tmp_path / "model"
    result = _train(
        ["--data", stage1_dataset("uint8"), "--model-dir", str(model_dir), "--model", "mobilenetv3small",
         "--weights", "imagenet", "--epochs", "1", "--global-batch-size", "8"],
        env,
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    name = keras_published_name(models.MOBILENET_V3_SMALL)[0]
    assert name in result.stderr and "--weights PATH" in result.stderr
    assert str(tmp_path / "empty_keras_home" / "models") in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr
    assert not model_dir.exists()  # stopped before the run wrote anything


def test_weights_flag_mistakes_are_refused_before_tensorflow(tmp_path):
    from tests.cli_probe import probe_module

    base = ["--data", str(tmp_path), "--model-dir", str(tmp_path / "m")]
    missing = probe_module(
        "train", [*base, "--weights", str(tmp_path / "nope.h5")], ("tensorflow",), tmp_path
    )
    assert "EXIT 2 HEAVY []" in missing.stderr and "no such file" in missing.stderr
    small = probe_module("train", [*base, "--weights", "imagenet"], ("tensorflow",), tmp_path)
    assert "EXIT 2 HEAVY []" in small.stderr and "--model small_cnn has no ImageNet weights" in small.stderr
    assert "Traceback" not in missing.stderr + small.stderr
