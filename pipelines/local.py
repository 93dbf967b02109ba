"""The local workflow: stage 1 on the DirectRunner, then training on this machine.

    python -m pipelines.local --workdir /tmp/run                 # the embedded sample corpus
    python -m pipelines.local --input ~/photos --workdir /tmp/run --image-size 224 --model mobilenetv3small \\
        --weights imagenet
    python -m pipelines.local --workdir /tmp/run --skip-preprocess   # train on the existing dataset as it is
"""

import difflib
import logging
import os
import shlex
import sys
import tempfile

from dataset_contract import geometry, log_format
from dataset_contract import manifest as manifest_lib
from dataset_contract.cli_help import CommandParser
from pipelines import sample_corpus
from pipelines.workflow import WorkflowError, WorkflowPaths, run_workflow, skip_preprocess_problem
from preprocess import options
from preprocess.launch import logs
from train import flags
from train.config import MODELS, TrainConfig, resolve_backend
from train.errors import SetupError
from train.model.weights_flag import WeightsFlagError, check_weights_flag

# TensorFlow and the trainer (~8 s to import) are imported where they run: --help answers at once.

SAMPLE_SUBDIR = "sample_corpus"

# The demo's settings: the sample corpus is learned to >= 90% validation
# accuracy by the small CNN at 64x64 in a couple of minutes on two cores
# (it needs ~600 steps before BatchNorm's statistics settle: 50 epochs of 15).
DEMO_IMAGE_SIZE = 64
DEMO_EPOCHS = 50
DEMO_GLOBAL_BATCH_SIZE = 32
DEMO_LEARNING_RATE = 2e-3


# The fields of python -m preprocess the workflow takes as flags (preprocess/config.py).
STAGE1_FIELDS = ("image_size", "encoding", "crop_margin", "max_failed_fraction", "retention_days")
# The flags that only stage 1 reads: given with --skip-preprocess they would change nothing.
STAGE1_FLAGS = (
    "--input",
    *(options.flag_of(name) for name in STAGE1_FIELDS),
    "--workers",
    "--sample-images-per-class",
)
# The fields of python -m train the workflow takes as flags (stage 2's group of its --help).
TRAIN_FIELDS = ("model", "epochs", "steps", "global_batch_size", "learning_rate", "weights", "backend")
SAMPLE_CORPUS_MARKER = "sample_corpus.json"  # WORKDIR/sample_corpus.json: what the corpus there was made with


