"""Command line of stage 2: train, evaluate and export a classifier on a stage 1 dataset.

On this machine (CPU, or every local GPU through MirroredStrategy), the
recommended first run on one's own photos (fine-tuning ImageNet weights):

    python -m train --data /tmp/dataset --model-dir /tmp/run1 --model mobilenetv3small --weights imagenet

On a Cloud TPU VM (TPUStrategy, bfloat16 and 32 steps per execution by default):

    python -m train --data gs://BUCKET/dataset --model-dir gs://BUCKET/runs/run1 \\
        --tpu local --model resnet50 --global-batch-size 1024 --epochs 90 \\
        --optimizer sgd --warmup-epochs 5 --label-smoothing 0.1

(the dataset preprocessed with --crop-margin 0.143: random 224 crops of 256 squares).

Running the same command again after an interruption resumes from the last
checkpoint in --model-dir. Problems with the dataset, the flags or the
machine are printed as one message (no traceback) and exit with status 2.
"""

import argparse
import logging
import sys

from train import flags
from train.config import TrainConfig
from train.errors import SetupError
from train.trainer import train_and_evaluate


def build_parser() -> argparse.ArgumentParser:
    defaults = TrainConfig(data_dir="", model_dir="")
    parser = argparse.ArgumentParser(
        prog="python -m train",
        description="Train a Keras image classifier on a dataset directory written by `python -m preprocess`, "
        "evaluate it on the validation split and export a SavedModel that serves encoded image bytes.",
    )
    parser.add_argument(
        "--data", required=True, help="The dataset directory (dataset.json + shards); local or gs://."
    )
    parser.add_argument(
        "--model-dir",
        required=True,
        help="Where checkpoints, TensorBoard logs, metrics.json and export/ go; local or gs://. "
        "An existing run there is resumed.",
    )
    flags.add_setup_flags(parser)
    flags.add_recipe_flags(parser)
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--epochs",
        type=flags.positive_int,
        default=defaults.epochs,
        help="Passes over the train split (default %(default)s).",
    )
    length.add_argument(
        "--steps",
        type=flags.positive_int,
        default=None,
        help="Total training steps instead of --epochs, split into equal epochs of at most --steps-per-epoch.",
    )
    parser.add_argument(
        "--steps-per-epoch",
        type=flags.positive_int,
        default=None,
        help="Steps between checkpoints and evaluations (default: one pass over the train split).",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=defaults.learning_rate,
        help="The peak learning rate, instead of --base-learning-rate x --global-batch-size / 256.",
    )
    parser.add_argument(
        "--verify-data",
        action="store_true",
        help="Check every shard's sha256 against the manifest before training.",
    )
    parser.add_argument("--no-export", dest="export", action="store_false", help="Skip the serving export.")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        data_dir=args.data,
        model_dir=args.model_dir,
        epochs=args.epochs,
        steps=args.steps,
        steps_per_epoch=args.steps_per_epoch,
        learning_rate=args.learning_rate,
        verify_data=args.verify_data,
        export=args.export,
        **flags.setup_config_fields(args),
        **flags.recipe_config_fields(args),
    )


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)  # TF's per-checkpoint chatter
    config = config_from_args(build_parser().parse_args(argv))
    try:
        train_and_evaluate(config)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
