"""Training throughput on this machine's device: batches already on the device vs. the real input pipeline.

    python -m benchmarks.train_throughput --small                       # CPU, a few minutes on 2 cores
    python -m benchmarks.train_throughput                               # a GPU machine, unchanged
    python -m benchmarks.train_throughput --tpu local --data gs://BUCKET/dataset   # a TPU VM (any uint8 dataset)
    python -m benchmarks.train_throughput --small --backend jax          # the same on Keras' JAX backend

For each model (`resnet50`, `mobilenetv3small` by default) at 224x224 it
trains with the device's defaults, resolved exactly as `python -m train`
resolves them (train.trainer.setup_run: the strategy, mixed precision, XLA,
steps per execution from train/device/accelerator.py), the model built and compiled
by the training code itself (train.model.models, train.trainer.compile_model), and
times `model.fit` on two inputs:

  (a) on device   one synthetic batch of the training shape and dtype, made once and repeated
                  (train.tools.bench_input.synthetic_dataset, distributed like training's input): no file is
                  read and nothing is decoded, so the step runs as fast as the device allows
  (b) real input  training's own input pipeline (train.trainer.distribute_train_input over
                  train.data.dataset's reader) on a uint8 dataset written by stage 1

(`--backend jax`: under keras.distribution.DataParallel, with (a) one batch of this process's share
repeated and (b) the same pipeline handed to JAX per process, as python -m train --backend jax runs it)
and prints (b)/(a): 1.0 means the input pipeline keeps the device fed; below
INPUT_BOUND_BELOW, training is input-bound. On a CPU-only machine the input
pipeline and the train step share the same cores, so (b) is below (a) there
by construction; on a GPU or TPU host they overlap, which is what the ratio
is for. Each window also records this process's CPU time per image (every
thread): on a CPU that is the cost of the step (plus, in (b), of reading and
decoding), and unlike images/s it does not depend on the share of a busy
machine the window got (on a machine shared with other jobs, a process with
more runnable threads, such as one running an input pipeline, gets a larger
share, which can put (b) above (a)).

The dataset is `--data` (any stage 1 dataset, local or gs://; on a TPU it
must be on GCS), or else stage 1 (`python -m preprocess`, the real job)
writes one at `--image-size` in uint8 from the benchmarks' photo corpus
(benchmarks/corpus.py), cached under `--cache`.

Each window is one `fit` of `--warmup-steps` untimed steps (the pipeline's
buffers fill, autotune settles) then the timed steps; the two inputs take
turns (`--repeats`, order alternating) and the ratio is the median of the
per-repetition ratios. The steps of a window default to about `--seconds`
of training, sized from a short probe.
"""

import argparse
import dataclasses
import datetime
import math
import platform
import sys
import time

from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, format_table, machine_description, machine_line, median

MODELS = ("resnet50", "mobilenetv3small")
# Training is input-bound when the real input pipeline leaves it below this fraction of the on-device rate.
INPUT_BOUND_BELOW = 0.9
# Long enough that every device default of steps per execution (32 TPU, 8 GPU, 1 CPU) divides an epoch:
# the plan then keeps the device's default whatever the dataset's size (train.loop.plan.plan_training).
_STEPS_PER_EPOCH = 1024
ON_DEVICE, REAL_INPUT = "on device", "real input"


@dataclasses.dataclass
class ModelResult:
    model: str
    backend: str
    device: str
    strategy: str
    num_replicas: int
    policy: str
    xla: str
    steps_per_execution: int
    global_batch_size: int
    steps_per_window: int
    images_per_second: dict  # {ON_DEVICE: median, REAL_INPUT: median}
    cpu_ms_per_image: dict  # {ON_DEVICE: median, REAL_INPUT: median}: this process's CPU time, every thread
    windows: dict  # {ON_DEVICE: [...], REAL_INPUT: [...]}
    real_over_on_device: float
    input_bound: bool


class _WindowClock:
    """Times the steps of a fit after its warm-up executions; the fit's return ends the window."""

    def __init__(self, warmup_executions: int):
        import keras

        clock = self

        class Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                clock.executions += 1
                if clock.executions == warmup_executions:
                    # The loss of the last warm-up step, read back: every step before it has finished.
                    float(keras.ops.convert_to_numpy(logs["loss"]))
                    clock.start, clock.start_step = time.perf_counter(), batch + 1
                    clock.cpu_start = time.process_time()

        self.callback = Callback()
        self.executions = 0
        self.start = None
        self.start_step = 0
        self.cpu_start = 0.0


