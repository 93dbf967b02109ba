"""Look at a dataset directory: the manifest as a readable summary, and a contact sheet of its images.

python -m preprocess.inspect gs://BUCKET/run/dataset --split validation --per-class 12 --out sheet.png
python -m preprocess.inspect /tmp/run/dataset --report /tmp/run/report.html --max-groups 50
python -m preprocess.inspect /tmp/run/dataset --diff RUN --limit 50
"""

from __future__ import annotations

import dataclasses
import io
import math
import posixpath
import sys
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from dataset_contract import features, native_logs
from dataset_contract import manifest as manifest_lib
from dataset_contract.cli_help import CommandParser

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow (and the modules that import it: verification, summary, the report) is imported where it is
# used, after the flags are parsed: --help and a typo come back at once, not after seconds of start-up.

# Without --classes, a sheet of a 1000-class dataset would be 1000 rows tall.
MAX_DEFAULT_CLASSES = 64
DEFAULT_MAX_GROUPS = 50
DEFAULT_DIFF_LIMIT = 20  # preprocess.inspect.diff.DEFAULT_LIMIT, here to answer --help before TensorFlow
BORDER = 2
_PADDING = 6
_MAX_LABEL_WIDTH = 200
_BACKGROUND = (32, 32, 32)
EMPTY_CELL = (60, 60, 60)
_TEXT = (235, 235, 235)


@dataclasses.dataclass(frozen=True)
class SheetExample:
    """One image on the sheet and where it came from."""

    uri: str
    label: int
    class_name: str
    pixels: np.ndarray  # uint8 [height, width, 3]


@dataclasses.dataclass
class Sample:
    """The examples drawn for a sheet, by integer label, and what reading them cost."""

    examples: dict[int, list[SheetExample]]
    num_records: int = 0
    num_bytes: int = 0
    num_shards: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)


def to_pixels(stored: np.ndarray, manifest: dict) -> np.ndarray:
    """Stored image values (see verification.decode_image) -> uint8 0-255 RGB pixels."""
    values = stored
    if manifest["image"]["encoding"] in features.NORMALIZED_ENCODINGS:
        normalization = manifest["normalization"]
        values = stored * np.asarray(normalization["std"], np.float32) + np.asarray(
            normalization["mean"], np.float32
        )
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _feature(example: tf.train.Example, key: str):
    feature = example.features.feature[key]
    values = feature.int64_list.value if key == features.LABEL else feature.bytes_list.value
    return values[0] if len(values) == 1 else None


def sample_examples(
    data_dir: str,
    manifest: dict,
    split: str,
    per_class: int,
    labels: list[int] | None = None,
    max_bytes: int = 512 << 20,
) -> Sample:
    """The first `per_class` examples of each of `labels` (default: all) in `split`'s shards, stopping once
    every class has what the split can give it or after `max_bytes` of records."""
    import tensorflow as tf  # noqa: PLC0415 - after the flags (module docstring)

    from dataset_contract import verification  # noqa: PLC0415
    from preprocess.inspect.summary import format_bytes  # noqa: PLC0415

    labels = list(range(len(manifest["labels"]))) if labels is None else labels
    per_class_counts = manifest["splits"][split]["num_examples_per_class"]
    wanted = {label: min(per_class, per_class_counts.get(manifest["labels"][label], 0)) for label in labels}
    sample = Sample(examples={label: [] for label in labels})
    missing = sum(wanted.values())

    for shard in manifest["splits"][split]["shards"]:
        if not missing or sample.num_bytes >= max_bytes:
            break
        path = manifest_lib.join(data_dir, shard["path"])
        sample.num_shards += 1
        try:
            for record in verification.read_records(path):
                sample.num_records += 1
                sample.num_bytes += len(record) + 16  # the TFRecord framing
                example = tf.train.Example.FromString(record)
                label = _feature(example, features.LABEL)
                if label in wanted and len(sample.examples[label]) < wanted[label]:
                    uri, class_name = (
                        (_feature(example, key) or b"?").decode("utf-8", "replace")
                        for key in (features.URI, features.CLASS_NAME)
                    )
                    stored = verification.decode_image(_feature(example, features.IMAGE), manifest["image"])
                    pixels = to_pixels(stored, manifest)
                    sample.examples[label].append(SheetExample(uri, label, class_name, pixels))
                    missing -= 1
                if not missing or sample.num_bytes >= max_bytes:
                    break
        except (verification.RecordError, tf.errors.OpError, ValueError, TypeError) as exc:
            sample.warnings.append(f"{path}: {exc} (skipped the rest of this shard)")
    short_in_split, short_in_budget = [], []
    for label, count in wanted.items():
        found = len(sample.examples[label])
        if found < per_class:
            entry = f"{manifest['labels'][label]} {found}"
            (short_in_split if found == count else short_in_budget).append(entry)
    if short_in_split:
        sample.warnings.append(f"fewer than {per_class} examples in the split: {', '.join(short_in_split)}")
    if short_in_budget:
        sample.warnings.append(
            f"stopped after {format_bytes(sample.num_bytes)} (--max-read-mb) with too few examples of: "
            + ", ".join(short_in_budget)
        )
    return sample


