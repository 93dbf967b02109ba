"""Stage 1's settings: one frozen Stage1Config, each setting with its default, help and check; the flags
are made from it (options.py) and library code takes it. Imports nothing heavy."""

import argparse
import dataclasses

from dataset_contract import features, geometry, image_errors
from dataset_contract import manifest as manifest_lib
from preprocess.near_duplicates import signature
from preprocess.near_duplicates.limits import DEFAULT_MAX_GROUP_SIZE, DEFAULT_MAX_MOVED_SHARE

DEFAULT_SPLIT = "0.8,0.1,0.1"
# A few broken files are normal in a large corpus; half of them failing is a broken input (a bucket
# without read access, a wrong manifest), which must not be published as a dataset.
DEFAULT_MAX_FAILED_FRACTION = 0.05
# How long a superseded run's files stay for the readers that opened its manifest: a training job reads
# its dataset for days.
DEFAULT_RETENTION_DAYS = 7.0
# `python -m preprocess.gc --max-objects`: deletions per call, so that one call's time stays bounded.
DEFAULT_GC_MAX_OBJECTS = 10_000
# --near-duplicates: report altered copies and keep them in one split, drop all but one of each group, or
# skip the audit (preprocess/near_duplicates/).
NEAR_DUPLICATES_KEEP = "keep"
NEAR_DUPLICATES_DROP = "drop"
NEAR_DUPLICATES_OFF = "off"
NEAR_DUPLICATE_MODES = (NEAR_DUPLICATES_KEEP, NEAR_DUPLICATES_DROP, NEAR_DUPLICATES_OFF)


# ---------------------------------------------------------------- parsers of one setting's text


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


