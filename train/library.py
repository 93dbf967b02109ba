"""The package as a library: the input pipeline training uses, for your own Keras code.

    import train
    ds = train.load_dataset("/tmp/dataset", "train", batch_size=64)           # endless, shuffled
    val = train.load_dataset("/tmp/dataset", "validation", batch_size=64)     # one pass, as Keras gives it
    model.fit(ds, steps_per_epoch=100, validation_data=val)
    val.class_names, val.num_examples

It is `train.data.dataset`'s pipeline itself (make_train_dataset, make_split_pass,
make_eval_dataset), not a copy: the same manifest-listed shards, parallel
reads, crops. What the images hold is documented on `load_dataset`.
"""

import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.data import checks, dataset


def load_dataset(
    data_dir: str,
    split: str = manifest_lib.TRAIN,
    batch_size: int = 32,
    *,
    training: bool | None = None,
    padded: bool = False,
    normalized: bool = False,
    augment: bool = False,
    shuffle_buffer: int = dataset.DEFAULT_SHUFFLE_BUFFER,
) -> tf.data.Dataset:
    """The tf.data pipeline `python -m train` reads `split` of the dataset at `data_dir` with.

    `data_dir` is a stage 1 dataset directory (local or gs://); only the
    shards its dataset.json lists are read.

    training (default: True for the train split, False for the others):
      True: an endless stream of (images [B, S, S, 3], labels [B] int32),
        shuffled, batches of exactly `batch_size` (the remainder dropped), a
        fully static shape; a dataset written with a crop margin gives random
        crops, mirrored half the time; `augment` adds random flips and shifts
        to one without. Pass `steps_per_epoch` to Keras' fit.
      False: one pass over the split as Keras' image_dataset_from_directory
        and TFDS give it: (images, labels), every example exactly once, the
        last batch partial, the same order on every pass (so `model.predict`
        lines up with the labels), `len(ds)` batches. Plain
        `compile(metrics=["accuracy"])`, `evaluate` and `predict` count it
        right. With a crop margin, the center crop (as serving takes it).
    padded (one pass only): static shapes for XLA and TPUs, as the package's
      own evaluation reads: (images, labels, weights [B] float32), the last
      batch padded with blank images of label 0 and weight 0. Keras counts
      that right only with the metrics in `compile(weighted_metrics=[...])`
      (plain `metrics` count the blanks), and its loss is divided by the
      padded count: scale it by batches x B / num_examples, or sum
      loss x weight yourself. `predict` returns the blank rows too.

    images, with `normalized=False` (the default): what the package's own
    models take, by the dataset's encoding: uint8 0-255 RGB pixels for the
    uint8 and jpeg encodings, and (pixel - mean) / std per channel for
    bfloat16 and float32 (stage 1 stored those normalized), in that dtype.
    With `normalized=True`: float32 (pixel - mean) / std for every encoding,
    mean and std being dataset.json's `normalization` (computed by stage 1
    on the train split) - what a `--model module:function` network takes.

    S is the dataset's image size (its crop size with a crop margin). The
    returned dataset has `class_names` (dataset.json's `labels`, index =
    label) and `num_examples` (the split's), as attributes, as Keras'
    image_dataset_from_directory has `class_names`; a `.map()` makes a new
    dataset without them. Raises train.errors.DatasetError when the
    directory is not a complete dataset or `split` has no examples, and
    ValueError for `padded` with `training`.
    """
    manifest = checks.read_manifest(data_dir)
    checks.check_dataset(data_dir, manifest, splits=(split,))
    if training is None:
        training = split == manifest_lib.TRAIN
    if training and padded:
        raise ValueError(
            "padded=True is for one pass over a split (training=False); training batches are full"
        )
    if training:
        pipeline = dataset.make_train_dataset(
            data_dir, manifest, batch_size, augment=augment, shuffle_buffer=shuffle_buffer, split=split
        )
    elif padded:
        pipeline = dataset.make_eval_dataset(data_dir, manifest, split, batch_size)
    else:
        pipeline = dataset.make_split_pass(data_dir, manifest, split, batch_size)
    if normalized:
        image_format = dataset.ImageFormat.from_manifest(manifest)

        def normalize(images, *rest):
            if image_format.normalized_offline:
                return (tf.cast(images, tf.float32), *rest)
            return (dataset.normalize(images, image_format.mean, image_format.std), *rest)

        # deterministic=None: the pipeline's own option (a one-pass split keeps its order).
        pipeline = pipeline.map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
    pipeline.class_names = list(manifest["labels"])
    pipeline.num_examples = int(manifest["splits"][split]["num_examples"])
    return pipeline
