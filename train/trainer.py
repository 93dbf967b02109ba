"""train_and_evaluate: one training run from a dataset directory to a serving model.

    from train.config import TrainConfig
    from train.trainer import train_and_evaluate
    metrics = train_and_evaluate(TrainConfig(data_dir="gs://b/dataset", model_dir="gs://b/run1", epochs=5))

The order of the steps is the point: everything that can fail cheaply (the
manifest, the shards, the model against the image size, the strategy, the
paths every host must reach, the batch arithmetic) fails before anything is
built; the model, optimizer and metrics are built inside the strategy's
scope; the run resumes from the latest checkpoint in the model dir, at its
global step; and the serving export is written last. train_and_evaluate reads
as those phases, one function each:

    resolve_dataset        the dataset run (pinned in the model dir), checked against the model
    start_run              strategy, plan, the checks that need them, the model dir, the input pipelines
    build_training_state   model, optimizer, metrics in the strategy's scope; the latest checkpoint restored
    fit_run                the callbacks and the fit to the end of the plan (or to a signal's checkpoint)
    finish_run             the shipped weights evaluated; metrics.json, plots, backbone weights, export

Resuming mid-epoch: training goes on at the checkpoint's global step, in
the same epoch, with the epoch's step counter restarted where it was
(fit_from_step), so that epoch boundaries (evaluation, epoch checkpoints,
epoch summaries) stay at the same global steps and the run ends exactly at
the planned step; the optimizer's restored iteration count puts the
learning-rate schedule at the right step. The input stream is not rewound
to the batches the interrupted epoch had consumed: it is shuffled
non-deterministically, per host, with no position to return to (tf.data
iterator checkpoints would have to hold every host's shuffle buffer, up to
hundreds of MB each, and are not supported for distributed iterators on
TPU), and skipping N batches would mean reading and throwing away up to an
epoch of data to arrive at a random place anyway. The rest of the
interrupted epoch draws a fresh shuffled pass instead: over the run, each
example is still seen about as often as planned, and no completed step is
repeated or lost.

Model dir layout:

    checkpoints/     step checkpoints (Keras weights files with the optimizer state, ckpt-<global step>.weights.h5,
                     listed by checkpoint.json), the resume point
    logs/            TensorBoard: train and validation curves (epoch_* and step_*), profiles
    metrics.json     final evaluation metrics of the exported weights (with --ema the average; the
                     validation confusion matrix too), the plan, throughput, the dataset run trained on
    dataset_pin.json, dataset_pin.manifest.json   the dataset run this model dir trains on (dataset_pin.py)
    learning_curves.png, confusion_matrix.png   the same, as pictures
    export/          the serving SavedModel (see serving/export.py)
    model.keras      the same model for Keras code (keras.models.load_model), where Keras can save it
    backbone.weights.h5   the trained backbone, for `--weights MODEL_DIR` in a later run (pretrained.py)
"""

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.config import (
    CheckpointInterval,
    TrainConfig,
    check_paths_for_tpu,
    parse_checkpoint_interval,
    parse_preemption_check,
    requests_tpu,
)
from train.data import checks, dataset, dataset_lease, dataset_pin
from train.device import accelerator, device_defaults
from train.device.backend import resolve_devices
from train.device.devices import Devices
from train.device.tensorflow_devices import (  # noqa: F401 - build_from_shapes: the benchmarks' and tests' name
    TensorFlowDevices,
    build_from_shapes,
    reduce_logs_as_vectors,
)
from train.errors import TrainingPreempted
from train.loop import learned_nothing, metrics, multi_step, plots, progress_lines, resume_check
from train.loop.checkpoints import (
    PreemptionNotice,
    SaveCheckpoints,
    StepCounter,
    TrainingProgress,
)
from train.loop.evaluation import EvaluateEachEpoch, EvaluateEverySteps, Evaluator, build_evaluation_model
from train.loop.plan import TrainingPlan, plan_training
from train.loop.summaries import VALIDATION, EpochSummaries, ProfileSteps, ScalarWriter, StepTelemetry
from train.model import losses, models, optimization, pretrained
from train.model import recipe as recipe_lib
from train.model.freeze import FreezeBackbone

