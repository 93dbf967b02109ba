"""The flags `python -m train` and `python -m train.tools.bench_input` share: what model runs, where, how.

Both commands must build the same training setup from the same flags (the
benchmark measures the input and step that training would run), so the
flags and their mapping onto TrainConfig live here once. Nothing here
imports TensorFlow or Keras: `--help` and flag errors come back at once.
"""

import argparse

from train.config import (
    JIT_COMPILE_CHOICES,
    MIXED_PRECISION_CHOICES,
    MODELS,
    STRATEGIES,
    USER_MODEL_SEPARATOR,
    TrainConfig,
)
from train.device import device_defaults
from train.model import lr_scaling
from train.model import recipe as recipe_lib


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def model_name(text: str) -> str:
    """--model: a built-in name, or module:function (checked for its form here, imported later)."""
    if text in MODELS:
        return text
    module, separator, function = text.partition(USER_MODEL_SEPARATOR)
    if separator and module and function:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r} is neither a built-in model ({', '.join(MODELS)}) nor module:function (e.g. my_models:tiny_net)"
    )


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """--model, --global-batch-size, --strategy, --tpu, --mixed-precision, --steps-per-execution,
    --jit-compile, --augment, --shuffle-buffer, --parallel-files, --shared-filesystem, --allow-cpu, --verbose,
    with TrainConfig's defaults."""
    defaults = TrainConfig(data_dir="", model_dir="")
    group = parser.add_argument_group("model and machine")
    per_replica = device_defaults.PER_REPLICA_BATCH
    parallel = device_defaults.PARALLEL_FILES
    group.add_argument(
        "--model",
        type=model_name,
        default=defaults.model,
        metavar="{" + ",".join(MODELS) + "} or module:function",
        help="A built-in model, or your own Keras network: module:function gets (input_shape, num_classes) "
        "and returns a keras.Model from normalized float32 images to logits (train/model/user_model.py). "
        "Default %(default)s.",
    )
    group.add_argument(
        "--global-batch-size",
        type=positive_int,
        default=defaults.global_batch_size,
        help=f"Images per step over all replicas. Default: per replica x replicas, {per_replica['tpu']} per TPU "
        f"replica (chip on v4 and later), {per_replica['gpu']} per GPU, {per_replica['cpu']} per CPU replica, at "
        f"{device_defaults.REFERENCE_IMAGE_SIZE}x{device_defaults.REFERENCE_IMAGE_SIZE}; less for larger images "
        "(x 224^2 / pixels) and for EfficientNet-B0 on GPUs; lowered to fit a small train split. The learning "
        "rate follows it (--learning-rate-scaling).",
    )
    group.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default=defaults.strategy,
        help="tf.distribute strategy; auto: a TPU if there is one, Mirrored over several GPUs, "
        "MultiWorkerMirrored under TF_CONFIG, else the default strategy.",
    )
    group.add_argument(
        "--tpu",
        default=None,
        help="'local' on a single-host TPU VM; the TPU's NAME for a multi-host slice (v4-32, v5litepod-16, ...), "
        "run on its worker 0: TensorFlow drives every host of the slice from there, and each host reads its "
        "own shards. Implies --strategy tpu.",
    )
    group.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISION_CHOICES,
        default=defaults.mixed_precision,
        help="auto (default): bfloat16 on TPUs and on GPUs of compute capability >= 8.0, float16 with loss "
        "scaling on older GPUs, off (float32) on CPUs.",
    )
    group.add_argument(
        "--steps-per-execution",
        type=positive_int,
        default=None,
        help="Training steps per device call (one host round trip per call). Default: 32 on TPU, 8 on GPUs "
        "(several GPUs run them in a tf.range loop around strategy.run, train/loop/multi_step.py), 1 on CPU.",
    )
    group.add_argument(
        "--jit-compile",
        choices=JIT_COMPILE_CHOICES,
        default=defaults.jit_compile,
        help="XLA on CPU/GPU (TPUs always compile). auto (default): on for GPUs, off for CPUs. With several "
        "replicas XLA comes from TensorFlow's auto-clustering, since Keras cannot compile a step that spans "
        "replicas.",
    )
    group.add_argument("--augment", action="store_true", help="Random flips and shifts of training images.")
    group.add_argument(
        "--shuffle-buffer",
        type=positive_int,
        default=defaults.shuffle_buffer,
        help="Examples held for shuffling (default %(default)s); host memory is this times the record size, "
        "e.g. 2048 x 294 KiB = 600 MB for bfloat16 224x224.",
    )
    group.add_argument(
        "--parallel-files",
        type=positive_int,
        default=defaults.parallel_files,
        help=f"Shards each host reads at once. Default: {parallel['tpu']} on a TPU host, {parallel['gpu']} on a GPU "
        f"host, {parallel['cpu']} on a CPU; each open file holds an 8 MiB read buffer. On GCS every file is one read "
        "stream, so this bounds a host's read bandwidth (train/device/device_defaults.py).",
    )
    group.add_argument(
        "--shared-filesystem",
        action="store_true",
        help="Allow local --data / --model-dir paths on more than one machine: every host mounts them at the "
        "same place (NFS, Filestore, gcsfuse). Without it, multi-host training needs gs:// paths.",
    )
    group.add_argument(
        "--allow-cpu",
        action="store_true",
        help="Train on the CPU although this machine has an NVIDIA GPU that TensorFlow cannot see (without "
        "it, that stops with the GPU install line: TensorFlow's CUDA libraries are missing).",
    )
    group.add_argument(
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
        "parallel_files": args.parallel_files,
        "shared_filesystem": args.shared_filesystem,
        "allow_cpu": args.allow_cpu,
    }


