"""The job's own flags. Everything else on the command line goes to Beam untouched."""

import argparse
import difflib
import sys

from dataset_contract import features, geometry, image_errors
from dataset_contract import manifest as manifest_lib
from dataset_contract.cli_help import DefaultsHelpFormatter, group_flags
from preprocess.near_duplicates import signature

DEFAULT_SPLIT = "0.8,0.1,0.1"
# A few broken files are normal in a large corpus; half of them failing is a broken input (a bucket
# without read access, a wrong manifest), which must not be published as a dataset.
DEFAULT_MAX_FAILED_FRACTION = 0.05
# How long a superseded run's files stay for the readers that opened its manifest (preprocess/publish/commit.py):
# a training job reads its dataset for days.
DEFAULT_RETENTION_DAYS = 7.0
# --near-duplicates: report altered copies and keep them in one split, drop all but one of each group, or
# skip the audit (preprocess/near_duplicates/).
NEAR_DUPLICATES_KEEP = "keep"
NEAR_DUPLICATES_DROP = "drop"
NEAR_DUPLICATES_OFF = "off"
NEAR_DUPLICATE_MODES = (NEAR_DUPLICATES_KEEP, NEAR_DUPLICATES_DROP, NEAR_DUPLICATES_OFF)


def parse_split_fractions(text: str) -> dict[str, float]:
    """'0.8,0.1,0.1' -> {'train': 0.8, 'validation': 0.1, 'test': 0.1} (must sum to 1)."""
    try:
        values = [float(value) for value in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--split {text!r}: expected three numbers like {DEFAULT_SPLIT}"
        ) from None
    if len(values) != len(manifest_lib.SPLITS) or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(
            f"--split {text!r}: expected three non-negative fractions for train,validation,test"
        )
    if abs(sum(values) - 1.0) > 1e-6 or values[0] <= 0:
        raise argparse.ArgumentTypeError(f"--split {text!r}: fractions must sum to 1 and train must be > 0")
    return dict(zip(manifest_lib.SPLITS, values, strict=True))


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text}")
    return value


def _near_duplicate_distance(text: str) -> int:
    value = _non_negative_int(text)
    if value > signature.MAX_COLOUR_CHECKED_DISTANCE:
        raise argparse.ArgumentTypeError(
            f"expected at most {signature.MAX_COLOUR_CHECKED_DISTANCE} (of the {signature.CANDIDATE_BITS} grey "
            f"bits; farther pairs are not near at any useful threshold), got {value}"
        )
    return value


def _positive_megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MB like 256, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of MB, got {text}")
    return value