METRICS_FILE = "metrics.json"
LOG_DIR = "logs"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunSetup:
    """Where and how a run trains: the devices (train/device/devices.py), their defaults, and the plan."""

    devices: Devices
    kind: str
    device: accelerator.DeviceDescription
    choice: accelerator.AcceleratorChoice
    plan: TrainingPlan
    continuation: resume_check.Continuation | None = None  # --more-epochs

    @property
    def strategy(self) -> tf.distribute.Strategy | None:
        """The tf.distribute strategy (the TensorFlow backend's; None on JAX)."""
        return self.devices.strategy


def setup_run(
    config: TrainConfig, manifest: dict, strategy: tf.distribute.Strategy | None = None
) -> RunSetup:
    """Resolve the devices (a given strategy, else train/device/devices.py), their defaults and the plan.

    Shared with bench_input and the benchmarks.
    """
    devices = resolve_devices(config, strategy)
    kind = devices.kind
    device = devices.describe()
    choice = accelerator.choose_defaults(
        device, config.mixed_precision, config.jit_compile, config.steps_per_execution
    )
    accelerator.check_cpu_xla_available(device, choice)
    plan = plan_training(
        config,
        manifest["splits"][manifest_lib.TRAIN]["num_examples"],
        devices.num_replicas,
        on_tpu=device.kind == accelerator.TPU,
        multi_step_supported=choice.multi_step_supported,
        default_steps_per_execution=choice.steps_per_execution,
        defaults=device_defaults.for_manifest(device.kind, config.model, manifest),
    )
    for note in choice.notes:
        log.info("%s", note)
    warn_about_steps_per_execution(config, choice, plan)
    return RunSetup(devices=devices, kind=kind, device=device, choice=choice, plan=plan)


def warn_about_steps_per_execution(
    config: TrainConfig, choice: accelerator.AcceleratorChoice, plan: TrainingPlan
) -> str | None:
    """Log (and return) a warning when the plan runs far fewer steps per execution than wanted.

    Wanted: the flag if given, else the device default (32 on a TPU), the
    number the plan was asked for either way. Where the strategy cannot run
    several, choose_defaults' notes already say so.
    """
    if not choice.multi_step_supported:
        return None
    asked_by_flag = config.steps_per_execution is not None
    wanted = config.steps_per_execution if asked_by_flag else choice.steps_per_execution
    message = accelerator.steps_per_execution_warning(wanted, asked_by_flag, plan)
    if message:
        log.warning("%s", message)
    return message


def continued_recipe(
    config: TrainConfig, plan: TrainingPlan, continuation: resume_check.Continuation
) -> recipe_lib.Recipe:
    """The recipe of the epochs --more-epochs adds: the run's peak, its warmup and a cosine decay over them,
    from the step the run had finished at (no frozen backbone: the head has trained)."""
    segment = dataclasses.replace(plan, epochs=continuation.more_epochs)
    recipe = recipe_lib.resolve_recipe(dataclasses.replace(config, freeze_backbone_epochs=0), segment)
    return dataclasses.replace(recipe, schedule_offset=continuation.from_step)


def compile_model(
    model: keras.Model,
    config: TrainConfig,
    plan: TrainingPlan,
    choice: accelerator.AcceleratorChoice,
    continuation: resume_check.Continuation | None = None,
) -> recipe_lib.Recipe:
    """Compile `model` with the run's recipe (optimizer, schedule, loss: recipe.py); returns the recipe."""
    if continuation is None:
        recipe = recipe_lib.resolve_recipe(config, plan)
    else:
        recipe = continued_recipe(config, plan, continuation)
    model.compile(
        optimizer=optimization.build_optimizer(recipe, model),
        loss=losses.training_loss(recipe.label_smoothing),
        weighted_metrics=metrics.evaluation_metrics(),
        steps_per_execution=plan.steps_per_execution,
        jit_compile=choice.keras_jit_compile,
    )
    if choice.multi_step_loop == accelerator.TF_RANGE_LOOP and plan.steps_per_execution > 1:
        multi_step.use_tf_range_loop(model)
    # Optimizer slots must exist before a checkpoint is restored into them, and
    # for every variable, before a frozen backbone hides some (freeze.py).
    model.optimizer.build(model.trainable_variables)
    return recipe