def build_parser() -> CommandParser:
    train_defaults = TrainConfig(data_dir="", model_dir="")
    parser = CommandParser(
        prog="python -m pipelines.local",
        allow_abbrev=False,  # a prefix of a stage 1 flag must not pass for it (STAGE1_FLAGS)
        description="Preprocess (Beam DirectRunner) then train (Keras) on this machine. Run again with the "
        "same command, it resumes: stage 1 is skipped when WORKDIR/dataset was built from the same inputs and "
        "stage 1 flags, and training goes on from its last checkpoint. Ctrl-C during training saves a "
        "checkpoint first (a second Ctrl-C stops at once).",
        epilog=f"The defaults are the demo's (the sample corpus, the small CNN from scratch): 64 px, "
        f"{DEMO_EPOCHS} epochs of batch {DEMO_GLOBAL_BATCH_SIZE} at learning rate {DEMO_LEARNING_RATE:g}. python -m train's own "
        f"defaults ({train_defaults.epochs} epochs, a batch per device, the optimizer's "
        "learning rate scaled with the batch) are for a dataset you bring: the small CNN needs ~600 steps on "
        "the sample corpus before BatchNorm's statistics settle, which its 15 steps per epoch reach in 50 epochs.",
    )
    parser.add_argument(
        "--workdir", required=True, help="Where the dataset and the model go (local or gs://)."
    )
    stage1 = parser.add_argument_group("stage 1 (python -m preprocess)")
    stage1.add_argument(
        "--input",
        help="Images: a ROOT/<class>/<file> tree or a CSV/JSONL manifest (default: the generated sample corpus, "
        "in WORKDIR/sample_corpus).",
    )
    stage1.add_argument(
        "--skip-preprocess",
        action="store_true",
        help="Reuse WORKDIR/dataset as it is (the stage 1 flags are then refused: they would change nothing).",
    )
    # python -m preprocess's own flags (preprocess/config.py), with the demo's defaults where they differ.
    options.add_stage1_flags(
        stage1,
        STAGE1_FIELDS,
        overrides={
            "image_size": {
                "default": DEMO_IMAGE_SIZE,
                "help": "Height and width the model sees (default %(default)s, the demo's; python -m preprocess's "
                "is 224).",
            },
            "max_failed_fraction": {
                "default": None,
                "help": "Above this fraction of failed inputs stage 1 publishes nothing (default: stage 1's, 0.05).",
            },
            "retention_days": {
                "default": None,
                "help": "How long the dataset a re-run supersedes stays for the jobs reading it (default: stage "
                "1's, 7).",
            },
        },
    )
    stage1.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="DirectRunner worker processes (default: one per core).",
    )
    stage1.add_argument(
        "--sample-images-per-class", type=int, default=120, help="Size of the generated sample corpus."
    )
    # python -m train's own flags (train/config.py), with the demo's defaults where they differ.
    flags.add_config_flags(
        parser,
        TRAIN_FIELDS,
        group="stage 2 (python -m train)",
        overrides={
            # Not checked by the parser: a misspelt name gets a "did you mean" before stage 1 (precheck_problem).
            "model": {"type": None},
            "epochs": {
                "default": DEMO_EPOCHS,
                "help": f"Passes over the train split (default {DEMO_EPOCHS}, the demo's; python -m train's is "
                f"{train_defaults.epochs}: see below).",
            },
            "global_batch_size": {
                "default": DEMO_GLOBAL_BATCH_SIZE,
                "help": f"Images per step (default {DEMO_GLOBAL_BATCH_SIZE}, the demo's; python -m train's is set "
                "per device: 32 per CPU, 128 per GPU or TPU chip).",
            },
            "learning_rate": {
                "help": f"The peak learning rate (default: {DEMO_LEARNING_RATE:g} from scratch, the demo's; with "
                "--weights, train's own default, scaled with the batch)."
            },
        },
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
        *options.stage1_argv(args, STAGE1_FIELDS),
        "--runner",
        "DirectRunner",
    ]
    if args.workers > 1:
        argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={args.workers}"]
    if args.verbose:
        argv.append("--verbose")
    return argv


def predict_one(export_dir: str, dataset_dir: str, manifest: dict):
    """(source file, true class, predicted class, probability) for one validation image, via the export."""
    import tensorflow as tf  # noqa: PLC0415 - see the imports

    from dataset_contract import verification  # noqa: PLC0415 - TensorFlow

    shard = manifest_lib.join(dataset_dir, manifest["splits"][manifest_lib.VALIDATION]["shards"][0]["path"])
    _, uri, class_name = next(verification.read_identities(shard))
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    outputs = serve(tf.constant([tf.io.gfile.GFile(uri, "rb").read()]))
    return (
        uri,
        class_name,
        outputs["label"][0].numpy().decode(),
        float(tf.reduce_max(outputs["probabilities"][0])),
    )


