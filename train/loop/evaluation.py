"""Evaluation during training: at every epoch end and every --eval-every steps, exactly.

The reported validation loss counts real examples only, and evaluation runs on its own model and a fresh
pass each time (why: docs/internals.md).
"""

import keras

from train.loop import metrics
from train.loop.checkpoints import TrainingProgress, sync_model_variables
from train.loop.plan import TrainingPlan
from train.loop.summaries import VALIDATION, ScalarWriter


def build_evaluation_model(model: keras.Model, jit_compile: bool) -> keras.Model:
    """A model over the same layers (same weights) with metrics of its own. Call in the strategy's scope."""
    evaluation_model = keras.Model(model.inputs, model.outputs, name=f"{model.name}_evaluation")
    evaluation_model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(),
        weighted_metrics=metrics.evaluation_metrics(),
        jit_compile=jit_compile,
    )
    return evaluation_model


def exact_logs(results: dict) -> dict:
    """evaluate()'s results with `loss` replaced by the example-weighted cross-entropy."""
    logs = {name: float(value) for name, value in results.items()}
    logs["loss"] = logs["cross_entropy"]
    return logs


class Evaluator:
    """One evaluation pass at a global step, written as `step_*` validation scalars (when `writer`).

    `model` is the evaluation model (build_evaluation_model), not the one being trained.
    """

    def __init__(self, model: keras.Model, eval_data, steps: int, writer: ScalarWriter | None):
        self._model = model
        self._eval_data = eval_data
        self._steps = steps
        self._writer = writer
        self._last = (
            None  # ((step, label), logs): an epoch end that is also an --eval-every step evaluates once
        )

    def evaluate(self, step: int, label: str | None = None) -> dict:
        """The validation metrics at global step `step`; `label` names other weights than the trained ones.

        With a label (`ema`: the moving average, swapped in after training) the
        scalars are `step_<label>_<metric>`, and the trained weights' evaluation
        at the same step is not reused.
        """
        if self._last is not None and self._last[0] == (step, label):
            return self._last[1]
        results = self._model.evaluate(self._eval_data, steps=self._steps, return_dict=True, verbose=0)
        logs = exact_logs(results)
        if self._writer is not None:
            named = logs if label is None else {f"{label}_{name}": value for name, value in logs.items()}
            self._writer.write(VALIDATION, "step", named, step)
        self._last = ((step, label), logs)
        return logs


class EvaluateEachEpoch(keras.callbacks.Callback):
    """Evaluate after every completed epoch; add the exact `val_*` logs to the epoch's logs.

    Put it before the callbacks that read `val_*` (checkpoints, summaries).
    An epoch stopped early (preemption) is not evaluated.
    """

    def __init__(self, evaluator: Evaluator, progress: TrainingProgress, plan: TrainingPlan):
        super().__init__()
        self._evaluator = evaluator
        self._progress = progress
        self._plan = plan

    def on_epoch_end(self, epoch, logs=None):
        if not self._progress.epoch_completed(epoch, self._plan):
            return
        results = self._evaluator.evaluate(self._progress.step)
        if logs is not None:
            logs.update({f"val_{name}": value for name, value in results.items()})


class EvaluateEverySteps(keras.callbacks.Callback):
    """Evaluate whenever the global step passes a multiple of `every` (at execution boundaries)."""

    def __init__(self, evaluator: Evaluator, progress: TrainingProgress, every: int):
        super().__init__()
        self._evaluator = evaluator
        self._progress = progress
        self._every = every
        self._last_step = progress.step

    def on_train_batch_end(self, batch, logs=None):
        step = self._progress.step
        if step // self._every > self._last_step // self._every:
            sync_model_variables(self.model)  # mid-epoch on JAX: the shared layers hold the trained values
            self._evaluator.evaluate(step)
        self._last_step = step
