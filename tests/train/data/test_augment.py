"""Crops of a dataset stored with a crop margin: random in training, the center in evaluation and serving.

The dataset is the real stage 1 output of the shared corpus with `--crop-margin 0.14`: 36x36 uint8
squares for a model that sees 32x32. uint8 makes every comparison exact: a crop only moves pixels.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from tests.stage1 import read_split
from tests.train.conftest import CROP_MARGIN, CROP_MARGIN_STORED_SIZE, IMAGE_SIZE
from train.data import augment, checks, dataset
from train.serving import export

BATCH = 8
STORED, CROP = CROP_MARGIN_STORED_SIZE, IMAGE_SIZE
CENTER = (STORED - CROP) // 2
POSITIONS = STORED - CROP + 1


@pytest.fixture(scope="module")
def margin_dataset(stage1_dataset):
    data_dir = stage1_dataset("uint8", CROP_MARGIN)
    return data_dir, checks.read_manifest(data_dir)


def _windows(stored: np.ndarray) -> dict[bytes, tuple[int, int, bool]]:
    """Every CROP x CROP window of a stored image, mirrored or not -> (top, left, mirrored)."""
    found = {}
    for top in range(POSITIONS):
        for left in range(POSITIONS):
            window = np.ascontiguousarray(stored[top : top + CROP, left : left + CROP])
            found[window.tobytes()] = (top, left, False)
            found.setdefault(np.ascontiguousarray(window[:, ::-1]).tobytes(), (top, left, True))
    return found


def test_the_pipeline_reads_stored_squares_and_feeds_the_model_crops(margin_dataset):
    _, manifest = margin_dataset
    image_format = dataset.ImageFormat.from_manifest(manifest)
    assert image_format.shape == (STORED, STORED, 3)
    assert image_format.input_shape == (CROP, CROP, 3)
    assert image_format.has_crop_margin


def test_random_crops_are_static_shaped_and_differ_between_epochs(margin_dataset):
    data_dir, manifest = margin_dataset
    train = dataset.make_train_dataset(data_dir, manifest, BATCH)
    images_spec, _ = train.element_spec
    assert images_spec.shape.as_list() == [BATCH, CROP, CROP, 3] and images_spec.dtype == tf.uint8

    stored = read_split(data_dir, manifest_lib.TRAIN, manifest)
    windows = {}
    for index, row in enumerate(stored):
        for key, position in _windows(row["image"].astype(np.uint8)).items():
            windows[key] = (index, *position)
    passes = 4
    seen = collections.defaultdict(list)
    for images, labels in train.take(passes * len(stored) // BATCH):
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            key = image.tobytes()
            assert key in windows, "a training image is not a crop of a stored image"
            index, top, left, mirrored = windows[key]
            assert stored[index]["label"] == label
            seen[index].append((top, left, mirrored))

    # The stream repeats the split: each image comes back pass after pass, with another crop.
    repeated = [crops for crops in seen.values() if len(crops) >= 2]
    assert len(repeated) >= len(stored) // 2
    assert sum(len(set(crops)) > 1 for crops in repeated) >= 0.9 * len(repeated)
    # Every position and both orientations occur.
    crops = [crop for per_image in seen.values() for crop in per_image]
    assert {top for top, _, _ in crops} == set(range(POSITIONS))
    assert {left for _, left, _ in crops} == set(range(POSITIONS))
    assert {mirrored for _, _, mirrored in crops} == {False, True}


def test_evaluation_takes_the_center_crop_of_every_stored_image(margin_dataset):
    data_dir, manifest = margin_dataset
    stored = read_split(data_dir, manifest_lib.VALIDATION, manifest)
    centers = {
        np.ascontiguousarray(row["image"][CENTER : CENTER + CROP, CENTER : CENTER + CROP])
        .astype(np.uint8)
        .tobytes()
        for row in stored
    }
    evaluation = dataset.make_eval_dataset(data_dir, manifest, manifest_lib.VALIDATION, BATCH)
    images_spec = evaluation.element_spec[0]
    assert images_spec.shape.as_list() == [BATCH, CROP, CROP, 3]
    found = set()
    for images, _, weights in evaluation:
        for i in np.flatnonzero(weights.numpy()):
            found.add(images[i].numpy().tobytes())
    assert found == centers and len(found) == len(stored)


def test_serving_takes_the_same_center_crop_as_evaluation(margin_dataset):
    data_dir, manifest = margin_dataset
    image_format = dataset.ImageFormat.from_manifest(manifest)
    rows = read_split(data_dir, manifest_lib.VALIDATION, manifest)
    contents = []
    for row in rows:
        with open(row["uri"], "rb") as handle:
            contents.append(handle.read())
    served = export.serving_model_input(
        tf.constant(contents), image_format, manifest["image"]["resize_method"]
    )
    assert served.shape == (len(rows), CROP, CROP, 3) and served.dtype == tf.uint8
    for row, image in zip(rows, served.numpy().astype(np.float64), strict=True):
        errors = {
            (top, left): np.abs(image - row["image"][top : top + CROP, left : left + CROP]).mean()
            for top in range(POSITIONS)
            for left in range(POSITIONS)
        }
        # The serving tolerance of tests/train/serving/test_export.py (PIL vs TF resize rounding), and no other
        # window of the stored square is as close: serving cuts exactly where evaluation does.
        assert errors[(CENTER, CENTER)] <= 1.0, row["uri"]
        assert min(errors, key=errors.get) == (CENTER, CENTER), row["uri"]


def test_crops_are_the_same_eagerly_and_inside_dataset_map():
    images = tf.reshape(tf.range(2 * STORED * STORED * 3, dtype=tf.int32) % 251, [2, STORED, STORED, 3])
    eager = augment.center_crop(images, CROP)
    mapped = next(iter(tf.data.Dataset.from_tensors(images).map(lambda x: augment.center_crop(x, CROP))))
    np.testing.assert_array_equal(eager.numpy(), mapped.numpy())
    np.testing.assert_array_equal(
        eager.numpy(), images.numpy()[:, CENTER : CENTER + CROP, CENTER : CENTER + CROP]
    )
    random = tf.data.Dataset.from_tensors(images).map(lambda x: augment.random_crop_and_flip(x, CROP))
    assert random.element_spec.shape.as_list() == [2, CROP, CROP, 3]
    assert augment.random_crop_and_flip(images, CROP).shape == (2, CROP, CROP, 3)


def test_crops_larger_than_the_stored_image_are_refused():
    with pytest.raises(ValueError, match="cannot crop"):
        augment.center_crop(tf.zeros([4, 16, 16, 3]), 32)
    with pytest.raises(ValueError, match="cannot crop"):
        augment.random_crop_and_flip(tf.zeros([4, 16, 16, 3]), 32)