def _crop_margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number like 0.14, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m preprocess",
        formatter_class=DefaultsHelpFormatter,
        description="Turn a corpus of images into a dataset directory of resized, sharded TFRecords "
        "with a manifest (dataset.json) holding the train split's normalization statistics. Any flag not listed here is passed to Apache Beam "
        "(--runner, --project, --region, --temp_location, --num_workers, --sdk_container_image, ...).",
    )
    parser.add_argument(
        "--input",
        required=True,
        help="A directory tree ROOT/<class>/<image> or a CSV/JSONL manifest of uri,label[,split]; local or gs://.",
    )
    parser.add_argument("--output", required=True, help="The dataset directory to write; local or gs://.")
    parser.add_argument(
        "--image-size", type=_positive_int, default=224, help="Output height and width (default 224)."
    )
    parser.add_argument(
        "--resize-method",
        choices=geometry.RESIZE_METHODS,
        default=geometry.CROP,
        help="crop: scale the short side, center-crop (default); pad: scale the long side, letterbox in black.",
    )
    parser.add_argument(
        "--crop-margin",
        type=_crop_margin,
        default=0.0,
        help="Store round(SIZE x (1 + F)) pixels on the short side, center-cropped to a square, so that "
        "training can take random SIZE x SIZE crops (evaluation and serving take the center one): the "
        "'resize to 256, crop 224' of the ImageNet recipes, done offline. 0.14 turns 224 into 255. Default 0: "
        "store the final center crop. Needs --resize-method crop.",
    )
    parser.add_argument(
        "--encoding",
        choices=features.ENCODINGS,
        default=features.UINT8,
        help="How images are stored: uint8 (default: the resized pixels, normalized on the accelerator "
        "in the model's first layer), jpeg (re-encoded pixels, normalized the same way), bfloat16 or "
        "float32 (normalized values, twice or four times uint8's bytes). uint8 and jpeg are written in one "
        "pass over the images; bfloat16 and float32 need the statistics first, so their decoded pixels "
        "are spilled to the staging directory and read back for a second pass.",
    )
    parser.add_argument(
        "--jpeg-quality", type=int, default=90, help="JPEG quality for --encoding jpeg (default 90)."
    )
    parser.add_argument(
        "--split",
        type=parse_split_fractions,
        default=parse_split_fractions(DEFAULT_SPLIT),
        help=f"train,validation,test fractions (default {DEFAULT_SPLIT}), assigned by content hash; "
        "a manifest's split column takes precedence.",
    )
    parser.add_argument(
        "--labels",
        type=lambda text: [label.strip() for label in text.split(",") if label.strip()],
        default=None,
        help="Comma-separated class names to accept; inputs with any other label are errors (unknown_label).",
    )
    parser.add_argument(
        "--shard-size-mb", type=_positive_int, default=150, help="Target shard size in MB (default 150)."
    )
    parser.add_argument(
        "--min-shards",
        type=_positive_int,
        default=8,
        help="At least this many shards per split, so several hosts can each read their own (default 8).",
    )
    parser.add_argument(
        "--max-pixels",
        type=_positive_int,
        default=image_errors.DEFAULT_MAX_PIXELS,
        help="Refuse images with more pixels than this, without decoding them (default 100M).",
    )
    parser.add_argument(
        "--max-file-mb",
        type=_positive_megabytes,
        default=image_errors.DEFAULT_MAX_FILE_MB,
        help="Refuse files larger than this many MB (10^6 bytes) as too_large, without reading them: one "
        f"stray multi-GB file must not take a worker's memory (default {image_errors.DEFAULT_MAX_FILE_MB}; "
        "the exported model refuses larger requests too).",
    )
    parser.add_argument(
        "--near-duplicates",
        choices=NEAR_DUPLICATE_MODES,
        default=NEAR_DUPLICATES_KEEP,
        help="Altered copies of one image (re-encoded, resized, brightened, ...), found by a perceptual "
        "signature of each decoded image: keep (default) keeps every copy, puts all of a group in one "
        "split (so none straddles train and evaluation) and lists the groups in the manifest's "
        "near_duplicate_files; drop also keeps only the largest image of each group (the others are "
        "counted as near_duplicates); off skips the audit (the job is one pass, as before it existed).",
    )
    parser.add_argument(
        "--near-duplicate-distance",
        type=_near_duplicate_distance,
        default=signature.DEFAULT_MAX_DISTANCE,
        metavar="N",
        help="Two images whose grey hashes differ in at most N of their "
        f"{signature.CANDIDATE_BITS} bits, and whose colour layouts agree, are near-duplicates (default {signature.DEFAULT_MAX_DISTANCE}, "
        "measured: benchmarks/RESULTS.md). Larger finds more altered copies and more false pairs.",
    )
    parser.add_argument(
        "--transform-batch-size",
        type=_positive_int,
        default=64,
        help="Images per Arrow record batch fed to tf.Transform; bounds its memory (default 64).",
    )
    parser.add_argument(
        "--max-failed-fraction",
        type=_fraction,
        default=DEFAULT_MAX_FAILED_FRACTION,
        help="If more than this fraction of the inputs found fail (unreadable, not an image, ...), the run "
        "publishes nothing and fails with the failure counts by reason, as a run whose inputs mostly "
        f"failed is a broken input, not a dataset (default {DEFAULT_MAX_FAILED_FRACTION:g}; 1: never).",
    )
    parser.add_argument(
        "--retention-days",
        type=_non_negative_float,
        default=DEFAULT_RETENTION_DAYS,
        help="How long the files of a run this one supersedes stay after the switch, for the training "
        "jobs still reading it (they read a dataset for days); later publishes remove them once older "
        f"(default {DEFAULT_RETENTION_DAYS:g}; 0: at once).",
    )
    parser.add_argument(
        "--in-process-below",
        type=int,
        default=1000,
        metavar="N",
        help="A local run (DirectRunner) over fewer than N inputs runs in this process, whatever "
        "--direct_running_mode says: worker processes cost more to start than they save on a small job "
        "(default 1000; 0: always as --direct_running_mode says).",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Also show the INFO logs of Beam, tf.Transform and TensorFlow, and those of the local "
        "worker processes; by default a local run prints its progress, warnings and the summary.",
    )
    group_flags(
        parser,
        {
            "input and output": ("--input", "--output", "--labels"),
            "images": (
                "--image-size", "--resize-method", "--crop-margin", "--encoding", "--jpeg-quality",
                "--max-pixels", "--max-file-mb",
            ),
            "dataset": ("--split", "--shard-size-mb", "--min-shards", "--max-failed-fraction", "--retention-days"),
            "near-duplicates": ("--near-duplicates", "--near-duplicate-distance"),
            "running": ("--transform-batch-size", "--in-process-below", "--verbose"),
        },
    )  # fmt: skip
    return parser


PROG = "python -m preprocess"


