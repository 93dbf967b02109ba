"""Nothing lost for speed: the same model, trained the same number of steps on our dataset and on
`keras.utils.image_dataset_from_directory` over the same images, reaches the same validation accuracy.

    python -m benchmarks.accuracy_parity --cache /tmp/bench-cache --images-per-class 300 --steps 400 \\
        --seeds 0,1,2

The corpus is the shape corpus (pipelines.sample_corpus.write_sample_corpus,
five classes, no broken files): learnable at 64x64 by the small CNN, with
photos of varied formats, sizes, modes and EXIF orientations. The photo corpus
is not used: its benchmark variants are copies, which would sit in both
splits.

The same images on both sides: the files image_dataset_from_directory can
read (.jpg .jpeg .png .bmp .gif; it has no WebP) go into a uri,label CSV,
stage 1 makes our dataset from it (64x64, bfloat16, split by content hash),
and the directory trees train/<class>/ and validation/<class>/ for Keras are
symlinks to exactly the files listed in our train and validation shards
(their `uri` feature). Both sides then train `train.model.models` small_cnn with
Adam and a cosine decay over `--steps` steps of 64 images, no augmentation,
from the same seed:

  ours   train.trainer.train_and_evaluate (validation accuracy from metrics)
  keras  image_dataset_from_directory(crop_to_aspect_ratio=True, bilinear) on the tree,
         normalized with our manifest's mean/std, batches of 64 (drop_remainder)

  target 6: |accuracy(ours) - accuracy(keras)| <= 2 points (medians over seeds)
"""

import argparse
import csv
import os
import shutil
import sys
import tempfile

import keras
import tensorflow as tf

from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, format_table, machine_line, median
from dataset_contract import features, verification
from dataset_contract import manifest as manifest_lib
from pipelines.sample_corpus import write_sample_corpus
from train.config import TrainConfig
from train.model import models
from train.trainer import train_and_evaluate

KERAS_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def shape_corpus(cache_dir: str, images_per_class: int, seed: int = 0) -> str:
    """The shape corpus without broken files, cached under `cache_dir`."""
    root = os.path.join(cache_dir, f"shapes-{images_per_class}-s{seed}")
    marker = os.path.join(root, ".complete")
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        write_sample_corpus(root, images_per_class=images_per_class, seed=seed, include_broken=False)
        open(marker, "w").close()
    return root


def write_keras_readable_csv(root: str, path: str) -> int:
    rows = [
        (file_path, class_name)
        for file_path, class_name in corpus_lib.corpus_files(root)
        if os.path.splitext(file_path)[1].lower() in KERAS_EXTENSIONS
    ]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["uri", "label"])
        writer.writerows(rows)
    return len(rows)


def split_uris(data_dir: str, manifest: dict, split: str) -> list[tuple[str, str]]:
    """(uri, class name) of every example of a split, read from its shards."""
    spec = {
        features.URI: tf.io.FixedLenFeature([], tf.string),
        features.CLASS_NAME: tf.io.FixedLenFeature([], tf.string),
    }
    paths = [os.path.join(data_dir, shard["path"]) for shard in manifest["splits"][split]["shards"]]
    found = []
    for record in tf.data.TFRecordDataset(paths):
        parsed = tf.io.parse_single_example(record, spec)
        found.append((parsed[features.URI].numpy().decode(), parsed[features.CLASS_NAME].numpy().decode()))
    return sorted(found)


def build_tree(uris: list[tuple[str, str]], root: str, labels: list[str]) -> None:
    """root/<class>/<file>: symlinks to the original files (a folder for every label, even if empty)."""
    for label in labels:
        os.makedirs(os.path.join(root, label), exist_ok=True)
    for uri, class_name in uris:
        class_dir = os.path.join(root, class_name)
        os.makedirs(class_dir, exist_ok=True)
        os.symlink(os.path.abspath(uri), os.path.join(class_dir, os.path.basename(uri)))


def train_ours(data_dir: str, steps: int, seed: int, learning_rate: float, batch: int) -> float:
    keras.utils.set_random_seed(seed)
    with tempfile.TemporaryDirectory() as model_dir:
        config = TrainConfig(
            data_dir=data_dir,
            model_dir=model_dir,
            model=models.SMALL_CNN,
            steps=steps,
            steps_per_epoch=steps,
            global_batch_size=batch,
            learning_rate=learning_rate,
            # Adam with a cosine decay from the first step, as the Keras side trains: no weight decay, no warmup.
            weight_decay=0.0,
            warmup_steps=0,
            export=False,
        )
        result = train_and_evaluate(config)
    return float(result["validation"]["accuracy"])


