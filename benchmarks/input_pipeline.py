"""Stage 2's input pipeline vs. the usual alternative and vs. the limit of reading the shards.

    python -m benchmarks.input_pipeline --cache /tmp/bench-cache --num-images 600 --seconds 5 --repeats 8

For each encoding, stage 1 (the real job, cached) writes a dataset of the
same photos at 224x224, and these pipelines are timed, all yielding batches
of 64:

  ours        train.data.dataset.make_train_dataset: the pipeline training uses (interleaved reads,
              shuffle, batch, parse, decode per encoding; uint8 and jpeg leave the host as
              uint8 pixels, which the model normalizes on the device)
  limit       tf.data.TFRecordDataset over the same shards with the same interleave and
              parallelism, batched, no parsing: what reading the bytes alone costs
  keras       keras.utils.image_dataset_from_directory on the original JPEGs
              (crop_to_aspect_ratio=True, bilinear, like stage 1's crop), then the same
              per-channel normalization, mapped with AUTOTUNE (bfloat16 group only)

Each pipeline is built once; each window creates a fresh iterator, pulls
`--warmup-batches` batches (not counted: the shuffle buffer fills, autotune
settles), times `--seconds` of batches and drops the iterator (an idle
iterator keeps filling its buffers in the background, which would steal CPU
from the next contender). The contenders of an encoding take turns, many
short windows each (`--repeats`), so that they see the same share of a
shared machine; ratios are per repetition, median reported:

  target 4: ours (bfloat16) / keras   >= 10
  target 5: ours / limit              >= 0.7, per encoding
"""

import argparse
import os
import sys
import time

import keras
import tensorflow as tf

from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, format_table, machine_line, median
from dataset_contract import manifest as manifest_lib
from dataset_contract import verification
from train.data import dataset as dataset_lib

BATCH = 64
ENCODINGS = ("bfloat16", "float32", "uint8", "jpeg")


def read_manifest(data_dir: str) -> dict:
    return verification.read_manifest(data_dir)


def ours(data_dir: str, manifest: dict, batch: int) -> tf.data.Dataset:
    return dataset_lib.make_train_dataset(data_dir, manifest, batch)


