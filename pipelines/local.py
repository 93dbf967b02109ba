"""The local workflow: stage 1 on the DirectRunner, then training on this machine.

    python -m pipelines.local --workdir /tmp/run                 # the embedded sample corpus
    python -m pipelines.local --input ~/photos --workdir /tmp/run --image-size 224 --model mobilenetv3small \
        --weights imagenet
    python -m pipelines.local --workdir /tmp/run --skip-preprocess   # retrain on the existing dataset

Without --input it generates the sample corpus (shapes in five classes, with
a few broken files) into WORKDIR/sample_corpus and uses that. Stage 1 runs
with one DirectRunner worker process per core. Outputs: WORKDIR/dataset (the
dataset directory) and WORKDIR/model (checkpoints, logs, metrics.json and
the serving export). Paths may be gs:// URIs.
"""

import argparse
import difflib
import logging
import os
import sys
import tempfile

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from pipelines import sample_corpus
from pipelines.workflow import WorkflowError, WorkflowPaths, run_workflow
from preprocess import logs
from train.config import MODELS, TrainConfig
from train.errors import SetupError

# TensorFlow and the trainer (~8 s to import) are imported where they run: --help answers at once.

SAMPLE_SUBDIR = "sample_corpus"

# The demo's settings: the sample corpus is learned to >= 90% validation
# accuracy by the small CNN at 64x64 in a couple of minutes on two cores
# (it needs ~600 steps before BatchNorm's statistics settle: 50 epochs of 15).
DEMO_IMAGE_SIZE = 64
DEMO_EPOCHS = 50
DEMO_LEARNING_RATE = 2e-3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.local",
        description="Preprocess (Beam DirectRunner) then train (Keras) on this machine.",
    )
    parser.add_argument(
        "--workdir", required=True, help="Where the dataset and the model go (local or gs://)."
    )
    parser.add_argument(
        "--input",
        help="Images: a ROOT/<class>/<file> tree or a CSV/JSONL manifest. Default: the sample corpus.",
    )
    parser.add_argument("--skip-preprocess", action="store_true", help="Reuse WORKDIR/dataset as it is.")
    parser.add_argument("--image-size", type=int, default=DEMO_IMAGE_SIZE)
    parser.add_argument("--encoding", choices=features.ENCODINGS, default=features.UINT8)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--epochs", type=int, default=DEMO_EPOCHS)
    parser.add_argument("--steps", type=int, default=None, help="Total training steps instead of --epochs.")
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help=f"The peak learning rate (default: {DEMO_LEARNING_RATE:g} from scratch, the demo's; with --weights, "
        "train's own default, scaled with the batch size).",
    )
    parser.add_argument(
        "--weights",
        default=None,
        help="Start from pretrained weights: 'imagenet' (with a keras.applications --model) or a backbone "
        ".weights.h5 / an earlier run's model dir (see python -m train --help).",
    )
    parser.add_argument(
        "--crop-margin",
        type=float,
        default=0.0,
        help="Stage 1 stores images this much larger for random-crop augmentation (see python -m preprocess --help).",
    )
    parser.add_argument(
        "--max-failed-fraction",
        default=None,
        help="Passed to stage 1: above this fraction of failed inputs it publishes nothing "
        "(see python -m preprocess --help).",
    )
    parser.add_argument(
        "--retention-days",
        default=None,
        help="Passed to stage 1: how long the dataset a re-run supersedes stays for the jobs reading it "
        "(see python -m preprocess --help).",
    )
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="DirectRunner worker processes."
    )
    parser.add_argument(
        "--sample-images-per-class", type=int, default=120, help="Size of the generated sample corpus."
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Also show the INFO logs of Beam, tf.Transform and TensorFlow, and those of stage 1's worker "
        "processes; by default the workflow prints its progress, warnings and the results.",
    )
    return parser


def preprocess_argv(args, input_spec: str, dataset_dir: str) -> list[str]:
    argv = [
        "--input",
        input_spec,
        "--output",
        dataset_dir,
        "--image-size",
        str(args.image_size),
        "--encoding",
        args.encoding,
        "--crop-margin",
        str(args.crop_margin),
        "--runner",
        "DirectRunner",
    ]
    if args.max_failed_fraction is not None:
        argv += ["--max-failed-fraction", args.max_failed_fraction]
    if args.retention_days is not None:
        argv += ["--retention-days", args.retention_days]
    if args.workers > 1:
        argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]
    if args.verbose:
        argv.append("--verbose")
    return argv


