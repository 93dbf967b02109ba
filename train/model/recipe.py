"""The numbers of a run's optimization, resolved from the flags and the plan (no TensorFlow here).

    peak learning rate   --learning-rate, or --base-learning-rate scaled to the global batch
                         (lr_scaling.py, --learning-rate-scaling): x batch / 256 for SGD (the linear
                         scaling rule, Goyal et al. 2017), so --global-batch-size 1024 on a TPU trains
                         like 256 on a GPU, with four times the learning rate and a quarter of the
                         steps; for AdamW the same up to 256 images and x sqrt(batch / 256) above
    warmup               --warmup-epochs or --warmup-steps; default one epoch, at most a tenth of the run
    --optimizer adamw    base learning rate 1e-3, decoupled weight decay 0.05
    --optimizer sgd      Nesterov momentum 0.9, base learning rate 0.1, decoupled weight decay 1e-3
                         (about the usual L2 of 1e-4 under momentum 0.9)
    --label-smoothing    0 by default
    --gradient-accumulation-steps N   an update every N steps, of their averaged gradients: the
                         peak learning rate follows the batch of an update (N x the global batch),
                         and the warmup and decay count updates (total steps / N), so that N steps
                         of B images train like one of N x B
    --ema                EMA decay per step: --ema-momentum, or 1 - 10 / total steps within
                         [0.9, 0.9999] (an average over about the last tenth of the run)

optimization.py turns a Recipe into a Keras optimizer.
"""

import dataclasses

from train.config import ADAMW, OPTIMIZERS, SGD, TrainConfig, is_user_model  # noqa: F401 - OPTIMIZERS for callers
from train.errors import ConfigError
from train.loop.plan import TrainingPlan
from train.model import lr_scaling

# The batch size the base learning rates are stated for.
REFERENCE_BATCH = lr_scaling.REFERENCE_BATCH
SGD_MOMENTUM = 0.9
# Without --warmup-*: one epoch, but never more than this fraction of the run.
DEFAULT_WARMUP_EPOCHS = 1
MAX_DEFAULT_WARMUP_FRACTION = 0.1
# Without --ema-momentum: average over about the last tenth of the run, within these bounds.
EMA_MOMENTUM_BOUNDS = (0.9, 0.9999)


@dataclasses.dataclass(frozen=True)
class OptimizerDefaults:
    base_learning_rate: float  # per REFERENCE_BATCH images
    weight_decay: float