def limit(data_dir: str, manifest: dict, batch: int) -> tf.data.Dataset:
    """Reading the train shards with our interleave, nothing else: records batched, never parsed."""
    paths = [os.path.join(data_dir, s["path"]) for s in manifest["splits"][manifest_lib.TRAIN]["shards"]]
    files = tf.data.Dataset.from_tensor_slices(paths).repeat()
    records = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=dataset_lib.READ_BUFFER_BYTES),
        cycle_length=max(1, min(len(paths), dataset_lib.DEFAULT_PARALLEL_FILES)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return records.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def keras_from_directory(corpus_dir: str, manifest: dict, batch: int) -> tf.data.Dataset:
    """The usual alternative: decode the original files at every step, resize, normalize."""
    size = manifest["image"]["height"]
    images = keras.utils.image_dataset_from_directory(
        corpus_dir,
        batch_size=batch,
        image_size=(size, size),
        crop_to_aspect_ratio=True,
        shuffle=True,
        seed=0,
        verbose=False,
    )
    mean = tf.constant(manifest["normalization"]["mean"], tf.float32)
    std = tf.constant(manifest["normalization"]["std"], tf.float32)
    normalized = images.map(lambda x, y: ((x - mean) / std, y), num_parallel_calls=tf.data.AUTOTUNE)
    return normalized.repeat().prefetch(tf.data.AUTOTUNE)


def time_window(iterator, seconds: float, warmup_batches: int) -> tuple[float, float]:
    """(images per second, CPU seconds per 1000 images) over `seconds` of pulling batches, after a warm-up.

    CPU is this process's (every tf.data thread's) user + system time: what an
    image costs whatever share of a shared machine the window got.
    """
    for _ in range(warmup_batches):
        next(iterator)
    images = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while True:
        element = next(iterator)
        images += int(element[0].shape[0]) if isinstance(element, tuple) else int(element.shape[0])
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return images / elapsed, 1000 * (time.process_time() - cpu_start) / images


def bytes_per_image(manifest: dict) -> float:
    train = manifest["splits"][manifest_lib.TRAIN]
    return sum(s["num_bytes"] for s in train["shards"]) / train["num_examples"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.input_pipeline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", default="/tmp/bench-cache", help="Corpus and datasets cache.")
    parser.add_argument("--num-images", type=int, default=600)
    parser.add_argument("--unique", type=int, default=None)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--encodings", default=",".join(ENCODINGS))
    parser.add_argument("--seconds", type=float, default=5.0, help="Length of one timed window.")
    parser.add_argument(
        "--warmup-batches", type=int, default=5, help="Batches before each window, not timed."
    )
    parser.add_argument("--repeats", type=int, default=8, help="Windows per contender, in turns.")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument(
        "--tiny", action="store_true", help="Smoke test: 12 tiny photos, 32 px, short windows."
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    batch = BATCH
    megapixels = corpus_lib.PHOTO_MEGAPIXELS
    if args.tiny:
        args.num_images, args.unique, args.image_size = 24, 24, 32
        args.seconds, args.warmup_batches, args.repeats, batch = 0.5, 1, 1, 4
        megapixels = corpus_lib.TINY_MEGAPIXELS
    encodings = [e.strip() for e in args.encodings.split(",") if e.strip()]
    corpus = corpus_lib.photo_corpus(args.cache, args.num_images, unique=args.unique, megapixels=megapixels)
    print(machine_line())
    print(
        f"corpus: {corpus}: {len(corpus_lib.corpus_files(corpus))} JPEGs; {args.image_size}x{args.image_size}, "
        f"batch {batch}, windows of {args.seconds:g} s x {args.repeats}",
        flush=True,
    )
    results = {}
    for encoding in encodings:
        data_dir = corpus_lib.stage1_dataset(
            args.cache, corpus, image_size=args.image_size, encoding=encoding
        )
        manifest = read_manifest(data_dir)
        contenders = {"ours": ours(data_dir, manifest, batch), "limit": limit(data_dir, manifest, batch)}
        if encoding == "bfloat16":
            contenders["keras"] = keras_from_directory(corpus, manifest, batch)
        rates = {name: [] for name in contenders}
        cpu = {name: [] for name in contenders}
        for repeat in range(args.repeats):
            names = list(contenders)
            names = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in names:
                # A fresh iterator per window, dropped after it: an idle pipeline would otherwise keep
                # filling its buffers in the background while the next contender is timed.
                iterator = iter(contenders[name])
                rate, cpu_ms = time_window(iterator, args.seconds, args.warmup_batches)
                del iterator
                rates[name].append(rate)
                cpu[name].append(cpu_ms)
                print(
                    f"  {encoding:8s} repeat {repeat} {name:6s} {rate:9.1f} images/s  "
                    f"{cpu_ms:7.2f} CPU s per 1000 images",
                    flush=True,
                )
        results[encoding] = {
            "bytes_per_image": bytes_per_image(manifest),
            "images_per_second": {name: median(values) for name, values in rates.items()},
            "windows": rates,
            "cpu_seconds_per_1000_images": {name: median(values) for name, values in cpu.items()},
            "ours_over_limit": median(o / lim for o, lim in zip(rates["ours"], rates["limit"], strict=True)),
        }
        if "keras" in rates:
            results[encoding]["ours_over_keras"] = median(
                o / k for o, k in zip(rates["ours"], rates["keras"], strict=True)
            )
        del contenders

    rows = [
        [
            encoding,
            f"{r['bytes_per_image']:,.0f}",
            f"{r['images_per_second']['ours']:,.0f}",
            f"{r['images_per_second']['limit']:,.0f}",
            f"{r['ours_over_limit']:.2f}",
            "met" if r["ours_over_limit"] >= 0.7 else "NOT met",
            f"{r['cpu_seconds_per_1000_images']['ours']:.2f}",
            f"{r['cpu_seconds_per_1000_images']['limit']:.2f}",
        ]
        for encoding, r in results.items()
    ]
    print()
    print(
        format_table(
            [
                "encoding",
                "bytes/image",
                "ours images/s",
                "limit images/s",
                "ours/limit",
                "target >= 0.7",
                "ours CPU s/1000 img",
                "limit CPU s/1000 img",
            ],
            rows,
        )
    )
    if "bfloat16" in results and "ours_over_keras" in results["bfloat16"]:
        r = results["bfloat16"]
        verdict = "met" if r["ours_over_keras"] >= 10 else "NOT met"
        print(
            f"\nours (bfloat16) {r['images_per_second']['ours']:,.0f} images/s vs "
            f"image_dataset_from_directory {r['images_per_second']['keras']:,.1f} images/s: "
            f"{r['ours_over_keras']:.1f}x (median of per-window ratios); target >= 10x: {verdict}. CPU per "
            f"image: keras {r['cpu_seconds_per_1000_images']['keras']:.1f} ms, ours "
            f"{r['cpu_seconds_per_1000_images']['ours']:.1f} ms"
        )
    figures = {
        "corpus": corpus,
        "batch": batch,
        "results": results,
    }
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
