"""`preprocess.inspect`: the summary, and a contact sheet that shows each stored image where it belongs.

The corpus for the sheet is made of two-colour images (top half the class's
colour, bottom half another, a different pair per image), so that a cell
shows at a glance whether its image is upright, in RGB order and in its
class's row; each cell is compared pixel by pixel with stage 1's own
`load_image` of the source file the record names.
"""

import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess.decode.image import load_image
from preprocess.inspect import contact_sheet as inspect_lib
from preprocess.inspect.summary import format_summary, read_error_examples
from tests.stage1 import read_manifest, read_split, run_stage1

SIZE = 16
CELL = 32  # each stored pixel becomes a 2x2 block
IMAGES_PER_CLASS = 3
# (top, bottom) colours of image i of a class: every channel varies across the
# corpus (a constant channel would have no std to normalize by).
CLASS_COLOURS = {"blue": (40, 60, 210), "green": (30, 190, 70), "red": (220, 40, 50)}
BOTTOM_COLOUR = (250, 230, 20)
# Largest per-pixel error allowed when de-normalizing each encoding back to 0-255.
TOLERANCE = {features.FLOAT32: 1, features.UINT8: 0, features.BFLOAT16: 2, features.JPEG: 40}


def two_colour_image(class_name: str, index: int) -> np.ndarray:
    pixels = np.zeros((SIZE, SIZE, 3), np.uint8)
    pixels[: SIZE // 2] = np.clip(np.array(CLASS_COLOURS[class_name]) + 8 * index, 0, 255)
    pixels[SIZE // 2 :] = np.clip(np.array(BOTTOM_COLOUR) - 8 * index, 0, 255)
    return pixels


def write_two_colour_corpus(root) -> str:
    for class_name in CLASS_COLOURS:
        os.makedirs(root / class_name)
        for index in range(IMAGES_PER_CLASS):
            Image.fromarray(two_colour_image(class_name, index)).save(root / class_name / f"{index}.png")
    return str(root)


@pytest.fixture(scope="module")
def two_colour_corpus(tmp_path_factory):
    return write_two_colour_corpus(tmp_path_factory.mktemp("two_colour"))


@pytest.fixture(scope="module", params=features.ENCODINGS)
def dataset(request, two_colour_corpus, tmp_path_factory):
    output = tmp_path_factory.mktemp(f"dataset_{request.param}")
    # Everything in train, in two shards: the sheet has to read across shards.
    run_stage1(
        two_colour_corpus, output, "--split", "1,0,0", image_size=SIZE, encoding=request.param, min_shards=2
    )
    return str(output)


def source_pixels(uri: str) -> np.ndarray:
    with open(uri, "rb") as handle:
        return load_image(handle.read(), size=SIZE, method="crop", max_pixels=1 << 30)


def read_png(path) -> np.ndarray:
    with open(path, "rb") as handle:
        return np.asarray(Image.open(io.BytesIO(handle.read())).convert("RGB"))


def cell(sheet: np.ndarray, layout: inspect_lib.SheetLayout, row: int, column: int) -> np.ndarray:
    x, y = layout.cell_origin(row, column)
    return sheet[y : y + layout.cell_size, x : x + layout.cell_size]


@pytest.mark.slow
def test_every_cell_shows_its_stored_image_upright_in_rgb_in_its_class_row(dataset, tmp_path):
    manifest = read_manifest(dataset)
    image, layout, sample = inspect_lib.contact_sheet(
        dataset, manifest, manifest_lib.TRAIN, per_class=IMAGES_PER_CLASS, cell_size=CELL
    )
    path = tmp_path / "sheet.png"
    inspect_lib.write_png(image, str(path))
    sheet = read_png(path)

    assert manifest["labels"] == sorted(CLASS_COLOURS)
    assert (layout.rows, layout.columns) == (len(CLASS_COLOURS), IMAGES_PER_CLASS)
    step = CELL + inspect_lib.BORDER
    assert sheet.shape == (
        layout.title_height + inspect_lib.BORDER + layout.rows * step,
        layout.label_width + inspect_lib.BORDER + layout.columns * step,
        3,
    )
    tolerance = TOLERANCE[manifest["image"]["encoding"]]
    for row, class_name in enumerate(manifest["labels"]):
        examples = sample.examples[row]
        assert len(examples) == IMAGES_PER_CLASS
        for column, example in enumerate(examples):
            assert os.path.basename(os.path.dirname(example.uri)) == class_name, f"{example.uri} in row {row}"
            expected = np.kron(source_pixels(example.uri), np.ones((2, 2, 1), np.uint8))
            shown = cell(sheet, layout, row, column)
            error = np.abs(shown.astype(int) - expected.astype(int))
            assert error.max() <= tolerance, (
                f"{example.uri} at row {row}, column {column}: max error {error.max()}"
            )
            # Upright, RGB: the class colour on top, the other below.
            top = shown[: CELL // 4].reshape(-1, 3).mean(axis=0)
            bottom = shown[-CELL // 4 :].reshape(-1, 3).mean(axis=0)
            assert np.argmax(top) == np.argmax(CLASS_COLOURS[class_name])
            assert np.abs(bottom - np.array(BOTTOM_COLOUR)).max() < 30


@pytest.mark.slow
def test_cells_without_an_example_are_blank_and_the_shortfall_is_noted(dataset):
    manifest = read_manifest(dataset)
    image, layout, sample = inspect_lib.contact_sheet(
        dataset, manifest, manifest_lib.TRAIN, per_class=IMAGES_PER_CLASS + 2, cell_size=CELL
    )
    sheet = np.asarray(image)
    for row in range(layout.rows):
        for column in (IMAGES_PER_CLASS, IMAGES_PER_CLASS + 1):
            assert (cell(sheet, layout, row, column) == inspect_lib.EMPTY_CELL).all()
    assert (
        f"fewer than {IMAGES_PER_CLASS + 2} examples in the split: blue 3, green 3, red 3" in sample.warnings
    )


@pytest.mark.slow
def test_reading_stops_as_soon_as_the_rows_are_full(dataset):
    manifest = read_manifest(dataset)
    # Shards are sized by bytes from an estimate (rough for jpeg): at least min_shards, maybe one more.
    assert len(manifest["splits"][manifest_lib.TRAIN]["shards"]) >= 2
    in_order = read_split(dataset, manifest_lib.TRAIN, manifest)  # the shards in manifest order
    first_of_class_0 = next(index for index, row in enumerate(in_order) if row["label"] == 0)
    sample = inspect_lib.sample_examples(dataset, manifest, manifest_lib.TRAIN, per_class=1, labels=[0])
    assert sample.num_records == first_of_class_0 + 1
    assert sample.examples[0][0].uri == in_order[first_of_class_0]["uri"]

    budget = inspect_lib.sample_examples(dataset, manifest, manifest_lib.TRAIN, per_class=8, max_bytes=1)
    assert (budget.num_records, budget.num_shards) == (1, 1)
    assert any("--max-read-mb" in note for note in budget.warnings)


@pytest.mark.slow
def test_cli_prints_the_summary_and_writes_the_sheet(dataset, tmp_path, capsys):
    out = tmp_path / "sheets" / "train.png"
    assert inspect_lib.main([dataset, "--per-class", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = read_manifest(dataset)
    num_shards = len(manifest["splits"][manifest_lib.TRAIN]["shards"])
    assert f"image: {SIZE}x{SIZE}x3 {manifest['image']['encoding']}" in printed
    assert "total size:" in printed and f"train: {num_shards} shards" in printed
    assert f"contact sheet: {out}" in printed
    assert Image.open(out).size == inspect_lib.contact_sheet(dataset, manifest, "train", 2)[1].size


def test_cli_refuses_a_directory_without_a_manifest(tmp_path, capsys):
    assert inspect_lib.main([str(tmp_path)]) == 2
    assert "dataset.json: not found" in capsys.readouterr().err


def fake_manifest() -> dict:
    return {
        "format_version": 1,
        "source": {"input": "/corpus", "kind": "directory"},
        "image": {"height": 64, "width": 64, "channels": 3, "encoding": "uint8", "resize_method": "crop"},
        "labels": ["cat", "dog"],
        "normalization": {"mean": [1.0, 2.0, 3.0], "std": [4.0, 5.0, 6.0], "computed_on": "train"},
        "splits": {
            "train": {
                "num_examples": 30,
                "num_examples_per_class": {"cat": 10, "dog": 20},
                "shards": [
                    {
                        "path": "train-00000-of-00002.tfrecord",
                        "num_examples": 15,
                        "num_bytes": 1000,
                        "sha256": "",
                    },
                    {
                        "path": "train-00001-of-00002.tfrecord",
                        "num_examples": 15,
                        "num_bytes": 3 << 20,
                        "sha256": "",
                    },
                ],
            },
            "validation": {"num_examples": 0, "num_examples_per_class": {"cat": 0, "dog": 0}, "shards": []},
        },
        "inputs": {
            "num_found": 40,
            "num_written": 30,
            "num_failed": 7,
            "num_duplicates": 3,
            "failures_by_reason": {"not_an_image": 2, "truncated": 5},
        },
    }


def test_summary_lists_classes_shard_sizes_and_failures_with_examples(tmp_path):
    manifest = fake_manifest()
    errors = [{"uri": f"/corpus/t{i}.jpg", "reason": "truncated", "detail": "."} for i in range(5)]
    errors.insert(2, {"uri": "/corpus/x.txt", "reason": "not_an_image", "detail": "."})
    errors.insert(4, {"uri": "/corpus/y.txt", "reason": "not_an_image", "detail": "."})
    (tmp_path / manifest_lib.ERRORS_FILE).write_text("".join(json.dumps(e) + "\n" for e in errors))

    examples = read_error_examples(str(tmp_path), manifest, per_reason=3)
    assert examples == {
        "truncated": ["/corpus/t0.jpg", "/corpus/t1.jpg", "/corpus/t2.jpg"],
        "not_an_image": ["/corpus/x.txt", "/corpus/y.txt"],
    }
    text = format_summary(manifest, str(tmp_path), examples)
    assert "40 found = 30 written + 7 failed + 3 duplicates" in text
    assert "64x64x3 uint8, resize crop" in text
    assert "mean [1.0, 2.0, 3.0] std [4.0, 5.0, 6.0]" in text
    assert any(line.split() == ["cat", "10"] for line in text.splitlines())
    assert any(line.split() == ["dog", "20"] for line in text.splitlines())
    assert "train: 2 shards, 3.0 MB (1000 B - 3.0 MB each)" in text
    assert "validation: none" in text
    assert "truncated 5: /corpus/t0.jpg, /corpus/t1.jpg, /corpus/t2.jpg, ..." in text
    assert "not_an_image 2: /corpus/x.txt, /corpus/y.txt" in text


def test_to_pixels_undoes_the_normalization():
    manifest = fake_manifest()
    pixels = np.array([[[0, 128, 255]]], np.float32)
    mean, std = (np.array(manifest["normalization"][key], np.float32) for key in ("mean", "std"))
    for encoding, stored in ((features.FLOAT32, (pixels - mean) / std), (features.UINT8, pixels)):
        manifest["image"]["encoding"] = encoding
        assert (inspect_lib.to_pixels(stored, manifest) == pixels).all()


@pytest.mark.slow
@pytest.mark.parametrize("dataset", [features.BFLOAT16], indirect=True)  # one encoding holds the gs:// path
def test_inspect_reads_and_writes_gs(dataset, gcs_dir, capsys):
    manifest = read_manifest(dataset)
    for name in [manifest_lib.MANIFEST_FILE, *(s["path"] for s in manifest["splits"]["train"]["shards"])]:
        tf.io.gfile.copy(os.path.join(dataset, name), f"{gcs_dir}/dataset/{name}")
    out = f"{gcs_dir}/sheets/train.png"
    assert inspect_lib.main([f"{gcs_dir}/dataset", "--per-class", "2", "--out", out]) == 0
    with tf.io.gfile.GFile(out, "rb") as handle:
        assert Image.open(io.BytesIO(handle.read())).size[0] > 2 * CELL
    assert f"contact sheet: {out}" in capsys.readouterr().out
