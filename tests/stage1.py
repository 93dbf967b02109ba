"""Test support: generate a corpus, run the real stage 1 job on it, read shards back.

Shared by the preprocess, train and pipelines tests. Reading uses plain
tf.data on the files the manifest lists, nothing from `train`.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from pipelines.sample_corpus import write_sample_corpus

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# An interpreter with stage 1's stack, for a test environment without it: the Python 3.10 leg of
# scripts/test.sh, where Beam 2.77 and tf.Transform 1.21 cannot install together (requirements-py310.txt),
# sets it to the quick start's .venv, as production writes datasets on Dataflow and reads them on a TPU VM.
STAGE1_PYTHON_VARIABLE = "STAGE1_PYTHON"


def write_corpus(root, images_per_class=10, seed=0, include_broken=True, near_duplicates=False):
    return write_sample_corpus(
        str(root),
        images_per_class=images_per_class,
        seed=seed,
        include_broken=include_broken,
        near_duplicates=near_duplicates,
    )


# The sample corpus is a few images per class plus six broken files: a quarter or more of it fails at
# the sizes tests use, far above --max-failed-fraction's default, which tests/preprocess/publish/test_publish_guards.py
# holds on its own.
ALLOW_ANY_FAILURES = ("--max-failed-fraction", "1")


def run_stage1(input_spec, output_dir, *extra_args, image_size=32, encoding="float32", min_shards=2):
    """Runs `python -m preprocess` in process (DirectRunner); returns the manifest.

    Any share of failed inputs is accepted unless `extra_args` sets --max-failed-fraction.
    """
    if "--max-failed-fraction" not in extra_args:
        extra_args = (*extra_args, *ALLOW_ANY_FAILURES)
    argv = [
        "--input",
        str(input_spec),
        "--output",
        str(output_dir),
        "--image-size",
        str(image_size),
        "--encoding",
        encoding,
        "--min-shards",
        str(min_shards),
        *extra_args,
    ]
    if importlib.util.find_spec("apache_beam") is None and os.environ.get(STAGE1_PYTHON_VARIABLE):
        return _run_stage1_in(os.environ[STAGE1_PYTHON_VARIABLE], argv)
    from preprocess import options  # noqa: PLC0415
    from preprocess.launch import launcher  # noqa: PLC0415 - needs Beam and tf.Transform

    return launcher.run(*options.parse_args(argv))


class SharedStage1Datasets:
    """Datasets the real stage 1 job wrote from the sample corpus, each written once per test session and
    copied for every module that asks (the `shared_stage1_datasets` fixture, tests/conftest.py).

    Several modules' fixtures began with the same corpus and the same stage 1 run; one run serves them all.
    A copy's files are new (copied, not their times kept), as if stage 1 had just written them; the corpus
    is shared: read it, do not change it.
    """

    def __init__(self, root):
        self._root = Path(root)
        self._written = {}

    def copy(self, destination, images_per_class: int, **stage1_args) -> tuple[str, dict]:
        """(corpus root, manifest): `destination` holds the dataset `run_stage1(corpus, ..., **stage1_args)`
        wrote from `write_corpus(..., images_per_class)`."""
        key = (images_per_class, tuple(sorted(stage1_args.items())))
        if key not in self._written:
            base = self._root / f"dataset-{len(self._written)}"
            corpus = write_corpus(base / "corpus", images_per_class=images_per_class)
            manifest = run_stage1(corpus.root, base / "dataset", **stage1_args)
            self._written[key] = (corpus.root, base / "dataset", json.dumps(manifest))
        corpus_root, dataset, manifest = self._written[key]
        shutil.copytree(dataset, destination, copy_function=shutil.copy)
        return corpus_root, json.loads(manifest)


def _run_stage1_in(python: str, argv: list[str]) -> dict:
    """`preprocess.launch.launcher.run` of `argv` in a process of `python` (this checkout first on its path)."""
    with tempfile.TemporaryDirectory() as scratch:
        manifest_path = os.path.join(scratch, "manifest.json")
        code = (
            "import json, sys\n"
            "from preprocess import options\n"
            "from preprocess.launch import launcher\n"
            "with open(sys.argv[1], 'w') as out:\n"
            "    json.dump(launcher.run(*options.parse_args(sys.argv[2:])), out)\n"
        )
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        }
        result = subprocess.run(
            [python, "-c", code, manifest_path, *argv], env=env, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"stage 1 under {python} failed:\n{result.stderr[-5000:]}")
        with open(manifest_path) as handle:
            return json.load(handle)


def read_manifest(dataset_dir):
    """The published manifest, found by the one reader (dataset_contract/commit_log.py)."""
    from dataset_contract import verification  # noqa: PLC0415 - TensorFlow, only when a dataset is read

    return verification.read_manifest(str(dataset_dir))


def read_errors(dataset_dir):
    """Every line of the error log's files the manifest lists, in the order listed."""
    errors = []
    for relative in manifest_lib.error_file_paths(read_manifest(dataset_dir)):
        with open(os.path.join(dataset_dir, relative)) as handle:
            errors += [json.loads(line) for line in handle if line.strip()]
    return errors