def time_window(model, data, warmup_steps: int, steps: int, global_batch_size: int) -> tuple[float, float]:
    """(images per second, CPU ms per image) of `steps` training steps on `data`, after `warmup_steps` untimed ones.

    The CPU time is this process's, every thread's (the train step's on a CPU, the input pipeline's, the
    host's share of an accelerator's step): unlike images/s, it does not depend on the share of a busy
    machine the window got.
    """
    per_call = model.steps_per_execution
    warmup_executions = max(1, math.ceil(warmup_steps / per_call))
    clock = _WindowClock(warmup_executions)
    total = warmup_executions * per_call + steps
    model.fit(data, epochs=1, steps_per_epoch=total, shuffle=False, verbose=0, callbacks=[clock.callback])
    # fit returns its logs as numbers: the last step has finished.
    elapsed, cpu = time.perf_counter() - clock.start, time.process_time() - clock.cpu_start
    images = (total - clock.start_step) * global_batch_size
    return images / elapsed, 1000 * cpu / images


def _build_model(config, setup, manifest, image_format):
    """The model as train_and_evaluate builds and compiles it (train.model.models, train.trainer)."""
    import keras

    from train import trainer
    from train.model import models

    strategy, plan, choice = setup.strategy, setup.plan, setup.choice
    if strategy is None:  # JAX: nothing of tf.distribute to prepare
        with setup.devices.scope():
            model = models.build_model_for_dataset(
                config.model, image_format, len(manifest["labels"]), choice.policy
            )
            trainer.compile_model(model, config, plan, choice)
        return model
    with strategy.scope():
        model = models.build_model_for_dataset(
            config.model, image_format, len(manifest["labels"]), choice.policy
        )
        trainer.compile_model(model, config, plan, choice)
        batch = plan.per_replica_batch_size
        trainer.build_from_shapes(
            model,
            strategy,
            (
                keras.KerasTensor((batch, *image_format.input_shape), image_format.dtype.name),
                keras.KerasTensor((batch,), "int32"),
            ),
        )
        trainer.reduce_logs_as_vectors(model, strategy)
    return model


def _synthetic_input(setup, image_format, num_classes: int):
    """(a)'s input: the TensorFlow backend's distributed one; on JAX one batch of this process's share."""
    import tensorflow as tf

    from train.tools import bench_input

    plan = setup.plan
    if setup.strategy is not None:
        return bench_input.synthetic_dataset(
            setup.strategy, image_format, plan.per_replica_batch_size, num_classes
        )
    batch = plan.global_batch_size // setup.devices.num_processes
    single = bench_input.synthetic_dataset(tf.distribute.get_strategy(), image_format, batch, num_classes)
    return tf.data.Dataset.from_tensors(next(iter(single))).repeat()


