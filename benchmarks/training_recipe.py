"""The training recipe on a fixed budget of steps: fine-tuning from pretrained weights vs. training from
scratch, and random crops of a crop margin vs. none, on a train split small enough that augmentation
matters.

    python -m benchmarks.training_recipe --cache /tmp/bench-cache --seeds 0,1,2

Two generated corpora (pipelines.sample_corpus), each through the real stage 1 (uint8, cached):

  pretraining  the shape corpus: 5 classes (circle, cross, square, star, triangle), one shape per
               image on noisy backgrounds, in every format and mode; `--pretrain-images-per-class`
  target       the photo corpus: photo-like JPEGs in 4 classes (circle, cross, square, star), the
               class's shape the largest of 2-4 soft shapes of any kind on a textured gradient;
               `--photos` photos, split `--split` by content hash (a small train split, a large
               validation split), written twice: without and with `--crop-margin 0.14` (same
               photos in the same splits: the split is by content hash)

The small CNN (train.model.models) is pretrained once on the shape corpus (`--pretrain-steps`), then
every contender trains on the photo corpus for the same `--steps` steps of `--batch-size`, with the
same recipe (AdamW, the same peak learning rate, warmup + cosine, weight decay), from the same seed:

  scratch             random initialization, no augmentation (the baseline)
  fine-tune           --weights <the pretraining run>: its backbone, a new head
  crop margin         the --crop-margin 0.14 dataset: random 64x64 crops of the 73x73 stored squares
                      plus flips in training, the center crop for evaluation
  flips+shifts        --augment on the plain dataset (the pipeline's flips and reflected shifts), for
                      reference
  fine-tune + margin  both

Reported: validation accuracy per seed, the median over seeds, and each contender's median
difference to scratch in points. Expected: fine-tuning wins clearly; augmentation does not lose.
"""

import argparse
import os
import shutil
import sys
import tempfile

import keras

from benchmarks import accuracy_parity
from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, format_table, machine_line, median
from dataset_contract import features, verification
from dataset_contract import manifest as manifest_lib
from train.config import TrainConfig
from train.model import models
from train.trainer import train_and_evaluate

CROP_MARGIN = 0.14
# Small photos: stage 1 makes 64-73 px squares of them, and they render in milliseconds.
PHOTO_MEGAPIXELS = (0.03, 0.08)
SCRATCH, FINE_TUNE, MARGIN, FLIPS_SHIFTS, FINE_TUNE_MARGIN = (
    "scratch",
    "fine-tune",
    "crop margin",
    "flips+shifts",
    "fine-tune + margin",
)
CONTENDERS = (SCRATCH, FINE_TUNE, MARGIN, FLIPS_SHIFTS, FINE_TUNE_MARGIN)


def train_once(data_dir: str, model_dir: str, args, seed: int, steps: int, **recipe) -> dict:
    """One run of `steps` steps as a single epoch (one evaluation, at the end); returns metrics.json."""
    keras.utils.set_random_seed(seed)
    config = TrainConfig(
        data_dir=data_dir,
        model_dir=model_dir,
        model=models.SMALL_CNN,
        steps=steps,
        steps_per_epoch=steps,
        global_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        export=False,
        **recipe,
    )
    return train_and_evaluate(config)


def pretrain(args, shapes_dir: str) -> str:
    """The pretraining run's model dir (its backbone.weights.h5 is what --weights loads)."""
    model_dir = os.path.join(args.workdir, "pretrain")
    shutil.rmtree(model_dir, ignore_errors=True)
    metrics = train_once(shapes_dir, model_dir, args, seed=0, steps=args.pretrain_steps)
    print(
        f"pretraining on the shape corpus: {args.pretrain_steps} steps, validation accuracy "
        f"{metrics['validation']['accuracy']:.4f} on {metrics['validation']['num_examples']} images",
        flush=True,
    )
    return model_dir


