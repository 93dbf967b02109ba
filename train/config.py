"""What a training run is asked to do: TrainConfig, one field per flag of `python -m train`.

A notebook or a test builds the same run as the command line does. No
TensorFlow or Keras here: the commands parse their flags (and print --help)
from these names before paying for those imports. What the run will do,
resolved against the dataset and the device, is train/loop/plan.py.
"""

import dataclasses
import re

from train.errors import ConfigError

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


# `--strategy` (train.device.strategy resolves them).
STRATEGIES = ("auto", "tpu", "mirrored", "multiworker", "default")
# `--mixed-precision` and `--jit-compile` (train.device.accelerator decides what `auto` means per device).
MIXED_PRECISION_CHOICES = ("auto", "bfloat16", "float16", "off")
JIT_COMPILE_CHOICES = ("auto", "on", "off")


@dataclasses.dataclass
class TrainConfig:
    """One training run. Paths may be local or gs://."""

    data_dir: str
    model_dir: str
    model: str = "small_cnn"
    epochs: int | None = 10  # passes over the train split; ignored when `steps` is set
    steps: int | None = None  # total training steps instead of epochs
    steps_per_epoch: int | None = None  # default: one pass over the train split
    global_batch_size: int | None = None  # None: per replica x replicas, per device (device_defaults.py)
    learning_rate: float | None = None  # the peak; None: base_learning_rate scaled by the batch (recipe.py)
    strategy: str = "auto"  # auto|tpu|mirrored|multiworker|default
    tpu: str | None = None  # a TPU name (a multi-host slice from its worker 0), or "local" on a TPU VM
    mixed_precision: str = "auto"  # auto|bfloat16|float16|off; auto: per device (train.device.accelerator)
    steps_per_execution: int | None = None  # None: per device (train.device.accelerator)
    jit_compile: str = "auto"  # auto|on|off: XLA on CPU/GPU (TPUs always compile)
    augment: bool = False
    verify_data: bool = False  # sha256 of every shard before training
    shuffle_buffer: int = 2048  # examples
    parallel_files: int | None = None  # shards each host reads at once; None: per device (device_defaults.py)
    export: bool = True  # write the serving SavedModel at the end
    checkpoints_to_keep: int = 3
    checkpoint_every: str | None = "10m"  # steps ("500") or time ("30s", "10m", "1h"); None: epoch ends only
    # Multi-worker: how often the workers agree on stopping for a signal (a collective), steps or time.
    preemption_check_every: str = "1s"
    log_every: int = 100  # steps between TensorBoard step scalars and progress lines
    eval_every: int | None = None  # steps between evaluations, besides the one at each epoch end
    profile_steps: tuple[int, int] | None = None  # (first, last) global step of a TensorBoard profile
    shared_filesystem: bool = False  # local paths are the same on every host (NFS, gcsfuse)
    allow_cpu: bool = False  # train on the CPU although the machine has an NVIDIA GPU TensorFlow cannot see
    # --- The training recipe (recipe.py, optimization.py, losses.py, pretrained.py, freeze.py) ---
    # Where the backbone starts: None (random), "imagenet", or a .weights.h5 file / a finished run's model dir.
    weights: str | None = None
    freeze_backbone_epochs: int = 0  # train the new head alone for this many epochs first
    optimizer: str = "adamw"  # adamw|sgd, both with decoupled weight decay
    base_learning_rate: float | None = None  # per 256 images; None: the optimizer's default
    learning_rate_scaling: str = "auto"  # auto|linear|sqrt: how the peak follows the batch (lr_scaling.py)
    # Linear warmup; with neither: 1 epoch, at most 10% of the run.
    warmup_epochs: float | None = None
    warmup_steps: int | None = None
    weight_decay: float | None = None  # None: the optimizer's default; never on biases and norm parameters
    label_smoothing: float = 0.0
    ema: bool = False  # exponential moving average of the weights, used by the final evaluation and export
    ema_momentum: float | None = None  # None: 1 - 10 / total steps, within [0.9, 0.9999]


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