def predict_one(export_dir: str, dataset_dir: str, manifest: dict):
    """(source file, true class, predicted class, probability) for one validation image, via the export."""
    import tensorflow as tf  # noqa: PLC0415 - see the imports

    shard = manifest_lib.join(dataset_dir, manifest["splits"][manifest_lib.VALIDATION]["shards"][0]["path"])
    record = next(iter(tf.data.TFRecordDataset(shard).take(1)))
    example = tf.io.parse_single_example(
        record,
        {
            features.URI: tf.io.FixedLenFeature([], tf.string),
            features.CLASS_NAME: tf.io.FixedLenFeature([], tf.string),
        },
    )
    uri = example[features.URI].numpy().decode()
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    outputs = serve(tf.constant([tf.io.gfile.GFile(uri, "rb").read()]))
    probability = float(tf.reduce_max(outputs["probabilities"][0]))
    return (
        uri,
        example[features.CLASS_NAME].numpy().decode(),
        outputs["label"][0].numpy().decode(),
        probability,
    )


def report(paths: WorkflowPaths, manifest: dict, metrics: dict) -> str:
    inputs = manifest["inputs"]
    lines = [
        "",
        "Done.",
        f"  dataset:      {paths.dataset_dir}  (manifest: dataset.json, "
        f"failures: {manifest_lib.describe_error_files(manifest)})",
        f"  model:        {paths.model_dir}  (metrics.json, checkpoints, TensorBoard logs)",
        f"  export:       {metrics.get('export_dir', '(not exported)')}",
        f"  images:       {inputs['num_found']} found, {inputs['num_written']} written, "
        f"{inputs['num_failed']} failed, {inputs['num_duplicates']} duplicates",
    ]
    for reason, count in inputs["failures_by_reason"].items():
        lines.append(f"    failed: {reason} x{count}")
    validation = metrics["validation"]
    lines.append(
        f"  validation accuracy: {validation['accuracy']:.1%} on {validation['num_examples']} images "
        f"({metrics['epochs']} epochs, {metrics['images_per_second']:.0f} images/s)"
    )
    if "export_dir" in metrics:
        uri, truth, predicted, probability = predict_one(metrics["export_dir"], paths.dataset_dir, manifest)
        lines.append(f"  prediction by the exported model on {uri}:")
        lines.append(f"    {predicted} (p={probability:.2f}); true class: {truth}")
    return "\n".join(lines)


def _train_and_evaluate(config: TrainConfig):
    from train.trainer import train_and_evaluate  # noqa: PLC0415 - see the imports

    return train_and_evaluate(config)


def unknown_model_problem(model: str) -> str | None:
    """Why `--model` names no model train can build (its registry, without importing TensorFlow); None if it does.

    `module:function` names a user's own model: train checks it when it imports it.
    """
    if model in MODELS or ":" in model:
        return None
    close = difflib.get_close_matches(model.lower(), MODELS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"--model {model}: no such model{hint}; choose one of {', '.join(MODELS)}"


def precheck_problem(args, paths: WorkflowPaths) -> str | None:
    """What is wrong with the command before stage 1 starts (the model, the input, the output), or None."""
    problem = unknown_model_problem(args.model)
    if problem or args.skip_preprocess or args.input is None:
        return problem
    from preprocess import input_checks  # noqa: PLC0415 - only where stage 1 runs

    try:
        input_checks.check_inputs(args.input, paths.dataset_dir, output_flag="--workdir")
    except input_checks.InputError as exc:
        return str(exc)
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # Before TensorFlow is imported (stage 1, training): it reads its C++ log level once.
    logs.configure_launcher(args.verbose)
    paths = WorkflowPaths(args.workdir)
    problem = precheck_problem(args, paths)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    stage1_argv = None
    if not args.skip_preprocess:
        input_spec = args.input
        if input_spec is None:
            input_spec = manifest_lib.join(args.workdir.rstrip("/"), SAMPLE_SUBDIR)
            if "://" in input_spec:  # the generator writes local files; stage 1 reads them from here
                input_spec = os.path.join(tempfile.mkdtemp(prefix="sample_corpus_"), SAMPLE_SUBDIR)
            print(f"Generating the sample corpus in {input_spec} ...")
            sample_corpus.write_sample_corpus(input_spec, images_per_class=args.sample_images_per_class)
        stage1_argv = preprocess_argv(args, input_spec, paths.dataset_dir)
    learning_rate = args.learning_rate
    if learning_rate is None and not args.weights:
        # The demo's small CNN from scratch; fine-tuning takes train's default, scaled with the batch.
        learning_rate = DEMO_LEARNING_RATE
    config = TrainConfig(
        data_dir=paths.dataset_dir,
        model_dir=paths.model_dir,
        model=args.model,
        epochs=args.epochs,
        steps=args.steps,
        global_batch_size=args.global_batch_size,
        learning_rate=learning_rate,
        weights=args.weights,
    )
    try:
        manifest, metrics = run_workflow(
            dataset_dir=paths.dataset_dir,
            preprocess_argv=stage1_argv,
            launch_training=lambda manifest: _train_and_evaluate(config),
            model_dir=paths.model_dir,
        )
    except (WorkflowError, SetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report(paths, manifest, metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
