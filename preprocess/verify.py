"""Check that a dataset directory is whole: every shard against the manifest, every record sound.

python -m preprocess.verify /tmp/run/dataset
python -m preprocess.verify gs://BUCKET/run/dataset --splits train,validation --workers 16
"""

import os
import sys
import time

from dataset_contract import manifest as manifest_lib
from dataset_contract import native_logs
from dataset_contract.cli_help import CommandParser

# verification and summary import TensorFlow: imported in main, after the flags (--help and a typo come
# back at once).


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m preprocess.verify",
        description="Check every shard of a dataset directory against its published manifest and "
        "every record against the dataset's schema. Exit status 0: all good; 1: problems (listed); "
        "2: no usable manifest.",
    )
    parser.add_argument("data_dir", help="The dataset directory; local or gs://.")
    parser.add_argument(
        "--splits",
        type=lambda text: [split.strip() for split in text.split(",") if split.strip()],
        default=list(manifest_lib.SPLITS),
        help="Comma-separated splits to check (default: all).",
    )
    parser.add_argument(
        "--no-records",
        action="store_true",
        help="Only presence, size and sha256 (skip parsing the records; still reads every byte).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="Shards checked at a time (default: the number of cores, at most 8).",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="Show TensorFlow's start-up lines (dropped by default)."
    )
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)  # --help and flag mistakes end here, before TensorFlow
    native_logs.import_tensorflow_quietly(args.verbose)
    from dataset_contract import verification  # noqa: PLC0415
    from preprocess.inspect.summary import format_bytes, read_manifest_or_explain  # noqa: PLC0415

    data_dir = args.data_dir.rstrip("/")
    manifest = read_manifest_or_explain(data_dir)
    if manifest is None:
        return 2
    unknown = [split for split in args.splits if split not in manifest["splits"]]
    if unknown:
        print(f"unknown splits {unknown}; the manifest has {list(manifest['splits'])}", file=sys.stderr)
        return 2

    shards = [shard for split in args.splits for shard in manifest["splits"][split]["shards"]]
    num_records = sum(shard["num_examples"] for shard in shards)
    num_bytes = sum(shard["num_bytes"] for shard in shards)
    print(
        f"verifying {len(shards)} shards of {', '.join(args.splits)} ({num_records} records, "
        f"{format_bytes(num_bytes)}) in {data_dir}"
        + (f" (run {manifest['run']['id']})" if (manifest.get("run") or {}).get("id") else ""),
        flush=True,
    )
    start = time.monotonic()
    problems = verification.verify_named_files(data_dir, manifest)
    problems += verification.verify_shards(
        data_dir,
        manifest,
        splits=args.splits,
        check_sha256=True,
        check_records=not args.no_records,
        num_workers=args.workers,
    )
    elapsed = time.monotonic() - start
    if not problems:
        print(f"OK: every shard matches {manifest_lib.MANIFEST_FILE} ({elapsed:.1f}s)")
        return 0
    for problem in problems:
        print(f"BAD {problem.kind}: {problem}")
    bad_shards = {problem.path for problem in problems if problem.kind != verification.WRONG_CLASS_COUNTS}
    print(f"FAILED: {len(bad_shards)} of {len(shards)} shards, {len(problems)} problems ({elapsed:.1f}s)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
