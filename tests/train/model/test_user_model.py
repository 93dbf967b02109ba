"""--model module:function, model.keras, and the predict and evaluate commands, on one real run.

A user's module (a temp directory on PYTHONPATH, with a custom layer nobody
registered with Keras) is trained by `python -m train` in a real process, once
for the module; the tests then read its export, its model.keras, and run
`python -m train.evaluate` and `python -m train.predict` on it.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import train
import train.errors
import train.model.models  # noqa: F401 - registers the package's layers with Keras (load_model needs them)
from dataset_contract import native_logs
from train.__main__ import main as train_main
from train.evaluate.__main__ import main as evaluate_main
from train.predict.__main__ import main as predict_main
from train.serving import export

WORKTREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPEC = "my_nets:tiny_net"
USER_MODULE = textwrap.dedent(
    '''
    """A user's own networks."""

    import keras


    class Halve(keras.layers.Layer):
        def call(self, inputs):
            return inputs * 0.5


    def tiny_net(input_shape, num_classes):
        inputs = keras.Input(input_shape)
        x = keras.layers.Conv2D(8, 3, activation="relu")(Halve()(inputs))
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


    def not_a_model(input_shape, num_classes):
        return "a string"
    '''
)


@pytest.fixture(scope="module")
def user_module_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("user_code")
    (directory / "my_nets.py").write_text(USER_MODULE)
    return str(directory)


@pytest.fixture
def user_module_importable(user_module_dir, monkeypatch):
    monkeypatch.syspath_prepend(user_module_dir)
    yield
    sys.modules.pop("my_nets", None)


def run_command(module, *args, user_module_dir):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([WORKTREE, user_module_dir]),
        "TPU_LOAD_LIBRARY": "0",
        "NO_GCE_CHECK": "true",
    }
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def user_run(stage1_dataset, user_module_dir, tmp_path_factory):
    """(data_dir, model_dir, metrics) of `python -m train --model my_nets:tiny_net`, run once."""
    data_dir = stage1_dataset("uint8")
    model_dir = str(tmp_path_factory.mktemp("user_model_run"))
    args = ["--data", data_dir, "--model-dir", model_dir, "--model", SPEC, "--epochs", "2"]
    args += ["--global-batch-size", "8", "--learning-rate", "0.01", "--ema"]
    result = run_command("train", *args, user_module_dir=user_module_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(model_dir, "metrics.json")) as handle:
        return data_dir, model_dir, json.load(handle)


def good_and_bad_files(sample_corpus, tmp_path):
    good = [sample_corpus.uri(f) for f in sample_corpus.files if f.expected_error is None][:3]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"this is not a JPEG")
    return good, str(broken), str(tmp_path / "missing.png")


def test_a_users_function_trains_to_an_export_that_serves_raw_bytes(user_run, sample_corpus, tmp_path):
    data_dir, model_dir, metrics = user_run
    assert metrics["model"] == SPEC and metrics["export_dir"] == export.export_path(model_dir)
    assert metrics["global_step"] > 0 and os.listdir(os.path.join(model_dir, "checkpoints"))
    assert os.path.exists(metrics["backbone_weights"])  # the user's network, for a later --weights
    labels = json.load(open(os.path.join(data_dir, "dataset.json")))["labels"]
    good, broken, _ = good_and_bad_files(sample_corpus, tmp_path)
    serve = tf.saved_model.load(metrics["export_dir"]).signatures[export.SIGNATURE]
    contents = [open(path, "rb").read() for path in [*good, broken]]
    outputs = serve(image_bytes=tf.constant(contents))
    assert outputs["valid"].numpy().tolist() == [True] * len(good) + [False]
    np.testing.assert_allclose(outputs["probabilities"].numpy()[: len(good)].sum(axis=1), 1.0, atol=1e-5)
    assert {label.decode() for label in outputs["label"].numpy()[: len(good)]} <= set(labels)
    assert outputs["error"].numpy()[-1].decode().startswith("not_an_image: ")


def test_the_run_is_also_a_keras_file_that_keras_loads(user_run, user_module_importable):
    data_dir, model_dir, metrics = user_run
    assert metrics["keras_model"] == os.path.join(model_dir, export.KERAS_FILE)
    model = keras.models.load_model(metrics["keras_model"])
    images, _ = next(iter(train.load_dataset(data_dir, "validation", batch_size=8)))
    probabilities = model(images).numpy()
    assert probabilities.shape == (8, len(metrics["validation"]["confusion_matrix"]))
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_evaluate_reports_the_shipped_weights_scores_on_a_split(user_run, user_module_dir):
    _, model_dir, metrics = user_run
    result = run_command(
        "train.evaluate",
        "--model-dir",
        model_dir,
        "--split",
        "validation",
        "--json",
        user_module_dir=user_module_dir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The trainer's own validation numbers of the weights it shipped (--ema: the moving average).
    validation = metrics["validation"]
    assert report["num_examples"] == validation["num_examples"]
    assert report["confusion_matrix"] == validation["confusion_matrix"]
    assert report["accuracy"] == pytest.approx(validation["accuracy"], abs=1e-6)
    assert report["loss"] == pytest.approx(validation["cross_entropy"], rel=1e-4)
    counts = np.array(report["confusion_matrix"])
    for index, label in enumerate(report["labels"]):
        scores = report["per_class"][label]
        assert scores["num_examples"] == counts[index].sum()
        if counts[index].sum():
            assert scores["recall"] == pytest.approx(counts[index, index] / counts[index].sum())
        if counts[:, index].sum():
            assert scores["precision"] == pytest.approx(counts[index, index] / counts[:, index].sum())


def test_evaluate_prints_a_table_and_names_the_splits_there_are(user_run, user_module_importable, capsys):
    _, model_dir, _ = user_run
    assert evaluate_main(["--model-dir", model_dir, "--split", "validation"]) == 0
    text = capsys.readouterr().out
    assert "accuracy" in text and "precision  recall" in text and "confusion matrix" in text
    assert evaluate_main(["--model-dir", model_dir]) == 2  # the default: test, which this dataset has none of
    error = capsys.readouterr().err
    assert "split 'test' has no examples" in error and "'validation'" in error and "Traceback" not in error


def test_predict_prints_a_line_per_file_with_its_top_classes_or_its_error(
    user_run, user_module_dir, sample_corpus, tmp_path
):
    _, model_dir, _ = user_run
    good, broken, missing = good_and_bad_files(sample_corpus, tmp_path)
    result = run_command(
        "train.predict",
        model_dir + "/export",
        *good,
        broken,
        missing,
        "--top-k",
        "2",
        "--json",
        user_module_dir=user_module_dir,
    )
    assert result.returncode == 1, result.stderr[-3000:]  # some files could not be classified
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [line["file"] for line in lines] == [*good, broken, missing]
    for line in lines[: len(good)]:
        assert len(line["top"]) == 2 and line["top"][0]["probability"] >= line["top"][1]["probability"]
    assert lines[-2]["error"].startswith("not_an_image: ")
    assert lines[-1]["error"].startswith("unreadable: ")
    assert "Traceback" not in result.stderr
    # TensorFlow's native notes (oneDNN's on uint8 decoding, on CPUs without AVX-512) are not for the user.
    assert [line for line in result.stderr.splitlines() if native_logs.is_native_noise(line)] == []


def test_predict_text_lines_and_a_missing_export(user_run, sample_corpus, tmp_path, capsys):
    _, model_dir, _ = user_run
    good, _, _ = good_and_bad_files(sample_corpus, tmp_path)
    assert predict_main([model_dir, *good, "--top-k", "1"]) == 0  # a model dir works as well as its export
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == good and all(
        len(line.split("\t")) == 2 for line in lines
    )
    assert predict_main([str(tmp_path), *good]) == 2
    assert "no SavedModel" in capsys.readouterr().err


def test_a_model_spec_without_a_colon_is_refused_before_tensorflow(capsys):
    with pytest.raises(SystemExit) as stopped:
        train_main(["--data", "d", "--model-dir", "m", "--model", "my_nets.tiny_net"])
    assert stopped.value.code == 2
    assert "neither a built-in model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module:net", "cannot import module 'no_such_module'"),
        ("my_nets:no_such_function", "has no function 'no_such_function'"),
        ("my_nets:not_a_model", "the function returned str, expected a keras.Model"),
    ],
)
def test_a_bad_model_spec_is_exit_2_with_what_is_wrong(
    stage1_dataset, user_module_importable, tmp_path, capsys, spec, message
):
    argv = ["--data", stage1_dataset("uint8"), "--model-dir", str(tmp_path), "--model", spec]
    assert train_main([*argv, "--epochs", "1", "--global-batch-size", "8"]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error


def test_freezing_the_backbone_of_a_users_network_is_refused(
    stage1_dataset, user_module_importable, tmp_path, capsys
):
    argv = ["--data", stage1_dataset("uint8"), "--model-dir", str(tmp_path), "--model", SPEC, "--epochs", "2"]
    assert train_main([*argv, "--global-batch-size", "8", "--freeze-backbone-epochs", "1"]) == 2
    error = capsys.readouterr().err
    assert "--freeze-backbone-epochs" in error and "one network with its own head" in error


def test_plain_keras_gets_the_class_names_and_the_exports_inputs_from_the_model_dir(
    user_run, user_module_importable, sample_corpus, tmp_path
):
    data_dir, model_dir, metrics = user_run
    labels = json.load(open(os.path.join(data_dir, "dataset.json")))["labels"]
    model = train.load_model(model_dir)
    assert model.class_names == labels
    # The file alone carries them, for code that loads it with Keras itself.
    assert keras.models.load_model(metrics["keras_model"]).get_layer("dataset_info").class_names == labels
    good, _, _ = good_and_bad_files(sample_corpus, tmp_path)
    images = train.load_image(good, model_dir)
    assert images.shape == (len(good), *model.input_shape[1:])
    # The same numbers as the serving export on the same files: stage 1's geometry, not a squashed image.
    serve = tf.saved_model.load(metrics["export_dir"]).signatures[export.SIGNATURE]
    served = serve(image_bytes=tf.constant([open(path, "rb").read() for path in good]))["probabilities"]
    np.testing.assert_allclose(model.predict(images, verbose=0), served.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="broken.jpg: not_an_image"):
        train.load_image([good[0], str(tmp_path / "broken.jpg")], model_dir)


def test_loading_a_users_model_without_its_module_says_what_to_import(user_run):
    _, model_dir, _ = user_run
    sys.modules.pop("my_nets", None)
    with pytest.raises(train.errors.SetupError) as raised:
        train.load_model(model_dir)
    message = str(raised.value)
    assert "cannot import module 'my_nets'" in message and "put its directory on PYTHONPATH" in message
    assert len(message.splitlines()) == 1


def test_predict_given_a_folder_classifies_the_images_in_it(user_run, sample_corpus, tmp_path, capsys):
    _, model_dir, _ = user_run
    good, _, _ = good_and_bad_files(sample_corpus, tmp_path)
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    copies = [
        folder / f"a{os.path.splitext(good[0])[1]}",
        folder / "nested" / f"b{os.path.splitext(good[1])[1]}",
    ]
    for source, copy in zip(good[:2], copies, strict=True):
        copy.write_bytes(open(source, "rb").read())
    (folder / "notes.txt").write_text("not an image, not an input")
    (tmp_path / "empty").mkdir()
    assert predict_main([model_dir, str(folder), str(tmp_path / "empty"), "--top-k", "1"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [*map(str, sorted(copies)), str(tmp_path / "empty")]
    assert "error" not in lines[0] and "error" not in lines[1]
    assert lines[2].endswith("error: a folder without image files (.jpg .jpeg .png .gif .bmp .webp)")
