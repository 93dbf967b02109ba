"""The input pipeline, on shards written by the real stage 1 job.

Pixel tolerances, in 0-255 levels, of the pipeline's images (de-normalized
for bfloat16 and float32; uint8 and jpeg come out as pixels) against the
source files decoded by stage 1's own `load_image`: uint8 is exact, float32
is within float rounding of normalize and back (<= 0.01);
bfloat16 is within its 8-bit mantissa (measured max 0.4, bound 1.0);
jpeg is lossy (stage 1 stores the 32x32 image as a quality-90 JPEG with 4:2:0
chroma: measured mean 5.8, bound 8 on the mean), and its decode is checked
exactly against a plain decode of the stored JPEG instead.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from dataset_contract import manifest as manifest_lib
from preprocess.decode.image import load_image
from tests.stage1 import read_split
from tests.train.conftest import IMAGE_SIZE
from train.data import checks, dataset
from train.errors import DatasetError

ENCODINGS = ("bfloat16", "float32", "uint8", "jpeg")
BATCH = 8
PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
MAX_LEVELS = {"bfloat16": 1.0, "float32": 0.01, "uint8": 0.0}
# What the model is fed: normalized values for the encodings stage 1 normalized, else pixels.
IMAGE_DTYPES = {"bfloat16": tf.bfloat16, "float32": tf.float32, "uint8": tf.uint8, "jpeg": tf.uint8}
JPEG_MEAN_LEVELS = 8.0


def _load(stage1_dataset, encoding):
    data_dir = stage1_dataset(encoding)
    return data_dir, checks.read_manifest(data_dir)


def _to_pixels(images, manifest) -> np.ndarray:
    """The pipeline's images in 0-255 levels: de-normalized if stage 1 normalized them."""
    pixels = tf.cast(images, tf.float32).numpy()
    if not dataset.ImageFormat.from_manifest(manifest).normalized_offline:
        return pixels
    normalization = manifest["normalization"]
    return pixels * np.array(normalization["std"]) + np.array(normalization["mean"])


def _real_eval_examples(eval_dataset, manifest):
    """(image in 0-255 levels, label) of every weight-1 example of an eval dataset."""
    examples = []
    for images, labels, weights in eval_dataset:
        pixels = _to_pixels(images, manifest)
        for i in np.flatnonzero(weights.numpy()):
            examples.append((pixels[i], int(labels[i])))
    return examples


def _graph_ops(ds: tf.data.Dataset) -> tuple[graph_pb2.GraphDef, set]:
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    ops = {node.op for node in graph.node} | {node.op for f in graph.library.function for node in f.node_def}
    return graph, ops


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_element_spec_is_fully_static_batch_dimension_included(stage1_dataset, encoding):
    data_dir, manifest = _load(stage1_dataset, encoding)
    train = dataset.make_train_dataset(data_dir, manifest, BATCH, augment=True)
    evaluation = dataset.make_eval_dataset(data_dir, manifest, manifest_lib.VALIDATION, BATCH)
    image_dtype = IMAGE_DTYPES[encoding]
    image_shape = [BATCH, IMAGE_SIZE, IMAGE_SIZE, 3]

    images, labels = train.element_spec
    assert images.shape.as_list() == image_shape and images.dtype == image_dtype
    assert labels.shape.as_list() == [BATCH] and labels.dtype == tf.int32
    images, labels, weights = evaluation.element_spec
    assert images.shape.as_list() == image_shape and images.dtype == image_dtype
    assert labels.shape.as_list() == [BATCH] and weights.shape.as_list() == [BATCH]
    # And the tensors really have those shapes, including the padded last batch.
    for images, _, weights in evaluation:
        assert images.shape.as_list() == image_shape and weights.shape.as_list() == [BATCH]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_pixels_and_labels_match_the_source_images(stage1_dataset, encoding):
    data_dir, manifest = _load(stage1_dataset, encoding)
    stored = read_split(data_dir, manifest_lib.VALIDATION, manifest)
    sources = []
    for row in stored:
        with open(row["uri"], "rb") as handle:
            pixels = load_image(handle.read(), size=IMAGE_SIZE, method="crop", max_pixels=10**8)
        sources.append((pixels.astype(np.float64), row["label"], row))
    evaluation = dataset.make_eval_dataset(data_dir, manifest, manifest_lib.VALIDATION, BATCH)
    examples = _real_eval_examples(evaluation, manifest)
    assert len(examples) == len(sources) == manifest["splits"][manifest_lib.VALIDATION]["num_examples"]

    matched = set()
    for image, label in examples:
        errors = [np.abs(image - source).mean() for source, _, _ in sources]
        best = int(np.argmin(errors))
        source, source_label, row = sources[best]
        assert best not in matched, "two pipeline examples matched the same source image"
        matched.add(best)
        assert label == source_label, f"label {label} for {row['uri']} (label {source_label})"
        if encoding == "jpeg":
            assert errors[best] <= JPEG_MEAN_LEVELS
            stored_pixels = row["image"]  # a plain decode_jpeg of the stored bytes
            np.testing.assert_allclose(image, stored_pixels, atol=1e-3)
        else:
            assert np.abs(image - source).max() <= MAX_LEVELS[encoding], row["uri"]
    assert len(matched) == len(sources)


