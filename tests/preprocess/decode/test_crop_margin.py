"""--crop-margin: stage 1 stores round(size x (1 + F)) squares and the manifest records both sizes."""

import json

import numpy as np
import pytest

from dataset_contract import geometry
from dataset_contract import manifest as manifest_lib
from preprocess import verify
from preprocess.decode.image import load_image, resize_image
from preprocess.inspect.summary import format_summary
from preprocess.options import parse_args
from preprocess.publish import runs
from preprocess.publish.finalize import build_manifest
from tests.stage1 import read_manifest, read_split, run_stage1, write_corpus
from train.data import dataset

SIZE = 16
MARGIN = 0.25
STORED = 20  # round(16 x 1.25)


@pytest.mark.parametrize(
    "size,margin,stored",
    [(224, 0.0, 224), (224, 0.14, 255), (224, 0.143, 256), (32, 0.14, 36), (16, 0.25, 20), (10, 0.05, 11)],
)
def test_stored_size_is_the_crop_grown_by_the_margin_rounded_half_up(size, margin, stored):
    assert geometry.stored_size(size, margin) == stored


@pytest.mark.parametrize("height,width", [(100, 60), (61, 200), (37, 37), (300, 299)])
def test_center_crop_window_is_the_stored_square_then_its_center(height, width):
    image = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    stored_size, crop = geometry.stored_size(SIZE * 4, MARGIN), SIZE * 4
    offset = geometry.center_crop_offset(stored_size, crop)
    two_steps = resize_image(image, stored_size, geometry.CROP)[
        offset : offset + crop, offset : offset + crop
    ]
    resized_height, resized_width, top, left = geometry.center_crop_window(height, width, stored_size, crop)
    resized = resize_image(image, max(resized_height, resized_width), geometry.PAD)  # the same resize, uncut
    assert resized.shape[:2] == (max(resized_height, resized_width),) * 2
    pad_top, pad_left = geometry.pad_offsets(
        resized_height, resized_width, max(resized_height, resized_width)
    )
    one_window = resized[pad_top + top : pad_top + top + crop, pad_left + left : pad_left + left + crop]
    np.testing.assert_array_equal(one_window, two_steps)


def test_the_flag_grows_the_stored_size_and_keeps_the_crop():
    args, _ = parse_args(["--input", "x", "--output", "y", "--image-size", "224", "--crop-margin", "0.14"])
    assert (args.stored_size, args.image_size, args.crop_margin) == (255, 224, 0.14)
    args, _ = parse_args(["--input", "x", "--output", "y", "--image-size", "64"])
    assert (args.stored_size, args.image_size, args.crop_margin) == (64, 64, 0.0)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--crop-margin", "0.1", "--resize-method", "pad"], "needs --resize-method crop"),
        (["--crop-margin", "-0.1"], "between 0 and 1"),
        (["--crop-margin", "abc"], "a number like 0.14"),
    ],
)
def test_impossible_margins_are_refused_with_a_reason(extra, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--input", "x", "--output", "y", *extra])
    assert message in str(stopped.value) + capsys.readouterr().err


def _manifest(**image_config):
    config = {
        "input": "x",
        "input_kind": "directory",
        "output": "/tmp/dataset",
        "max_pixels": 100_000_000,
        "image_size": STORED,
        "resize_method": "crop",
        "encoding": "uint8",
        "jpeg_quality": 90,
        "split_fractions": {"train": 1.0, "validation": 0.0, "test": 0.0},
        **image_config,
    }
    return build_manifest(
        config=config,
        run_id=runs.new_run_id(),
        labels=["a"],
        stats=((1.0, 2.0, 3.0), (4.0, 5.0, 6.0)),
        shards=[{"split": "train", "path": "train-00000-of-00001.tfrecord", "num_examples": 1,
                 "num_bytes": 10, "sha256": "0" * 64}],
        class_counts=[(("train", "a"), 1)],
        num_found=1,
        failures={},
        num_duplicates=0,
    )  # fmt: skip


def test_the_manifest_sizes_round_trip_to_the_training_pipeline():
    manifest = json.loads(json.dumps(_manifest(crop_size=SIZE, crop_margin=MARGIN)))
    manifest_lib.check_manifest(manifest)
    assert (manifest["image"]["height"], manifest["image"]["width"]) == (STORED, STORED)
    assert (manifest["image"]["crop_size"], manifest["image"]["crop_margin"]) == (SIZE, MARGIN)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    assert image_format.shape == (STORED, STORED, 3) and image_format.input_shape == (SIZE, SIZE, 3)


def test_a_manifest_without_crop_size_means_the_model_sees_the_stored_image():
    manifest = _manifest()
    del manifest["image"]["crop_size"], manifest["image"]["crop_margin"]
    manifest_lib.check_manifest(manifest)
    assert manifest_lib.crop_size(manifest["image"]) == STORED
    assert not dataset.ImageFormat.from_manifest(manifest).has_crop_margin


def test_a_crop_larger_than_the_stored_image_is_refused():
    manifest = _manifest(crop_size=STORED + 1)
    with pytest.raises(manifest_lib.ManifestError, match="crop_size"):
        manifest_lib.check_manifest(manifest)


@pytest.mark.slow
def test_stage1_with_a_crop_margin_stores_larger_center_squares(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", images_per_class=4, include_broken=False)
    output = tmp_path / "dataset"
    run_stage1(
        corpus.root, output, "--crop-margin", str(MARGIN), image_size=SIZE, encoding="uint8", min_shards=1
    )
    manifest = read_manifest(output)
    image = manifest["image"]
    assert (image["height"], image["width"], image["crop_size"], image["crop_margin"]) == (
        STORED,
        STORED,
        SIZE,
        MARGIN,
    )
    rows = read_split(output, manifest_lib.TRAIN, manifest)
    assert rows
    for row in rows:
        with open(row["uri"], "rb") as handle:
            expected = load_image(handle.read(), size=STORED, method="crop", max_pixels=10**8)
        np.testing.assert_array_equal(row["image"], expected.astype(np.float32))
    assert verify.main([str(output)]) == 0
    assert f"training crops {SIZE}x{SIZE}" in format_summary(manifest, str(output))