DEFAULTS = {
    ADAMW: OptimizerDefaults(base_learning_rate=1e-3, weight_decay=0.05),
    SGD: OptimizerDefaults(base_learning_rate=0.1, weight_decay=1e-3),
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The optimization numbers a run uses, resolved from its config and plan (recorded in metrics.json)."""

    optimizer: str
    peak_learning_rate: float
    base_learning_rate: float | None  # None when --learning-rate fixed the peak
    warmup_steps: int
    decay_steps: int
    weight_decay: float
    label_smoothing: float
    ema_momentum: float | None  # None: no EMA
    weights: str | None  # where the backbone started: None (random), "imagenet" or a path
    freeze_backbone_steps: int  # the backbone is frozen while the step counter is below this
    learning_rate_scaling: str | None = (
        None  # lr_scaling.LINEAR or SQRT; None when --learning-rate fixed the peak
    )
    # --more-epochs: the step the schedule (warmup, then decay) starts from; 0 for a run's own schedule.
    schedule_offset: int = 0
    # Steps per optimizer update; warmup_steps and decay_steps count updates (steps / this).
    gradient_accumulation_steps: int = 1

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _check_optimizer(name: str) -> OptimizerDefaults:
    if name not in DEFAULTS:
        raise ConfigError(f"unknown --optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return DEFAULTS[name]


def peak_learning_rate(config: TrainConfig, global_batch_size: int) -> tuple[float, float | None]:
    """(peak learning rate, base learning rate per 256 images or None if the peak was given)."""
    peak, base, _ = scaled_peak_learning_rate(config, global_batch_size)
    return peak, base


def scaled_peak_learning_rate(
    config: TrainConfig, global_batch_size: int
) -> tuple[float, float | None, str | None]:
    """(peak, base per 256 images, lr_scaling rule): base and rule are None when --learning-rate gave the peak."""
    if config.learning_rate is not None:
        if config.learning_rate <= 0:
            raise ConfigError(f"--learning-rate must be positive, got {config.learning_rate}")
        return config.learning_rate, None, None
    base = config.base_learning_rate
    if base is None:
        base = _check_optimizer(config.optimizer).base_learning_rate
    if base <= 0:
        raise ConfigError(f"--base-learning-rate must be positive, got {base}")
    scaling = lr_scaling.effective_scaling(config.learning_rate_scaling, config.optimizer, global_batch_size)
    return lr_scaling.scaled_learning_rate(base, global_batch_size, scaling), base, scaling


def accumulation_steps(config: TrainConfig, plan: TrainingPlan) -> int:
    """--gradient-accumulation-steps, checked against the plan: it must divide an epoch."""
    steps = config.gradient_accumulation_steps
    if steps < 1:
        raise ConfigError(f"--gradient-accumulation-steps must be at least 1, got {steps}")
    if plan.steps_per_epoch % steps:
        raise ConfigError(
            f"--gradient-accumulation-steps {steps} does not divide an epoch's {plan.steps_per_epoch} steps: an "
            "update would straddle the epoch's end. Choose a divisor, or --steps-per-epoch a multiple of it"
        )
    return steps


def warmup_steps(config: TrainConfig, plan: TrainingPlan) -> int:
    """Optimizer updates of linear warmup: --warmup-steps, --warmup-epochs, or one epoch capped at a tenth of
    the run. With gradient accumulation an update takes several steps: these count updates."""
    updates_per_step = 1 / accumulation_steps(config, plan)
    total = plan.total_steps // accumulation_steps(config, plan)
    if config.warmup_steps is not None and config.warmup_epochs is not None:
        raise ConfigError("give --warmup-steps or --warmup-epochs, not both")
    if config.warmup_steps is not None:
        steps = config.warmup_steps
    elif config.warmup_epochs is not None:
        steps = round(config.warmup_epochs * plan.steps_per_epoch * updates_per_step)
    else:
        steps = min(
            round(DEFAULT_WARMUP_EPOCHS * plan.steps_per_epoch * updates_per_step),
            int(MAX_DEFAULT_WARMUP_FRACTION * total),
        )
    if steps < 0:
        raise ConfigError(f"the warmup must not be negative, got {steps} steps")
    if steps >= total:
        raise ConfigError(
            f"a warmup of {steps} steps leaves nothing of the {total} training steps (optimizer updates) for the decay; "
            "shorten --warmup-epochs/--warmup-steps or train longer"
        )
    return steps


def ema_momentum(config: TrainConfig, plan: TrainingPlan) -> float | None:
    """The EMA decay per step (None without --ema): --ema-momentum, or 1 - 10 / total steps, bounded."""
    if not config.ema:
        return None
    if config.ema_momentum is not None:
        if not 0.0 < config.ema_momentum < 1.0:
            raise ConfigError(f"--ema-momentum must be in (0, 1), got {config.ema_momentum}")
        return config.ema_momentum
    low, high = EMA_MOMENTUM_BOUNDS
    return min(high, max(low, 1.0 - 10.0 / plan.total_steps))


def resolve_recipe(config: TrainConfig, plan: TrainingPlan) -> Recipe:
    """The optimization numbers of `config` under `plan`; raises ConfigError for impossible ones."""
    defaults = _check_optimizer(config.optimizer)
    accumulation = accumulation_steps(config, plan)
    # The learning rate follows the batch of an update: N steps of the global batch.
    peak, base, scaling = scaled_peak_learning_rate(config, plan.global_batch_size * accumulation)
    warmup = warmup_steps(config, plan)
    weight_decay = defaults.weight_decay if config.weight_decay is None else config.weight_decay
    if weight_decay < 0:
        raise ConfigError(f"--weight-decay must not be negative, got {weight_decay}")
    if not 0.0 <= config.label_smoothing < 1.0:
        raise ConfigError(f"--label-smoothing must be in [0, 1), got {config.label_smoothing}")
    freeze = config.freeze_backbone_epochs
    if freeze < 0 or (freeze and freeze >= plan.epochs):
        raise ConfigError(
            f"--freeze-backbone-epochs {freeze} must be between 0 and the number of epochs ({plan.epochs}) "
            "minus one: the backbone is unfrozen for the epochs after it"
        )
    if freeze and is_user_model(config.model):
        raise ConfigError(
            f"--freeze-backbone-epochs: --model {config.model} is one network with its own head, nothing of it "
            "would train; leave the flag out"
        )
    return Recipe(
        optimizer=config.optimizer,
        peak_learning_rate=peak,
        base_learning_rate=base,
        warmup_steps=warmup,
        decay_steps=plan.total_steps // accumulation - warmup,
        weight_decay=weight_decay,
        label_smoothing=config.label_smoothing,
        ema_momentum=ema_momentum(config, plan),
        weights=config.weights,
        freeze_backbone_steps=freeze * plan.steps_per_epoch,
        learning_rate_scaling=scaling,
        gradient_accumulation_steps=accumulation,
    )


def describe(recipe: Recipe) -> str:
    """One log line: the optimizer and its numbers."""
    scaled = (
        f" ({lr_scaling.describe(recipe.base_learning_rate, recipe.learning_rate_scaling or lr_scaling.LINEAR)})"
        if recipe.base_learning_rate is not None
        else " (--learning-rate)"
    )
    ema = f", EMA {recipe.ema_momentum:g}" if recipe.ema_momentum is not None else ""
    smoothing = f", label smoothing {recipe.label_smoothing:g}" if recipe.label_smoothing else ""
    start = f"from {recipe.weights} weights" if recipe.weights else "from random weights"
    if recipe.freeze_backbone_steps:
        start += f", backbone frozen for {recipe.freeze_backbone_steps} steps"
    return (
        f"{start}; {recipe.optimizer}, peak learning rate {recipe.peak_learning_rate:.3g}{scaled}, warmup "
        f"{recipe.warmup_steps} steps then cosine decay over {recipe.decay_steps}, weight decay "
        f"{recipe.weight_decay:g}{ema}{smoothing}"
    )