def sample_classes(
    data_dir: str,
    manifest: dict,
    split: str,
    per_class: int,
    classes: list[str] | None = None,
    max_bytes: int = 512 << 20,
) -> Sample:
    """`sample_examples` of the named `classes`, or of the first MAX_DEFAULT_CLASSES; ValueError for a wrong name."""
    names = manifest["labels"]
    if classes:
        unknown = [name for name in classes if name not in names]
        if unknown:
            raise ValueError(f"classes {unknown} are not in the dataset's labels {names}")
        labels = [names.index(name) for name in classes]
    else:
        labels = list(range(min(len(names), MAX_DEFAULT_CLASSES)))
    sample = sample_examples(data_dir, manifest, split, per_class, labels, max_bytes)
    if len(labels) < len(names) and not classes:
        sample.warnings.append(
            f"showing the first {len(labels)} of {len(names)} classes (choose with --classes)"
        )
    return sample


@dataclasses.dataclass(frozen=True)
class SheetLayout:
    """Where things are on a contact sheet (pixels; x right, y down)."""

    rows: int
    columns: int
    cell_size: int
    label_width: int
    title_height: int
    border: int = BORDER

    def cell_origin(self, row: int, column: int) -> tuple[int, int]:
        """(x, y) of the top-left pixel of a cell."""
        step = self.cell_size + self.border
        return self.label_width + self.border + column * step, self.title_height + self.border + row * step

    @property
    def size(self) -> tuple[int, int]:
        return self.cell_origin(self.rows, self.columns)  # the origin of the cell past the last


def default_cell_size(image_height: int) -> int:
    """Small images blown up by a whole factor (pixels stay sharp), large ones shrunk to 128."""
    if image_height >= 128:
        return 128
    return image_height * math.ceil(64 / image_height)


def _fit(text: str, font, width: int) -> str:
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "...") > width:
        text = text[:-1]
    return text + "..."


