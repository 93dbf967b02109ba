"""What a run will do (TrainingPlan): epochs, steps and batch sizes, resolved before anything is built.

plan_training resolves a TrainConfig against the dataset's size, the replica
count and the device's defaults, and checks that the numbers can work. No
TensorFlow here.
"""

import dataclasses
import math

from train.config import TrainConfig
from train.device import device_defaults
from train.errors import ConfigError

# On a TPU every host->device round trip costs about as much as a small step,
# so a TPU runs many steps per call by default.
TPU_STEPS_PER_EXECUTION = 32


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
