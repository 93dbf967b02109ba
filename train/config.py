"""What a training run is asked to do: TrainConfig, one field per flag of `python -m train`.

A notebook or a test builds the same run as the command line does. No
TensorFlow or Keras here: the commands parse their flags (and print --help)
from these names before paying for those imports. What the run will do,
resolved against the dataset and the device, is train/loop/plan.py.
"""

import argparse
import dataclasses
import os
import re
from collections.abc import Callable
from typing import Any

from train.errors import ConfigError
from train.model import lr_scaling

# The names `--model` accepts (train.model.models builds them).
# train.model.pretrained.APPLICATIONS holds the keras.applications ones (a test keeps the two in step).
SMALL_CNN = "small_cnn"
RESNET50 = "resnet50"
MOBILENET_V2 = "mobilenetv2"
MOBILENET_V3_SMALL = "mobilenetv3small"
MOBILENET_V3_LARGE = "mobilenetv3large"
EFFICIENTNET_B0 = "efficientnetb0"
MODELS = (SMALL_CNN, RESNET50, MOBILENET_V2, MOBILENET_V3_SMALL, MOBILENET_V3_LARGE, EFFICIENTNET_B0)
# Or your own network: `--model module:function` (train.model.user_model).
USER_MODEL_SEPARATOR = ":"


def is_user_model(name: str) -> bool:
    """Whether `--model` names a user's `module:function` rather than a built-in model."""
    return USER_MODEL_SEPARATOR in name


# `--backend`: Keras 3's backend, fixed when Keras is imported (KERAS_BACKEND); train.device.devices
# holds what differs between them.
TENSORFLOW, JAX = "tensorflow", "jax"
BACKENDS = (TENSORFLOW, JAX)
KERAS_BACKEND_ENV = "KERAS_BACKEND"

# `--strategy` (train.device.strategy resolves them).
STRATEGIES = ("auto", "tpu", "mirrored", "multiworker", "default")
# `--mixed-precision` and `--jit-compile` (train.device.accelerator decides what `auto` means per device).
MIXED_PRECISION_CHOICES = ("auto", "bfloat16", "float16", "off")
JIT_COMPILE_CHOICES = ("auto", "on", "off")

# `--optimizer` (train.model.recipe holds each one's defaults).
ADAMW, SGD = "adamw", "sgd"
OPTIMIZERS = (ADAMW, SGD)