def _replica_batch(plan: TrainingPlan, image_format, weighted: bool) -> tuple:
    batch = plan.per_replica_batch_size
    images = keras.KerasTensor((batch, *image_format.input_shape), image_format.dtype.name)
    labels = keras.KerasTensor((batch,), "int32")
    return (images, labels, keras.KerasTensor((batch,), "float32")) if weighted else (images, labels)


def _write_json(path: str, content: dict) -> None:
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(json.dumps(content, indent=2, sort_keys=True) + "\n")


def distribute_train_input(
    devices: Devices | tf.distribute.Strategy, config: TrainConfig, manifest: dict, plan: TrainingPlan
):
    """The training input of `config` on `devices` (or a strategy), as train_and_evaluate feeds it (and
    bench_input times it)."""
    if isinstance(devices, tf.distribute.Strategy):
        devices = TensorFlowDevices(devices)
    return devices.train_input(
        config.data_dir,
        manifest,
        plan.global_batch_size,
        augment=config.augment,
        shuffle_buffer=config.shuffle_buffer,
        parallel_files=plan.parallel_files,
    )


class TrainingClock(keras.callbacks.Callback):
    """Time spent in the train function, and steps run, per epoch of this process.

    Evaluations and checkpoint saves are not counted.
    """

    def __init__(self):
        super().__init__()
        self.epochs = []  # [steps, seconds] per epoch (or part of one) this process ran
        self._call_start = None
        self._begin = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append([0, 0.0])

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = batch
        self._call_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.epochs[-1][0] += batch - self._begin + 1
        self.epochs[-1][1] += time.perf_counter() - self._call_start

    def steps(self) -> int:
        return sum(steps for steps, _ in self.epochs)

    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.epochs)

    def images_per_second(self, global_batch_size: int) -> float | None:
        """Steady-state throughput: the first epoch (tracing, XLA compilation, warm-up) left out if possible."""
        timed = [epoch for epoch in self.epochs[1:] if epoch[1] > 0] or [e for e in self.epochs if e[1] > 0]
        if not timed:
            return None
        return global_batch_size * sum(steps for steps, _ in timed) / sum(seconds for _, seconds in timed)


class EpochProgress(keras.callbacks.Callback):
    """One line per completed epoch: the train and (exact) validation metrics."""

    def __init__(self, progress: TrainingProgress, plan: TrainingPlan, printer=print):
        super().__init__()
        self._progress = progress
        self._plan = plan
        self._printer = printer
        self._timer = progress_lines.EpochTimer(plan.total_steps)

    def on_epoch_begin(self, epoch, logs=None):
        self._timer.begin(self._progress.step)

    def on_epoch_end(self, epoch, logs=None):
        if not self._progress.epoch_completed(epoch, self._plan) or not logs:
            return
        line = f"epoch {epoch + 1}/{self._plan.epochs}: loss {logs.get('loss', float('nan')):.4f}"
        if "accuracy" in logs:
            line += f", accuracy {logs['accuracy']:.4f}"
        if "val_loss" in logs:
            line += f" | validation loss {logs['val_loss']:.4f}, accuracy {logs.get('val_accuracy', float('nan')):.4f}"
        self._printer(line + self._timer.end(self._progress.step))


@contextlib.contextmanager
def _steps_per_execution(model: keras.Model, steps: int):
    """Run `model` with `steps` per execution for a while (the train function is retraced both ways)."""
    if steps == model.steps_per_execution:
        yield
        return
    previous = model.steps_per_execution
    model.steps_per_execution, model.train_function = steps, None
    try:
        yield
    finally:
        model.steps_per_execution, model.train_function = previous, None


