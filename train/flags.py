"""The flags `python -m train` and `python -m train.bench_input` share: what model runs, where, how.

Both commands must build the same training setup from the same flags (the
benchmark measures the input and step that training would run), so the
flags and their mapping onto TrainConfig live here once. Nothing here
imports TensorFlow or Keras: `--help` and flag errors come back at once.
"""

import argparse

from train.config import JIT_COMPILE_CHOICES, MIXED_PRECISION_CHOICES, MODELS, STRATEGIES, TrainConfig

MULTI_STEP_BLOCKER = "keras-team/keras#19246"  # the same as train.accelerator's, without importing it


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """--model, --global-batch-size, --strategy, --tpu, --mixed-precision, --steps-per-execution,
    --jit-compile, --augment, --shuffle-buffer, --shared-filesystem, --verbose, with TrainConfig's defaults."""
    defaults = TrainConfig(data_dir="", model_dir="")
    parser.add_argument("--model", choices=MODELS, default=defaults.model, help="default %(default)s")
    parser.add_argument("--global-batch-size", type=positive_int, default=defaults.global_batch_size)
    parser.add_argument("--strategy", choices=STRATEGIES, default=defaults.strategy)
    parser.add_argument(
        "--tpu",
        default=None,
        help="'local' on a single-host TPU VM; the TPU's NAME for a multi-host slice (v4-32, v5litepod-16, ...), "
        "run on its worker 0: TensorFlow drives every host of the slice from there, and each host reads its "
        "own shards. Implies --strategy tpu.",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISION_CHOICES,
        default=defaults.mixed_precision,
        help="auto (default): bfloat16 on TPUs and on GPUs of compute capability >= 8.0, float16 with loss "
        "scaling on older GPUs, off (float32) on CPUs.",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=positive_int,
        default=None,
        help="Training steps per device call. Default: 32 on TPU, 8 on one GPU, 1 on CPU and under a "
        f"multi-replica MirroredStrategy or multi-worker strategy, where Keras 3 (3.15.1) cannot run more "
        f"({MULTI_STEP_BLOCKER}: its multi-step loop puts the cross-replica merge in a tf.cond).",
    )
    parser.add_argument(
        "--jit-compile",
        choices=JIT_COMPILE_CHOICES,
        default=defaults.jit_compile,
        help="XLA on CPU/GPU (TPUs always compile). auto (default): on for GPUs, off for CPUs. With several "
        "replicas XLA comes from TensorFlow's auto-clustering, since Keras cannot compile a step that spans "
        "replicas.",
    )
    parser.add_argument("--augment", action="store_true", help="Random flips and shifts of training images.")
    parser.add_argument(
        "--shuffle-buffer",
        type=positive_int,
        default=defaults.shuffle_buffer,
        help="Examples held for shuffling (default %(default)s); host memory is this times the record size, "
        "e.g. 2048 x 294 KiB = 600 MB for bfloat16 224x224.",
    )
    parser.add_argument(
        "--shared-filesystem",
        action="store_true",
        help="Allow local --data / --model-dir paths on more than one machine: every host mounts them at the "
        "same place (NFS, Filestore, gcsfuse). Without it, multi-host training needs gs:// paths.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Log at INFO (default: warnings only), TensorFlow's start-up too.",
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
        "jit_compile": args.jit_compile,
        "augment": args.augment,
        "shuffle_buffer": args.shuffle_buffer,
        "shared_filesystem": args.shared_filesystem,
    }