# The groups of `python -m train --help`, in their order.
DATA_AND_OUTPUT = "data and output"
MODEL_AND_MACHINE = "model and machine"
LENGTH_AND_LEARNING_RATE = "training length and learning rate"
RECIPE = "training recipe"
CHECKPOINTS_AND_PROGRESS = "checkpoints and progress"
GROUPS = (DATA_AND_OUTPUT, MODEL_AND_MACHINE, LENGTH_AND_LEARNING_RATE, RECIPE, CHECKPOINTS_AND_PROGRESS)


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a TrainConfig field is set on the command line; train/flags.py makes the argparse flag from it.

    `help` may name {placeholders} that train/flags.py fills from the modules holding the figures (the
    batch per device, the optimizers' defaults), which import this one.
    """

    help: str
    group: str
    name: str = ""  # default: --the-field-name
    type: Callable[[str], Any] | None = None  # argparse's `type`: the text -> the value, or ArgumentTypeError
    choices: tuple | None = None
    metavar: str | None = None
    switch: bool = (
        False  # no value: store_true, or store_false (a `--no-...` name) for a field that defaults to True
    )
    exclusive: str = ""  # fields that share this key are mutually exclusive
    parse: Callable[[Any], Any] | None = None  # after parsing: the flag's value -> the field's (ConfigError)


def flag(default=dataclasses.MISSING, **settings) -> Any:
    """A TrainConfig field and its flag (Flag's arguments)."""
    return dataclasses.field(default=default, metadata={"flag": Flag(**settings)})


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
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


@dataclasses.dataclass(frozen=True)
class CheckpointInterval:
    """How often training saves a checkpoint besides the epoch ends: every `steps`, or every `seconds`."""

    steps: int | None = None
    seconds: float | None = None

    def due(self, steps_since_save: int, seconds_since_save: float) -> bool:
        if self.steps is not None:
            return steps_since_save >= self.steps
        if self.seconds is not None:
            return seconds_since_save >= self.seconds
        return False

    def describe(self) -> str:
        if self.steps is not None:
            return f"every {self.steps} steps"
        if self.seconds is not None:
            return f"every {self.seconds:g} s"
        return "at epoch ends only"


_TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_checkpoint_interval(text: str | None, flag: str = "--checkpoint-every") -> CheckpointInterval:
    """`500` -> every 500 steps; `90s`, `10m`, `1h` -> every so much time; None/`epoch` -> epoch ends only."""
    if text is None or text.strip().lower() in ("", "epoch", "none"):
        return CheckpointInterval()
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text.lower())
    if not match or float(match.group(1)) <= 0 or (not match.group(2) and "." in match.group(1)):
        raise ConfigError(
            f"{flag} {text!r}: expected a number of steps (500) or a time with a unit "
            "(90s, 10m, 1h), or 'epoch'"
        )
    number, unit = match.groups()
    if unit:
        return CheckpointInterval(seconds=float(number) * _TIME_UNITS[unit])
    return CheckpointInterval(steps=int(number))


def parse_preemption_check(text: str) -> CheckpointInterval:
    """--preemption-check-every: `20` -> every 20 steps; `1s` -> about a second's worth of steps."""
    interval = parse_checkpoint_interval(text, "--preemption-check-every")
    if interval.steps is None and interval.seconds is None:
        raise ConfigError(
            f"--preemption-check-every {text!r}: expected a number of steps (20) or a time (1s); "
            "the workers must check for a signal during an epoch"
        )
    return interval


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """`--profile-steps 100,110` -> (100, 110): profile from global step 100 to step 110."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", text)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < int(match.group(1)):
        raise ConfigError(
            f"--profile-steps {text!r}: expected FIRST,LAST global steps with 1 <= FIRST <= LAST"
        )
    return int(match.group(1)), int(match.group(2))


@dataclasses.dataclass
class TrainConfig:
    """One training run; each field with its flag (train/flags.py makes the command lines from them).

    Paths may be local or gs://. A field without a flag is for library callers only.
    """

    # --- data and output ---
    data_dir: str = flag(
        name="--data",
        group=DATA_AND_OUTPUT,
        help="The dataset directory (dataset.json + shards); local or gs://.",
    )
    model_dir: str = flag(
        group=DATA_AND_OUTPUT,
        help="Where checkpoints, TensorBoard logs, metrics.json and export/ go; local or gs://. An existing run "
        "there is resumed, mid-epoch included, on the dataset run it started on (MODEL_DIR/dataset_pin.json), "
        "whatever dataset.json names now.",
    )
    # --- model and machine ---
    model: str = flag(
        SMALL_CNN,
        group=MODEL_AND_MACHINE,
        type=model_name,
        metavar="{" + ",".join(MODELS) + "} or module:function",
        help="A built-in model, or your own Keras network: module:function gets (input_shape, num_classes) "
        "and returns a keras.Model from normalized float32 images to logits (train/model/user_model.py). "
        "Default %(default)s.",
    )
    # --- training length ---
    epochs: int | None = flag(
        10,
        group=LENGTH_AND_LEARNING_RATE,
        type=positive_int,
        exclusive="length",
        help="Passes over the train split.",
    )
    steps: int | None = flag(
        None,
        group=LENGTH_AND_LEARNING_RATE,
        type=positive_int,
        exclusive="length",
        help="Total training steps instead of --epochs, split into equal epochs of at most --steps-per-epoch.",
    )
    more_epochs: int = flag(
        0,
        group=LENGTH_AND_LEARNING_RATE,
        type=non_negative_int,
        help="Continue the finished run in --model-dir for this many more epochs, on purpose (Keras' "
        "initial_epoch): the same flags it was trained with, plus this one. The learning rate restarts: a "
        "linear warmup to the run's peak, then a cosine decay to 0 over the new epochs (the plan line says "
        "it). Interrupted, the same command resumes it; run again once finished, it adds as many again.",
    )
    steps_per_epoch: int | None = flag(
        None,
        group=LENGTH_AND_LEARNING_RATE,
        type=positive_int,
        help="Steps between epoch-end evaluations and checkpoints (default: one pass over the train split).",
    )
    global_batch_size: int | None = flag(
        None,
        group=MODEL_AND_MACHINE,
        type=positive_int,
        help="Images per step over all replicas. Default: per replica x replicas, {per_replica[tpu]} per TPU "
        "replica (chip on v4 and later), {per_replica[gpu]} per GPU, {per_replica[cpu]} per CPU replica, at "
        "{image_size}x{image_size}; less for larger images (x 224^2 / pixels) and for EfficientNet-B0 on GPUs; "
        "lowered to fit a small train split. The learning rate follows it (--learning-rate-scaling).",
    )
    learning_rate: float | None = flag(
        None,
        group=LENGTH_AND_LEARNING_RATE,
        type=float,
        help="The peak learning rate (default: --base-learning-rate x --global-batch-size / 256).",
    )
    backend: str | None = flag(
        None,
        group=MODEL_AND_MACHINE,
        choices=BACKENDS,
        help="Keras' backend. tensorflow: a tf.distribute strategy (--strategy). jax: "
        "keras.distribution.DataParallel over this process's devices (every TPU chip of the host; "
        "keras.distribution.initialize() on a multi-host slice), tf.data feeding it from the CPU; the serving "
        "export is the same SavedModel, written by a TensorFlow process from the trained weights. Default: "
        "$KERAS_BACKEND, else tensorflow. Set before Keras is imported, as KERAS_BACKEND is.",
    )
    strategy: str = flag(
        "auto",
        group=MODEL_AND_MACHINE,
        choices=STRATEGIES,
        help="tf.distribute strategy; auto: a TPU if there is one, Mirrored over several GPUs, "
        "MultiWorkerMirrored under TF_CONFIG, else the default strategy.",
    )
    tpu: str | None = flag(
        None,
        group=MODEL_AND_MACHINE,
        help="'local' on a single-host TPU VM; the TPU's NAME for a multi-host slice (v4-32, v5litepod-16, ...), "
        "run on its worker 0: TensorFlow drives every host of the slice from there, and each host reads its "
        "own shards. Implies --strategy tpu.",
    )
    mixed_precision: str = flag(
        "auto",
        group=MODEL_AND_MACHINE,
        choices=MIXED_PRECISION_CHOICES,
        help="auto (default): bfloat16 on TPUs and on GPUs of compute capability >= 8.0, float16 with loss "
        "scaling on older GPUs, off (float32) on CPUs.",
    )
    steps_per_execution: int | None = flag(
        None,
        group=MODEL_AND_MACHINE,
        type=positive_int,
        help="Training steps per device call (one host round trip per call). Default: 32 on TPU, 8 on GPUs "
        "(several GPUs run them in a tf.range loop around strategy.run, train/loop/multi_step.py), 1 on CPU.",
    )
    jit_compile: str = flag(
        "auto",
        group=MODEL_AND_MACHINE,
        choices=JIT_COMPILE_CHOICES,
        help="XLA on CPU/GPU (TPUs always compile). auto (default): on for GPUs, off for CPUs. With several "
        "replicas XLA comes from TensorFlow's auto-clustering, since Keras cannot compile a step that spans "
        "replicas.",
    )
    augment: bool = flag(
        False, group=MODEL_AND_MACHINE, switch=True, help="Random flips and shifts of training images."
    )
    verify_data: bool = flag(
        False,
        group=DATA_AND_OUTPUT,
        switch=True,
        help="Check every shard's sha256 against the manifest before training.",
    )
    shuffle_buffer: int = flag(
        2048,
        group=MODEL_AND_MACHINE,
        type=positive_int,
        help="Examples held for shuffling (default %(default)s); host memory is this times the record size, "
        "e.g. 2048 x 294 KiB = 600 MB for bfloat16 224x224.",
    )
    parallel_files: int | None = flag(
        None,
        group=MODEL_AND_MACHINE,
        type=positive_int,
        help="Shards each host reads at once. Default: {parallel_files[tpu]} on a TPU host, {parallel_files[gpu]} "
        "on a GPU host, {parallel_files[cpu]} on a CPU; each open file holds an 8 MiB read buffer. On GCS every "
        "file is one read stream, so this bounds a host's read bandwidth (train/device/device_defaults.py).",
    )
    export: bool = flag(
        True, name="--no-export", group=DATA_AND_OUTPUT, switch=True, help="Skip the serving export."
    )
    checkpoints_to_keep: int = 3
    # --- checkpoints and progress ---
    checkpoint_every: str | None = flag(
        "10m",
        group=CHECKPOINTS_AND_PROGRESS,
        help="Also checkpoint mid-epoch: every N steps (500) or every so much time (90s, 10m, 1h); 'epoch' for "
        "epoch ends only. A SIGKILL loses at most this much; Ctrl-C and SIGTERM lose nothing.",
    )
    preemption_check_every: str = flag(
        "1s",
        group=CHECKPOINTS_AND_PROGRESS,
        help="Multi-worker only: how often the workers agree whether one of them got SIGTERM/SIGHUP (a "
        "collective): every N steps (20), or every so much time's worth of steps, from the measured step time. "
        "A signal is acted on within this much.",
    )
    log_every: int = flag(
        100,
        group=CHECKPOINTS_AND_PROGRESS,
        type=positive_int,
        help="Steps between progress lines and TensorBoard step scalars: loss, learning rate, step time, "
        "images/s overall and per replica.",
    )
    eval_every: int | None = flag(
        None,
        group=CHECKPOINTS_AND_PROGRESS,
        type=positive_int,
        help="Also evaluate on the validation split every N steps (default: at epoch ends only).",
    )
    profile_steps: tuple[int, int] | None = flag(
        None,
        group=CHECKPOINTS_AND_PROGRESS,
        metavar="FIRST,LAST",
        parse=parse_profile_steps,
        help="Capture a TensorBoard profile of global steps FIRST to LAST into MODEL_DIR/logs (profile tab).",
    )
    shared_filesystem: bool = flag(
        False,
        group=MODEL_AND_MACHINE,
        switch=True,
        help="Allow local --data / --model-dir paths on more than one machine: every host mounts them at the "
        "same place (NFS, Filestore, gcsfuse). Without it, multi-host training needs gs:// paths.",
    )
    allow_cpu: bool = flag(
        False,
        group=MODEL_AND_MACHINE,
        switch=True,
        help="Train on the CPU although this machine has an NVIDIA GPU that TensorFlow cannot see (without "
        "it, that stops with the GPU install line: TensorFlow's CUDA libraries are missing).",
    )
    # --- the training recipe (train/model/: recipe, optimization, losses, pretrained, freeze) ---
    weights: str | None = flag(
        None,
        group=RECIPE,
        help="Where the backbone starts: 'imagenet' (keras.applications' published weights, from "
        "~/.keras/models or downloaded there once; not for small_cnn; offline, the error names the file to "
        "place there), 'none' (random), or a weights file, local or gs://: a run's backbone.weights.h5, "
        "the no-top .h5 Keras publishes for the backbone (e.g. resnet50_weights_tf_dim_ordering_tf_kernels_"
        "notop.h5, efficientnetb0_notop.h5), or a finished run's --model-dir. Only the backbone is loaded; "
        "the head is new. Default: none.",
    )
    freeze_backbone_epochs: int = flag(
        0,
        group=RECIPE,
        type=non_negative_int,
        help="Train only the new head for this many epochs (the backbone frozen, its BatchNorm in inference "
        "mode), then the whole model (default %(default)s).",
    )
    optimizer: str = flag(
        ADAMW,
        group=RECIPE,
        choices=OPTIMIZERS,
        help="adamw (default; base learning rate {adamw.base_learning_rate:g}, weight decay "
        "{adamw.weight_decay:g}) or sgd with Nesterov momentum 0.9 (base learning rate "
        "{sgd.base_learning_rate:g}, weight decay {sgd.weight_decay:g}). Weight decay is decoupled and skips "
        "biases and normalization parameters.",
    )
    base_learning_rate: float | None = flag(
        None,
        group=RECIPE,
        type=float,
        help="Peak learning rate per {reference_batch} images, scaled to --global-batch-size by "
        "--learning-rate-scaling (default: the optimizer's, above).",
    )
    learning_rate_scaling: str = flag(
        lr_scaling.AUTO,
        group=RECIPE,
        choices=lr_scaling.SCALINGS,
        help="How the peak learning rate follows the batch: linear (x batch / {reference_batch}, Goyal et al.), "
        "sqrt (x sqrt(batch / {reference_batch})), or auto (default): linear for sgd; for adamw linear up to "
        "{reference_batch} images and sqrt above. The plan line says which was used.",
    )
    warmup_epochs: float | None = flag(
        None,
        group=RECIPE,
        type=non_negative_float,
        exclusive="warmup",
        help="Linear warmup from 0 to the peak learning rate, then cosine decay to 0 "
        "(default: 1 epoch, at most a tenth of the run).",
    )
    warmup_steps: int | None = flag(
        None, group=RECIPE, type=non_negative_int, exclusive="warmup", help="The warmup in steps."
    )
    weight_decay: float | None = flag(
        None,
        group=RECIPE,
        type=non_negative_float,
        help="Decoupled weight decay (default: the optimizer's, above; 0 turns it off).",
    )
    label_smoothing: float = flag(
        0.0,
        group=RECIPE,
        type=fraction,
        help="Smooth the training targets: (1 - s) x one-hot + s / classes (default %(default)s; 0.1 is the "
        "ImageNet recipes' value). The reported cross-entropy stays unsmoothed.",
    )
    gradient_accumulation_steps: int = flag(
        1,
        group=RECIPE,
        type=positive_int,
        help="Average the gradients of N steps and update once (Keras' gradient_accumulation_steps): the "
        "optimizer sees N x --global-batch-size images per update, and the learning rate follows that batch. "
        "The schedule (warmup, decay, --warmup-steps) counts optimizer updates; N must divide an epoch's steps. "
        "Default %(default)s (an update every step).",
    )
    ema: bool = flag(
        False,
        group=RECIPE,
        switch=True,
        help="Keep an exponential moving average of the weights; the final evaluation, the export and "
        "backbone.weights.h5 use it.",
    )
    ema_momentum: float | None = flag(
        None,
        group=RECIPE,
        type=float,
        help="The EMA's decay per step (default: 1 - 10 / total steps, within [0.9, 0.9999]).",
    )


def resolve_backend(backend: str | None, environ=os.environ) -> str:
    """`--backend`, else $KERAS_BACKEND, else tensorflow; ConfigError for a backend this package does not run on."""
    chosen = backend or environ.get(KERAS_BACKEND_ENV) or TENSORFLOW
    if chosen not in BACKENDS:
        raise ConfigError(
            f"{KERAS_BACKEND_ENV}={chosen}: this package trains on the {' or '.join(BACKENDS)} backend; "
            f"unset {KERAS_BACKEND_ENV} or pass --backend {TENSORFLOW}|{JAX}"
        )
    return chosen


def requests_tpu(config: TrainConfig) -> bool:
    """Whether the flags ask for a TPU (--tpu NAME|local or --strategy tpu), before any strategy is resolved."""
    return config.tpu is not None or config.strategy == "tpu"


def check_paths_for_tpu(data_dir: str, model_dir: str, shared_filesystem: bool) -> None:
    """Refuse a local --data or --model-dir for training on a TPU.

    A spot or preemptible TPU VM is deleted with its disk: checkpoints on it
    cannot resume anything, and a multi-host slice's other hosts cannot read
    a dataset on worker 0's disk. --shared-filesystem (a mount that outlives
    the VM: Filestore, NFS, gcsfuse) allows local paths, as it does for
    multi-worker training (checks.check_paths_for_hosts).
    """
    if shared_filesystem:
        return
    named = paths_off_gcs(data_dir, model_dir)
    if named:
        raise ConfigError(
            f"{named}: not on gs://, but this training uses a TPU. A spot or preemptible TPU VM is deleted with its "
            "disk, taking the checkpoints with it, and the hosts of a slice read the dataset themselves: put the "
            "dataset and the model dir on gs://BUCKET/..., or pass --shared-filesystem for a mount that outlives "
            "the VM (Filestore, NFS, gcsfuse)"
        )


def paths_off_gcs(data_dir: str, model_dir: str) -> str:
    """`--data PATH, --model-dir PATH` for those of the two not on gs://; empty when both are."""
    return ", ".join(
        f"{flag} {path}"
        for flag, path in (("--data", data_dir), ("--model-dir", model_dir))
        if not path.startswith("gs://")
    )