_PARSE_SPEC = {
    features.IMAGE: tf.io.FixedLenFeature([], tf.string),
    features.LABEL: tf.io.FixedLenFeature([], tf.int64),
    features.CLASS_NAME: tf.io.FixedLenFeature([], tf.string),
    features.SHA256: tf.io.FixedLenFeature([], tf.string),
    features.URI: tf.io.FixedLenFeature([], tf.string),
}


def decode_image_feature(payload: bytes, manifest) -> np.ndarray:
    """The stored image as float32 [H, W, 3] in the stored units (normalized or 0-255)."""
    image = manifest["image"]
    shape = (image["height"], image["width"], image["channels"])
    encoding = image["encoding"]
    if encoding == features.JPEG:
        return tf.io.decode_jpeg(payload, channels=3).numpy().astype(np.float32)
    dtype = {features.BFLOAT16: tf.bfloat16, features.FLOAT32: tf.float32, features.UINT8: tf.uint8}[encoding]
    return tf.cast(tf.reshape(tf.io.decode_raw(payload, dtype), shape), tf.float32).numpy()


def read_split(dataset_dir, split, manifest=None):
    """Every example of a split, as dicts with the image decoded per the manifest."""
    manifest = manifest or read_manifest(dataset_dir)
    paths = [os.path.join(dataset_dir, shard["path"]) for shard in manifest["splits"][split]["shards"]]
    rows = []
    for record in tf.data.TFRecordDataset(paths):
        parsed = tf.io.parse_single_example(record, _PARSE_SPEC)
        rows.append(
            {
                "image": decode_image_feature(parsed[features.IMAGE].numpy(), manifest),
                "label": int(parsed[features.LABEL]),
                "class_name": parsed[features.CLASS_NAME].numpy().decode(),
                "sha256": parsed[features.SHA256].numpy().decode(),
                "uri": parsed[features.URI].numpy().decode(),
            }
        )
    return rows


def published_manifest_path(dataset_dir) -> Path:
    """Where the published manifest's bytes are (local disk): the head commit of `manifests/`, or
    `dataset.json` in the older layouts (dataset_contract/commit_log.py)."""
    from dataset_contract import commit_log  # noqa: PLC0415

    manifests = Path(dataset_dir) / manifest_lib.MANIFESTS_DIR
    head = commit_log.head_of(os.listdir(manifests)) if manifests.is_dir() else None
    return manifests / head[1] if head else Path(dataset_dir) / manifest_lib.MANIFEST_FILE


def write_published_manifest(dataset_dir, manifest: dict, older_layout: bool = False):
    """A test's edit of a written dataset: `manifest` becomes the published one in place (the head commit
    and its copy, dataset.json). `older_layout`: the log goes, and dataset.json alone is the manifest (a
    directory written before the commit log: formats 1 and 2)."""
    data = json.dumps(manifest, indent=2).encode()
    if older_layout:
        shutil.rmtree(Path(dataset_dir) / manifest_lib.MANIFESTS_DIR, ignore_errors=True)
    path = published_manifest_path(dataset_dir)
    path.write_bytes(data)
    (Path(dataset_dir) / manifest_lib.MANIFEST_FILE).write_bytes(data)


def remove_published_manifest(dataset_dir):
    """No published manifest any more: the log and its copy gone."""
    shutil.rmtree(Path(dataset_dir) / manifest_lib.MANIFESTS_DIR, ignore_errors=True)
    (Path(dataset_dir) / manifest_lib.MANIFEST_FILE).unlink(missing_ok=True)