def _keras_dataset(tree: str, labels: list[str], size: int, manifest: dict, shuffle: bool, seed: int):
    dataset = keras.utils.image_dataset_from_directory(
        tree,
        class_names=labels,
        batch_size=None,
        image_size=(size, size),
        crop_to_aspect_ratio=True,
        shuffle=shuffle,
        seed=seed,
        verbose=False,
    )
    mean = tf.constant(manifest["normalization"]["mean"], tf.float32)
    std = tf.constant(manifest["normalization"]["std"], tf.float32)
    return dataset.map(lambda x, y: ((x - mean) / std, y), num_parallel_calls=tf.data.AUTOTUNE)


def train_keras(
    trees: dict, labels: list[str], manifest: dict, steps: int, seed: int, learning_rate: float, batch: int
) -> float:
    keras.utils.set_random_seed(seed)
    size = manifest["image"]["height"]
    train = _keras_dataset(trees["train"], labels, size, manifest, shuffle=True, seed=seed)
    train = train.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    validation = _keras_dataset(trees["validation"], labels, size, manifest, shuffle=False, seed=seed)
    validation = validation.batch(batch).prefetch(tf.data.AUTOTUNE)
    model = models.build_model(models.SMALL_CNN, (size, size, 3), len(labels))
    model.compile(
        optimizer=keras.optimizers.Adam(
            keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=steps)
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy"],
    )
    model.fit(train, steps_per_epoch=steps, epochs=1, verbose=2)
    return float(model.evaluate(validation, return_dict=True, verbose=0)["accuracy"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.accuracy_parity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Corpus and dataset cache.")
    parser.add_argument("--images-per-class", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workdir", default="/tmp/bench-accuracy")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument(
        "--tiny", action="store_true", help="Smoke test: 12 images per class, 32 px, 3 steps."
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.images_per_class, args.image_size, args.steps, args.seeds, args.batch_size = 12, 32, 3, "0", 8
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    os.makedirs(args.workdir, exist_ok=True)
    root = shape_corpus(args.cache, args.images_per_class)
    csv_path = os.path.join(args.workdir, "keras_readable.csv")
    num_files = write_keras_readable_csv(root, csv_path)
    data_dir = corpus_lib.stage1_dataset(
        args.cache,
        csv_path,
        image_size=args.image_size,
        encoding=features.BFLOAT16,
        extra_args=("--min-shards", "2"),
    )
    manifest = verification.read_manifest(data_dir)
    labels = manifest["labels"]
    trees = {}
    for split in (manifest_lib.TRAIN, manifest_lib.VALIDATION):
        trees[split] = os.path.join(args.workdir, "tree", split)
        shutil.rmtree(trees[split], ignore_errors=True)
        build_tree(split_uris(data_dir, manifest, split), trees[split], labels)
    counts = {split: manifest["splits"][split]["num_examples"] for split in trees}
    print(machine_line())
    print(
        f"corpus: {root}: {num_files} files Keras can read, {args.image_size}x{args.image_size}; "
        f"train {counts['train']}, validation {counts['validation']} (same files on both sides); "
        f"{args.steps} steps of {args.batch_size}",
        flush=True,
    )

    runs = []
    for seed in seeds:
        # Alternate which side goes first: nothing should depend on it, and nothing will hide if it does.
        sides = ("ours", "keras") if seed % 2 == 0 else ("keras", "ours")
        accuracy = {}
        for side in sides:
            if side == "ours":
                accuracy[side] = train_ours(data_dir, args.steps, seed, args.learning_rate, args.batch_size)
            else:
                accuracy[side] = train_keras(
                    trees, labels, manifest, args.steps, seed, args.learning_rate, args.batch_size
                )
            print(f"  seed {seed} {side:5s} validation accuracy {accuracy[side]:.4f}", flush=True)
        runs.append({"seed": seed, **accuracy})

    rows = [
        [r["seed"], f"{r['ours']:.4f}", f"{r['keras']:.4f}", f"{100 * (r['ours'] - r['keras']):+.1f}"]
        for r in runs
    ]
    ours_median = median(r["ours"] for r in runs)
    keras_median = median(r["keras"] for r in runs)
    rows.append(
        ["median", f"{ours_median:.4f}", f"{keras_median:.4f}", f"{100 * (ours_median - keras_median):+.1f}"]
    )
    print()
    print(format_table(["seed", "ours", "image_dataset_from_directory", "difference, points"], rows))
    gap = abs(ours_median - keras_median) * 100
    print(f"\n|difference of medians| = {gap:.1f} points; target <= 2: {'met' if gap <= 2 else 'NOT met'}")
    figures = {
        "corpus": root,
        "num_files": num_files,
        "splits": counts,
        "steps": args.steps,
        "runs": runs,
        "median": {"ours": ours_median, "keras": keras_median},
        "gap_points": gap,
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
