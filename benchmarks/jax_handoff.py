"""The tf.data-to-JAX handoff on the host: training's input pipeline alone vs. the same pipeline handed to JAX.

    python -m benchmarks.jax_handoff --small          # CPU, a minute or two
    python -m benchmarks.jax_handoff --data gs://BUCKET/dataset   # on a TPU VM: onto its chips

`python -m train --backend jax` feeds JAX from the TensorFlow backend's own pipeline
(train.data.dataset.make_train_dataset, one per process): Keras turns each batch into NumPy and places it
on the devices with the distribution's layout (jax.make_array_from_process_local_data). Both windows
iterate the same pipeline, in turns (`--repeats`, order alternating), `--steps` batches each:

  (a) raw pipeline   the tf.data batches themselves, as TensorFlow tensors (nothing leaves TensorFlow)
  (b) to JAX         each batch as NumPy (as_numpy_iterator, as Keras' adapter does) then onto the
                     devices with the DataParallel layout, waited for (block_until_ready)

and prints images/s of both and (b)/(a), the median over repetitions: 1.0 means handing the batches to JAX
costs nothing beside reading them; well below it, the handoff is the limit and prefetching to the device
(a second batch in flight) would pay. The dataset is `--data`, or the train_throughput benchmark's photo
dataset (stage 1 writes it once under `--cache`).
"""

import argparse
import datetime
import platform
import sys
import time

from benchmarks import corpus as corpus_lib
from benchmarks import train_throughput
from benchmarks.measure import finish_report, format_table, machine_description, machine_line, median

RAW, TO_JAX = "raw pipeline", "to JAX"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.jax_handoff", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--data", default=None, help="A stage 1 dataset (default: the photo dataset, made once)."
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Corpus and datasets cache.")
    parser.add_argument("--num-images", type=int, default=512)
    parser.add_argument("--unique", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="Batches per window (default %(default)s).")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="128 photos, batches of 32, 20 per window.")
    parser.add_argument("--tiny", action="store_true", help="Smoke test: 24 tiny photos at 32 px.")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    return parser


def _window(batches, steps: int, batch_size: int, place) -> float:
    """Images per second over `steps` batches of `batches`, each given to `place` (which waits for it)."""
    start = time.perf_counter()
    for _ in range(steps):
        place(next(batches))
    return steps * batch_size / (time.perf_counter() - start)


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    args.megapixels = corpus_lib.PHOTO_MEGAPIXELS
    if args.small:
        args.num_images, args.global_batch_size, args.steps = 128, 32, 20
    if args.tiny:
        args.num_images, args.unique, args.image_size = 24, 24, 32
        args.megapixels = corpus_lib.TINY_MEGAPIXELS
        args.global_batch_size, args.steps, args.repeats = 8, 2, 1

    from train import console

    console.configure(verbose=False, backend="jax")  # before Keras is imported
    console.import_tensorflow(verbose=False)
    import jax
    import keras
    import tensorflow as tf

    from train.data import checks, dataset

    data_dir = train_throughput._dataset_dir(args)
    manifest = checks.read_manifest(data_dir)
    distribution = keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
    batch = args.global_batch_size // jax.process_count()
    context = tf.distribute.InputContext(jax.process_count(), jax.process_index(), jax.process_count())
    pipeline = dataset.make_train_dataset(data_dir, manifest, batch, input_context=context)

    def to_devices(numpy_batch):
        # As Keras' JAX trainer does: the process's part of the global batch, laid out over the devices.
        placed = [
            jax.make_array_from_process_local_data(
                distribution.get_data_layout((args.global_batch_size, *part.shape[1:])).backend_layout, part
            )
            for part in numpy_batch
        ]
        jax.block_until_ready(placed)

    sources = {
        RAW: (iter(pipeline), lambda tensors: None),
        TO_JAX: (pipeline.as_numpy_iterator(), to_devices),
    }
    for batches, place in sources.values():  # fill the pipelines' buffers, compile nothing
        for _ in range(3):
            place(next(batches))
    rates = {name: [] for name in sources}
    for repeat in range(args.repeats):
        order = list(sources) if repeat % 2 == 0 else list(reversed(sources))
        for name in order:
            batches, place = sources[name]
            rates[name].append(_window(batches, args.steps, batch, place))
            print(f"  repeat {repeat} {name:12s} {rates[name][-1]:10.1f} images/s", flush=True)

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python -m benchmarks.jax_handoff " + " ".join(sys.argv[1:] if argv is None else argv)
    ratio = median(b / a for a, b in zip(rates[RAW], rates[TO_JAX], strict=True))
    image = manifest["image"]
    print(f"command: {command}\ndate: {when}; {machine_line()}")
    print(
        f"jax {jax.__version__}, tensorflow {tf.__version__}, python {platform.python_version()}; {jax.devices()}"
    )
    print(
        format_table(
            ["dataset", "batch per process", "(a) raw pipeline images/s", "(b) to JAX images/s", "(b)/(a)"],
            [
                [
                    f"{image['height']}x{image['width']} {image['encoding']}",
                    batch,
                    f"{median(rates[RAW]):,.1f}",
                    f"{median(rates[TO_JAX]):,.1f}",
                    f"{ratio:.2f}",
                ]
            ],
        )
    )
    figures = {
        "command": command,
        "date": when,
        "machine": machine_description(),
        "devices": [str(device) for device in jax.devices()],
        "dataset": data_dir,
        "batch_per_process": batch,
        "images_per_second": {name: median(values) for name, values in rates.items()},
        "windows": rates,
        "to_jax_over_raw": ratio,
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