# --- The training recipe: weights, optimizer, schedule, regularization (issue 13) ---


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text}")
    return value


def add_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """--weights, --freeze-backbone-epochs, --optimizer, --base-learning-rate, --warmup-epochs/--warmup-steps,
    --weight-decay, --label-smoothing, --ema, --ema-momentum (see train/model/recipe.py)."""
    defaults = TrainConfig(data_dir="", model_dir="")
    adamw, sgd = recipe_lib.DEFAULTS[recipe_lib.ADAMW], recipe_lib.DEFAULTS[recipe_lib.SGD]
    recipe = parser.add_argument_group("training recipe")
    recipe.add_argument(
        "--weights",
        default=None,
        help="Where the backbone starts: 'imagenet' (keras.applications' published weights, from "
        "~/.keras/models or downloaded there once; not for small_cnn; offline, the error names the file to "
        "place there), 'none' (random), or a weights file, local or gs://: a run's backbone.weights.h5, "
        "the no-top .h5 Keras publishes for the backbone (e.g. resnet50_weights_tf_dim_ordering_tf_kernels_"
        "notop.h5, efficientnetb0_notop.h5), or a finished run's --model-dir. Only the backbone is loaded; "
        "the head is new. Default: none.",
    )
    recipe.add_argument(
        "--freeze-backbone-epochs",
        type=_non_negative_int,
        default=defaults.freeze_backbone_epochs,
        help="Train only the new head for this many epochs (the backbone frozen, its BatchNorm in inference "
        "mode), then the whole model (default %(default)s).",
    )
    recipe.add_argument(
        "--optimizer",
        choices=recipe_lib.OPTIMIZERS,
        default=defaults.optimizer,
        help=f"adamw (default; base learning rate {adamw.base_learning_rate:g}, weight decay "
        f"{adamw.weight_decay:g}) or sgd with Nesterov momentum 0.9 (base learning rate "
        f"{sgd.base_learning_rate:g}, weight decay {sgd.weight_decay:g}). Weight decay is decoupled and skips "
        "biases and normalization parameters.",
    )
    recipe.add_argument(
        "--base-learning-rate",
        type=float,
        default=None,
        help=f"Peak learning rate per {recipe_lib.REFERENCE_BATCH} images, scaled to --global-batch-size by "
        "--learning-rate-scaling (default: the optimizer's, above).",
    )
    recipe.add_argument(
        "--learning-rate-scaling",
        choices=lr_scaling.SCALINGS,
        default=defaults.learning_rate_scaling,
        help=f"How the peak learning rate follows the batch: linear (x batch / {lr_scaling.REFERENCE_BATCH}, Goyal et "
        f"al.), sqrt (x sqrt(batch / {lr_scaling.REFERENCE_BATCH})), or auto (default): linear for sgd; for adamw "
        f"linear up to {lr_scaling.REFERENCE_BATCH} images and sqrt above. The plan line says which was used.",
    )
    warmup = recipe.add_mutually_exclusive_group()
    warmup.add_argument(
        "--warmup-epochs",
        type=_non_negative_float,
        default=None,
        help="Linear warmup from 0 to the peak learning rate, then cosine decay to 0 "
        "(default: 1 epoch, at most a tenth of the run).",
    )
    warmup.add_argument("--warmup-steps", type=_non_negative_int, default=None, help="The warmup in steps.")
    recipe.add_argument(
        "--weight-decay",
        type=_non_negative_float,
        default=None,
        help="Decoupled weight decay (default: the optimizer's, above; 0 turns it off).",
    )
    recipe.add_argument(
        "--label-smoothing",
        type=_fraction,
        default=defaults.label_smoothing,
        help="Smooth the training targets: (1 - s) x one-hot + s / classes (default %(default)s; 0.1 is the "
        "ImageNet recipes' value). The reported cross-entropy stays unsmoothed.",
    )
    recipe.add_argument(
        "--ema",
        action="store_true",
        help="Keep an exponential moving average of the weights; the final evaluation, the export and "
        "backbone.weights.h5 use it.",
    )
    recipe.add_argument(
        "--ema-momentum",
        type=float,
        default=None,
        help="The EMA's decay per step (default: 1 - 10 / total steps, within [0.9, 0.9999]).",
    )


def recipe_config_fields(args: argparse.Namespace) -> dict:
    """The TrainConfig fields that add_recipe_flags sets, from parsed arguments."""
    return {
        "weights": args.weights,
        "freeze_backbone_epochs": args.freeze_backbone_epochs,
        "optimizer": args.optimizer,
        "base_learning_rate": args.base_learning_rate,
        "learning_rate_scaling": args.learning_rate_scaling,
        "warmup_epochs": args.warmup_epochs,
        "warmup_steps": args.warmup_steps,
        "weight_decay": args.weight_decay,
        "label_smoothing": args.label_smoothing,
        "ema": args.ema,
        "ema_momentum": args.ema_momentum,
    }