def report(paths: WorkflowPaths, manifest: dict, metrics: dict) -> str:
    inputs = manifest["inputs"]
    lines = [
        "",
        "Done.",
        f"  dataset:      {paths.dataset_dir}  (manifest: dataset.json, "
        f"failures: {manifest_lib.describe_error_files(manifest, paths.dataset_dir)})",
        f"  model:        {paths.model_dir}  (metrics.json, checkpoints, TensorBoard logs)",
        f"  export:       {metrics.get('export_dir', '(not exported)')}",
        f"  images:       {inputs['num_found']} found, {inputs['num_written']} written, "
        f"{inputs['num_failed']} failed, {inputs['num_duplicates']} duplicates",
    ]
    for reason, count in inputs["failures_by_reason"].items():
        lines.append(f"    failed: {reason} x{count}")
    from preprocess.inspect.summary import format_near_duplicates  # noqa: PLC0415 - TensorFlow, loaded by now

    lines += format_near_duplicates(manifest, paths.dataset_dir)
    validation = metrics["validation"]
    speed = metrics.get("images_per_second")  # None when this run had nothing left to train
    lines.append(
        f"  validation accuracy: {validation['accuracy']:.1%} on {validation['num_examples']} images "
        f"({metrics['epochs']} epochs"
        + (f", {speed:.0f} images/s)" if speed else ", trained by an earlier run)")
    )
    if validation.get("warning"):
        lines.append(f"  {validation['warning']}")
    if "export_dir" in metrics:
        uri, truth, predicted, probability = predict_one(metrics["export_dir"], paths.dataset_dir, manifest)
        lines.append(f"  prediction by the exported model on {uri}:")
        lines.append(f"    {predicted} (p={probability:.2f}); true class: {truth}")
    return "\n".join(lines)


def _train_and_evaluate(config: TrainConfig):
    from train.trainer import train_and_evaluate  # noqa: PLC0415 - see the imports

    return train_and_evaluate(config)


def sample_corpus_input(args) -> str:
    """The generated sample corpus's directory: made once per WORKDIR and size, then reused as it is (the
    build fingerprint holds the files' times)."""
    import json  # noqa: PLC0415

    input_spec = manifest_lib.join(args.workdir.rstrip("/"), SAMPLE_SUBDIR)
    if "://" in input_spec:  # the generator writes local files; stage 1 reads them from here
        input_spec = os.path.join(tempfile.mkdtemp(prefix="sample_corpus_"), SAMPLE_SUBDIR)
    marker = os.path.join(os.path.dirname(input_spec), SAMPLE_CORPUS_MARKER)
    # Altered copies too, so that the near-duplicate audit has groups to show (one across two labels).
    made_with = {"images_per_class": args.sample_images_per_class, "near_duplicates": True}
    try:
        with open(marker) as handle:
            if json.load(handle) == made_with and os.path.isdir(input_spec):
                return input_spec
    except (OSError, ValueError):
        pass
    print(f"Generating the sample corpus in {input_spec} ...")
    sample_corpus.write_sample_corpus(
        input_spec, images_per_class=args.sample_images_per_class, near_duplicates=True
    )
    with open(marker, "w") as handle:
        json.dump(made_with, handle)
    return input_spec


def check_before_stage1(args) -> None:
    """What would otherwise fail only after stage 1: the weights (a file that exists; ImageNet's file in
    Keras' cache or downloadable from here). The model name is checked by the parser."""
    args.weights = check_weights_flag(args.weights, args.model)
    if args.weights is None or ("://" not in args.weights and args.weights != "imagenet"):
        return
    from train import console  # noqa: PLC0415 - see the imports
    from train.model import pretrained

    console.import_tensorflow(args.verbose)
    pretrained.check_weights(args.model, args.weights, (args.image_size, args.image_size, 3))


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
    from preprocess.inputs import checks as input_checks  # noqa: PLC0415 - only where stage 1 runs

    try:
        input_checks.check_inputs(args.input, paths.dataset_dir, output_flag="--workdir")
    except input_checks.InputError as exc:
        return str(exc)
    from preprocess.inputs import size_check  # noqa: PLC0415

    stored = geometry.stored_size(args.image_size, args.crop_margin)
    warning = size_check.check_image_size(args.input, stored, args.image_size, geometry.CROP, args.encoding)
    if warning:
        logging.warning("%s", warning)
    return None