def _image_keys(ds, batches=None):
    """Bytes of every real image a dataset yields (eval datasets pad with weight-0 images)."""
    keys = []
    for element in ds if batches is None else ds.take(batches):
        images = element[0]
        weights = element[2] if len(element) == 3 else tf.ones([images.shape[0]])
        for i in np.flatnonzero(weights.numpy()):
            keys.append(tf.io.serialize_tensor(images[i]).numpy())
    return keys


@pytest.mark.parametrize("num_pipelines", [2, 4])
def test_input_pipelines_read_disjoint_shares_that_cover_the_split(stage1_dataset, num_pipelines, caplog):
    """2 pipelines on 2 shards: whole shards each. 4 pipelines on 2 shards: record by record, with a warning."""
    data_dir, manifest = _load(stage1_dataset, "bfloat16")
    shards = manifest["splits"][manifest_lib.TRAIN]["shards"]
    contexts = [
        tf.distribute.InputContext(num_pipelines, index, num_pipelines) for index in range(num_pipelines)
    ]
    shares = [dataset.shards_for_input_pipeline(shards, c) for c in contexts]
    if num_pipelines == 2:
        assert [len(share.whole) for share in shares] == [1, 1] and not shares[0].split
    else:
        assert all(len(share.split) == 2 and not share.whole for share in shares)

    # One pass over each pipeline's share: disjoint, together the whole split, each of the size planned.
    own = []
    for context, share in zip(contexts, shares, strict=True):
        keys = _image_keys(dataset.make_eval_dataset(data_dir, manifest, manifest_lib.TRAIN, BATCH, context))
        assert len(keys) == share.num_examples
        own.append(set(keys))
    for i in range(num_pipelines):
        for j in range(i + 1, num_pipelines):
            assert not own[i] & own[j]
    assert sum(len(keys) for keys in own) == manifest["splits"][manifest_lib.TRAIN]["num_examples"]
    if num_pipelines > len(shards):
        # Balanced: record-level sharding leaves at most one record per shard between two hosts.
        counts = [share.num_examples for share in shares]
        assert max(counts) - min(counts) <= len(shards)

    # The training stream of each pipeline holds only images of its own share.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="train.data.dataset"):
        for context, keys in zip(contexts, own, strict=True):
            train = dataset.make_train_dataset(data_dir, manifest, 2, input_context=context)
            assert set(_image_keys(train, batches=3)) <= keys
    warnings = [r.getMessage() for r in caplog.records if "input pipelines" in r.getMessage()]
    if num_pipelines > len(shards):
        assert len(warnings) == 1  # once, from pipeline 0, not once per host
        assert (
            f"--min-shards {num_pipelines}" in warnings[0] and "every host reads every shard" in warnings[0]
        )
    else:
        assert not warnings


def test_ten_equal_shards_on_four_hosts_give_every_host_as_many_examples():
    shards = [{"path": f"runs/7/train-{i:05d}-of-00010.tfrecord", "num_examples": 100} for i in range(10)]
    shares = [dataset.input_share(shards, 4, index) for index in range(4)]
    # Whole files alone would give hosts 3, 3, 2 and 2 shards: the 2-shard hosts' examples seen 1.5x as often.
    assert [share.num_examples for share in shares] == [250, 250, 250, 250]
    wholes = [{shard["path"] for shard in share.whole} for share in shares]
    assert all(len(whole) == 2 for whole in wholes)
    assert len(set().union(*wholes)) == 8  # each whole shard read by one host only
    assert all(len(share.split) == 2 for share in shares)  # the 2 left over are split record by record


def test_unequal_shards_leave_the_smallest_to_be_split_record_by_record():
    sizes = [120, 118, 121, 119, 40]  # stage 1's last shard is often the small one
    shards = [{"path": f"train-{i}", "num_examples": n} for i, n in enumerate(sizes)]
    shares = [dataset.input_share(shards, 2, index) for index in range(2)]
    assert [shard["num_examples"] for shard in shares[0].split] == [40]
    # 121+119 and 120+118 whole, and 20 of the 40 each: within 2 examples of each other.
    assert sorted(share.num_examples for share in shares) == [258, 260]


def test_a_pipeline_with_less_than_a_batch_is_a_clear_error(stage1_dataset):
    data_dir, manifest = _load(stage1_dataset, "bfloat16")
    examples = manifest["splits"][manifest_lib.TRAIN]["num_examples"]
    context = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=3, num_replicas_in_sync=4)
    with pytest.raises(DatasetError, match="fewer than one batch"):
        dataset.make_train_dataset(data_dir, manifest, examples, input_context=context)


