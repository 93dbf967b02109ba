"""Which is the bottleneck of a training run: the input pipeline or the train step?

    python -m train.tools.bench_input --data /tmp/dataset
    python -m train.tools.bench_input --data gs://BUCKET/dataset --tpu local --model resnet50 --global-batch-size 1024

Run this first when training is slower than it should be. With the flags a
training run would use (same model, global batch size, strategy, mixed
precision, XLA, steps per execution, the device's `auto` defaults resolved
as training resolves them, and printed first), it measures, one after the other:

  input        the training input pipeline alone (train.data.dataset.distribute_train_dataset,
               exactly what training reads), batches pulled as fast as they come
  train step   the model's train step on synthetic batches of the same shape and dtype,
               already on the host (no file is read), under the same strategy
  training     both together: real batches through the train step (what training gets)

and says which one limits training, with the figures. On a CPU-only machine
the input pipeline and the train step share the same cores, so together they
are slower than either alone; on a TPU or GPU host they overlap.
"""

import argparse
import dataclasses
import sys
import time

from dataset_contract.cli_help import DefaultsHelpFormatter
from train import flags
from train.config import MODEL_AND_MACHINE, TrainConfig

# The input pipeline counts as the bottleneck unless it delivers at least this
# much more than the train step consumes: below that margin, any hiccup in
# reading (GCS latency, a busy host) shows up as device idle time.
HEADROOM = 1.2


@dataclasses.dataclass
class BenchResult:
    input_images_per_second: float
    step_images_per_second: float
    training_images_per_second: float | None
    global_batch_size: int
    strategy: str
    num_replicas: int
    policy: str
    xla: str
    steps_per_execution: int
    device: str
    bottleneck: str  # "input" or "train step"
    verdict: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _pull(iterator, batches: int) -> None:
    for _ in range(batches):
        next(iterator)


def measure_input(data, global_batch_size: int, seconds: float, warmup_batches: int) -> float:
    """Images per second of an input pipeline (a dataset or a distributed dataset), after a warm-up."""
    iterator = iter(data)
    _pull(iterator, warmup_batches)
    batches = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or batches < 2:
        next(iterator)
        batches += 1
    return batches * global_batch_size / (time.perf_counter() - start)


def synthetic_dataset(strategy, image_format, per_replica_batch: int, num_classes: int):
    """Endless batches of random images and labels of the training shape and dtype, one per replica."""
    import tensorflow as tf

    def dataset_fn(_):
        # Pixel-like values for the pixel encodings, normalized-like values for the others.
        scale = 1.0 if image_format.normalized_offline else 64.0
        images = scale * tf.random.stateless_normal(
            [per_replica_batch, *image_format.input_shape], seed=[1, 2]
        )
        if not image_format.normalized_offline:
            images = tf.clip_by_value(images + 128.0, 0.0, 255.0)
        labels = tf.random.stateless_uniform(
            [per_replica_batch], seed=[3, 4], maxval=num_classes, dtype=tf.int32
        )
        return tf.data.Dataset.from_tensors((tf.cast(images, image_format.dtype), labels)).repeat()

    return strategy.distribute_datasets_from_function(dataset_fn)