@contextlib.contextmanager
def _final_weights_held_back(model: keras.Model):
    """Keep a fit from finalizing the weights: use_final_weights does that, once, when training is done.

    At the end of every fit, Keras swaps the optimizer's moving average into
    the model (`finalize_variable_values`, with --ema: optimization.py). After
    a resumed epoch's own fit that would restart the remaining epochs from the
    average instead of from the trained weights; after the last fit it would
    come before the run could evaluate the trained weights; and a run resumed
    after its last step runs no fit at all, yet must ship the average too.
    """
    optimizer = model.optimizer
    optimizer.finalize_variable_values = lambda var_list: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values


def use_final_weights(model: keras.Model) -> None:
    """Swap the weights training ends on into the model: with --ema, the optimizer's moving average.

    Once, after training, whether this process trained the last step or was
    resumed after it (the checkpoint holds the trained weights and the
    average, optimization.py). The evaluation that metrics.json reports, the
    confusion matrix, the export and backbone.weights.h5 all come after it.
    """
    model.optimizer.finalize_variable_values(model.trainable_weights)
    # On JAX, assign() makes each weight hold its average's very array; Keras' steps donate their inputs'
    # buffers, so the next evaluation would delete the optimizer's copy too. Each weight gets its own.
    for weight in model.trainable_weights:
        weight.assign(keras.ops.copy(weight))


def fit_from_step(
    model: keras.Model, train_data, plan: TrainingPlan, start_step: int, callbacks: list, stopped
) -> None:
    """Train from global step `start_step` to the end of the plan; see the module docstring.

    A resumed epoch runs its remaining steps as a fit of its own, so Keras's
    epoch bookkeeping (and every epoch-end callback) lines up with the
    plan's epochs. `stopped()` says whether a callback stopped training.
    The model ends on the trained weights, never their average: call
    use_final_weights after it.
    """
    epoch, step_in_epoch = plan.position(start_step)
    if epoch >= plan.epochs:
        return
    if step_in_epoch:
        remaining = plan.steps_per_epoch - step_in_epoch
        # A checkpoint of this plan lies on an execution boundary; one of another plan
        # (a changed --steps-per-execution) may not: run the remainder in steps that divide it.
        with (
            _steps_per_execution(model, math.gcd(remaining, plan.steps_per_execution)),
            _final_weights_held_back(model),
        ):
            model.fit(
                train_data,
                epochs=epoch + 1,
                initial_epoch=epoch,
                steps_per_epoch=remaining,
                callbacks=callbacks,
                shuffle=False,
                verbose=0,
            )
        if stopped() or epoch + 1 >= plan.epochs:
            return
        epoch += 1
    with _final_weights_held_back(model):
        model.fit(
            train_data,
            epochs=plan.epochs,
            initial_epoch=epoch,
            steps_per_epoch=plan.steps_per_epoch,
            callbacks=callbacks,
            shuffle=False,  # the input pipeline shuffles; Keras cannot shuffle a tf.data stream anyway
            verbose=0,
        )


@dataclasses.dataclass(frozen=True)
class RunDataset:
    """Phase 1's result: the dataset run this training reads (pinned in the model dir) and its image format."""

    pinned: dataset_pin.PinnedDataset
    image_format: dataset.ImageFormat
    # The chief's lease on the run (dataset_lease.py), taken before it committed to the run, refreshed
    # until the run ends; None elsewhere.
    lease: dataset_lease.DatasetLease | None = None

    @property
    def manifest(self) -> dict:
        return self.pinned.manifest

    @property
    def num_classes(self) -> int:
        return len(self.manifest["labels"])


@dataclasses.dataclass
class Run:
    """Phase 2's result: where and how the run trains, who writes, and its input."""

    setup: RunSetup
    interval: CheckpointInterval
    preemption_check: CheckpointInterval
    chief: bool
    printer: Callable[[str], None]
    train_data: object
    eval_data: object
    eval_steps: int

    @property
    def devices(self) -> Devices:
        return self.setup.devices

    @property
    def strategy(self) -> tf.distribute.Strategy | None:
        return self.setup.strategy

    @property
    def plan(self) -> TrainingPlan:
        return self.setup.plan

    @property
    def choice(self) -> accelerator.AcceleratorChoice:
        return self.setup.choice


