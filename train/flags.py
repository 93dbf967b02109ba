"""The flags `python -m train` and `python -m train.bench_input` share: what model runs, where, how.

Both commands must build the same training setup from the same flags (the
benchmark measures the input and step that training would run), so the
flags and their mapping onto TrainConfig live here once.
"""

import argparse

from train import models
from train import strategy as strategy_lib
from train.config import TrainConfig

_JIT_COMPILE = {"auto": None, "on": True, "off": False}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """--model, --global-batch-size, --strategy, --tpu, --mixed-precision, --steps-per-execution,
    --jit-compile, --augment, --shuffle-buffer, with TrainConfig's defaults."""
    defaults = TrainConfig(data_dir="", model_dir="")
    parser.add_argument("--model", choices=models.MODELS, default=defaults.model, help="default %(default)s")
    parser.add_argument("--global-batch-size", type=positive_int, default=defaults.global_batch_size)
    parser.add_argument("--strategy", choices=strategy_lib.STRATEGIES, default=defaults.strategy)
    parser.add_argument(
        "--tpu", default=None, help="A TPU node name, or 'local' on a TPU VM (with --strategy auto or tpu)."
    )
    parser.add_argument(
        "--mixed-precision",
        choices=strategy_lib.MIXED_PRECISION_CHOICES,
        default=defaults.mixed_precision,
        help="auto: bfloat16 on TPU, off elsewhere (default).",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=positive_int,
        default=None,
        help="Training steps per device call (default: 32 on TPU, 1 elsewhere).",
    )
    parser.add_argument(
        "--jit-compile",
        choices=tuple(_JIT_COMPILE),
        default="auto",
        help="XLA-compile the train step on CPU/GPU (TPUs always compile).",
    )
    parser.add_argument("--augment", action="store_true", help="Random flips and shifts of training images.")
    parser.add_argument(
        "--shuffle-buffer",
        type=positive_int,
        default=defaults.shuffle_buffer,
        help="Examples held for shuffling (default %(default)s); host memory is this times the record size, "
        "e.g. 2048 x 294 KiB = 600 MB for bfloat16 224x224.",
    )


def setup_config_fields(args: argparse.Namespace) -> dict:
    """The TrainConfig fields that add_setup_flags sets, from parsed arguments."""
    return {
        "model": args.model,
        "global_batch_size": args.global_batch_size,
        "strategy": args.strategy,
        "tpu": args.tpu,
        "mixed_precision": args.mixed_precision,
        "steps_per_execution": args.steps_per_execution,
        "jit_compile": _JIT_COMPILE[args.jit_compile],
        "augment": args.augment,
        "shuffle_buffer": args.shuffle_buffer,
    }