def measure_fit(model, data, steps_per_execution: int, global_batch_size: int, seconds: float) -> float:
    """Images per second of model.fit on `data`: one short fit to compile, then a timed one of ~`seconds`."""
    model.fit(data, epochs=1, steps_per_epoch=2 * steps_per_execution, shuffle=False, verbose=0)
    # Compiled by now: a short probe sizes the timed run.
    probe_steps = 4 * steps_per_execution
    start = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=probe_steps, shuffle=False, verbose=0)
    per_step = max((time.perf_counter() - start) / probe_steps, 1e-6)
    steps = max(probe_steps, int(seconds / per_step) // steps_per_execution * steps_per_execution)
    start = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
    return steps * global_batch_size / (time.perf_counter() - start)


def verdict_for(
    input_ips: float, step_ips: float, training_ips: float | None, on_cpu: bool
) -> tuple[str, str]:
    """(bottleneck, a sentence for the user) from the measured rates."""
    if input_ips < HEADROOM * step_ips:
        bottleneck = "input"
        text = (
            f"the INPUT PIPELINE is the bottleneck: it delivers {input_ips:,.0f} images/s, the train step "
            f"could take {step_ips:,.0f} images/s ({input_ips / step_ips:.2f}x). Faster input: a raw encoding "
            "(bfloat16 or uint8) instead of jpeg, shards near the hosts (same region), more host CPU, or a "
            "smaller --shuffle-buffer if the host is short of memory"
        )
    else:
        bottleneck = "train step"
        text = (
            f"the TRAIN STEP is the bottleneck: it takes {step_ips:,.0f} images/s, the input pipeline delivers "
            f"{input_ips:,.0f} images/s ({input_ips / step_ips:.1f}x of what the step needs). Faster training "
            "comes from the model side: larger batches, mixed precision, more steps per execution"
        )
    if training_ips is not None:
        text += f". Together: {training_ips:,.0f} images/s"
        if on_cpu:
            text += " (CPU only: the input pipeline and the step share the cores)"
    return bottleneck, text


def run(args) -> BenchResult:
    import tensorflow as tf

    from dataset_contract import manifest as manifest_lib
    from train import trainer
    from train.data import checks, dataset
    from train.device import accelerator
    from train.device import strategy as strategy_lib
    from train.model import models

    config = TrainConfig(model_dir="", **flags.config_fields(args))
    manifest = checks.read_manifest(config.data_dir)
    checks.check_model_fits(config.model, manifest)
    checks.check_dataset(config.data_dir, manifest, splits=(manifest_lib.TRAIN,))
    setup = trainer.setup_run(config, manifest)
    strategy, plan, choice = setup.strategy, setup.plan, setup.choice
    image_format = dataset.ImageFormat.from_manifest(manifest)
    num_classes = len(manifest["labels"])
    print(
        f"{config.model} on {setup.kind} ({plan.num_replicas} replica(s), {setup.device.kind}): policy "
        f"{choice.policy}, XLA {choice.xla}, {plan.steps_per_execution} step(s) per execution, global batch "
        f"{plan.global_batch_size}; images {image_format.height}x{image_format.width} {image_format.encoding}",
        flush=True,
    )
    for note in choice.notes:
        print(f"  ({note})", flush=True)

    train_data = trainer.distribute_train_input(strategy, config, manifest, plan)
    input_ips = measure_input(train_data, plan.global_batch_size, args.seconds, args.warmup_batches)
    print(f"  input pipeline alone: {input_ips:,.1f} images/s", flush=True)

    with accelerator.xla_autoclustering(choice.xla == accelerator.XLA_AUTOCLUSTERING):
        with strategy.scope():
            model = models.build_model_for_dataset(config.model, image_format, num_classes, choice.policy)
            trainer.compile_model(model, config, plan, choice)
        synthetic = synthetic_dataset(strategy, image_format, plan.per_replica_batch_size, num_classes)
        step_ips = measure_fit(
            model, synthetic, plan.steps_per_execution, plan.global_batch_size, args.seconds
        )
        print(f"  train step on synthetic input: {step_ips:,.1f} images/s", flush=True)

        training_ips = None
        if not args.skip_training:
            training_ips = measure_fit(
                model, train_data, plan.steps_per_execution, plan.global_batch_size, args.seconds
            )
            print(f"  training (real input through the train step): {training_ips:,.1f} images/s", flush=True)

    on_cpu = setup.kind != strategy_lib.TPU and not tf.config.list_logical_devices("GPU")
    bottleneck, text = verdict_for(input_ips, step_ips, training_ips, on_cpu)
    return BenchResult(
        input_images_per_second=input_ips,
        step_images_per_second=step_ips,
        training_images_per_second=training_ips,
        global_batch_size=plan.global_batch_size,
        strategy=setup.kind,
        num_replicas=plan.num_replicas,
        policy=choice.policy,
        xla=choice.xla,
        steps_per_execution=plan.steps_per_execution,
        device=setup.device.kind,
        bottleneck=bottleneck,
        verdict=text,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m train.tools.bench_input",
        formatter_class=DefaultsHelpFormatter,
        description="Measure the training input pipeline alone and the train step on synthetic input of the "
        "same shape (same model, batch size, strategy), and say which one is the bottleneck.",
    )
    # The dataset and the machine flags of python -m train (train/config.py), so that the benchmark builds
    # the input and the step that training would run.
    groups = flags.add_config_flags(parser, ("data_dir", *flags.names_in(MODEL_AND_MACHINE)))
    flags.add_verbose_flag(groups[MODEL_AND_MACHINE])
    bench = parser.add_argument_group("the measurement")
    bench.add_argument("--seconds", type=float, default=20.0, help="Length of each timed measurement.")
    bench.add_argument("--warmup-batches", type=int, default=10, help="Input batches not timed.")
    bench.add_argument(
        "--skip-training", action="store_true", help="Do not time real input through the train step."
    )
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from train import console
    from train.device import cuda_cache
    from train.errors import SetupError

    console.configure(args.verbose, args.tpu)
    cuda_cache.configure_cuda_cache()  # before TensorFlow initializes CUDA, as python -m train (train/device/cuda_cache.py)
    console.import_tensorflow(args.verbose)
    try:
        result = run(args)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
