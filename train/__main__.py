"""Command line of stage 2: train, evaluate and export a classifier on a stage 1 dataset.

On this machine (CPU, or every local GPU through MirroredStrategy), the
recommended first run on one's own photos (fine-tuning ImageNet weights):

    python -m train --data /tmp/dataset --model-dir /tmp/run1 --model mobilenetv3small --weights imagenet

On a single-host Cloud TPU VM (TPUStrategy, bfloat16 and 32 steps per execution by default):

    python -m train --data gs://BUCKET/dataset --model-dir gs://BUCKET/runs/run1 \\
        --tpu local --model resnet50 --global-batch-size 1024 --epochs 90 \\
        --optimizer sgd --warmup-epochs 5 --label-smoothing 0.1

(the dataset preprocessed with --crop-margin 0.143: random 224 crops of 256 squares).

On a multi-host TPU slice (v4-32, v5litepod-16, ...), on its worker 0, with
the TPU's name: TensorFlow drives every host of the slice from that one
process, and each host reads its own shards (pipelines/dataflow.py prints
the full launch, software on every worker included):

    python -m train --data gs://BUCKET/dataset --model-dir gs://BUCKET/runs/run1 --tpu my-v4-32 ...

On several GPU machines: the same command on each, with TF_CONFIG naming the
cluster (MultiWorkerMirroredStrategy).

On Keras' JAX backend (`pip install '.[tpu-jax]'` on a TPU VM, Python 3.11): the same command with
--backend jax trains under keras.distribution.DataParallel over the host's chips (on a multi-host
slice, the same command on every worker, with --tpu NAME), tf.data feeding it from the CPU:

    python -m train --backend jax --data gs://BUCKET/dataset --model-dir gs://BUCKET/runs/run1 --tpu local ...

Running the same command again after an interruption resumes from the last
checkpoint in --model-dir, at its step, on the dataset run it started on
(MODEL_DIR/dataset_pin.json: a re-run of stage 1 in the meantime does not
change what it reads; train/data/dataset_pin.py). SIGTERM (spot VM preemption, TPU
maintenance) or SIGHUP (the ssh session closed) saves a checkpoint at the
next step boundary and exits with status 143; Ctrl-C (SIGINT) does the same and exits with status 130,
and a second Ctrl-C stops at once, without saving. Both print the command that resumes. Problems with the
dataset, the flags or the machine are printed as one message (no traceback) and exit with status 2.

`--help` is printed before TensorFlow is imported.
"""

import argparse
import shlex
import sys

from dataset_contract.cli_help import CommandParser
from train import flags
from train.config import MODEL_AND_MACHINE, TrainConfig

# 128 + the signal, as a shell reports a process it ended (train.loop.checkpoints.PREEMPTED_EXIT_CODE and
# INTERRUPTED_EXIT_CODE, without importing TensorFlow): supervisors restart after 143, a person pressed Ctrl-C for 130.
PREEMPTED_EXIT_CODE = 143
INTERRUPTED_EXIT_CODE = 130


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m train",
        description="Train a Keras image classifier on a dataset directory written by `python -m preprocess`, "
        "evaluate it on the validation split and export a SavedModel that serves encoded image bytes. "
        "Ctrl-C (SIGINT) saves a checkpoint at the next step and exits with status 130, SIGTERM or SIGHUP "
        "the same with status 143; a second Ctrl-C stops at once. The same command resumes.",
    )
    groups = flags.add_config_flags(parser)  # every TrainConfig field with a flag (train/config.py)
    flags.add_verbose_flag(groups[MODEL_AND_MACHINE])
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**flags.config_fields(args))


def resume_command(argv) -> str:
    """The command line that resumes this run: the same one."""
    return shlex.join(["python", "-m", "train", *(sys.argv[1:] if argv is None else argv)])


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)  # --help and flag errors end here, before TensorFlow
    from train import console
    from train.config import resolve_backend
    from train.device import cuda_cache
    from train.errors import SetupError
    from train.model.weights_flag import WeightsFlagError, check_weights_flag

    try:
        args.backend = resolve_backend(args.backend)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    console.configure(args.verbose, args.tpu, args.backend)  # KERAS_BACKEND, before Keras is imported
    try:
        args.weights = check_weights_flag(args.weights, args.model)
        config = config_from_args(args)
    except (SetupError, WeightsFlagError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cuda_cache.configure_cuda_cache()  # before TensorFlow initializes CUDA (train/device/cuda_cache.py)
    try:
        console.import_tensorflow(args.verbose)
        from train.errors import TrainingPreempted
        from train.preflight import check_weights_before_training
        from train.trainer import train_and_evaluate
    except KeyboardInterrupt:
        print("interrupted while starting; nothing was trained", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE

    try:
        check_weights_before_training(config)
        train_and_evaluate(config)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingPreempted as exc:
        # One line: what stopped, where the checkpoint is, the command that resumes.
        print(f"{exc}; resume with: {resume_command(argv)}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE if exc.signal_name == "SIGINT" else PREEMPTED_EXIT_CODE
    except KeyboardInterrupt:
        # Ctrl-C outside the training loop (setting up, or the final evaluation and export): the last
        # checkpoint, if any, is where the same command goes on from.
        print(
            f"interrupted; the same command resumes from the last checkpoint: {resume_command(argv)}",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
