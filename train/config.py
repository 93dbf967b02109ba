"""What a training run is asked to do (TrainConfig) and what it will do (TrainingPlan).

TrainConfig mirrors the command line one field per flag, so a notebook or a
test builds the same run as `python -m train ...` does. TrainingPlan is the
config resolved against the dataset and the strategy: epochs, steps and
batch sizes as numbers, checked for consistency before anything is built.

This module imports neither TensorFlow nor Keras: the command line parses
its flags (and prints --help) from the names defined here before paying for
those imports.
"""

import dataclasses
import math
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

# On a TPU every host->device round trip costs about as much as a small step,
# so a TPU runs many steps per call by default.
TPU_STEPS_PER_EXECUTION = 32


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


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """The numbers a run trains with, resolved from the config, the dataset and the replica count."""

    epochs: int
    steps_per_epoch: int
    steps_per_execution: int
    global_batch_size: int
    per_replica_batch_size: int
    num_replicas: int
    batch_rule: str = "--global-batch-size"  # where the global batch came from, for the plan line
    parallel_files: int = 16  # shards each host reads at once (dataset.py)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def describe_batch(self) -> str:
        """The global batch and where it came from, for the plan line."""
        if self.batch_rule == "--global-batch-size":
            return f"global batch {self.global_batch_size} (--global-batch-size; {self.per_replica_batch_size} per replica)"
        return f"global batch {self.global_batch_size} = {self.batch_rule}"

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, step within that epoch) of a global step: where a run resumed at `step` continues."""
        step = min(step, self.total_steps)
        return step // self.steps_per_epoch, step % self.steps_per_epoch


def steps_per_execution_dividing(steps_per_epoch: int, wanted: int) -> int:
    """The divisor of `steps_per_epoch` to run per execution when `wanted` does not divide it.

    The divisor nearest `wanted` between half and twice it (the smaller on a
    tie: callbacks, progress lines and a signal's save come at execution
    boundaries), so that an epoch of 100 steps runs 25 at a time rather than
    the 32 a TPU wants, and one of 74 runs 37 rather than 2. Only when no
    divisor lies that near (a prime number of steps, say) the largest one below
    `wanted`, possibly 1: the caller warns then (accelerator.steps_per_execution_warning).
    """
    near = [
        divisor
        for divisor in range(max(1, -(-wanted // 2)), min(steps_per_epoch, 2 * wanted) + 1)
        if steps_per_epoch % divisor == 0
    ]
    if near:
        return min(near, key=lambda divisor: (abs(divisor - wanted), divisor))
    return max(d for d in range(1, min(steps_per_epoch, wanted) + 1) if steps_per_epoch % d == 0)


def resolve_global_batch(
    config: TrainConfig, num_train_examples: int, num_replicas: int, defaults
) -> tuple[int, str]:
    """(global batch, the rule that gave it): --global-batch-size, else the device's batch per replica x replicas.

    `defaults` is a device_defaults.DeviceDefaults. A default larger than the
    train split is lowered to fit it (a flag is not: plan_training refuses that
    with the numbers), so that a small dataset trains without a flag.
    """
    if config.global_batch_size is not None:
        return config.global_batch_size, "--global-batch-size"
    per_replica, reason = defaults.batch.per_replica, defaults.batch.reason
    fits = num_train_examples // num_replicas
    if 1 <= fits < per_replica:
        reason = f"lowered from the default {per_replica}, {reason}, to fit the train split's {num_train_examples} examples"
        per_replica = fits // 8 * 8 if fits >= 8 else fits
    replicas = f"{num_replicas} replica{'s' if num_replicas != 1 else ''}"
    return per_replica * num_replicas, f"{per_replica} per replica ({reason}) x {replicas}"


def plan_training(
    config: TrainConfig,
    num_train_examples: int,
    num_replicas: int,
    on_tpu: bool,
    multi_step_supported: bool = True,
    default_steps_per_execution: int | None = None,
    defaults=None,
) -> TrainingPlan:
    """Resolve epochs, steps and batch sizes; raise ConfigError if they cannot work.

    Keras runs `steps_per_execution` steps per call and does not cut the last
    call of an epoch short, so the steps of an epoch must be a multiple of it,
    or an epoch would train past its plan. When the epoch length comes from the
    dataset it is rounded down to a multiple (an epoch stays about one pass);
    when the user fixed it, steps_per_execution shrinks to a divisor instead.
    `multi_step_supported=False` forces one step per execution (see
    accelerator.multi_step_supported). `default_steps_per_execution` is what
    the device would run when the user asked for nothing (accelerator.choose_defaults).
    `defaults` (device_defaults.DeviceDefaults) gives the batch per replica and
    the files read at once when the flags leave them unset; without it, a
    TPU's or a CPU's at 224x224.
    """
    if defaults is None:
        from train.device import device_defaults

        kind = device_defaults.TPU if on_tpu else device_defaults.CPU
        defaults = device_defaults.device_defaults(kind, config.model, device_defaults.REFERENCE_IMAGE_SIZE)
    batch, batch_rule = resolve_global_batch(config, num_train_examples, num_replicas, defaults)
    parallel_files = defaults.parallel_files if config.parallel_files is None else config.parallel_files
    if parallel_files < 1:
        raise ConfigError(f"--parallel-files must be positive, got {parallel_files}")
    if batch < 1 or batch % num_replicas:
        raise ConfigError(
            f"--global-batch-size {batch} must be a positive multiple of the number of replicas ({num_replicas})"
        )
    one_pass = num_train_examples // batch
    if one_pass < 1:
        raise ConfigError(
            f"the train split has {num_train_examples} examples, fewer than one global batch of {batch}; "
            "lower --global-batch-size"
        )
    if config.steps is not None and config.steps < 1:
        raise ConfigError(f"--steps must be positive, got {config.steps}")
    if config.steps is None and (config.epochs is None or config.epochs < 1):
        raise ConfigError(f"--epochs must be positive, got {config.epochs}")
    if config.steps_per_epoch is not None and config.steps_per_epoch < 1:
        raise ConfigError(f"--steps-per-epoch must be positive, got {config.steps_per_epoch}")

    fixed_epoch_length = config.steps_per_epoch is not None
    steps_per_epoch = config.steps_per_epoch or one_pass
    if config.steps is not None:
        # An epoch is the unit of checkpointing and evaluation: split the steps
        # into equal epochs no longer than the chosen epoch length (so the
        # total is `steps` rounded up to a multiple of the epoch count).
        epochs = math.ceil(config.steps / steps_per_epoch)
        steps_per_epoch = math.ceil(config.steps / epochs)
    else:
        epochs = config.epochs

    requested = config.steps_per_execution
    if requested is None:
        requested = default_steps_per_execution or (TPU_STEPS_PER_EXECUTION if on_tpu else 1)
    if requested < 1:
        raise ConfigError(f"--steps-per-execution must be positive, got {requested}")
    per_call = min(requested, steps_per_epoch) if multi_step_supported else 1
    if steps_per_epoch % per_call:
        if fixed_epoch_length or config.steps is not None:
            per_call = steps_per_execution_dividing(steps_per_epoch, per_call)
        else:
            steps_per_epoch -= steps_per_epoch % per_call
    return TrainingPlan(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        steps_per_execution=per_call,
        global_batch_size=batch,
        per_replica_batch_size=batch // num_replicas,
        num_replicas=num_replicas,
        batch_rule=batch_rule,
        parallel_files=parallel_files,
    )