def refuse(message: str, prog: str = PROG):
    """Exit 2 with `message`: a user's mistake, said in a line or two, without a traceback."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    print(f"(see {prog} --help)", file=sys.stderr)
    raise SystemExit(2)


def beam_option_flags() -> list[str]:
    """Every flag Beam's PipelineOptions (all of its subclasses: Dataflow's, the DirectRunner's, ...) knows.

    Collected as Beam collects them when it parses its options (PipelineOptions.get_all_options).
    """
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser  # noqa: PLC0415

    parser = _BeamArgumentParser(allow_abbrev=False, add_help=False)
    # A subclass defined twice (a re-imported main session) would add its flags twice: keep one.
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam's own way to list its flags
    return [flag for flag in parser._option_string_actions if flag.startswith("--")]  # noqa: SLF001


def unknown_flags(beam_args: list[str], known: list[str]) -> list[str]:
    """The command-line words of `beam_args` that no flag in `known` takes: unknown flags, stray values.

    A value right after an unknown flag (`--image-szie 64`) belongs to it and is not listed again.
    """
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    for flag in known:
        # Any flag with an optional value: only whether it is known matters here, Beam checks its value.
        parser.add_argument(flag, nargs="?")
    _, unknown = parser.parse_known_args(beam_args)
    words, previous_was_flag = [], False
    for word in unknown:
        if word.startswith("-"):
            words.append(word.split("=", 1)[0])
            previous_was_flag = "=" not in word
        elif not previous_was_flag:
            words.append(word)
        else:
            previous_was_flag = False
    return words


def did_you_mean(word: str, candidates) -> str:
    """' (did you mean --x?)' for the closest of `candidates`, or ''."""

    # --image_size for --image-size, --runner for --runner: compare with '-' and '_' alike.
    def normal(flag):
        return flag.replace("_", "-").lower()

    by_normal = {normal(candidate): candidate for candidate in candidates}
    close = difflib.get_close_matches(normal(word), list(by_normal), n=1, cutoff=0.75)
    return f" (did you mean {by_normal[close[0]]}?)" if close else ""


def beam_args_problem(beam_args: list[str], parser: argparse.ArgumentParser) -> str | None:
    """What is wrong with the flags `parser` left for Beam: a flag that is neither `parser`'s nor a Beam
    pipeline option (Beam would only warn 'Discarding unparseable args' and run without it); or None."""
    if not beam_args:
        return None  # Beam is not even imported
    beam_flags = beam_option_flags()
    unknown = unknown_flags(beam_args, beam_flags)
    if not unknown:
        return None
    ours = [flag for flag in parser._option_string_actions if flag.startswith("--")]  # noqa: SLF001
    problems = [
        f"unknown flag {word}{did_you_mean(word, ours + beam_flags)}"
        if word.startswith("-")
        else f"unexpected argument {word!r}"
        for word in unknown
    ]
    return (
        "; ".join(problems) + ". Flags other than this command's own must be Apache Beam pipeline options "
        "(--runner, --project, --temp_location, ...)."
    )


def check_beam_args(beam_args: list[str], parser: argparse.ArgumentParser, prog: str = PROG) -> None:
    """Refuses (exit 2) the flags beam_args_problem finds wrong."""
    problem = beam_args_problem(beam_args, parser)
    if problem:
        refuse(problem, prog)


def parse_args(argv, check_beam_flags: bool = True):
    """(our args, the rest for Beam's PipelineOptions).

    `args.image_size` is the stored square (--image-size grown by --crop-margin), `args.crop_size` the
    --image-size asked for (what the model sees). A mistake exits 2 with a line saying what is wrong.
    `check_beam_flags`: also refuse a flag Beam does not know (check_beam_args; imports Beam's options).
    """
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    if not 1 <= args.jpeg_quality <= 100:
        refuse(f"--jpeg-quality {args.jpeg_quality}: expected 1..100")
    if args.crop_margin and args.resize_method != geometry.CROP:
        refuse(
            f"--crop-margin {args.crop_margin} needs --resize-method crop: random crops of a letterboxed "
            "image would cut into its black bars"
        )
    if check_beam_flags:
        check_beam_args(beam_args, parser)
    # --image-size is the size the model sees. Everything the job does (decode,
    # statistics, encoding, shard sizing, the manifest's height and width) is
    # about the square it stores, so from here on `image_size` is that square
    # and `crop_size` the model's.
    args.crop_size = args.image_size
    args.image_size = geometry.stored_size(args.crop_size, args.crop_margin)
    args.max_file_bytes = max_file_bytes(args.max_file_mb)
    return args, beam_args


def max_file_bytes(max_file_mb: float) -> int:
    """--max-file-mb in bytes (MB = 10^6 bytes, as --shard-size-mb)."""
    return max(1, int(max_file_mb * 10**6))
