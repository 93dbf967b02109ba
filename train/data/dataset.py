"""The input pipeline: the shards of one split -> batches a TPU can consume at full speed.

    make_train_dataset   one input pipeline's endless, shuffled stream of (images, labels)
    make_eval_dataset    one input pipeline's single pass over a split: (images, labels, weights), padded
    make_split_pass      one pass over a split as Keras and TFDS give it: (images, labels), partial last batch
    distribute_train_dataset / distribute_eval_dataset
                         the same under a strategy, one pipeline per host
    input_share          which shards each host reads: whole shards of its own, and the few
                         left over (or all, when there are fewer shards than hosts) record by record

Everything is built from the manifest's shard list (never a glob) and plain
TF ops (no py_function), so the whole pipeline runs in the tf.data runtime,
in parallel, on every core of the host; on a multi-host TPU slice it runs on
each host's own TensorFlow server, where no Python of ours exists. Every element has a fully static
shape, batch dimension included, because XLA (and so a TPU) compiles one
program per shape.

Decoding a serialized example and turning it into model input are separate
pieces (`parse_batch`, `decode_images`, `normalize`), shared with the serving
export, so training and serving cannot drift apart.
"""

import dataclasses
import functools
import logging
import math

import tensorflow as tf

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from train.data.augment import center_crop, random_crop_and_flip
from train.errors import DatasetError

AUTOTUNE = tf.data.AUTOTUNE

# Read from up to this many shards at once (--parallel-files; per device by default,
# device_defaults.PARALLEL_FILES, 64 on a TPU host): on GCS each file in flight is one read
# stream, so this bounds what a host can read per second; each holds a READ_BUFFER_BYTES
# buffer, which bounds it the other way. Many files also mix examples from many shards.
DEFAULT_PARALLEL_FILES = 16
# TFRecordDataset's read-ahead per open file; large reads are what keep GCS
# at streaming speed (the 256 KiB default is tuned for local disks).
READ_BUFFER_BYTES = 8 << 20
DEFAULT_SHUFFLE_BUFFER = 2048

log = logging.getLogger(__name__)

_FEATURE_SPEC = {
    features.IMAGE: tf.io.FixedLenFeature([], tf.string),
    features.LABEL: tf.io.FixedLenFeature([], tf.int64),
}


@dataclasses.dataclass(frozen=True)
class ImageFormat:
    """What the pipeline needs to know about the stored images, from the manifest."""

    height: int
    width: int
    encoding: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # The square the model sees; smaller than height/width when stage 1 stored a crop margin.
    crop_size: int | None = None

    @classmethod
    def from_manifest(cls, manifest: dict) -> "ImageFormat":
        image, normalization = manifest["image"], manifest["normalization"]
        return cls(
            height=int(image["height"]),
            width=int(image["width"]),
            encoding=image["encoding"],
            mean=tuple(float(v) for v in normalization["mean"]),
            std=tuple(float(v) for v in normalization["std"]),
            crop_size=manifest_lib.crop_size(image),
        )

    @property
    def shape(self) -> tuple[int, int, int]:
        """The stored images' shape (what the records hold)."""
        return (self.height, self.width, features.CHANNELS)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """The shape the model takes: the stored one, or the crop of it with a crop margin."""
        size = self.crop_size or self.height
        return (size, size, features.CHANNELS)

    @property
    def has_crop_margin(self) -> bool:
        """Whether training crops at random and evaluation/serving take the center (stage 1's --crop-margin)."""
        return self.input_shape != self.shape

    @property
    def normalized_offline(self) -> bool:
        """True when stage 1 stored normalized values (bfloat16, float32), False for pixels (uint8, jpeg)."""
        return self.encoding in features.NORMALIZED_ENCODINGS

    @property
    def dtype(self) -> tf.DType:
        """The dtype of the pipeline's images, which is the dtype the model takes.

        bfloat16 and float32 are the normalized values stage 1 stored (the host
        only bitcasts them). uint8 and jpeg reach the model as uint8 pixels and
        are normalized in its first layer, on the accelerator: normalizing on
        the host would cost it a float32 write per pixel and send 4x the bytes
        to the device (benchmarks/RESULTS.md, target 5).
        """
        if self.encoding == features.BFLOAT16:
            return tf.bfloat16
        if self.encoding == features.FLOAT32:
            return tf.float32
        return tf.uint8

    @property
    def device_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(mean, std) for the model's first layer to apply, or None when stage 1 normalized already."""
        return None if self.normalized_offline else (self.mean, self.std)


