"""A resume must train the run it resumes: the same batch, length and schedule, or it stops and says so.

A checkpoint's global step only means something under the plan it was saved in: under another
--global-batch-size the same step is another epoch (a finished 20-epoch run of batch 64 reads as
epoch 11 of batch 32, and trains on), and another --epochs reshapes the cosine schedule around the
restored step (the learning rate climbs back). So the first start in a model dir records its plan,
MODEL_DIR/run_plan.json, and every start that finds a checkpoint compares:

    the same plan                 resume (a finished run is evaluated and exported again, not trained:
                                  a line says so)
    another batch, length or      ConfigError (exit 2) naming each difference and the flags that restore
    schedule                      the recorded plan; training longer is --more-epochs N on the finished run
                                  (continue_run: a restarted schedule, recorded in run_plan.json), training
                                  differently a new --model-dir, from this one's backbone (--weights MODEL_DIR)
    no run_plan.json (a model     resume, with a line saying the plan could not be checked
    dir of an older version)

Steps per execution may change (another device): it changes no step's meaning.
"""

import dataclasses
import json

import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.errors import ConfigError
from train.loop import checkpoints
from train.loop.checkpoints import CHECKPOINT_DIR
from train.loop.plan import TrainingPlan
from train.model.recipe import Recipe

PLAN_FILE = "run_plan.json"

# What a resume must keep, with the flag that sets each and how to write it.
_COMPARED = (
    ("global_batch_size", "--global-batch-size", lambda value: str(value)),
    ("epochs", "--epochs", lambda value: str(value)),
    ("steps_per_epoch", "--steps-per-epoch", lambda value: str(value)),
    ("optimizer", "--optimizer", lambda value: str(value)),
    ("peak_learning_rate", "--learning-rate", lambda value: f"{value:.6g}"),
    ("warmup_steps", "--warmup-steps", lambda value: str(value)),
    ("weight_decay", "--weight-decay", lambda value: f"{value:.6g}"),
    ("label_smoothing", "--label-smoothing", lambda value: f"{value:g}"),
    ("ema_momentum", "--ema-momentum", lambda value: "(no --ema)" if value is None else f"{value:.6g}"),
    ("freeze_backbone_steps", "--freeze-backbone-epochs", None),  # written from the epochs, below
    ("gradient_accumulation_steps", "--gradient-accumulation-steps", lambda value: str(value)),
)


def recorded_plan(plan: TrainingPlan, recipe: Recipe) -> dict:
    """What run_plan.json holds: the plan's shape and the schedule's numbers."""
    return {
        "global_batch_size": plan.global_batch_size,
        "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch,
        "total_steps": plan.total_steps,
        "optimizer": recipe.optimizer,
        "peak_learning_rate": recipe.peak_learning_rate,
        "warmup_steps": recipe.warmup_steps,
        "decay_steps": recipe.decay_steps,
        "weight_decay": recipe.weight_decay,
        "label_smoothing": recipe.label_smoothing,
        "ema_momentum": recipe.ema_momentum,
        "freeze_backbone_steps": recipe.freeze_backbone_steps,
        "gradient_accumulation_steps": recipe.gradient_accumulation_steps,
    }


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)
    return a == b


def _flag(key: str, flag: str, write, values: dict) -> str:
    if key == "freeze_backbone_steps":
        return f"--freeze-backbone-epochs {values[key] // max(1, values['steps_per_epoch'])}"
    if key == "ema_momentum":
        return "(without --ema)" if values[key] is None else f"--ema --ema-momentum {write(values[key])}"
    return f"{flag} {write(values[key])}"


_LABELS = {
    "global_batch_size": "global batch {}",
    "epochs": "{} epochs",
    "steps_per_epoch": "{} steps per epoch",
    "optimizer": "optimizer {}",
    "peak_learning_rate": "peak learning rate {:.4g}",
    "warmup_steps": "{} warmup steps",
    "weight_decay": "weight decay {:g}",
    "label_smoothing": "label smoothing {:g}",
    "freeze_backbone_steps": "backbone frozen for {} steps",
    "gradient_accumulation_steps": "{} step(s) per optimizer update",
}


def _described(key: str, value) -> str:
    if key == "ema_momentum":
        return "no EMA" if value is None else f"EMA {value:.6g}"
    return _LABELS[key].format(value)


def described_differences(recorded: dict, wanted: dict) -> list[str]:
    """'global batch 16 (the checkpoint's run: 8)' for every compared value that differs."""
    return [
        f"{_described(key, wanted[key])} (the checkpoint's run: {_described(key, recorded[key])})"
        for key, _, _ in _COMPARED
        if key in recorded and not _same(recorded[key], wanted[key])
    ]


def differences(recorded: dict, wanted: dict) -> list[tuple[str, str]]:
    """[(what the checkpoint's run has, what this command asks)] as flags, for every compared value."""
    return [
        (_flag(key, flag, write, recorded), _flag(key, flag, write, wanted))
        for key, flag, write in _COMPARED
        if key in recorded and not _same(recorded[key], wanted[key])
    ]


def _flag_name(flag_and_value: str) -> str:
    return flag_and_value.split(" ", 1)[0]