def _as_path(spec: str) -> str:
    spec = str(spec).rstrip("/")
    return spec if "://" in spec else os.path.abspath(spec)


def stage1_changes(args, input_spec: str, manifest: dict | None) -> list[str]:
    """What this command's stage 1 would build differently from the published dataset `manifest`, as flags:
    `--image-size 96 (the dataset's: 64)`; the inputs when no flag differs (files added, removed or changed)."""
    if manifest is None:
        return ["there is no published dataset"]
    image = manifest.get("image", {})
    compared = (  # (flag, the dataset's, this command's, the form both are compared in)
        ("--input", (manifest.get("source") or {}).get("input"), input_spec, _as_path),
        ("--image-size", manifest_lib.crop_size(image) if image else None, args.image_size, str),
        ("--encoding", image.get("encoding"), args.encoding, str),
        ("--crop-margin", image.get("crop_margin", 0.0), args.crop_margin, float),
    )
    changes = [
        f"{flag} {asked} (the dataset's: {published})"
        for flag, published, asked, form in compared
        if published is not None and form(published) != form(asked)
    ]
    return changes or [
        f"the files of {input_spec} changed since the dataset was built: added, removed or modified"
    ]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    log_format.configure(logging.INFO)
    # Before TensorFlow is imported (stage 1, training): it reads its C++ log level once.
    logs.configure_launcher(args.verbose)
    from train import console  # noqa: PLC0415 - see the imports

    try:  # Keras' backend, before anything imports Keras (stage 1 does not; training does)
        console.set_backend(resolve_backend(args.backend))
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = WorkflowPaths(args.workdir)
    problem = args.skip_preprocess and skip_preprocess_problem(argv, STAGE1_FLAGS, paths.dataset_dir)
    problem = problem or precheck_problem(args, paths)  # cheap: before TensorFlow is imported
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        check_before_stage1(args)
    except (WeightsFlagError, SetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # TensorFlow's native start-up lines (before absl's logging is set up, TF_CPP_MIN_LOG_LEVEL cannot hold them)
    # are dropped unless --verbose: imported here, once, for stage 1 and training alike.
    console.import_tensorflow(args.verbose)
    stage1_argv = input_spec = None
    if not args.skip_preprocess:
        input_spec = args.input if args.input is not None else sample_corpus_input(args)
        stage1_argv = preprocess_argv(args, input_spec, paths.dataset_dir)
    learning_rate = args.learning_rate
    if learning_rate is None and not args.weights:
        # The demo's small CNN from scratch; fine-tuning takes train's default, scaled with the batch.
        learning_rate = DEMO_LEARNING_RATE
    config = TrainConfig(
        data_dir=paths.dataset_dir,
        model_dir=paths.model_dir,
        **{**flags.config_fields(args, TRAIN_FIELDS), "learning_rate": learning_rate},
    )
    from train.errors import TrainingPreempted  # noqa: PLC0415 - no TensorFlow in train.errors

    try:
        manifest, metrics = run_workflow(
            dataset_dir=paths.dataset_dir,
            preprocess_argv=stage1_argv,
            launch_training=lambda manifest: _train_and_evaluate(config),
            model_dir=paths.model_dir,
            skip_if_built=True,
            describe_stage1_changes=lambda published: stage1_changes(args, input_spec, published),
        )
    except (WorkflowError, SetupError) as exc:
        # A resume refused for another plan names only flags this command takes (resume_check.PlanChangedError).
        message = exc.message_for(build_parser().flags()) if hasattr(exc, "message_for") else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 2
    except TrainingPreempted as exc:
        print(
            f"{exc}; resume with: {shlex.join(['python', '-m', 'pipelines.local', *argv])}", file=sys.stderr
        )
        return 130 if exc.signal_name == "SIGINT" else 143
    with console.filtered_native_stderr(enabled=not args.verbose):  # the export's first uint8 decode
        text = report(paths, manifest, metrics)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