# ---------------------------------------------------------------- per batch


def parse_batch(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """A batch of serialized Examples -> {'image': [B] bytes, 'label': [B] int64}, in one op."""
    return tf.io.parse_example(serialized, _FEATURE_SPEC)


def normalize(pixels: tf.Tensor, mean, std) -> tf.Tensor:
    """(pixel - mean) / std per channel, in float32, pixels in 0-255 units (as stage 1 does)."""
    mean = tf.constant(mean, tf.float32)
    std = tf.constant(std, tf.float32)
    return (tf.cast(pixels, tf.float32) - mean) / std


def _decode_jpeg(image_bytes: tf.Tensor, image_format: ImageFormat) -> tf.Tensor:
    pixels = tf.io.decode_jpeg(image_bytes, channels=features.CHANNELS)
    # A JPEG of another size would break the batch's static shape; fail loudly instead.
    return tf.ensure_shape(pixels, image_format.shape)


def decode_images(image_bytes: tf.Tensor, image_format: ImageFormat) -> tf.Tensor:
    """A batch of `image` features -> model input [B, H, W, 3] of `image_format.dtype`.

    bfloat16 and float32 come out normalized (as stage 1 stored them), uint8
    and jpeg as uint8 pixels (the model normalizes them: ImageFormat.dtype).
    The raw encodings decode the whole batch with one `decode_raw` (a bitcast
    for bfloat16 and float32, a reshape for uint8). JPEG has no
    batched decoder, so each image is decoded in a `map_fn` inside this
    batched map: the per-element overhead of a per-example `Dataset.map` is
    avoided, and several batches still decode at once (the map runs with
    num_parallel_calls), which keeps every core busy.
    """
    batch = image_bytes.shape[0] if image_bytes.shape.rank == 1 and image_bytes.shape[0] is not None else -1
    shape = [batch, *image_format.shape]
    encoding = image_format.encoding
    if encoding in (*features.NORMALIZED_ENCODINGS, features.UINT8):
        return tf.reshape(tf.io.decode_raw(image_bytes, image_format.dtype, little_endian=True), shape)
    if encoding == features.JPEG:
        return tf.map_fn(
            functools.partial(_decode_jpeg, image_format=image_format),
            image_bytes,
            fn_output_signature=tf.TensorSpec(image_format.shape, tf.uint8),
            parallel_iterations=16,
        )
    raise DatasetError(f"unknown image encoding {encoding!r}; expected one of {features.ENCODINGS}")


def augment_images(images: tf.Tensor, max_shift: int | None = None) -> tf.Tensor:
    """Random horizontal flip and random translation (pad + crop) of each image of a batch.

    Vectorized over the batch with gathers (no per-image map), and the output
    has the input's static shape. Padding reflects the border, so no
    artificial frame appears.
    """
    batch, height, width, _ = images.shape
    if max_shift is None:
        max_shift = max(1, min(height, width) // 8)
    padded = tf.pad(images, [[0, 0], [max_shift, max_shift], [max_shift, max_shift], [0, 0]], mode="REFLECT")
    top = tf.random.uniform([batch], 0, 2 * max_shift + 1, dtype=tf.int32)
    left = tf.random.uniform([batch], 0, 2 * max_shift + 1, dtype=tf.int32)
    rows = top[:, None] + tf.range(height)[None, :]
    cols = left[:, None] + tf.range(width)[None, :]
    images = tf.gather(padded, rows, axis=1, batch_dims=1)
    images = tf.gather(images, cols, axis=2, batch_dims=1)
    flip = tf.random.uniform([batch]) < 0.5
    return tf.where(flip[:, None, None, None], tf.reverse(images, axis=[2]), images)


# ---------------------------------------------------------------- files


def split_shards(manifest: dict, split: str) -> list[dict]:
    """The manifest's shard entries of `split`, in manifest order."""
    info = manifest["splits"].get(split)
    if not info or not info["shards"]:
        raise DatasetError(f"split {split!r} has no shards in {manifest_lib.MANIFEST_FILE}")
    return list(info["shards"])


@dataclasses.dataclass(frozen=True)
class InputShare:
    """What one input pipeline (one host) reads of a split.

    `whole` shards are read entirely by this pipeline and by no other.
    `split` shards are read by every pipeline, each keeping the records
    whose index in the shard is `index` modulo `count` (record-level
    sharding). `num_examples` is exact: what one pass over the share yields.
    """

    whole: tuple[dict, ...]
    split: tuple[dict, ...]
    count: int
    index: int

    @property
    def num_examples(self) -> int:
        kept = sum(_records_kept(shard["num_examples"], self.count, self.index) for shard in self.split)
        return sum(shard["num_examples"] for shard in self.whole) + kept

    @property
    def shards(self) -> tuple[dict, ...]:
        return self.whole + self.split


def _records_kept(num_records: int, count: int, index: int) -> int:
    """How many of records 0..num_records-1 have `record % count == index`."""
    return max(0, -(-(num_records - index) // count))


def input_share(shards: list, num_input_pipelines: int, input_pipeline_id: int) -> InputShare:
    """The share of `shards` that input pipeline `input_pipeline_id` of `num_input_pipelines` reads.

    Whole files where possible, so that a host reads only its own bytes: the
    largest `num_input_pipelines * k` shards go round-robin (largest first,
    so every host gets about as many examples). The few shards left over
    (fewer than one per pipeline) are split record by record among all
    pipelines, so that no host holds a whole extra shard: with 10 equal
    shards on 4 hosts, whole-file sharding alone gives hosts 3, 3, 2 and 2
    shards, and since every host contributes one batch per step, the
    examples of the 2-shard hosts would be seen 1.5x as often. When there
    are fewer shards than pipelines, every shard is split that way (the
    fallback: every host then reads every byte of the split).
    """
    count, index = num_input_pipelines, input_pipeline_id
    if count == 1:
        return InputShare(whole=tuple(shards), split=(), count=1, index=0)
    # Largest first, ties in manifest order: every pipeline computes the same assignment.
    ordered = sorted(shards, key=lambda shard: -int(shard["num_examples"]))
    num_whole = len(ordered) - len(ordered) % count
    return InputShare(
        whole=tuple(ordered[index:num_whole:count]),
        split=tuple(ordered[num_whole:]),
        count=count,
        index=index,
    )


def shards_for_input_pipeline(shards: list, input_context: tf.distribute.InputContext | None) -> InputShare:
    """input_share for the pipeline an InputContext describes (the whole split without one)."""
    if input_context is None:
        return input_share(shards, 1, 0)
    return input_share(shards, input_context.num_input_pipelines, input_context.input_pipeline_id)


def warn_if_record_sharded(num_shards: int, num_input_pipelines: int, split: str) -> None:
    """Say how to re-shard when a split has fewer shards than input pipelines."""
    if num_shards >= num_input_pipelines:
        return
    log.warning(
        "split %r has %d shard(s) for %d input pipelines (one per host): every host reads every shard and "
        "keeps one record in %d, so each host reads %dx the bytes it uses. Re-run preprocess with "
        "--min-shards %d (or a multiple of it) so that each host reads whole shards of its own",
        split,
        num_shards,
        num_input_pipelines,
        num_input_pipelines,
        num_input_pipelines,
        num_input_pipelines,
    )


def _read_records(path: tf.Tensor, count: tf.Tensor, index: tf.Tensor) -> tf.data.Dataset:
    # count=1, index=0 for a shard this pipeline reads whole.
    return tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER_BYTES).shard(count, index)


def _share_files(data_dir: str, share: InputShare) -> tf.data.Dataset:
    """(path, count, index) per shard of the share: the reader keeps records `index` mod `count`."""
    # Manifest paths are relative to the dataset directory and may name a subdirectory
    # (e.g. runs/<id>/train-3f9c0a1b2c4d-0000.tfrecord): joined, never assumed to be a bare file name.
    paths = [manifest_lib.join(data_dir, shard["path"]) for shard in share.shards]
    counts = [1] * len(share.whole) + [share.count] * len(share.split)
    indexes = [0] * len(share.whole) + [share.index] * len(share.split)
    return tf.data.Dataset.from_tensor_slices(
        (tf.constant(paths, tf.string), tf.constant(counts, tf.int64), tf.constant(indexes, tf.int64))
    )


def _interleave_records(
    files: tf.data.Dataset, num_files: int, parallel_files: int = DEFAULT_PARALLEL_FILES
) -> tf.data.Dataset:
    # deterministic=False: take a record from whichever file has one ready,
    # instead of stalling the round robin on the slowest read (GCS latency varies).
    return files.interleave(
        _read_records,
        cycle_length=max(1, min(num_files, parallel_files)),
        num_parallel_calls=AUTOTUNE,
        deterministic=False,
    )


def pipeline_options() -> tf.data.Options:
    """Options for every pipeline: throughput over order, tuned at run time."""
    options = tf.data.Options()
    options.deterministic = False  # the default for every parallel stage that does not set its own
    options.autotune.enabled = True  # AUTOTUNE parallelism and prefetch depths, adjusted while running
    # Files are sharded per pipeline above; tf.distribute must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


# ---------------------------------------------------------------- pipelines


def make_train_dataset(
    data_dir: str,
    manifest: dict,
    batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
    augment: bool = False,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    split: str = manifest_lib.TRAIN,
    parallel_files: int = DEFAULT_PARALLEL_FILES,
) -> tf.data.Dataset:
    """One input pipeline's endless stream of (images [B,H,W,3], labels [B]) for training.

    `batch_size` is the per-replica batch size (InputContext.get_per_replica_batch_size).
    `parallel_files` shards are read at once (--parallel-files).
    A dataset with a crop margin yields random crops, mirrored half the time,
    of the stored images (train/data/augment.py), whatever `augment`
    says; `augment` adds flips and shifts to datasets without one.
    """
    image_format = ImageFormat.from_manifest(manifest)
    all_shards = split_shards(manifest, split)
    share = shards_for_input_pipeline(all_shards, input_context)
    if share.index == 0:  # one warning per run, not one per host
        warn_if_record_sharded(len(all_shards), share.count, split)
    if share.num_examples < batch_size:
        raise DatasetError(
            f"input pipeline {share.index} of {share.count} gets {share.num_examples} example(s) of split "
            f"{split!r}, fewer than one batch of {batch_size}: lower --global-batch-size or train on fewer hosts"
        )

    # Shard first, shuffle second: every pipeline computes the same share
    # assignment from the manifest, so the shares stay disjoint; each pipeline
    # then shuffles its own files, anew on every pass (with few large shards,
    # file order is most of the randomness). Repeating the file list here,
    # before the readers, keeps the interleave full across epoch boundaries
    # instead of draining it.
    files = _share_files(data_dir, share)
    files = files.shuffle(len(share.shards), reshuffle_each_iteration=True).repeat()
    records = _interleave_records(files, len(share.shards), parallel_files)
    # The example shuffle mixes records from the open files; its buffer holds
    # serialized records, which are small for jpeg and up to H*W*12 bytes for float32.
    # A buffer larger than this pipeline's examples adds no randomness, only
    # repeated passes over the files to fill it (on GCS: re-opening every shard).
    records = records.shuffle(max(1, min(shuffle_buffer, share.num_examples)))
    # drop_remainder: every batch has the same static shape, which XLA needs.
    # Batching before parsing lets one parse_example / decode_raw handle the batch.
    batches = records.batch(batch_size, drop_remainder=True)

    def to_model_input(serialized):
        parsed = parse_batch(serialized)
        images = decode_images(parsed[features.IMAGE], image_format)
        if image_format.has_crop_margin:
            images = random_crop_and_flip(images, image_format.input_shape[0])
        elif augment:
            images = augment_images(images)
        return images, tf.cast(parsed[features.LABEL], tf.int32)

    batches = batches.map(to_model_input, num_parallel_calls=AUTOTUNE, deterministic=False)
    return batches.prefetch(AUTOTUNE).with_options(pipeline_options())


def eval_steps(
    manifest: dict, split: str, batch_size: int, num_input_pipelines: int = 1, num_replicas: int = 1
) -> int:
    """Steps that cover every example of `split` once, whichever pipeline holds the most.

    Every pipeline must yield the same number of batches (replicas run in
    lockstep), so each is padded to the number the fullest one needs.
    """
    replicas_per_pipeline = max(1, num_replicas // num_input_pipelines)
    shards = split_shards(manifest, split)
    steps = 0
    for pipeline in range(num_input_pipelines):
        examples = input_share(shards, num_input_pipelines, pipeline).num_examples
        batches = math.ceil(examples / batch_size)
        steps = max(steps, math.ceil(batches / replicas_per_pipeline))
    return max(steps, 1)


def make_eval_dataset(
    data_dir: str,
    manifest: dict,
    split: str,
    batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
    """One input pipeline's single pass over `split`: (images, labels, weights), static shapes.

    Evaluation must see every example exactly once, with the static shapes a
    TPU needs. So the last partial batch is padded with blank images of
    weight 0, and pipelines with fewer examples add blank batches until all
    yield `eval_steps` batches per replica; the metrics are weighted metrics,
    so padding counts for nothing. One scheme for every strategy: the path a
    TPU takes is the path the CPU tests take. With a crop margin, the images
    are the center crops of the stored ones, as serving takes them.
    """
    image_format = ImageFormat.from_manifest(manifest)
    share = shards_for_input_pipeline(split_shards(manifest, split), input_context)
    pipelines = input_context.num_input_pipelines if input_context else 1
    replicas = input_context.num_replicas_in_sync if input_context else 1
    steps = eval_steps(manifest, split, batch_size, pipelines, replicas)
    total_batches = steps * max(1, replicas // pipelines)
    real_batches = math.ceil(share.num_examples / batch_size)

    records = _interleave_records(_share_files(data_dir, share), len(share.shards))
    batches = records.batch(batch_size, drop_remainder=False)

    def to_padded_model_input(serialized):
        parsed = parse_batch(serialized)
        images = decode_images(parsed[features.IMAGE], image_format)
        if image_format.has_crop_margin:
            images = center_crop(images, image_format.input_shape[0])
        labels = tf.cast(parsed[features.LABEL], tf.int32)
        real = tf.shape(labels)[0]
        missing = batch_size - real
        images = tf.pad(images, [[0, missing], [0, 0], [0, 0], [0, 0]])
        labels = tf.pad(labels, [[0, missing]])
        weights = tf.pad(tf.ones([real], tf.float32), [[0, missing]])
        return (
            tf.ensure_shape(images, [batch_size, *image_format.input_shape]),
            tf.ensure_shape(labels, [batch_size]),
            tf.ensure_shape(weights, [batch_size]),
        )

    batches = batches.map(to_padded_model_input, num_parallel_calls=AUTOTUNE, deterministic=False)
    blank = tf.data.Dataset.from_tensors(
        (
            tf.zeros([batch_size, *image_format.input_shape], image_format.dtype),
            tf.zeros([batch_size], tf.int32),
            tf.zeros([batch_size], tf.float32),
        )
    )
    batches = batches.concatenate(blank.repeat(total_batches - real_batches))
    # take(): a shard holding more records than the manifest says must not add a step.
    return batches.take(total_batches).prefetch(AUTOTUNE).with_options(pipeline_options())


def make_split_pass(data_dir: str, manifest: dict, split: str, batch_size: int) -> tf.data.Dataset:
    """One pass over `split` as Keras' image_dataset_from_directory and TFDS give it: (images, labels).

    Every example exactly once and nothing else: batches of `batch_size`, the last one partial (the
    batch dimension is None), in an order fixed by the manifest, so that
    `model.predict` lines up with the labels of another pass (the same order on every pass). Keras' plain `metrics=["accuracy"]` and its
    loss count it right (the padded form of make_eval_dataset needs `weighted_metrics`). The dataset's
    cardinality is known (`len(ds)`), so Keras never warns that the input ran out of data. With a crop
    margin, the center crops, as evaluation and serving take them. Not for a multi-host strategy: its
    replicas need make_eval_dataset's static shapes and equal step counts.
    """
    image_format = ImageFormat.from_manifest(manifest)
    shards = split_shards(manifest, split)
    num_examples = sum(int(shard["num_examples"]) for shard in shards)
    files = _share_files(data_dir, input_share(shards, 1, 0))
    # deterministic=True: several files are still read at once, but their records come out in the same
    # round-robin order on every pass.
    records = files.interleave(
        _read_records,
        cycle_length=max(1, min(len(shards), DEFAULT_PARALLEL_FILES)),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )
    # take(): a shard holding more records than the manifest says must not add examples; fewer is an
    # error at the end of the pass (assert_cardinality), never a silently short evaluation.
    batches = records.take(num_examples).batch(batch_size, drop_remainder=False)

    def to_model_input(serialized):
        parsed = parse_batch(serialized)
        images = decode_images(parsed[features.IMAGE], image_format)
        if image_format.has_crop_margin:
            images = center_crop(images, image_format.input_shape[0])
        return images, tf.cast(parsed[features.LABEL], tf.int32)

    batches = batches.map(to_model_input, num_parallel_calls=AUTOTUNE, deterministic=True)
    batches = batches.apply(tf.data.experimental.assert_cardinality(math.ceil(num_examples / batch_size)))
    options = pipeline_options()
    options.deterministic = True
    return batches.prefetch(AUTOTUNE).with_options(options)


def distribute_train_dataset(
    strategy: tf.distribute.Strategy, data_dir: str, manifest: dict, global_batch_size: int, **kwargs
) -> tf.distribute.DistributedDataset:
    """make_train_dataset under `strategy`: each host builds its own pipeline over its own files."""

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        return make_train_dataset(data_dir, manifest, batch_size, input_context=input_context, **kwargs)

    return strategy.distribute_datasets_from_function(dataset_fn)


def distribute_eval_dataset(
    strategy: tf.distribute.Strategy, data_dir: str, manifest: dict, split: str, global_batch_size: int
) -> tuple[tf.distribute.DistributedDataset, int]:
    """make_eval_dataset under `strategy`, and the number of steps that covers `split` once.

    The steps come from the input contexts the strategy hands to the
    pipelines (how many pipelines, how many replicas), so they cannot
    disagree with what the pipelines yield.
    """
    steps = set()

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        steps.add(
            eval_steps(
                manifest,
                split,
                batch_size,
                input_context.num_input_pipelines,
                input_context.num_replicas_in_sync,
            )
        )
        return make_eval_dataset(data_dir, manifest, split, batch_size, input_context=input_context)

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    if len(steps) != 1:  # the strategy builds its pipelines right away, and they all agree
        raise RuntimeError(f"evaluation pipelines disagree on the number of steps: {sorted(steps)}")
    return distributed, steps.pop()