@pytest.mark.parametrize("encoding", ("bfloat16", "jpeg"))
def test_pipeline_is_non_deterministic_autotuned_and_free_of_python(stage1_dataset, encoding):
    data_dir, manifest = _load(stage1_dataset, encoding)
    pipelines = [
        dataset.make_train_dataset(data_dir, manifest, BATCH, augment=True),
        dataset.make_eval_dataset(data_dir, manifest, manifest_lib.VALIDATION, BATCH),
    ]
    for ds in pipelines:
        options = ds.options()
        assert options.deterministic is False
        assert options.autotune.enabled is True
        graph, ops = _graph_ops(ds)
        assert not ops & PYTHON_OPS
        constants = {node.name: node for node in graph.node if node.op == "Const"}
        parallel = [node for node in graph.node if node.op.startswith(("ParallelMap", "ParallelInterleave"))]
        assert {node.op for node in parallel} == {"ParallelMapDatasetV2", "ParallelInterleaveDatasetV4"}
        for node in parallel:
            assert node.attr["deterministic"].s == b"false", node.op
            # The last input is num_parallel_calls: AUTOTUNE (-1), not a fixed guess.
            parallelism = constants[node.input[-1].split(":")[0]]
            assert tf.make_ndarray(parallelism.attr["value"].tensor) == tf.data.AUTOTUNE, node.op
        prefetch = [node for node in graph.node if node.op == "PrefetchDataset"]
        assert (
            prefetch
            and tf.make_ndarray(constants[prefetch[-1].input[1]].attr["value"].tensor) == tf.data.AUTOTUNE
        )


@pytest.mark.parametrize("num_pipelines,num_replicas", [(1, 1), (1, 2), (2, 2), (4, 4), (3, 6)])
def test_evaluation_sees_every_example_once_whatever_the_replicas(
    stage1_dataset, num_pipelines, num_replicas
):
    data_dir, manifest = _load(stage1_dataset, "uint8")
    split = manifest_lib.VALIDATION
    steps = dataset.eval_steps(manifest, split, BATCH, num_pipelines, num_replicas)
    counts = []
    for pipeline in range(num_pipelines):
        context = tf.distribute.InputContext(num_pipelines, pipeline, num_replicas)
        batches = list(dataset.make_eval_dataset(data_dir, manifest, split, BATCH, context))
        # Replicas run in lockstep: every pipeline feeds `steps` batches to each of its replicas.
        assert len(batches) == steps * (num_replicas // num_pipelines)
        counts.append(sum(float(tf.reduce_sum(weights)) for _, _, weights in batches))
    assert sum(counts) == manifest["splits"][split]["num_examples"]


def test_eval_steps_pad_to_the_fullest_pipeline():
    manifest = {
        "splits": {
            "validation": {
                "shards": [{"num_examples": 10}, {"num_examples": 3}, {"num_examples": 7}],
            }
        }
    }
    # One pipeline: 20 examples in batches of 4.
    assert dataset.eval_steps(manifest, "validation", 4) == 5
    # Two pipelines: the shards of 10 and 7 whole, one each; the 3 records of the third split 2/1
    # (input_share). The first pipeline holds 12 examples: 3 batches, and the second pads to 3 too.
    assert dataset.eval_steps(manifest, "validation", 4, num_input_pipelines=2, num_replicas=2) == 3
    # Three pipelines, one whole shard each: the shard of 10 needs 3 batches.
    assert dataset.eval_steps(manifest, "validation", 4, num_input_pipelines=3, num_replicas=3) == 3
    # Batches of 2: the fullest of the two pipelines (12) needs 6, where whole shards alone (10+3 vs 7)
    # would have needed 7.
    assert dataset.eval_steps(manifest, "validation", 2, num_input_pipelines=2, num_replicas=2) == 6
    # One pipeline feeding two replicas: 5 batches -> 3 steps of 2 batches.
    assert dataset.eval_steps(manifest, "validation", 4, num_input_pipelines=1, num_replicas=2) == 3


def test_jpeg_decode_is_the_same_eagerly_and_inside_dataset_map(stage1_dataset):
    data_dir, manifest = _load(stage1_dataset, "jpeg")
    image_format = dataset.ImageFormat.from_manifest(manifest)
    paths = [
        manifest_lib.join(data_dir, shard["path"]) for shard in manifest["splits"]["validation"]["shards"]
    ]
    serialized = next(iter(tf.data.TFRecordDataset(paths).batch(BATCH)))
    eager = dataset.decode_images(dataset.parse_batch(serialized)["image"], image_format)
    mapped = next(
        iter(
            tf.data.Dataset.from_tensors(serialized).map(
                lambda s: dataset.decode_images(dataset.parse_batch(s)["image"], image_format)
            )
        )
    )
    np.testing.assert_array_equal(eager.numpy(), mapped.numpy())


def test_augmentation_keeps_shape_and_dtype_and_moves_pixels():
    images = tf.cast(tf.random.stateless_uniform([BATCH, 16, 16, 3], seed=[1, 2]), tf.bfloat16)
    augmented = dataset.augment_images(images)
    assert augmented.shape == images.shape and augmented.dtype == tf.bfloat16
    assert not np.array_equal(augmented.numpy(), images.numpy())
    # A shift or flip moves pixels; it does not invent values.
    assert set(np.unique(augmented.numpy())) <= set(np.unique(images.numpy()))
