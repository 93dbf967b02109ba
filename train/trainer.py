"""train_and_evaluate: one training run from a dataset directory to a serving model.

    from train.config import TrainConfig
    from train.trainer import train_and_evaluate
    metrics = train_and_evaluate(TrainConfig(data_dir="gs://b/dataset", model_dir="gs://b/run1", epochs=5))

The order of the steps is the point: everything that can fail cheaply (the
manifest, the shards, the model against the image size, the strategy, the
batch arithmetic) fails before anything is built; the model, optimizer and
metrics are built inside the strategy's scope; the run resumes from the
latest checkpoint in the model dir; and the serving export is written last.

Model dir layout:

    checkpoints/     per-epoch checkpoints (tf.train.CheckpointManager), the resume point
    logs/            TensorBoard (train and validation curves)
    metrics.json     final evaluation metrics (with the validation confusion matrix), the plan, throughput
    learning_curves.png, confusion_matrix.png   the same, as pictures
    export/          the serving SavedModel (see export.py)
    backbone.weights.h5   the trained backbone, for `--weights MODEL_DIR` in a later run (pretrained.py)
"""

import json
import logging
import time

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train import checks, dataset, export, losses, metrics, models, optimization, plots, pretrained
from train import recipe as recipe_lib
from train import strategy as strategy_lib
from train.checkpoints import EpochCheckpoints, SaveCheckpointEachEpoch
from train.config import TrainConfig, TrainingPlan, plan_training
from train.freeze import FreezeBackbone
from train.summaries import EpochSummaries

METRICS_FILE = "metrics.json"
LOG_DIR = "logs"

log = logging.getLogger(__name__)


class TrainingClock(keras.callbacks.Callback):
    """Wall time of each epoch's training steps, and the first epoch this process ran.

    Put it before EvaluateEachEpoch: its on_epoch_end stops the clock before
    the evaluation starts.
    """

    def __init__(self):
        super().__init__()
        self.first_epoch = None
        self.epoch_seconds = []
        self._start = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(time.perf_counter() - self._start)

    def images_per_second(self, images_per_epoch: int) -> float | None:
        """Steady-state throughput: the run's first epoch (tracing, XLA compilation) is left out if possible."""
        timed = self.epoch_seconds[1:] or self.epoch_seconds
        if not timed:
            return None
        return images_per_epoch * len(timed) / sum(timed)


class EvaluateEachEpoch(keras.callbacks.Callback):
    """Evaluate on the validation split after every epoch; add `val_*` to the epoch's logs.

    Used instead of fit(validation_data=...): Keras 3.15 caches fit's
    validation iterator and, under a tf.distribute strategy, takes one batch
    from it before every evaluation, so from the second epoch on an exactly
    sized evaluation dataset (see dataset.make_eval_dataset) is found empty.
    evaluate() with explicit steps starts a fresh pass each time. Put it
    before the callbacks that read `val_*` (checkpoint log, summaries).
    """

    def __init__(self, eval_data, steps: int):
        super().__init__()
        self._eval_data = eval_data
        self._steps = steps

    def on_epoch_end(self, epoch, logs=None):
        results = self.model.evaluate(self._eval_data, steps=self._steps, return_dict=True, verbose=0)
        if logs is not None:
            logs.update({f"val_{name}": value for name, value in results.items()})


def multi_step_supported(strategy: tf.distribute.Strategy) -> bool:
    """Whether Keras can run several steps per execution under `strategy`.

    Keras 3 (up to at least 3.15) builds its multi-step loop from tf.cond
    inside tf.while_loop, which breaks under a MirroredStrategy with more than
    one replica ("You must feed a value for placeholder tensor ...",
    keras-team/keras#19246): a merge_call cannot run inside a conditional
    branch. TPUStrategy and single-replica strategies are not affected.
    """
    kind = strategy_lib.strategy_kind(strategy)
    return not (
        kind in (strategy_lib.MIRRORED, strategy_lib.MULTIWORKER) and strategy.num_replicas_in_sync > 1
    )


def _compile(model: keras.Model, config: TrainConfig, plan: TrainingPlan) -> recipe_lib.Recipe:
    """Compile `model` with the run's recipe (optimizer, schedule, loss); returns the recipe."""
    recipe = recipe_lib.resolve_recipe(config, plan)
    model.compile(
        optimizer=optimization.build_optimizer(recipe, model),
        loss=losses.training_loss(recipe.label_smoothing),
        weighted_metrics=metrics.evaluation_metrics(),
        steps_per_execution=plan.steps_per_execution,
        jit_compile="auto" if config.jit_compile is None else config.jit_compile,
    )
    # Optimizer slots must exist before a checkpoint is restored into them, and
    # for every variable, before a frozen backbone hides some (freeze.py).
    model.optimizer.build(model.trainable_variables)
    return recipe


def _write_json(path: str, content: dict) -> None:
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(json.dumps(content, indent=2, sort_keys=True) + "\n")


def distribute_train_input(
    strategy: tf.distribute.Strategy, config: TrainConfig, manifest: dict, plan: TrainingPlan
):
    """The training input of `config` under `strategy`, as train_and_evaluate feeds it (and bench_input times it)."""
    return dataset.distribute_train_dataset(
        strategy,
        config.data_dir,
        manifest,
        plan.global_batch_size,
        augment=config.augment,
        shuffle_buffer=config.shuffle_buffer,
    )


