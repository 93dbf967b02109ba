"""The CSV manifests the incremental tests list their versions' inputs in (one reader's rows, one writer), and
the altered copies they add to a version."""

import csv
import hashlib
import os

from PIL import Image

from preprocess.config import DEFAULT_SPLIT, parse_split_fractions
from preprocess.inputs.content import assign_split
from preprocess.inputs.reading import key_of_md5


def corpus_rows(corpus) -> list[list[str]]:
    """[uri, label, ""] of every PNG of a class-per-folder corpus, sorted: a manifest that names no split."""
    return sorted(
        [os.path.join(folder, name), os.path.basename(folder), ""]
        for folder, _, names in os.walk(corpus)
        for name in names
        if name.endswith(".png")
    )


def write_manifest(path, rows):
    """A CSV manifest (uri, label, split) of `rows`."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["uri", "label", "split"])
        writer.writerows(rows)


def content_split(path) -> str:
    """The split the content rule gives the file at `path` (its MD5 content key, the default fractions)."""
    with open(path, "rb") as handle:
        key = key_of_md5(hashlib.md5(handle.read()).hexdigest())
    return assign_split(key, parse_split_fractions(DEFAULT_SPLIT))


def near_jpeg_copy(original, path, image_size: int, wanted) -> bool:
    """Writes to `path` a JPEG re-encoding of `original` that the audit's signature finds near it and whose own
    content split satisfies `wanted(split)`; False when no quality from 60 to 99 gives one."""
    from preprocess.decode.image import load_image_with_source  # noqa: PLC0415
    from preprocess.near_duplicates import signature  # noqa: PLC0415

    def signed(data):
        _, size, source = load_image_with_source(data, size=image_size, method="crop", max_pixels=10**8)
        return signature.source_signature(source, size)

    with open(original, "rb") as handle:
        data = handle.read()
    with Image.open(original) as image:
        source = image.convert("RGB")
    for quality in range(60, 100):
        source.save(path, format="JPEG", quality=quality)
        with open(path, "rb") as handle:
            if signature.near(signed(data), signed(handle.read()), signature.DEFAULT_MAX_DISTANCE) is None:
                return False
        if wanted(content_split(path)):
            return True
    return False
