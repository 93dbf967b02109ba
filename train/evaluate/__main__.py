"""python -m train.evaluate --model-dir MODEL_DIR [--split test] [--data DATA_DIR] [--json]: see __init__.py."""

import json
import sys

from dataset_contract import manifest as manifest_lib
from dataset_contract.cli_help import CommandParser


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m train.evaluate",
        description="Evaluate a trained model (MODEL_DIR/model.keras) on a split of the dataset run it was "
        "trained on: accuracy, loss, per-class precision and recall, confusion matrix.",
    )
    parser.add_argument("--model-dir", required=True, help="The --model-dir of a finished training run.")
    parser.add_argument("--split", default=manifest_lib.TEST, help="The split to evaluate.")
    parser.add_argument(
        "--data",
        default=None,
        help="The dataset directory (default: the one the run trained on, metrics.json).",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="Images per evaluation batch.")
    parser.add_argument("--json", action="store_true", help="Print the report as one JSON object.")
    parser.add_argument("--verbose", action="store_true", help="Log at INFO, TensorFlow's start-up too.")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        print(f"error: --batch-size must be positive, got {args.batch_size}", file=sys.stderr)
        return 2
    from train import console

    console.configure(args.verbose)
    console.import_tensorflow(args.verbose)
    from train.errors import SetupError
    from train.evaluate import scores, split

    try:
        result = split.evaluate_split(args.model_dir, args.split, args.data, args.batch_size)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True) if args.json else scores.format_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
