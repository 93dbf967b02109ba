"""Garbage collection of a dataset directory (preprocess/publish/gc.py): what no commit, retention promise
or live lease needs goes, a bounded amount per call.

    python -m preprocess.gc DIR [--dry-run] [--max-objects N]
    python -m preprocess.gc gs://bucket/datasets/flowers --dry-run
"""

import logging
import sys

from dataset_contract import commit_log
from dataset_contract import manifest as manifest_lib
from dataset_contract.cli_help import CommandParser
from preprocess.config import DEFAULT_GC_MAX_OBJECTS


def main(argv=None) -> int:
    parser = CommandParser(
        prog="python -m preprocess.gc",
        description="Remove what no commit, retention promise or live lease of a dataset directory needs.",
    )
    parser.add_argument("dir", help="the dataset directory (local path or gs://bucket/prefix)")
    parser.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    parser.add_argument(
        "--max-objects",
        type=int,
        default=DEFAULT_GC_MAX_OBJECTS,
        help=f"delete at most this many objects in this call (default {DEFAULT_GC_MAX_OBJECTS}); run it again for more",
    )
    args = parser.parse_args(argv)
    if args.max_objects < 1:
        parser.error("--max-objects must be at least 1")
    # Beam (the file systems) only once the flags are parsed: --help and a mistake answer at once.
    from preprocess.publish import gc as garbage  # noqa: PLC0415 - Beam
    from preprocess.publish import store as dataset_store  # noqa: PLC0415 - Beam

    store = dataset_store.open_store(args.dir)
    if store.read(commit_log.HINT_FILE) is None and not store.list(f"{manifest_lib.MANIFESTS_DIR}/").objects:
        if not store.list(f"{manifest_lib.RUNS_DIR}/", delimiter=True).prefixes:
            print(
                f"preprocess.gc: {args.dir} holds no dataset (no {manifest_lib.MANIFESTS_DIR}/, "
                f"{commit_log.HINT_FILE} or {manifest_lib.RUNS_DIR}/): check the path",
                file=sys.stderr,
            )
            return 2
    report = garbage.collect_garbage(args.dir, args.max_objects, args.dry_run)
    print("\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