def _number(convert, like: str, *checks):
    """A flag's parser: its text as a number (`convert`) that passes each (ok, expected) of `checks`;
    argparse's error saying what was expected else."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {like}, got {text!r}") from None
        for ok, expected in checks:
            if not ok(value):
                raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    return parse


_NOT_NEGATIVE = (lambda value: value >= 0, "a number >= 0")
_WHOLE = (lambda value: value >= 0, "a whole number >= 0")
_positive_int = _number(int, "a positive integer", (lambda value: value > 0, "a positive integer"))
_near_duplicate_distance = _number(
    int,
    "a whole number",
    _WHOLE,
    (
        lambda value: value <= signature.MAX_COLOUR_CHECKED_DISTANCE,
        f"at most {signature.MAX_COLOUR_CHECKED_DISTANCE} (of the {signature.CANDIDATE_BITS} grey bits; "
        "farther pairs are not near at any useful threshold)",
    ),
)
_group_size = _number(
    int, "a whole number", _WHOLE, (lambda value: value >= 2, "at least 2 (a group has two images or more)")
)
_positive_megabytes = _number(
    float, "a number of MB like 256", (lambda value: value > 0, "a positive number of MB")
)
_crop_margin = _number(
    float, "a number like 0.14", (lambda value: 0 <= value <= 1, "a fraction between 0 and 1")
)
_non_negative_float = _number(float, "a number", _NOT_NEGATIVE)
_fraction = _number(
    float, "a number", _NOT_NEGATIVE, (lambda value: value <= 1, "a fraction between 0 and 1")
)


def image_size(text: str) -> int:
    """--image-size, of every command that runs stage 1: a whole number of pixels up to MAX_IMAGE_SIZE."""
    value = _number(int, "a whole number of pixels like 224")(text)
    problem = geometry.image_size_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _class_names(text: str) -> tuple[str, ...]:
    return tuple(label.strip() for label in text.split(",") if label.strip())


def setting(default, help: str, group: str, parse=None, **flag):
    """A Stage1Config field: its default, its --help text, its --help group, the parser of its flag's
    text (`parse`), and any other argparse keyword of the flag (choices, metavar, required)."""
    metadata = {"help": help, "group": group, "parse": parse, "flag": flag}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


IO, IMAGES, DATASET, NEAR, RUNNING = "input and output", "images", "dataset", "near-duplicates", "running"


@dataclasses.dataclass(frozen=True)
class Stage1Config:
    """Every setting of stage 1: one field per flag of `python -m preprocess` (--image-size: image_size)."""

    input: str = setting(
        None,
        "A directory tree ROOT/<class>/<image> or a CSV/JSONL manifest of uri,label[,split]; local or gs://.",
        IO,
        required=True,
    )
    output: str = setting(None, "The dataset directory to write; local or gs://.", IO, required=True)
    labels: tuple[str, ...] | None = setting(
        None,
        "Comma-separated class names to accept; inputs with any other label are errors (unknown_label).",
        IO,
        _class_names,
    )
    image_size: int = setting(
        224, f"Output height and width (default 224), at most {geometry.MAX_IMAGE_SIZE}.", IMAGES, image_size
    )
    resize_method: str = setting(
        geometry.CROP,
        "crop: scale the short side, center-crop (default); pad: scale the long side, letterbox in black.",
        IMAGES,
        choices=geometry.RESIZE_METHODS,
    )
    crop_margin: float = setting(
        0.0,
        "Store round(SIZE x (1 + F)) pixels on the short side, center-cropped to a square, so that "
        "training can take random SIZE x SIZE crops (evaluation and serving take the center one): the "
        "'resize to 256, crop 224' of the ImageNet recipes, done offline. 0.14 turns 224 into 255. Default 0: "
        "store the final center crop. Needs --resize-method crop.",
        IMAGES,
        _crop_margin,
    )
    encoding: str = setting(
        features.UINT8,
        "How images are stored: uint8 (default: the resized pixels, normalized on the accelerator "
        "in the model's first layer), jpeg (re-encoded pixels, normalized the same way), bfloat16 or "
        "float32 (normalized values, twice or four times uint8's bytes). uint8 and jpeg are written in one "
        "pass over the images; bfloat16 and float32 need the statistics first, so their decoded pixels "
        "are spilled to the staging directory and read back for a second pass.",
        IMAGES,
        choices=features.ENCODINGS,
    )
    jpeg_quality: int = setting(90, "JPEG quality for --encoding jpeg (default 90).", IMAGES, int)
    max_pixels: int = setting(
        image_errors.DEFAULT_MAX_PIXELS,
        "Refuse images with more pixels than this, without decoding them (default 100M).",
        IMAGES,
        _positive_int,
    )
    max_file_mb: float = setting(
        image_errors.DEFAULT_MAX_FILE_MB,
        "Refuse files larger than this many MB (10^6 bytes) as too_large, without reading them: one "
        f"stray multi-GB file must not take a worker's memory (default {image_errors.DEFAULT_MAX_FILE_MB}; "
        "the exported model refuses larger requests too).",
        IMAGES,
        _positive_megabytes,
    )
    split: dict[str, float] = setting(
        parse_split_fractions(DEFAULT_SPLIT),
        f"train,validation,test fractions (default {DEFAULT_SPLIT}), assigned by content hash; "
        "a manifest's split column takes precedence.",
        DATASET,
        parse_split_fractions,
    )
    shard_size_mb: int = setting(150, "Target shard size in MB (default 150).", DATASET, _positive_int)
    min_shards: int | None = setting(
        None,
        "At least this many shards per split, so several hosts can each read their own (default: 8, or "
        "one per 4 MB of a smaller split).",
        DATASET,
        _positive_int,
    )
    max_failed_fraction: float = setting(
        DEFAULT_MAX_FAILED_FRACTION,
        "If more than this fraction of the inputs found fail (unreadable, not an image, ...), the run "
        "publishes nothing and fails with the failure counts by reason, as a run whose inputs mostly "
        f"failed is a broken input, not a dataset (default {DEFAULT_MAX_FAILED_FRACTION:g}; 1: never).",
        DATASET,
        _fraction,
    )
    retention_days: float = setting(
        DEFAULT_RETENTION_DAYS,
        "How long the files of a run this one supersedes stay after the switch, for the training "
        "jobs still reading it (they read a dataset for days); later publishes remove them once older "
        f"(default {DEFAULT_RETENTION_DAYS:g}; 0: at once).",
        DATASET,
        _non_negative_float,
    )
    rebuild: bool = setting(
        False,
        "Decode every input again, even those whose record the published version of --output holds "
        "(by default a re-run carries over the records of unchanged inputs and decodes only new or "
        "changed ones; a change of --image-size, --crop-margin, --encoding or --resize-method rebuilds "
        "anyway).",
        DATASET,
    )
    checksum: bool = setting(
        False,
        "Key every local input by its bytes (read in full for their MD5) on a re-run, as rsync --checksum "
        "does. By default a re-run trusts the content key the published version recorded for a file whose "
        "size and modification time are unchanged, and reads only the others (a file rewritten with the "
        "same size and its mtime restored is then missed). GCS inputs are keyed by the MD5 their listing "
        "gives either way; --rebuild implies it.",
        DATASET,
    )
    near_duplicates: str = setting(
        NEAR_DUPLICATES_KEEP,
        "Altered copies of one image (re-encoded, resized, brightened, ...), found by a perceptual "
        "signature of each decoded image: keep (default) keeps every copy, puts all of a group in one "
        "split (so none straddles train and evaluation) and lists the groups in the manifest's "
        "near_duplicate_files; drop also keeps one image of each group (of the majority's label, then a "
        "named split's, then the largest; the others are counted as near_duplicates); off skips the audit (the job is one pass, as before it existed).",
        NEAR,
        choices=NEAR_DUPLICATE_MODES,
    )
    near_duplicate_distance: int = setting(
        signature.DEFAULT_MAX_DISTANCE,
        "Two images whose grey hashes differ in at most N of their "
        f"{signature.CANDIDATE_BITS} bits, and whose colour layouts agree, are near-duplicates (default "
        f"{signature.DEFAULT_MAX_DISTANCE}, measured: benchmarks/RESULTS.md). Larger finds more altered copies "
        "and more false pairs.",
        NEAR,
        _near_duplicate_distance,
        metavar="N",
    )
    near_duplicate_max_group: int = setting(
        DEFAULT_MAX_GROUP_SIZE,
        f"A group of more than N near-duplicates (default {DEFAULT_MAX_GROUP_SIZE}) is more likely a family "
        "of similar images than copies of one: it is listed and counted, and none of its images is moved to "
        "another split or dropped.",
        NEAR,
        _group_size,
        metavar="N",
    )
    near_duplicate_max_moved: float = setting(
        DEFAULT_MAX_MOVED_SHARE,
        "If the audit would move more than this fraction of the images to another split (default "
        f"{DEFAULT_MAX_MOVED_SHARE:g}), it moves and drops none and the summary says so: so many moves mean "
        "groups of similar images rather than copies, and the split would be far from --split. 1: no limit.",
        NEAR,
        _fraction,
        metavar="FRACTION",
    )
    transform_batch_size: int = setting(
        64,
        "Images per Arrow record batch fed to tf.Transform; bounds its memory (default 64).",
        RUNNING,
        _positive_int,
    )
    in_process_below: int = setting(
        1000,
        "A local run (DirectRunner) over fewer than N inputs runs in this process, whatever "
        "--direct_running_mode says: worker processes cost more to start than they save on a small job "
        "(default 1000; 0: always as --direct_running_mode says).",
        RUNNING,
        int,
        metavar="N",
    )
    verbose: bool = setting(
        False,
        "Also show the INFO logs of Beam, tf.Transform and TensorFlow, and those of the local "
        "worker processes; by default a local run prints its progress, warnings and the summary.",
        RUNNING,
    )

    def problems(self) -> list[str]:
        """What is wrong with the settings together (each one alone was checked as it was parsed)."""
        found = []
        if not 1 <= self.jpeg_quality <= 100:
            found.append(f"--jpeg-quality {self.jpeg_quality}: expected 1..100")
        if self.crop_margin and self.resize_method != geometry.CROP:
            found.append(
                f"--crop-margin {self.crop_margin} needs --resize-method crop: random crops of a letterboxed "
                "image would cut into its black bars"
            )
        return found

    @property
    def stored_size(self) -> int:
        """The square stage 1 stores: --image-size (what the model sees) grown by --crop-margin. Decoding,
        statistics, encoding, shard sizing and the manifest's height and width are about this square."""
        return geometry.stored_size(self.image_size, self.crop_margin)

    @property
    def max_file_bytes(self) -> int:
        """--max-file-mb in bytes (MB = 10^6 bytes, as --shard-size-mb)."""
        return max(1, int(self.max_file_mb * 10**6))