def measure_model(
    args, model_name: str, data_dir: str, manifest: dict, strategy, replicas: int
) -> ModelResult:
    from train import trainer
    from train.config import TrainConfig
    from train.data import dataset

    config = TrainConfig(
        data_dir=data_dir,
        model_dir="",
        model=model_name,
        global_batch_size=args.global_batch_size or args.per_replica_batch * replicas,
        steps_per_epoch=_STEPS_PER_EPOCH,
        tpu=args.tpu,
        shuffle_buffer=args.shuffle_buffer,
        backend=args.backend,
    )
    setup = trainer.setup_run(config, manifest, strategy)
    plan, choice = setup.plan, setup.choice
    image_format = dataset.ImageFormat.from_manifest(manifest)
    print(
        f"\n{model_name} on {args.backend}: {setup.device.kind} ({setup.kind} strategy, {plan.num_replicas} replica(s)), "
        f"{choice.describe()}, global batch {plan.global_batch_size}",
        flush=True,
    )
    for note in choice.notes:
        print(f"  ({note})", flush=True)

    with setup.devices.training(choice):
        model = _build_model(config, setup, manifest, image_format)
        inputs = {
            ON_DEVICE: _synthetic_input(setup, image_format, len(manifest["labels"])),
            REAL_INPUT: trainer.distribute_train_input(setup.devices, config, manifest, plan),
        }
        per_call = plan.steps_per_execution
        start = time.perf_counter()
        for data in inputs.values():  # traces and compiles the train step for each input
            model.fit(data, epochs=1, steps_per_epoch=per_call, shuffle=False, verbose=0)
        print(f"  compiled in {time.perf_counter() - start:.0f} s", flush=True)
        steps = args.steps
        if steps is None:
            probe, _ = time_window(model, inputs[ON_DEVICE], 0, 2 * per_call, plan.global_batch_size)
            steps = max(2, round(args.seconds * probe / plan.global_batch_size / per_call)) * per_call
        steps = math.ceil(steps / per_call) * per_call
        windows = {name: [] for name in inputs}
        cpu = {name: [] for name in inputs}
        for repeat in range(args.repeats):
            order = list(inputs) if repeat % 2 == 0 else list(reversed(inputs))
            for name in order:
                rate, cpu_ms = time_window(
                    model, inputs[name], args.warmup_steps, steps, plan.global_batch_size
                )
                windows[name].append(rate)
                cpu[name].append(cpu_ms)
                print(
                    f"  repeat {repeat} {name:11s} {rate:10.1f} images/s, {cpu_ms:8.1f} CPU ms per image "
                    f"({steps} steps)",
                    flush=True,
                )
    del model, inputs
    ratio = median(b / a for a, b in zip(windows[ON_DEVICE], windows[REAL_INPUT], strict=True))
    return ModelResult(
        model=model_name,
        backend=args.backend,
        device=setup.device.kind,
        strategy=setup.kind,
        num_replicas=plan.num_replicas,
        policy=choice.policy,
        xla=choice.xla,
        steps_per_execution=plan.steps_per_execution,
        global_batch_size=plan.global_batch_size,
        steps_per_window=steps,
        images_per_second={name: median(values) for name, values in windows.items()},
        cpu_ms_per_image={name: median(values) for name, values in cpu.items()},
        windows=windows,
        real_over_on_device=ratio,
        input_bound=ratio < INPUT_BOUND_BELOW,
    )


def verdict(result: ModelResult) -> str:
    on_device, real = result.images_per_second[ON_DEVICE], result.images_per_second[REAL_INPUT]
    if result.input_bound:
        text = (
            f"{result.model}: INPUT-BOUND: the real input pipeline gives {real:,.1f} images/s, "
            f"{result.real_over_on_device:.2f}x of the {on_device:,.1f} images/s the device trains at with "
            f"batches already on it (below {INPUT_BOUND_BELOW})"
        )
    else:
        text = (
            f"{result.model}: not input-bound: the real input pipeline keeps up "
            f"({result.real_over_on_device:.2f}x of the on-device rate, {real:,.1f} vs {on_device:,.1f} images/s)"
        )
    if result.device == "cpu":
        text += (
            f" (CPU only: the input pipeline and the train step share the cores; CPU per image "
            f"{result.cpu_ms_per_image[REAL_INPUT]:,.1f} ms with the real input vs "
            f"{result.cpu_ms_per_image[ON_DEVICE]:,.1f} ms on device)"
        )
    return text


