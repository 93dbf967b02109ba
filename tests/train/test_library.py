"""train.load_dataset: the training pipeline on the real shards stage 1 wrote, as a library function."""

import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import train
from dataset_contract import manifest as manifest_lib
from tests.stage1 import read_manifest
from tests.train.conftest import IMAGE_SIZE
from train.errors import DatasetError


def one_pass(pipeline):
    """(images, labels) of the real examples of a padded evaluation pass (weight 1), as numpy."""
    images, labels = [], []
    for batch_images, batch_labels, weights in pipeline:
        real = weights.numpy() > 0
        images.append(batch_images.numpy()[real])
        labels.append(batch_labels.numpy()[real])
    return np.concatenate(images), np.concatenate(labels)


def test_the_train_split_is_an_endless_stream_of_static_batches(stage1_dataset):
    data_dir = stage1_dataset("uint8")
    pipeline = train.load_dataset(data_dir, "train", batch_size=4)
    images, labels = pipeline.element_spec
    assert images.shape == (4, IMAGE_SIZE, IMAGE_SIZE, 3) and images.dtype == tf.uint8
    assert labels.shape == (4,) and labels.dtype == tf.int32
    num_train = read_manifest(data_dir)["splits"]["train"]["num_examples"]
    batches = list(pipeline.take(num_train // 4 + 3))  # past one pass: it repeats
    num_classes = len(read_manifest(data_dir)["labels"])
    assert all(0 <= label < num_classes for _, batch in batches for label in batch.numpy())


def test_the_padded_form_is_one_pass_of_static_batches_with_every_example_once(stage1_dataset):
    data_dir = stage1_dataset("uint8")
    manifest = read_manifest(data_dir)
    pipeline = train.load_dataset(data_dir, manifest_lib.VALIDATION, batch_size=5, padded=True)
    assert [spec.shape for spec in pipeline.element_spec] == [(5, IMAGE_SIZE, IMAGE_SIZE, 3), (5,), (5,)]
    _, labels = one_pass(pipeline)
    per_class = manifest["splits"][manifest_lib.VALIDATION]["num_examples_per_class"]
    assert len(labels) == manifest["splits"][manifest_lib.VALIDATION]["num_examples"]
    counted = {manifest["labels"][label]: int(count) for label, count in enumerate(np.bincount(labels))}
    assert {name: count for name, count in counted.items() if count} == {
        name: count for name, count in per_class.items() if count
    }


def test_normalized_images_are_stage_ones_normalization_whatever_the_encoding(stage1_dataset):
    # uint8 stores pixels, float32 stores (pixel - mean) / std: normalized=True gives the same values.
    pixels, pixel_labels = one_pass(train.load_dataset(stage1_dataset("uint8"), "validation", 8, padded=True))
    normalized, labels = one_pass(
        train.load_dataset(stage1_dataset("uint8"), "validation", 8, normalized=True, padded=True)
    )
    stored, stored_labels = one_pass(
        train.load_dataset(stage1_dataset("float32"), "validation", 8, normalized=True, padded=True)
    )
    assert normalized.dtype == stored.dtype == np.float32
    statistics = read_manifest(stage1_dataset("uint8"))["normalization"]

    # The pass order is not deterministic: compare images sorted by (label, mean).
    def ordered(images, labels):
        return images[np.lexsort((images.mean(axis=(1, 2, 3)), labels))]

    expected = (pixels.astype(np.float32) - statistics["mean"]) / statistics["std"]
    np.testing.assert_allclose(ordered(normalized, labels), ordered(expected, pixel_labels), atol=1e-5)
    # Stage 1's float32 values: the same images, up to its rounding of resized pixels (< 1 level).
    level = 1.0 / min(statistics["std"])
    assert np.abs(ordered(stored, stored_labels) - ordered(normalized, labels)).mean() < level


def test_a_split_without_examples_is_a_dataset_error_naming_it(stage1_dataset):
    with pytest.raises(DatasetError, match="split 'test' has no examples"):
        train.load_dataset(stage1_dataset("uint8"), "test")


def _plain_keras_model(num_classes):
    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Conv2D(8, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_plain_keras_evaluate_and_predict_on_an_evaluation_split_match_hand_counts(stage1_dataset):
    data_dir = stage1_dataset("uint8")
    manifest = read_manifest(data_dir)
    num_examples = manifest["splits"][manifest_lib.VALIDATION]["num_examples"]
    batch_size = next(size for size in (5, 6, 7, 9) if num_examples % size)  # a partial last batch
    val = train.load_dataset(data_dir, manifest_lib.VALIDATION, batch_size=batch_size)
    assert val.class_names == manifest["labels"] and val.num_examples == num_examples
    assert [spec.shape.as_list() for spec in val.element_spec] == [[None, IMAGE_SIZE, IMAGE_SIZE, 3], [None]]
    assert len(val) == math.ceil(num_examples / batch_size)

    keras.utils.set_random_seed(0)
    model = _plain_keras_model(len(val.class_names))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(train.load_dataset(data_dir, "train", 8), steps_per_epoch=6, epochs=2, validation_data=val)
    assert not [w for w in caught if "ran out of data" in str(w.message)]

    # By hand: every example of the split once, its prediction against its label.
    batches = [(x.numpy(), y.numpy()) for x, y in val]
    images, labels = np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])
    assert len(labels) == num_examples
    probabilities = model(images, training=False).numpy()
    hand_accuracy = float(np.mean(probabilities.argmax(axis=1) == labels))
    hand_loss = float(np.mean(-np.log(np.clip(probabilities[np.arange(len(labels)), labels], 1e-7, 1.0))))

    loss, accuracy = model.evaluate(val, verbose=0)
    assert accuracy == pytest.approx(hand_accuracy, abs=1e-6)
    assert loss == pytest.approx(hand_loss, rel=1e-4)
    predicted = model.predict(val, verbose=0)
    assert predicted.shape == (num_examples, len(val.class_names))
    # The same order on every pass: predict's rows line up with the labels of the pass above.
    assert float(np.mean(predicted.argmax(axis=1) == labels)) == pytest.approx(hand_accuracy, abs=1e-6)


def test_padded_with_training_is_refused(stage1_dataset):
    with pytest.raises(ValueError, match="padded=True is for one pass"):
        train.load_dataset(stage1_dataset("uint8"), "train", training=True, padded=True)