def train_and_evaluate(config: TrainConfig, strategy: tf.distribute.Strategy | None = None) -> dict:
    """Train `config.model` on `config.data_dir`, evaluate on its validation split, export.

    Resumes from the latest checkpoint in `config.model_dir` and trains only
    the epochs still missing from the plan. `strategy` overrides
    `config.strategy` (a notebook that already connected to a TPU passes its
    own). Returns the content of metrics.json. Raises a SetupError subclass
    (DatasetError, StrategyError, ConfigError) before the first step for
    anything the user can fix.
    """
    manifest = checks.read_manifest(config.data_dir)
    checks.check_model_fits(config.model, manifest)
    checks.check_dataset(config.data_dir, manifest, verify_sha256=config.verify_data)
    if strategy is None:
        strategy = strategy_lib.resolve_strategy(config.strategy, config.tpu)
    kind = strategy_lib.strategy_kind(strategy)
    policy = strategy_lib.mixed_precision_policy(config.mixed_precision, strategy)
    train_examples = manifest["splits"][manifest_lib.TRAIN]["num_examples"]
    plan = plan_training(
        config,
        train_examples,
        strategy.num_replicas_in_sync,
        on_tpu=kind == strategy_lib.TPU,
        multi_step_supported=multi_step_supported(strategy),
    )
    # Resolved here too so that an impossible recipe fails before anything is built.
    log.info("recipe: %s", recipe_lib.describe(recipe_lib.resolve_recipe(config, plan)))
    if (config.steps_per_execution or 1) > plan.steps_per_execution:
        log.warning(
            "%d step(s) per execution instead of the %d asked for: it must divide the %d steps of an epoch, "
            "and a multi-replica MirroredStrategy runs 1 (keras-team/keras#19246)",
            plan.steps_per_execution,
            config.steps_per_execution,
            plan.steps_per_epoch,
        )
    chief = strategy_lib.is_chief(strategy)
    if chief:
        tf.io.gfile.makedirs(config.model_dir)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    log.info(
        "strategy %s (%d replicas), policy %s, %s: %d epochs x %d steps of %d images (%d per replica), "
        "%d steps per execution",
        kind,
        plan.num_replicas,
        policy,
        config.model,
        plan.epochs,
        plan.steps_per_epoch,
        plan.global_batch_size,
        plan.per_replica_batch_size,
        plan.steps_per_execution,
    )

    train_data = distribute_train_input(strategy, config, manifest, plan)
    eval_data, eval_steps = dataset.distribute_eval_dataset(
        strategy, config.data_dir, manifest, manifest_lib.VALIDATION, plan.global_batch_size
    )

    with strategy.scope():
        model = models.build_model_for_dataset(
            config.model, image_format, len(manifest["labels"]), policy, weights=config.weights
        )
        recipe = _compile(model, config, plan)
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=epoch)
    checkpoints = EpochCheckpoints(
        checkpoint,
        epoch,
        config.model_dir,
        strategy_lib.worker_name(strategy),
        keep=config.checkpoints_to_keep,
    )
    initial_epoch = min(checkpoints.restore_latest(), plan.epochs)
    if initial_epoch:
        log.info(
            "resuming from %s: %d of %d epochs already done",
            checkpoints.directory,
            initial_epoch,
            plan.epochs,
        )

    clock = TrainingClock()
    callbacks = [clock, EvaluateEachEpoch(eval_data, eval_steps), SaveCheckpointEachEpoch(checkpoints)]
    if recipe.freeze_backbone_steps:
        callbacks.insert(0, FreezeBackbone(recipe.freeze_backbone_steps))
    if chief:
        callbacks.append(EpochSummaries(manifest_lib.join(config.model_dir, LOG_DIR)))
    model.fit(
        train_data,
        epochs=plan.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=plan.steps_per_epoch,
        callbacks=callbacks,
        shuffle=False,  # the input pipeline shuffles; Keras cannot shuffle a tf.data stream anyway
        verbose=2,
    )
    evaluation = model.evaluate(eval_data, steps=eval_steps, return_dict=True, verbose=0)

    result = {
        "validation": {
            "accuracy": float(evaluation["accuracy"]),
            "cross_entropy": float(evaluation["cross_entropy"]),
            "num_examples": int(round(float(evaluation["num_examples"]))),
        },
        "epochs": plan.epochs,
        "initial_epoch": initial_epoch,
        "epochs_this_run": len(clock.epoch_seconds),
        "global_step": int(model.optimizer.iterations.numpy()),
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "num_replicas": plan.num_replicas,
        "images_per_second": clock.images_per_second(plan.steps_per_epoch * plan.global_batch_size),
        "train_seconds": sum(clock.epoch_seconds),
        "model": config.model,
        "strategy": kind,
        "mixed_precision": policy,
        "encoding": image_format.encoding,
        "image_size": [image_format.height, image_format.width],
        "crop_size": image_format.input_shape[0],
        "data_dir": config.data_dir,
        "recipe": recipe.as_dict(),
    }
    counts = metrics.validation_confusion_matrix(
        strategy, model, eval_data, eval_steps, len(manifest["labels"])
    )
    result["validation"]["confusion_matrix"] = counts.tolist()
    if chief:
        plots.plot_learning_curves(
            plots.read_epoch_scalars(manifest_lib.join(config.model_dir, LOG_DIR)),
            manifest_lib.join(config.model_dir, plots.LEARNING_CURVES_FILE),
        )
        plots.plot_confusion_matrix(
            counts, manifest["labels"], manifest_lib.join(config.model_dir, plots.CONFUSION_MATRIX_FILE)
        )
        # After fit: with --ema these are the averaged weights (optimization.py).
        result["backbone_weights"] = pretrained.save_backbone_weights(model, config.model_dir)
        if config.export:
            result["export_dir"] = export.export_serving_model(
                model, manifest, export.export_path(config.model_dir)
            )
        _write_json(manifest_lib.join(config.model_dir, METRICS_FILE), result)
    log.info("validation: %s", result["validation"])
    return result