def _dataset_dir(args) -> str:
    if args.data:
        return args.data
    corpus = corpus_lib.photo_corpus(
        args.cache, args.num_images, unique=args.unique, megapixels=args.megapixels
    )
    print(
        f"corpus: {corpus}; stage 1 writes (or has cached) a uint8 dataset at {args.image_size}", flush=True
    )
    return corpus_lib.stage1_dataset(args.cache, corpus, image_size=args.image_size, encoding="uint8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.train_throughput", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--models", default=",".join(MODELS), help="Comma-separated (default %(default)s).")
    parser.add_argument(
        "--data",
        default=None,
        help="A stage 1 dataset (local or gs://) to read; default: one stage 1 writes from the corpus.",
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Corpus and datasets cache.")
    parser.add_argument("--num-images", type=int, default=512, help="Corpus size (default %(default)s).")
    parser.add_argument("--unique", type=int, default=64, help="Distinct photos in it (default %(default)s).")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--per-replica-batch", type=int, default=64, help="Batch per replica (default %(default)s)."
    )
    parser.add_argument("--global-batch-size", type=int, default=None, help="Overrides --per-replica-batch.")
    parser.add_argument(
        "--shuffle-buffer", type=int, default=2048, help="As training's (default %(default)s)."
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="Timed steps per window (default: --seconds)."
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="Window length when --steps is not given."
    )
    parser.add_argument("--warmup-steps", type=int, default=4, help="Untimed steps before each window.")
    parser.add_argument("--repeats", type=int, default=3, help="Windows per input, in turns (default 3).")
    parser.add_argument(
        "--tpu",
        default=None,
        help="As train's --tpu: 'local' on a TPU VM, a slice's name on its worker 0 (then --data gs://...).",
    )
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument(
        "--small",
        action="store_true",
        help="A CPU-sized run (about 5 minutes on 2 idle cores): 128 images, batch 8, 2 warm-up steps.",
    )
    parser.add_argument("--tiny", action="store_true", help="Smoke test: 24 tiny photos at 32 px, 1 step.")
    parser.add_argument("--verbose", action="store_true", help="TensorFlow's INFO logs too.")
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax"),
        default=None,
        help="Keras' backend, as python -m train --backend (default: $KERAS_BACKEND, else tensorflow).",
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    args.megapixels = corpus_lib.PHOTO_MEGAPIXELS
    if args.small:
        args.num_images, args.per_replica_batch, args.warmup_steps = 128, 8, 2
    if args.tiny:
        args.num_images, args.unique, args.image_size = 24, 24, 32
        args.megapixels = corpus_lib.TINY_MEGAPIXELS
        args.per_replica_batch, args.steps, args.warmup_steps, args.repeats = 4, 1, 1, 1
    models = [name.strip() for name in args.models.split(",") if name.strip()]

    from train import console
    from train.config import resolve_backend

    args.backend = resolve_backend(args.backend)
    console.configure(args.verbose, args.tpu, args.backend)  # before Keras is imported
    console.import_tensorflow(args.verbose)
    import tensorflow as tf

    from train.data import checks
    from train.device import strategy as strategy_lib

    data_dir = _dataset_dir(args)
    manifest = checks.read_manifest(data_dir)
    image = manifest["image"]
    if args.backend == "jax":
        import jax

        strategy, replicas = None, jax.device_count()
    else:
        strategy = strategy_lib.resolve_strategy("tpu" if args.tpu else "auto", args.tpu)
        replicas = strategy.num_replicas_in_sync
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m benchmarks.train_throughput " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: {command}")
    print(f"date: {when}; {machine_line()}")
    print(
        f"tensorflow {tf.__version__}, python {platform.python_version()}; devices: "
        + ", ".join(sorted({d.device_type for d in tf.config.list_logical_devices()}))
    )
    print(
        f"dataset: {data_dir}: {manifest['splits']['train']['num_examples']} train images, "
        f"{image['height']}x{image['width']} {image['encoding']}",
        flush=True,
    )
    results = [measure_model(args, name, data_dir, manifest, strategy, replicas) for name in models]

    print()
    print(
        format_table(
            [
                "model",
                "backend",
                "device",
                "policy",
                "XLA",
                "steps/exec",
                "global batch",
                "(a) on device images/s",
                "(b) real input images/s",
                "(b)/(a)",
                "input-bound",
                "(a) CPU ms/image",
                "(b) CPU ms/image",
            ],
            [
                [
                    r.model,
                    r.backend,
                    f"{r.device} x{r.num_replicas}",
                    r.policy,
                    r.xla,
                    r.steps_per_execution,
                    r.global_batch_size,
                    f"{r.images_per_second[ON_DEVICE]:,.1f}",
                    f"{r.images_per_second[REAL_INPUT]:,.1f}",
                    f"{r.real_over_on_device:.2f}",
                    "yes" if r.input_bound else "no",
                    f"{r.cpu_ms_per_image[ON_DEVICE]:,.1f}",
                    f"{r.cpu_ms_per_image[REAL_INPUT]:,.1f}",
                ]
                for r in results
            ],
        )
    )
    for result in results:
        print(verdict(result))
    figures = {
        "command": command,
        "date": when,
        "machine": machine_description(),
        "tensorflow": tf.__version__,
        "backend": args.backend,
        "dataset": data_dir,
        "image": f"{image['height']}x{image['width']} {image['encoding']}",
        "input_bound_below": INPUT_BOUND_BELOW,
        "results": {r.model: dataclasses.asdict(r) for r in results},
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