def run_contender(contender: str, datasets: dict, pretrained_dir: str, args, seed: int) -> float:
    plain, margin = datasets["plain"], datasets["margin"]
    data_dir, recipe = {
        SCRATCH: (plain, {}),
        FINE_TUNE: (plain, {"weights": pretrained_dir}),
        MARGIN: (margin, {}),
        FLIPS_SHIFTS: (plain, {"augment": True}),
        FINE_TUNE_MARGIN: (margin, {"weights": pretrained_dir}),
    }[contender]
    with tempfile.TemporaryDirectory(dir=args.workdir) as model_dir:
        metrics = train_once(data_dir, model_dir, args, seed, args.steps, **recipe)
    return float(metrics["validation"]["accuracy"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.training_recipe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Corpus and dataset cache.")
    parser.add_argument("--workdir", default="/tmp/bench-recipe")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--pretrain-images-per-class", type=int, default=200)
    parser.add_argument("--pretrain-steps", type=int, default=600)
    parser.add_argument("--photos", type=int, default=1000)
    parser.add_argument(
        "--split",
        default="0.2,0.8,0.0",
        help="train,validation,test of the photo corpus (default %(default)s).",
    )
    parser.add_argument("--steps", type=int, default=300, help="The budget of every contender.")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="The peak, for every run.")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument(
        "--tiny", action="store_true", help="Smoke test: a few images, 32 px, 3 steps, three contenders."
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.image_size, args.pretrain_images_per_class, args.photos = 32, 6, 24
        args.pretrain_steps, args.steps, args.batch_size, args.seeds = 3, 3, 4, "0"
        args.split = "0.5,0.5,0.0"
        if args.contenders == ",".join(CONTENDERS):
            args.contenders = ",".join((SCRATCH, FINE_TUNE, MARGIN))
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown or SCRATCH not in contenders:
        raise SystemExit(
            f"--contenders: {sorted(unknown)} unknown; choose from {CONTENDERS}, scratch included"
        )
    os.makedirs(args.workdir, exist_ok=True)

    shapes_root = accuracy_parity.shape_corpus(args.cache, args.pretrain_images_per_class)
    shapes_dir = corpus_lib.stage1_dataset(
        args.cache,
        shapes_root,
        image_size=args.image_size,
        encoding=features.UINT8,
        extra_args=("--min-shards", "2"),
    )
    photos_root = corpus_lib.photo_pool(
        args.cache, args.photos, classes=4, seed=1, megapixels=PHOTO_MEGAPIXELS, processes=2
    )
    split_args = ("--split", args.split, "--min-shards", "2")
    datasets = {
        "plain": corpus_lib.stage1_dataset(
            args.cache,
            photos_root,
            image_size=args.image_size,
            encoding=features.UINT8,
            extra_args=split_args,
        ),
        "margin": corpus_lib.stage1_dataset(
            args.cache,
            photos_root,
            image_size=args.image_size,
            encoding=features.UINT8,
            extra_args=(*split_args, "--crop-margin", str(CROP_MARGIN)),
        ),
    }
    manifest = verification.read_manifest(datasets["margin"])
    counts = {
        split: manifest["splits"][split]["num_examples"]
        for split in (manifest_lib.TRAIN, manifest_lib.VALIDATION)
    }
    stored = manifest["image"]["height"]
    print(machine_line())
    print(
        f"pretraining corpus: {shapes_root} (shapes, 5 classes); target corpus: {photos_root} (photos, 4 classes), "
        f"train {counts['train']}, validation {counts['validation']}; {args.image_size}x{args.image_size} "
        f"(crop margin: {stored}x{stored} stored); small_cnn, {args.steps} steps of {args.batch_size}, "
        f"peak learning rate {args.learning_rate:g}",
        flush=True,
    )
    pretrained_dir = pretrain(args, shapes_dir)

    accuracy = {contender: {} for contender in contenders}
    for seed in seeds:
        # Rotate the order: nothing should depend on it, and nothing will hide if something does.
        order = contenders[seed % len(contenders) :] + contenders[: seed % len(contenders)]
        for contender in order:
            accuracy[contender][seed] = run_contender(contender, datasets, pretrained_dir, args, seed)
            print(
                f"  seed {seed} {contender:20s} validation accuracy {accuracy[contender][seed]:.4f}",
                flush=True,
            )

    medians = {contender: median(accuracy[contender].values()) for contender in contenders}
    rows = []
    for contender in contenders:
        gain = 100 * (medians[contender] - medians[SCRATCH])
        rows.append(
            [contender]
            + [f"{accuracy[contender][seed]:.4f}" for seed in seeds]
            + [f"{medians[contender]:.4f}", "-" if contender == SCRATCH else f"{gain:+.1f}"]
        )
    print()
    print(format_table(["contender", *[f"seed {s}" for s in seeds], "median", "vs scratch, points"], rows))
    figures = {
        "pretraining_corpus": shapes_root,
        "target_corpus": photos_root,
        "splits": counts,
        "image_size": args.image_size,
        "stored_size_with_margin": stored,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "pretrain_steps": args.pretrain_steps,
        "accuracy": {c: {str(s): v for s, v in per_seed.items()} for c, per_seed in accuracy.items()},
        "median": medians,
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
