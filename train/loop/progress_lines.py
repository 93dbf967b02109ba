"""The lines `python -m train` prints at its default verbosity: the plan, each epoch, where the export went.

    training small_cnn from random weights on /data/ds (run 20260101-..., 32x32 uint8, 5 classes)
      data:      480 train images, 96 validation; 10 epochs x 7 steps of 64 images = 70 steps
      schedule:  adamw, peak learning rate 0.00025 (base 0.001 x batch / 256, linear scaling); ...
      device:    cpu, default strategy, 1 replica(s); global batch 64 (...); precision float32, XLA off, ...
      model dir: /runs/r1 (checkpoints every 600 s and at epoch ends; Ctrl-C or SIGTERM saves and stops)
    epoch 1/10: loss 1.5, accuracy 0.31 | validation loss 1.4, accuracy 0.40 (12.1 s, ETA 1 min 49 s)
    ...
    export: /runs/r1/export/1767225600 (serving SavedModel); metrics: /runs/r1/metrics.json

The plan lines are printed (not logged at INFO, which the default verbosity hides), by the chief
only. No TensorFlow here: the numbers come in already resolved.
"""

import time
from collections.abc import Callable

from train.model import lr_scaling


def format_seconds(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 2 h 03 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(int(round(seconds)), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(int(round(seconds)) // 60, 60)
    return f"{hours} h {rest:02d} min"


def plan_lines(
    *,
    model: str,
    weights_description: str,
    data_dir: str,
    manifest: dict,
    plan,
    schedule_description: str,
    device_kind: str,
    strategy_kind: str,
    precision: str,
    xla: str,
    model_dir: str,
    checkpoint_interval: str,
    steps_per_execution: str = "",
) -> list[str]:
    """The plan of a run, as printed at its start (see the module docstring)."""
    steps_per_execution = steps_per_execution or f"{plan.steps_per_execution} step(s) per execution"
    image = manifest["image"]
    crop = image.get("crop_size", image["height"])
    splits = manifest["splits"]
    validation = splits.get("validation", {}).get("num_examples", 0)
    run_id = (manifest.get("run") or {}).get("id")
    dataset = f"{crop}x{crop} {image['encoding']}, {len(manifest['labels'])} classes"
    if run_id:
        dataset = f"run {run_id}, {dataset}"
    return [
        f"training {model} {weights_description} on {data_dir} ({dataset})",
        f"  data:      {splits['train']['num_examples']} train images, {validation} validation; "
        f"{plan.epochs} epochs x {plan.steps_per_epoch} steps of {plan.global_batch_size} images "
        f"= {plan.total_steps} steps",
        f"  schedule:  {schedule_description}",
        f"  device:    {device_kind}, {strategy_kind} strategy, {plan.num_replicas} replica(s); "
        f"{plan.describe_batch()}; precision {precision}, XLA {xla}, {steps_per_execution}, "
        f"{plan.parallel_files} files read at once per host",
        f"  model dir: {model_dir} (checkpoints {checkpoint_interval}, at epoch ends, and when Ctrl-C or "
        "SIGTERM stops the run)",
    ]


def weights_description(weights: str | None) -> str:
    return f"from {weights} weights" if weights else "from random weights"


def schedule_description(recipe) -> str:
    """The learning-rate schedule and the optimizer's numbers of a recipe.Recipe, in one line."""
    scaled = (
        f" ({lr_scaling.describe(recipe.base_learning_rate, recipe.learning_rate_scaling or lr_scaling.LINEAR)})"
        if recipe.base_learning_rate is not None
        else " (--learning-rate)"
    )
    parts = [
        f"{recipe.optimizer}, peak learning rate {recipe.peak_learning_rate:.3g}{scaled}",
        f"linear warmup {recipe.warmup_steps} steps, then cosine decay to 0 over {recipe.decay_steps}",
        f"weight decay {recipe.weight_decay:g}",
    ]
    if recipe.label_smoothing:
        parts.append(f"label smoothing {recipe.label_smoothing:g}")
    if recipe.ema_momentum is not None:
        parts.append(f"EMA {recipe.ema_momentum:g}")
    if recipe.freeze_backbone_steps:
        parts.append(f"backbone frozen for the first {recipe.freeze_backbone_steps} steps")
    accumulation = getattr(recipe, "gradient_accumulation_steps", 1)
    if accumulation > 1:
        parts.append(
            f"gradients accumulated over {accumulation} steps: an update every {accumulation} steps, the warmup "
            "and decay counted in updates"
        )
    return "; ".join(parts)


def steps_per_execution_description(plan, loop: str) -> str:
    """'8 step(s) per execution (tf.range loop)': which loop runs several steps (accelerator.py)."""
    return f"{plan.steps_per_execution} step(s) per execution" + (
        f" ({loop})" if plan.steps_per_execution > 1 else ""
    )


def describe_plan(config, manifest: dict, run, recipe, checkpoint_interval: str) -> str:
    """plan_lines of a TrainConfig, its manifest, trainer.RunSetup and recipe.Recipe, as one text."""
    return "\n".join(
        plan_lines(
            model=config.model,
            weights_description=weights_description(config.weights),
            data_dir=config.data_dir,
            manifest=manifest,
            plan=run.plan,
            schedule_description=schedule_description(recipe),
            device_kind=run.device.kind,
            strategy_kind=run.kind,
            precision=run.choice.policy,
            xla=run.choice.xla,
            model_dir=config.model_dir,
            checkpoint_interval=checkpoint_interval,
            steps_per_execution=steps_per_execution_description(run.plan, run.choice.multi_step_loop),
        )
    )


class EpochTimer:
    """Wall time per epoch (evaluation and checkpoint included) and the ETA of the rest of the plan.

    The ETA is the remaining steps at the seconds per step of this process's epochs, the first one
    (tracing, compilation) left out once there is another: a resumed run has no earlier timing.
    """

    def __init__(self, total_steps: int, clock: Callable[[], float] = time.monotonic):
        self._total_steps = total_steps
        self._clock = clock
        self._started = None
        self._start_step = 0
        self._epochs = []  # (steps, seconds) per epoch this process ran

    def begin(self, step: int) -> None:
        self._started = self._clock()
        self._start_step = step

    def end(self, step: int) -> str:
        """' (12.1 s, ETA 1 min 49 s)' for the epoch that ends at global step `step`."""
        if self._started is None:
            return ""
        seconds = self._clock() - self._started
        self._epochs.append((step - self._start_step, seconds))
        timed = self._epochs[1:] or self._epochs
        steps = sum(count for count, _ in timed)
        remaining = self._total_steps - step
        if remaining <= 0:
            return f" ({format_seconds(seconds)})"
        if not steps:
            return f" ({format_seconds(seconds)})"
        eta = remaining * sum(took for _, took in timed) / steps
        return f" ({format_seconds(seconds)}, ETA {format_seconds(eta)})"


def final_line(result: dict, model_dir: str, metrics_file: str) -> str:
    """Where the run's results went: the export (or that there is none) and metrics.json."""
    export = result.get("export_dir")
    where = f"export: {export} (serving SavedModel)" if export else "export: none (--no-export)"
    return f"{where}; metrics: {model_dir.rstrip('/')}/{metrics_file}"


def continuation_line(continuation, recipe) -> str:
    """What --more-epochs does, for the plan's lines: from which step to which, and the learning rate."""
    warmup = (
        f"linear warmup over {recipe.warmup_steps} steps to " if recipe.warmup_steps else "restarting at "
    )
    return (
        f"continuing the finished run for {continuation.more_epochs} more epochs (--more-epochs), steps "
        f"{continuation.from_step + 1} to {continuation.total_steps}: learning rate {warmup}"
        f"{recipe.peak_learning_rate:.3g}, then cosine decay to 0 over {recipe.decay_steps} steps"
    )
