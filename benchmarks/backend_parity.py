"""The same recipe on Keras' two backends reaches the same validation accuracy, within the noise of seeds.

    python -m benchmarks.backend_parity --cache /tmp/bench-cache --images-per-class 100 --steps 300 --seeds 0,1,2
    python -m benchmarks.backend_parity --cache /tmp/bench-cache --datasets digits --steps 450 --seeds 0,1,2

On the shape corpus (pipelines.sample_corpus, five classes, no broken files; stage 1 writes a 64x64 uint8
dataset from it once, cached) or scikit-learn's digits (tests/data/digits.csv.gz: 1,797 real 8x8 scans of
ten digits, written as PNGs, through stage 1 at 32x32 uint8), `train.trainer.train_and_evaluate` trains the small CNN
`--steps` steps of `--batch-size` images, once per seed and backend, each run in a process of its own
(KERAS_BACKEND is read when Keras is imported; JAX over two host devices, as over a TPU host's chips) after
keras.utils.set_random_seed(seed). It prints every run's validation accuracy and the medians per backend.
tf.data reads the shards non-deterministically on both sides, so runs differ by seed and by read order: the
spread across seeds is the noise to compare the medians against.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, format_table, machine_line, median

BACKENDS = ("tensorflow", "jax")
_RUN = """
import json, sys
import keras
from train.config import TrainConfig
from train.trainer import train_and_evaluate
seed, data_dir, model_dir, steps, batch, learning_rate = sys.argv[1:7]
keras.utils.set_random_seed(int(seed))
config = TrainConfig(data_dir=data_dir, model_dir=model_dir, steps=int(steps), global_batch_size=int(batch),
                     learning_rate=float(learning_rate), export=False, checkpoint_every="epoch")
metrics = train_and_evaluate(config)
print("RESULT " + json.dumps({"accuracy": metrics["validation"]["accuracy"],
                              "images_per_second": metrics["images_per_second"], "backend": metrics["backend"]}))
"""


def shape_dataset(cache: str, images_per_class: int) -> str:
    from benchmarks.accuracy_parity import shape_corpus

    corpus = shape_corpus(cache, images_per_class)
    return corpus_lib.stage1_dataset(cache, corpus, image_size=64, encoding="uint8")


DIGITS_CSV = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "digits.csv.gz"
)


def digits_dataset(cache: str) -> str:
    """scikit-learn's digits as PNGs in a folder per digit (once), through stage 1 at 32x32 uint8 (cached)."""
    import numpy as np
    from PIL import Image

    root = os.path.join(cache, "digits")
    if not os.path.isdir(root):
        with gzip.open(DIGITS_CSV, "rt") as handle:
            rows = np.loadtxt(handle, delimiter=",", dtype=np.int64)
        partial = root + ".partial"
        for index, row in enumerate(rows):
            folder = os.path.join(partial, str(row[64]))
            os.makedirs(folder, exist_ok=True)
            pixels = (row[:64].reshape(8, 8) * 255 // 16).astype(np.uint8)  # the scans count 0-16
            Image.fromarray(pixels).save(os.path.join(folder, f"{index:04d}.png"))
        os.replace(partial, root)
    return corpus_lib.stage1_dataset(cache, root, image_size=32, encoding="uint8")


DATASETS = {
    "shapes": lambda args: shape_dataset(args.cache, args.images_per_class),
    "digits": lambda args: digits_dataset(args.cache),
}


def run(backend: str, seed: int, data_dir: str, args) -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if backend == "jax":
        env.update(
            JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2", TPU_LOAD_LIBRARY="0"
        )
    with tempfile.TemporaryDirectory(prefix="backend-parity-") as model_dir:
        argv = [
            str(seed),
            data_dir,
            model_dir,
            str(args.steps),
            str(args.batch_size),
            str(args.learning_rate),
        ]
        finished = subprocess.run(
            [sys.executable, "-c", _RUN, *argv], env=env, capture_output=True, text=True, check=False
        )
    if finished.returncode != 0:
        raise RuntimeError(f"{backend} seed {seed} failed:\n{finished.stderr[-3000:]}")
    line = next(line for line in finished.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.backend_parity", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", default="/tmp/bench-cache")
    parser.add_argument("--images-per-class", type=int, default=100)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--datasets", default="shapes", help="Comma-separated: shapes, digits.")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    datasets = {name: DATASETS[name](args) for name in args.datasets.split(",")}
    command = "python -m benchmarks.backend_parity " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: {command}\n{machine_line()}", flush=True)
    results = {}
    for name, data_dir in datasets.items():
        for backend in BACKENDS:
            for seed in seeds:
                result = run(backend, seed, data_dir, args)
                assert result["backend"] == backend, result
                results.setdefault(name, {}).setdefault(backend, []).append(result)
                print(f"  {name} {backend:10s} seed {seed}: accuracy {result['accuracy']:.4f}", flush=True)
    rows = []
    for name, by_backend in results.items():
        for backend, runs in by_backend.items():
            accuracies = [r["accuracy"] for r in runs]
            rows.append(
                [
                    name,
                    backend,
                    ", ".join(f"{a:.3f}" for a in accuracies),
                    f"{median(accuracies):.3f}",
                    f"{max(accuracies) - min(accuracies):.3f}",
                    f"{median(r['images_per_second'] or 0.0 for r in runs):,.1f}",
                ]
            )
    print(
        format_table(
            ["dataset", "backend", f"accuracy, seeds {args.seeds}", "median", "spread", "images/s (median)"],
            rows,
        )
    )
    return finish_report({"command": command, "seeds": seeds, "results": results}, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
