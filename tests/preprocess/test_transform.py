"""tf.Transform: statistics and vocabulary on inputs small enough to work out by hand."""

import tempfile

import apache_beam as beam
import numpy as np
import pytest
import tensorflow_transform.beam as tft_beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from dataset_contract import features
from preprocess import transform
from preprocess.transform import MEAN, STD, make_preprocessing_fn, tensor_adapter_config, to_record_batch

SIZE = 2


def _example(rgb, label, name):
    pixels = np.broadcast_to(np.array(rgb, dtype=np.uint8), (SIZE, SIZE, 3))
    return {"image_raw": pixels.tobytes(), "label": label, "sha256": name * 8, "uri": f"/corpus/{name}.png"}


# Per channel: R is 0 and 100 (mean 50, std 50); G is 10 and 30 (mean 20, std
# 10); B is 100 in both (std 0, which the transform must not divide by).
TRAIN = [
    _example((0, 10, 100), "zebra", "a"),
    _example((100, 30, 100), "ant", "b"),
    _example((100, 30, 100), "zebra", "c"),
    _example((0, 10, 100), "ant", "d"),
]


def _rows(batches):
    rows = []
    for batch, _ in batches:
        columns = {
            name: batch.column(name).flatten().to_numpy(zero_copy_only=False) for name in batch.schema.names
        }
        for index in range(batch.num_rows):
            rows.append(
                {
                    "image": columns["image"].reshape(batch.num_rows, -1)[index],
                    "label": int(columns["label"][index]),
                    "mean": columns[MEAN].reshape(batch.num_rows, 3)[index],
                    "std": columns[STD].reshape(batch.num_rows, 3)[index],
                }
            )
    return rows


def _check_transform(train, others, *, check_train, check_others, encoding="float32"):
    """Analyze `train`, transform both, and run the checks on the transformed rows.

    The checks run inside the pipeline (assert_that), where the rows are.
    """
    with TestPipeline() as pipeline, tft_beam.Context(temp_dir=tempfile.mkdtemp()):
        config = tensor_adapter_config()
        train_batches = pipeline | "Train" >> beam.Create([to_record_batch(train)])
        other_batches = pipeline | "Others" >> beam.Create([to_record_batch(others)])
        transform_fn = (train_batches, config) | tft_beam.AnalyzeDataset(
            make_preprocessing_fn(SIZE, encoding)
        )
        for name, batches, check in (
            ("train", train_batches, check_train),
            ("others", other_batches, check_others),
        ):
            transformed, _ = (
                (batches, config),
                transform_fn,
            ) | f"Transform{name}" >> tft_beam.TransformDataset(output_record_batches=True)
            assert_that(transformed, lambda batches, check=check: check(_rows(batches)), label=f"check{name}")


def test_normalization_uses_per_channel_mean_and_std_of_the_train_split():
    # The held-out image is far from the train statistics: if it were part of
    # the analysis, the mean would move.
    expected_mean = np.array([50.0, 20.0, 100.0])
    expected_std = np.array([50.0, 10.0, 1.0])  # a constant channel is left unscaled

    def check_statistics(rows):
        for row in rows:
            np.testing.assert_allclose(row["mean"], expected_mean, rtol=1e-6)
            np.testing.assert_allclose(row["std"], expected_std, rtol=1e-6)

    def check_train(rows):
        check_statistics(rows)
        dark = [row for row in rows if row["image"][0] < 0][0]["image"].reshape(SIZE, SIZE, 3)
        np.testing.assert_allclose(dark[1, 1], [-1.0, -1.0, 0.0], atol=1e-6)

    def check_held_out(rows):
        check_statistics(rows)
        held_out = rows[0]["image"].reshape(SIZE, SIZE, 3)
        np.testing.assert_allclose(
            held_out[0, 0], [(255 - 50) / 50, (255 - 20) / 10, (255 - 100) / 1], rtol=1e-6
        )

    _check_transform(
        TRAIN, [_example((255, 255, 255), "ant", "e")], check_train=check_train, check_others=check_held_out
    )


def test_label_vocabulary_is_sorted_by_class_name_and_unseen_classes_get_minus_one():
    def check_train(rows):
        assert sorted(row["label"] for row in rows) == [0, 0, 1, 1]  # ant=0, zebra=1

    def check_others(rows):
        assert sorted(row["label"] for row in rows) == [-1, 1]  # yak was never seen in train

    others = [_example((1, 2, 3), "zebra", "e"), _example((1, 2, 3), "yak", "f")]
    _check_transform(TRAIN, others, check_train=check_train, check_others=check_others)


@pytest.mark.parametrize("encoding", ["uint8", "jpeg"])
def test_pixel_encodings_keep_the_raw_pixels(encoding):
    def check_others(rows):
        (row,) = rows
        assert (
            bytes(row["image"][0])
            == np.broadcast_to(np.array([7, 8, 9], np.uint8), (SIZE, SIZE, 3)).tobytes()
        )
        np.testing.assert_allclose(row["mean"], [50.0, 20.0, 100.0], rtol=1e-6)

    _check_transform(
        TRAIN,
        [_example((7, 8, 9), "ant", "e")],
        check_train=lambda rows: None,
        check_others=check_others,
        encoding=encoding,
    )


def test_the_analysis_makes_no_float64_copy_of_a_batch_of_pixels():
    """Only per-image [batch, 3] statistics are float64; a batch of pixels is at most float32."""
    import tensorflow as tf

    image_size = 8
    with tf.compat.v1.Graph().as_default() as graph:
        inputs = {
            name: tf.compat.v1.placeholder(tf.string, [None])
            for name in (
                transform.IMAGE_RAW,
                transform.IMAGE_MOMENTS,
                features.CLASS_NAME,
                features.SHA256,
                features.URI,
            )
        }
        transform.make_preprocessing_fn(image_size, "uint8")(inputs)
    pixels_per_image = image_size * image_size
    large_float64 = [
        (op.name, tensor.shape)
        for op in graph.get_operations()
        for tensor in op.outputs
        if tensor.dtype == tf.float64
        and tensor.shape.rank is not None
        and any(dim is not None and dim >= pixels_per_image for dim in tensor.shape.as_list())
    ]
    assert large_float64 == []
