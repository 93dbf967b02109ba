"""python -m train.predict EXPORT FILE... [--top-k K] [--json]: see __init__.py."""

import argparse
import json
import sys

from dataset_contract.cli_help import CommandParser


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m train.predict",
        description="Classify image files with the serving export of a training run: one line per file, its "
        "top classes or its error.",
    )
    parser.add_argument("export", metavar="EXPORT", help="MODEL_DIR/export (or MODEL_DIR); local or gs://.")
    parser.add_argument(
        "files",
        metavar="FILE",
        nargs="+",
        help="Image files, or folders of them (every image below, sorted); local or gs://.",
    )
    parser.add_argument("--top-k", type=positive_int, default=3, help="Classes shown per file.")
    parser.add_argument("--json", action="store_true", help="One JSON object per line.")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="Files per request to the model.")
    parser.add_argument("--verbose", action="store_true", help="Log at INFO, TensorFlow's start-up too.")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from train import console

    console.configure(args.verbose)
    console.import_tensorflow(args.verbose)
    from train.errors import SetupError
    from train.predict.predictor import Predictor, expand_folders

    try:
        predictor = Predictor(args.export)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    # The export's first uint8 decode makes oneDNN log a note on CPUs without AVX-512: start-up noise.
    with console.filtered_native_stderr(enabled=not args.verbose):
        files = expand_folders(args.files)  # a folder: the images in it, as stage 1 reads a tree
        for prediction in predictor.predict_files(files, args.top_k, args.batch_size):
            failed += prediction.error is not None
            print(json.dumps(prediction.as_dict()) if args.json else prediction.as_line(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
