"""--image-size against the sources, before a job starts: a warning when most sources are smaller."""

import io
import itertools
import logging
import os

from PIL import Image

from dataset_contract import features, geometry
from preprocess.inputs import rules as input_rules

log = logging.getLogger(__name__)

SAMPLE_IMAGES = 24
COUNT_LIMIT = 200_000
# Bytes read from a gs:// source for its header: a JPEG's size marker follows its EXIF block (up to 64 KB).
_HEADER_BYTES = 256 << 10
# Bytes per pixel of a record, by encoding; jpeg's is a typical photo's at quality 90 (about 1/8 of uint8).
_BYTES_PER_PIXEL = {features.UINT8: 3.0, features.BFLOAT16: 6.0, features.FLOAT32: 12.0, features.JPEG: 0.4}


def _image_names(folder: str):
    """Image files below a local folder, hidden ones left out, in walk order."""
    for path, name in input_rules.walk_files(folder):
        if input_rules.is_input_name(name) and input_rules.is_image_name(name):
            yield path


def _local_tree_images(root: str):
    """(a few images of each class folder, round robin up to SAMPLE_IMAGES; a count of all up to COUNT_LIMIT)."""
    class_folders = [
        folder
        for name, top in input_rules.list_level(root)[0]
        # A pre-split tree's split folder: the classes are inside.
        for folder in (
            [path for _, path in input_rules.list_level(top)[0]]
            if name.lower() in input_rules.SPLIT_FOLDER_NAMES
            else [top]
        )
    ]
    firsts = [list(itertools.islice(_image_names(folder), SAMPLE_IMAGES)) for folder in class_folders]
    sample = [uri for row in itertools.zip_longest(*firsts) for uri in row if uri][:SAMPLE_IMAGES]
    count = sum(1 for _ in itertools.islice(itertools.chain(*map(_image_names, class_folders)), COUNT_LIMIT))
    return sample, count


def _source_size(uri: str) -> tuple[int, int] | None:
    """(width, height) from the header of a source image, or None when it cannot be read."""
    try:
        if uri.startswith("gs://"):
            from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415 - Beam, only for gs://

            with FileSystems.open(uri, compression_type="uncompressed") as handle:
                head = handle.read(_HEADER_BYTES)
            with Image.open(io.BytesIO(head)) as image:
                return image.size
        with Image.open(uri) as image:  # the header only: the pixels are decoded on first access
            return image.size
    except Exception:  # noqa: BLE001 - a broken source is the job's to report, with its reason
        return None


def estimated_bytes(num_images: int, stored_size: int, encoding: str) -> float:
    """The shards' size for `num_images` records of `stored_size` squares in `encoding` (jpeg: typical)."""
    return num_images * stored_size * stored_size * _BYTES_PER_PIXEL[encoding]


def _format_bytes(num_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes:.0f} B"


def upscale_warning(
    uris: list[str],
    num_images: int | None,
    stored_size: int,
    crop_size: int,
    resize_method: str,
    encoding: str,
) -> str | None:
    """The warning for an --image-size larger than most of the sampled sources `uris`, or None."""
    sizes = [size for size in map(_source_size, uris) if size]
    if not sizes:
        return None
    # crop scales the short side to the square; pad scales the long side.
    sides = sorted(min(size) if resize_method == geometry.CROP else max(size) for size in sizes)
    smaller = sum(side < stored_size for side in sides)
    if smaller * 2 <= len(sides):
        return None
    side_kind = "short" if resize_method == geometry.CROP else "long"
    stored = f" ({stored_size} px stored with the crop margin)" if stored_size != crop_size else ""
    if num_images:
        at_least = "at least " if num_images >= COUNT_LIMIT else ""
        total = _format_bytes(estimated_bytes(num_images, stored_size, encoding))
        estimate = (
            f"the dataset will take about {at_least}{total} ({at_least}{num_images:,} images, {encoding})"
        )
    else:
        estimate = f"the dataset will take about {_format_bytes(estimated_bytes(1000, stored_size, encoding))} per 1,000 images ({encoding})"
    return (
        f"--image-size {crop_size}{stored} is larger than {smaller} of the {len(sides)} source images sampled "
        f"(their {side_kind} side: {sides[0]}-{sides[-1]} px, median {sides[len(sides) // 2]}): each of those is "
        f"upscaled, which adds bytes but no detail, and {estimate}. A size at most the sources' "
        f"(e.g. {min(224, sides[len(sides) // 2])}) is the usual choice; the run goes on."
    )


def check_image_size(
    input_spec: str, stored_size: int, crop_size: int, resize_method: str, encoding: str, labels=None
) -> str | None:
    """upscale_warning for --input `input_spec` (a tree or a manifest, local or gs://); None when the size fits
    most sources or none could be sampled."""
    if input_rules.input_kind(input_spec) == input_rules.DIRECTORY:
        if input_spec.startswith("gs://"):
            from preprocess.inputs import listing as inputs  # noqa: PLC0415 - Beam's GCS client, only for gs://

            records = itertools.islice(
                (
                    record
                    for folder in inputs.list_class_folders(input_spec)
                    for record in inputs.list_class_files(folder)
                ),
                SAMPLE_IMAGES,
            )
            uris, count = [record.uri for record in records], None
        else:
            uris, count = _local_tree_images(input_spec)
    else:
        from preprocess.inputs import checks as input_checks  # noqa: PLC0415

        lines, _ = input_checks.manifest_sample(input_spec)
        kind = input_rules.input_kind(input_spec)
        uris = [
            item.uri
            for item in input_rules.parse_manifest_rows(lines, kind, input_spec)
            if isinstance(item, input_rules.InputRecord) and (not labels or item.label in labels)
        ][:SAMPLE_IMAGES]
        count = None  # the manifest's rows, up to COUNT_LIMIT (local ones only)
        if not input_spec.startswith("gs://"):
            with open(input_spec, "rb") as handle:
                count = sum(1 for line in itertools.islice(handle, COUNT_LIMIT) if line.strip())
    return upscale_warning(uris, count, stored_size, crop_size, resize_method, encoding)


def _published_at_this_size(config) -> bool:
    """Whether --output holds a published version of this --image-size and resize method: the sources were
    checked when it was built, and a re-run reads no unchanged source, not even a header (preprocess/reuse/)."""
    from preprocess.publish.protocol import read_published_manifest  # noqa: PLC0415 - Beam's filesystems

    output = config.output.rstrip("/")
    manifest = read_published_manifest(output if "://" in output else os.path.abspath(output))
    image = (manifest or {}).get("image") or {}
    return (image.get("height"), image.get("crop_size", image.get("height")), image.get("resize_method")) == (
        config.stored_size,
        config.image_size,
        config.resize_method,
    )


def warn_if_upscaled(config) -> None:
    """Logs check_image_size's warning for a Stage1Config (preprocess/config.py), if there is one."""
    if not config.rebuild and _published_at_this_size(config):
        return
    warning = check_image_size(
        config.input,
        config.stored_size,
        config.image_size,
        config.resize_method,
        config.encoding,
        config.labels,
    )
    if warning:
        log.warning("%s", warning)