@dataclasses.dataclass
class TrainingState:
    """Phase 3's result: the compiled model, its evaluation twin, the recipe, and where training resumes."""

    model: keras.Model
    evaluation_model: keras.Model
    recipe: recipe_lib.Recipe
    checkpoints: object  # the devices' checkpoints: loop/checkpoints.py KerasCheckpoints
    resumed_from_step: int
    progress: TrainingProgress


@dataclasses.dataclass
class FitOutcome:
    """Phase 4's result: what the finish phase reads of the fit."""

    evaluator: Evaluator
    writer: ScalarWriter | None
    clock: TrainingClock
    agreement: object  # checkpoints.make_worker_agreement's
    log_dir: str


def train_and_evaluate(config: TrainConfig, strategy: tf.distribute.Strategy | None = None) -> dict:
    """Train `config.model` on `config.data_dir`, evaluate on its validation split, export.

    Resumes from the latest checkpoint in `config.model_dir` at its global
    step. `strategy` overrides `config.strategy` (a notebook that already
    connected to a TPU passes its own). Returns the content of metrics.json.
    Raises a SetupError subclass (DatasetError, StrategyError, ConfigError)
    before the first step for anything the user can fix, and
    TrainingPreempted when SIGTERM stopped training (after its checkpoint).
    """
    interval = parse_checkpoint_interval(config.checkpoint_every)
    preemption_check = parse_preemption_check(config.preemption_check_every)
    data = resolve_dataset(config)
    try:
        run = start_run(config, data, strategy, interval, preemption_check)
        state = build_training_state(config, data, run)
        outcome = fit_run(config, data, run, state)
        return finish_run(config, data, run, state, outcome)
    finally:
        if data.lease is not None:
            data.lease.stop()  # the last lease stays: a resume within its day finds the run there


def resolve_dataset(config: TrainConfig) -> RunDataset:
    """Phase 1: the dataset run to train on, checked against the model; nothing is built yet.

    The model dir's pinned dataset run on a resume, else the one dataset.json
    names (dataset_pin.py). The chief leases the run before it commits to it
    (dataset_lease.py): from here on stage 1's cleanup leaves the run alone.
    """
    if requests_tpu(config):  # before anything is read: the flags alone say a TPU will be used
        check_paths_for_tpu(config.data_dir, config.model_dir, config.shared_filesystem)
    pinned, lease = dataset_lease.resolve_and_lease(
        config.data_dir, config.model_dir, enabled=dataset_lease.is_chief_process()
    )
    try:
        checks.check_model_fits(config.model, pinned.manifest)
        checks.check_dataset(config.data_dir, pinned.manifest, verify_sha256=config.verify_data)
    except BaseException:
        if lease is not None and not pinned.recorded:
            lease.release()  # a first start that will not read the run: its lease would only keep it
        elif lease is not None:
            lease.stop()  # a resume keeps its run leased for when the command is fixed
        raise
    return RunDataset(
        pinned=pinned, image_format=dataset.ImageFormat.from_manifest(pinned.manifest), lease=lease
    )