class PlanChangedError(ConfigError):
    """A resume whose plan differs from the checkpoint's: every difference, and the flags that restore it.

    str() is python -m train's message (any of its flags may restore the plan). A command that takes fewer
    flags (pipelines.local) says it with `message_for(its flags)`: only flags it accepts are suggested, and
    the values its flags do not set are named as following from them (a warmup follows from the epochs).
    """

    def __init__(
        self, model_dir: str, state: str, asked: list[str], changed: list[tuple[str, str]], total_steps=None
    ):
        self.model_dir, self.state, self.asked, self.changed = model_dir, state, asked, changed
        self.total_steps = total_steps
        super().__init__(self.message_for())

    def message_for(self, accepted_flags=None) -> str:
        changed = [was for was, _ in self.changed]
        accepted = None if accepted_flags is None else set(accepted_flags)
        length = [was for was in changed if _flag_name(was) in ("--epochs", "--steps-per-epoch")]
        if accepted is not None and length and "--steps-per-epoch" not in accepted and "--steps" in accepted:
            # A command without --steps-per-epoch restores the run's length with --steps (its total).
            changed = [f"--steps {self.total_steps}"] + [was for was in changed if was not in length]
        restore = [was for was in changed if accepted is None or _flag_name(was) in accepted]
        follow = [was for was in changed if was not in restore]
        how = (
            f"the same command with {' '.join(restore)}"
            if restore
            else "the same command with the flags it was started with"
        )
        if follow:
            how += f" ({', '.join(_flag_name(was) for was in follow)}: set by this command from those, not a flag of it)"
        return (
            f"{self.model_dir} holds a run {self.state} planned differently; this command's plan has "
            f"{', '.join(self.asked)}. A checkpoint's step only means something under its own plan (another batch "
            "size makes it another epoch; other epochs or another schedule move the learning rate under it), so "
            "nothing was trained.\n"
            f"  To resume it: {how}\n"
            + (
                "  To train it longer: once finished, its own flags plus --more-epochs N\n"
                if accepted is None or "--more-epochs" in accepted
                else ""
            )
            + f"  To train further or differently: a new --model-dir, with --weights {self.model_dir} to start "
            "from its backbone"
        )


def latest_checkpoint_step(model_dir: str) -> int | None:
    """The global step of the latest checkpoint in MODEL_DIR (checkpoints are numbered by it), or None."""
    try:
        return checkpoints.latest_checkpoint_step(manifest_lib.join(model_dir, CHECKPOINT_DIR))
    except (IndexError, ValueError, KeyError):
        return None


def check_resume(model_dir: str, plan: TrainingPlan, recipe: Recipe, chief: bool) -> str | None:
    """Record the plan at a first start; on a resume, refuse another plan (module docstring).

    Returns the line to print about the resume, if any (a finished run; a plan that cannot be checked).
    """
    path = manifest_lib.join(model_dir, PLAN_FILE)
    wanted = recorded_plan(plan, recipe)
    step = latest_checkpoint_step(model_dir)
    if step is None:
        if chief:
            tf.io.gfile.makedirs(model_dir)
            with tf.io.gfile.GFile(path, "w") as handle:
                handle.write(json.dumps(wanted, indent=2, sort_keys=True) + "\n")
        return None
    if not tf.io.gfile.exists(path):
        return (
            f"resuming at step {step} without {PLAN_FILE} (a model dir of an older version): the batch "
            "size, epochs and schedule cannot be checked against the checkpoint's"
        )
    with tf.io.gfile.GFile(path) as handle:
        recorded = json.load(handle)
    changed = differences(recorded, wanted)
    if changed:
        finished = step >= recorded.get("total_steps", step + 1)
        state = (
            f"finished (step {step} of {recorded['total_steps']})"
            if finished
            else f"at step {step} of {recorded.get('total_steps', '?')}"
        )
        raise PlanChangedError(
            model_dir, state, described_differences(recorded, wanted), changed, recorded.get("total_steps")
        )
    if step >= recorded["total_steps"]:
        return (
            f"{model_dir} holds a finished run (step {step} of {recorded['total_steps']}): nothing to train; "
            "evaluating and exporting its final weights again"
        )
    return None


@dataclasses.dataclass(frozen=True)
class Continuation:
    """--more-epochs: a finished run trained on from `from_step` for `more_epochs` epochs, to `total_steps`."""

    from_step: int
    more_epochs: int
    total_steps: int


CONTINUED = "continued"  # run_plan.json: the continuations, in order


def continue_run(model_dir: str, plan: TrainingPlan, more_epochs: int, chief: bool) -> Continuation:
    """The continuation --more-epochs asks of MODEL_DIR's run (check_resume has found its plan the same).

    A finished run (its last step, or its last continuation's) gets a new one, recorded in run_plan.json;
    an interrupted continuation of as many epochs is resumed; a run not finished is refused (ConfigError).
    """
    path = manifest_lib.join(model_dir, PLAN_FILE)
    step = latest_checkpoint_step(model_dir)
    if step is None or not tf.io.gfile.exists(path):
        raise ConfigError(
            f"--more-epochs {more_epochs} continues a finished run, and {model_dir} holds none (no checkpoint, or "
            f"no {PLAN_FILE}): train it first without --more-epochs"
        )
    with tf.io.gfile.GFile(path) as handle:
        recorded = json.load(handle)
    continued = list(recorded.get(CONTINUED, []))
    end = continued[-1]["total_steps"] if continued else recorded["total_steps"]
    if step < end:
        last = continued[-1] if continued else None
        if last is not None and last["more_epochs"] == more_epochs and step >= last["from_step"]:
            return Continuation(last["from_step"], more_epochs, last["total_steps"])  # interrupted: resume it
        raise ConfigError(
            f"{model_dir} holds a run at step {step} of {end}, not finished: --more-epochs continues a finished "
            "run; run the same command without --more-epochs to finish it first"
        )
    continuation = Continuation(end, more_epochs, end + more_epochs * plan.steps_per_epoch)
    if chief:
        recorded[CONTINUED] = [*continued, dataclasses.asdict(continuation)]
        with tf.io.gfile.GFile(path, "w") as handle:
            handle.write(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    return continuation