def _paste(sheet: Image.Image, pixels: np.ndarray, origin: tuple[int, int], cell_size: int):
    image = Image.fromarray(pixels, "RGB")
    scale = cell_size / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    if size != image.size:
        # Nearest when enlarging shows the stored pixels as they are; bilinear
        # (antialiased by PIL) when shrinking keeps thin lines visible.
        image = image.resize(size, Image.Resampling.NEAREST if scale > 1 else Image.Resampling.BILINEAR)
    x, y = origin
    sheet.paste(image, (x + (cell_size - size[0]) // 2, y + (cell_size - size[1]) // 2))


def render_contact_sheet(
    rows: list[tuple[str, list[np.ndarray]]], columns: int, cell_size: int, title: str = ""
) -> tuple[Image.Image, SheetLayout]:
    """A grid image: one row per (label text, images) entry, `columns` cells of `cell_size` square."""
    font = ImageFont.load_default()
    _, top, _, bottom = font.getbbox("Ag")
    text_height = bottom - top
    label_width = min(_MAX_LABEL_WIDTH, max([0, *(math.ceil(font.getlength(text)) for text, _ in rows)]))
    layout = SheetLayout(
        rows=len(rows),
        columns=columns,
        cell_size=cell_size,
        label_width=label_width + 2 * _PADDING,
        title_height=text_height + 2 * _PADDING if title else 0,
    )
    sheet = Image.new("RGB", layout.size, _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((_PADDING, _PADDING - top), _fit(title, font, layout.size[0] - 2 * _PADDING), _TEXT, font)
    for row, (text, images) in enumerate(rows):
        _, y = layout.cell_origin(row, 0)
        draw.text(
            (_PADDING, y + (cell_size - text_height) // 2 - top), _fit(text, font, label_width), _TEXT, font
        )
        for column in range(columns):
            origin = layout.cell_origin(row, column)
            if column < len(images):
                _paste(sheet, images[column], origin, cell_size)
            else:
                draw.rectangle([origin, (origin[0] + cell_size - 1, origin[1] + cell_size - 1)], EMPTY_CELL)
    return sheet, layout


def write_file(path: str, data: bytes):
    """Write `data` to a local path or gs://, making its directory."""
    import tensorflow as tf  # noqa: PLC0415 - after the flags (module docstring)

    parent = posixpath.dirname(path)
    if parent and not tf.io.gfile.exists(parent):
        tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(path, "wb") as handle:
        handle.write(data)


def write_png(image: Image.Image, path: str):
    """Save as PNG to a local path or gs://."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    write_file(path, buffer.getvalue())


def contact_sheet(
    data_dir: str,
    manifest: dict,
    split: str,
    per_class: int,
    classes: list[str] | None = None,
    cell_size: int | None = None,
    max_bytes: int = 512 << 20,
) -> tuple[Image.Image, SheetLayout, Sample]:
    """Sample `split` and render its sheet; rows in label order (of `classes`, if given)."""
    names = manifest["labels"]
    sample = sample_classes(data_dir, manifest, split, per_class, classes, max_bytes)
    labels = list(sample.examples)
    image = manifest["image"]
    cell_size = cell_size or default_cell_size(image["height"])
    title = (
        f"{data_dir} | {split} | {image['height']}x{image['width']} {image['encoding']} | "
        f"first {per_class} per class"
    )
    rows = [(f"{label} {names[label]}", [ex.pixels for ex in sample.examples[label]]) for label in labels]
    sheet, layout = render_contact_sheet(rows, per_class, cell_size, title)
    return sheet, layout, sample


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m preprocess.inspect",
        description="Print a dataset's manifest as a readable summary and write a contact sheet PNG of its "
        "images (one row per class), decoded from the shards; or, with --diff, what changed between two of "
        "its versions.",
    )
    parser.add_argument("data_dir", help="The dataset directory; local or gs://.")
    parser.add_argument("--split", default=manifest_lib.TRAIN, help="Split to draw from (default train).")
    parser.add_argument("--per-class", type=int, default=8, help="Examples per class (default 8).")
    parser.add_argument(
        "--out",
        help="Where to write the PNG, local or gs:// (default ./contact_sheet_<split>.png).",
    )
    parser.add_argument(
        "--classes",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        help=f"Comma-separated class names to show (default: all, at most the first {MAX_DEFAULT_CLASSES}).",
    )
    parser.add_argument("--cell-size", type=int, help="Cell size in pixels (default: from the image size).")
    parser.add_argument(
        "--max-read-mb",
        type=int,
        default=512,
        help="Stop reading shards after this many MB (default 512); with --report, also the most the "
        "near-duplicate thumbnails read from the source files, and the most the changes between two versions "
        "read of their shards (else that section is left out; --diff reads them all).",
    )
    parser.add_argument(
        "--report",
        metavar="PATH",
        help="Write a self-contained HTML report (local or gs://): examples per split and class, failures, "
        "source image sizes, a contact sheet per class of --split, the near-duplicate groups. The PNG sheet "
        "is then written only if --out is given.",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="Show TensorFlow's start-up lines (dropped by default)."
    )
    parser.add_argument(
        "--max-groups",
        type=int,
        default=DEFAULT_MAX_GROUPS,
        help=f"Near-duplicate groups the report shows, those with more than one label first "
        f"(default {DEFAULT_MAX_GROUPS}).",
    )
    parser.add_argument(
        "--diff",
        nargs="?",
        const="",
        metavar="RUN",
        help="Print what changed between two published versions instead of the summary and the sheet: the "
        "images added, removed, relabelled and moved to another split, with counts and up to --limit files "
        "of each. Without RUN, the newest version against the one before it; with RUN (a run id, or a "
        "version number), the newest against RUN's version, as `git diff RUN` compares RUN with now. "
        "Reads the shards of both versions. With --report, the report's section compares the same two.",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_DIFF_LIMIT,
        help=f"Files listed for each kind of change, by --diff and the report (default {DEFAULT_DIFF_LIMIT}).",
    )
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # --help and flag mistakes end here, before TensorFlow
    native_logs.import_tensorflow_quietly(args.verbose)
    for flag, value in (("--max-groups", args.max_groups), ("--limit", args.limit)):
        if value < 0:
            print(f"{parser.prog}: error: {flag} must be 0 or more, not {value}", file=sys.stderr)
            return 2
    from preprocess.inspect.summary import (  # noqa: PLC0415 - TensorFlow, after the flags
        format_bytes,
        format_summary,
        read_error_examples,
        read_manifest_or_explain,
    )

    data_dir = args.data_dir.rstrip("/")
    manifest = read_manifest_or_explain(data_dir)
    if manifest is None:
        return 2
    changes = None
    if args.diff is not None:
        status, changes = print_diff(args, data_dir)
        if status or not args.report:
            return status
    else:
        print(format_summary(manifest, data_dir, read_error_examples(data_dir, manifest)))
    if args.report:
        status = write_report(args, data_dir, manifest, changes)
        if status or not args.out:
            return status
    if args.split not in manifest["splits"] or not manifest["splits"][args.split]["shards"]:
        print(f"split {args.split!r} has no shards; no contact sheet", file=sys.stderr)
        return 1
    try:
        sheet, layout, sample = contact_sheet(
            data_dir,
            manifest,
            args.split,
            args.per_class,
            classes=args.classes,
            cell_size=args.cell_size,
            max_bytes=args.max_read_mb << 20,
        )
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    out = args.out or f"contact_sheet_{args.split}.png"
    write_png(sheet, out)
    num_shards = len(manifest["splits"][args.split]["shards"])
    print(
        f"\ncontact sheet: {out} ({layout.rows} classes x {layout.columns}, {layout.cell_size}px cells, "
        f"{layout.size[0]}x{layout.size[1]}); read {sample.num_records} records "
        f"({format_bytes(sample.num_bytes)}) from {sample.num_shards} of {num_shards} shards"
    )
    for warning in sample.warnings:
        print(f"  note: {warning}")
    return 0


def print_diff(args, data_dir: str):
    """--diff: print what changed between the two versions; (exit status, the VersionDiff or None)."""
    from preprocess.inspect import diff  # noqa: PLC0415 - TensorFlow, after the flags

    try:
        old, new = diff.choose_versions(data_dir, args.diff or None)
        changes = diff.diff_versions(data_dir, old, new, args.limit)
    except diff.DiffRefused as exc:
        print(f"{build_parser().prog}: {exc}", file=sys.stderr)
        return 2, None
    except diff.VersionUnreadable as exc:
        print(f"cannot compare: {exc}", file=sys.stderr)
        return 1, None
    print(diff.format_diff(changes))
    return 0, changes


def write_report(args, data_dir: str, manifest: dict, changes=None) -> int:
    """--report: sample the split's classes and write the HTML page; the exit status. `changes`: the
    --diff already computed, for the page's section (else the section compares the default pair)."""
    from preprocess.inspect.report import build as report_build  # noqa: PLC0415 - TensorFlow, after the flags
    from preprocess.inspect.report import page  # noqa: PLC0415

    sample = Sample(examples={})  # a split without shards: no sheet
    if args.split in manifest["splits"] and manifest["splits"][args.split]["shards"]:
        try:
            sample = sample_classes(
                data_dir, manifest, args.split, args.per_class, args.classes, args.max_read_mb << 20
            )
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    data = report_build.gather(
        data_dir, manifest, args.split, sample, args.max_groups, args.max_read_mb << 20, changes, args.limit
    )
    write_file(args.report, page.render(data).encode("utf-8"))
    groups = data.groups
    print(
        f"\nreport: {args.report} ({len(sample.examples)} classes of {args.split}, "
        f"{len(groups.groups)} of {groups.total_groups} near-duplicate groups"
        + (f", the changes since version {data.changes.old.sequence}" if data.changes is not None else "")
        + ")"
    )
    if data.changes_note:
        print(f"  note: {data.changes_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