def start_run(
    config: TrainConfig,
    data: RunDataset,
    strategy: tf.distribute.Strategy | None,
    interval: CheckpointInterval,
    preemption_check: CheckpointInterval,
) -> Run:
    """Phase 2: the strategy and plan, the checks that need them, the model dir and pin, the input pipelines."""
    manifest = data.manifest
    setup = setup_run(config, manifest, strategy)
    devices, plan, choice = setup.devices, setup.plan, setup.choice
    checks.check_paths_for_hosts(
        config.data_dir, config.model_dir, devices.num_machines(), config.shared_filesystem
    )
    if (
        setup.device.kind == accelerator.TPU
    ):  # also a TPU found without being asked for ($TPU_NAME, this VM's chips)
        check_paths_for_tpu(config.data_dir, config.model_dir, config.shared_filesystem)
    # Resolved here too so that an impossible recipe fails before anything is built.
    planned_recipe = recipe_lib.resolve_recipe(config, plan)
    chief = devices.is_chief()
    worker = devices.worker_name()
    printer = print if chief else (lambda line: print(f"[{worker}] {line}", flush=True))
    # A resume must keep the checkpoint's batch, length and schedule (resume_check.py).
    resume_note = resume_check.check_resume(config.model_dir, plan, planned_recipe, chief)
    if config.more_epochs:
        # The run's own plan checked, then extended: fit goes on from the step it finished at.
        continuation = resume_check.continue_run(config.model_dir, plan, config.more_epochs, chief)
        plan = dataclasses.replace(plan, epochs=continuation.total_steps // plan.steps_per_epoch)
        setup = dataclasses.replace(setup, plan=plan, continuation=continuation)
        planned_recipe = continued_recipe(config, plan, continuation)
        resume_note = progress_lines.continuation_line(continuation, planned_recipe)
    if chief:
        printer(progress_lines.describe_plan(config, manifest, setup, planned_recipe, interval.describe()))
        if resume_note:
            printer(resume_note)
    if chief:
        tf.io.gfile.makedirs(config.model_dir)
        dataset_pin.record_pin(config.model_dir, data.pinned)
    log.info(  # the printed plan's figures, for the log of a non-chief worker too
        "strategy %s (%d replicas), %s, %s: %d epochs x %d steps, %s, %d files read at once per host",
        setup.kind,
        plan.num_replicas,
        choice.describe(),
        config.model,
        plan.epochs,
        plan.steps_per_epoch,
        plan.describe_batch(),
        plan.parallel_files,
    )
    train_data = distribute_train_input(devices, config, manifest, plan)
    eval_data, eval_steps = devices.eval_input(
        config.data_dir, manifest, manifest_lib.VALIDATION, plan.global_batch_size
    )
    return Run(
        setup=setup,
        interval=interval,
        preemption_check=preemption_check,
        chief=chief,
        printer=printer,
        train_data=train_data,
        eval_data=eval_data,
        eval_steps=eval_steps,
    )


def build_training_state(config: TrainConfig, data: RunDataset, run: Run) -> TrainingState:
    """Phase 3: model, optimizer and metrics in the strategy's scope, then the latest checkpoint restored."""
    devices, plan, choice = run.devices, run.plan, run.choice
    with devices.scope():
        model = models.build_model_for_dataset(
            config.model, data.image_format, data.num_classes, choice.policy, weights=config.weights
        )
        recipe = compile_model(model, config, plan, choice, run.setup.continuation)
        evaluation_model = build_evaluation_model(model, choice.keras_jit_compile)
    devices.prepare(
        model,
        evaluation_model,
        _replica_batch(plan, data.image_format, weighted=False),
        _replica_batch(plan, data.image_format, weighted=True),
    )
    checkpoints = devices.checkpoints(model, config.model_dir, config.checkpoints_to_keep)
    resumed_from_step = min(checkpoints.restore_latest(), plan.total_steps)
    if resumed_from_step and run.printer:
        epoch, step_in_epoch = plan.position(resumed_from_step)
        run.printer(
            f"resuming from step {resumed_from_step} of {plan.total_steps} (epoch {epoch + 1}, step "
            f"{step_in_epoch} of {plan.steps_per_epoch}), checkpoint in {checkpoints.directory}"
        )
    return TrainingState(
        model=model,
        evaluation_model=evaluation_model,
        recipe=recipe,
        checkpoints=checkpoints,
        resumed_from_step=resumed_from_step,
        progress=TrainingProgress(resumed_from_step),
    )


def fit_run(config: TrainConfig, data: RunDataset, run: Run, state: TrainingState) -> FitOutcome:
    """Phase 4: train to the end of the plan with the run's callbacks; checkpoint the final step.

    Raises TrainingPreempted (after its checkpoint) when a signal stopped training.
    """
    devices, plan, progress = run.devices, run.plan, state.progress
    log_dir = manifest_lib.join(config.model_dir, LOG_DIR)
    writer = ScalarWriter(log_dir) if run.chief else None
    evaluator = Evaluator(state.evaluation_model, run.eval_data, run.eval_steps, writer)
    clock = TrainingClock()
    notice = PreemptionNotice()
    agreement = devices.worker_agreement(run.preemption_check, state.resumed_from_step)
    saver = SaveCheckpoints(state.checkpoints, progress, plan, run.interval, notice, agreement)
    # Order matters: the step count first; at epoch ends the clock stops, then the evaluation
    # fills val_* before the checkpoint, the summaries and the progress line read it.
    callbacks = [StepCounter(progress), clock, EvaluateEachEpoch(evaluator, progress, plan)]
    if state.recipe.freeze_backbone_steps:
        callbacks.insert(0, FreezeBackbone(state.recipe.freeze_backbone_steps, progress))
    if config.eval_every:
        callbacks.append(EvaluateEverySteps(evaluator, progress, config.eval_every))
    callbacks.append(saver)
    callbacks.append(StepTelemetry(writer, progress, plan, config.log_every, printer=run.printer))
    # Chief only: TensorBoard files, epoch lines, the profile.
    if run.chief:
        callbacks += [EpochSummaries(writer), EpochProgress(progress, plan, run.printer)]
        if config.profile_steps:
            callbacks.append(ProfileSteps(log_dir, progress, *config.profile_steps))

    checkpoints = state.checkpoints
    try:
        with (
            notice,
            devices.training(run.choice),
            dataset_pin.explain_vanished_shards(data.pinned),
        ):
            fit_from_step(
                state.model,
                run.train_data,
                plan,
                state.resumed_from_step,
                callbacks,
                lambda: saver.preempted_at_step is not None,
            )
        if saver.preempted_at_step is not None:
            if writer:
                writer.close()
            # Under several workers the signal may have reached another one only.
            cause = notice.signal_name or ("a signal to another worker" if agreement.multi_worker else None)
            raise TrainingPreempted(saver.preempted_at_step, checkpoints.directory, cause)
        # Before the moving average is swapped in: the checkpoint holds the trained weights and the average.
        checkpoints.save(progress.step)  # a run that had nothing left to train still leaves its final state
    finally:
        checkpoints.close()
    return FitOutcome(evaluator=evaluator, writer=writer, clock=clock, agreement=agreement, log_dir=log_dir)


def finish_run(
    config: TrainConfig, data: RunDataset, run: Run, state: TrainingState, outcome: FitOutcome
) -> dict:
    """Phase 5: evaluate the weights that ship, then metrics.json, the plots, the backbone weights, the export.

    The trained weights' evaluation (the last epoch's, unless this run
    trained nothing), then the weights that ship: with --ema the average,
    evaluated on its own, and reported as the run's result.
    """
    model, recipe, progress, plan = state.model, state.recipe, state.progress, run.plan
    trained_evaluation = outcome.evaluator.evaluate(progress.step)
    use_final_weights(model)
    evaluation = trained_evaluation
    if recipe.ema_momentum is not None:
        evaluation = outcome.evaluator.evaluate(progress.step, label="ema")
        if outcome.writer:  # the exported weights' point on the learning curves (plots.py)
            outcome.writer.write(
                VALIDATION, "epoch", {f"ema_{name}": value for name, value in evaluation.items()}, plan.epochs
            )
    result = run_metrics(config, data, run, state, outcome, evaluation, trained_evaluation)
    counts = run.devices.confusion_matrix(model, run.eval_data, run.eval_steps, data.num_classes)
    result["validation"]["confusion_matrix"] = counts.tolist()
    warning = learned_nothing.learned_nothing_warning(
        result["validation"]["confusion_matrix"],
        result["validation"]["cross_entropy"],
        data.manifest["labels"],
        weights=config.weights,
        steps=progress.step,
        model=config.model,
    )
    if warning:
        result["validation"]["warning"] = warning
    result.update(ship_model(config, data, run, model))
    if run.chief:
        write_run_outputs(config, data, result, counts, outcome)
        run.printer(
            f"validation: accuracy {result['validation']['accuracy']:.4f}, loss "
            f"{result['validation']['cross_entropy']:.4f} on {result['validation']['num_examples']} images"
        )
        if warning:
            run.printer(warning)
        run.printer(progress_lines.final_line(result, config.model_dir, METRICS_FILE))
    return result


def run_metrics(
    config: TrainConfig,
    data: RunDataset,
    run: Run,
    state: TrainingState,
    outcome: FitOutcome,
    evaluation: dict,
    trained_evaluation: dict,
) -> dict:
    """metrics.json's content (without the confusion matrix and the written paths)."""
    plan, choice, recipe, progress = run.plan, run.choice, state.recipe, state.progress
    image_format, resumed_from_step = data.image_format, state.resumed_from_step
    result = {
        "validation": {
            "accuracy": float(evaluation["accuracy"]),
            "cross_entropy": float(evaluation["cross_entropy"]),
            "num_examples": int(round(float(evaluation["num_examples"]))),
            "weights": "moving average" if recipe.ema_momentum is not None else "trained",
        },
        "epochs": plan.epochs,
        "global_step": progress.step,
        "resumed_from_step": resumed_from_step,
        "initial_epoch": plan.position(resumed_from_step)[0],
        "steps_this_run": progress.step - resumed_from_step,
        "steps_per_epoch": plan.steps_per_epoch,
        "steps_per_execution": plan.steps_per_execution,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "num_replicas": plan.num_replicas,
        "images_per_second": outcome.clock.images_per_second(plan.global_batch_size),
        "train_seconds": outcome.clock.seconds(),
        "model": config.model,
        "backend": run.devices.backend,
        "strategy": run.setup.kind,
        "mixed_precision": choice.policy,
        "xla": choice.xla,
        "checkpoint_interval": run.interval.describe(),
        "encoding": image_format.encoding,
        "image_size": [image_format.height, image_format.width],
        "crop_size": image_format.input_shape[0],
        "data_dir": config.data_dir,
        "dataset": data.pinned.lineage,
        "recipe": recipe.as_dict(),
    }
    if recipe.ema_momentum is not None:
        result["validation_trained_weights"] = {
            "accuracy": float(trained_evaluation["accuracy"]),
            "cross_entropy": float(trained_evaluation["cross_entropy"]),
        }
    if outcome.agreement.multi_worker:
        result["preemption_check"] = outcome.agreement.describe()
    return result


def ship_model(config: TrainConfig, data: RunDataset, run: Run, model: keras.Model) -> dict:
    """backbone.weights.h5 and the export (export/, model.keras); their paths, for metrics.json.

    Every process calls it, the chief writes: on JAX, Keras' saving runs a collective that every
    process of a multi-host run must join. After use_final_weights: with --ema the averaged weights.
    """
    shipped = {
        "backbone_weights": pretrained.save_backbone_weights(model, config.model_dir, publish=run.chief)
    }
    if config.export:
        # {"export_dir", "keras_model"}: the serving SavedModel and model.keras (serving/export.py)
        shipped.update(
            run.devices.export(
                model, data.manifest, config.model_dir, data.pinned.lineage, config.model, publish=run.chief
            )
        )
    return shipped


def write_run_outputs(
    config: TrainConfig, data: RunDataset, result: dict, counts, outcome: FitOutcome
) -> None:
    """The chief's files: the plots, then metrics.json."""
    outcome.writer.close()
    plots.plot_learning_curves(
        plots.read_epoch_scalars(outcome.log_dir),
        manifest_lib.join(config.model_dir, plots.LEARNING_CURVES_FILE),
    )
    plots.plot_confusion_matrix(
        counts, data.manifest["labels"], manifest_lib.join(config.model_dir, plots.CONFUSION_MATRIX_FILE)
    )
    _write_json(manifest_lib.join(config.model_dir, METRICS_FILE), result)
