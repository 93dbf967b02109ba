"""Deterministic synthetic image corpora for the demo, the tests and the benchmarks."""

import argparse
import csv
import dataclasses
import hashlib
import io
import json
import math
import multiprocessing
import os
import struct
import sys
import zlib
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

from preprocess import errors
from preprocess.decode.image import EXIF_ORIENTATION_TAG, TRANSPOSE_FOR_ORIENTATION

SHAPES = ("circle", "cross", "square", "star", "triangle")

# What a file is. The usable kinds decode to an upright RGB image of their
# class; the others are broken in the way the name says.
GOOD = "good"
GRAYSCALE = "grayscale"  # mode L
CMYK = "cmyk"  # a CMYK JPEG (print workflows)
RGBA = "rgba"  # PNG, shape on a fully transparent background
# A JPEG with EXIF Orientation k whose pixels are upright.transpose(INVERSE_TRANSPOSE[k]), so that
# PIL.ImageOps.exif_transpose(stored) is the upright image again (up to JPEG loss).
EXIF_ROTATED = "exif_rotated"
PNG_NAMED_JPG = "png_named_jpg"  # PNG content behind a .jpg extension
DUPLICATE = "duplicate"  # same bytes as another file of the same class
TRUNCATED = "truncated"
EMPTY = "empty"
NOT_AN_IMAGE = "not_an_image"
TOO_MANY_PIXELS = "too_many_pixels"
CONFLICTING_ORIGINAL = "conflicting_original"  # the copy of it sits under another class
CONFLICTING_DUPLICATE = "conflicting_duplicate"
PHOTO = "photo"  # write_photo_corpus: a photo-like RGB JPEG
NEAR_DUPLICATE = "near_duplicate"  # an altered copy (resized, brightened, re-encoded) of another file

USABLE_KINDS = (GOOD, GRAYSCALE, CMYK, RGBA, EXIF_ROTATED, PNG_NAMED_JPG)

# The reason stage 1 must report for each broken kind. Both copies of a
# content listed under two labels fail: neither label can be trusted.
EXPECTED_REASONS = {
    TRUNCATED: errors.TRUNCATED,
    EMPTY: errors.EMPTY_FILE,
    NOT_AN_IMAGE: errors.NOT_AN_IMAGE,
    TOO_MANY_PIXELS: errors.TOO_MANY_PIXELS,
    CONFLICTING_ORIGINAL: errors.CONFLICTING_LABELS,
    CONFLICTING_DUPLICATE: errors.CONFLICTING_LABELS,
}

# Side of the decompression bomb's claimed size: 2.5 gigapixels, far over any
# sane --max-pixels and over PIL's own guard (2 x 89.5 MP raises on open).
BOMB_SIDE = 50000

# The file stores the upright image transformed by the inverse of its orientation's transpose (the one
# PIL's exif_transpose and stage 1 apply), so that applying the orientation gives the upright image back.
INVERSE_TRANSPOSE = {**TRANSPOSE_FOR_ORIENTATION, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}

_FORMAT_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "GIF": "gif"}
# The encoders' settings, fixed (a JPEG's quality is drawn from the image's random stream).
_SAVE_OPTIONS = {
    "JPEG": {"optimize": False, "progressive": False},
    "PNG": {"optimize": False, "compress_level": 6},
    "WEBP": {"quality": 85, "method": 4, "lossless": False},
    "BMP": {},
    "GIF": {"optimize": False},
}


@dataclasses.dataclass(frozen=True)
class ShapeImageParams:
    """Everything that determines one rendered shape image (upright, RGB)."""

    shape: str
    width: int
    height: int
    center: tuple[float, float]  # (x, y) in pixels
    radius: float  # circumradius of the shape, pixels
    angle_degrees: float
    shape_color: tuple[int, int, int]
    background_colors: tuple[tuple[int, int, int], tuple[int, int, int]]  # gradient endpoints
    gradient_angle_degrees: float
    noise_std: float
    noise_seed: int


@dataclasses.dataclass(frozen=True)
class CorpusFile:
    """One file of a generated corpus."""

    path: str  # relative to the corpus root, '/'-separated: <class>/<name>
    class_name: str
    kind: str
    format: str | None  # the format of the content (not of the extension); None if not an image
    sha256: str
    expected_error: str | None = None  # a reason code of preprocess/errors.py, for broken kinds
    duplicate_of: str | None = None  # path of the file with the same bytes
    altered_from: str | None = None  # NEAR_DUPLICATE: path of the file it is an altered copy of
    exif_orientation: int | None = None
    params: ShapeImageParams | None = None  # how the upright image was rendered (shape corpora)


@dataclasses.dataclass
class CorpusInfo:
    """What a corpus generator wrote, for tests to hold stage 1 against."""

    root: str
    class_names: list[str]
    files: list[CorpusFile]

    def uri(self, corpus_file: CorpusFile) -> str:
        return os.path.join(self.root, *corpus_file.path.split("/"))

    def files_of_kind(self, kind: str) -> list[CorpusFile]:
        return [f for f in self.files if f.kind == kind]

    @property
    def expected_errors(self) -> dict[str, str]:
        """Relative path -> reason code, for every file stage 1 must reject."""
        return {f.path: f.expected_error for f in self.files if f.expected_error}

    @property
    def num_found(self) -> int:
        return len(self.files)

    @property
    def num_duplicates(self) -> int:
        """Files that are exact copies of another file of the same class."""
        return len(self.files_of_kind(DUPLICATE))

    @property
    def num_failed(self) -> int:
        return len(self.expected_errors)

    @property
    def num_usable(self) -> int:
        """Distinct usable images: what stage 1 writes (found - failed - duplicates)."""
        return sum(self.usable_per_class().values())

    def usable_per_class(self) -> dict[str, int]:
        counts = dict.fromkeys(self.class_names, 0)
        for f in self.files:
            if f.expected_error is None and f.kind != DUPLICATE:
                counts[f.class_name] += 1
        return counts


# ---------------------------------------------------------------- rendering


def _luminance(color: Sequence[int]) -> float:
    r, g, b = color
    return 0.299 * r + 0.587 * g + 0.114 * b


def _random_color(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(c) for c in rng.integers(0, 256, size=3))


def sample_shape_params(rng: np.random.Generator, shape: str) -> ShapeImageParams:
    """Random size, placement, rotation (at most 20 degrees from upright) and colours of one shape image, the
    shape inside the central square and of a luminance unlike the background's."""
    short = int(rng.integers(80, 257))
    long = int(round(short * rng.uniform(1.0, 1.6)))
    width, height = (long, short) if rng.random() < 0.5 else (short, long)
    radius = short * rng.uniform(0.25, 0.42)
    slack = short / 2 - radius
    center = (width / 2 + rng.uniform(-slack, slack), height / 2 + rng.uniform(-slack, slack))
    # A gentle gradient: the second colour is near the first, as in a lit scene.
    start = _random_color(rng)
    end = tuple(int(c) for c in np.clip(np.asarray(start) + rng.integers(-80, 81, size=3), 0, 255))
    background = (start, end)
    for _ in range(1000):
        shape_color = _random_color(rng)
        if min(abs(_luminance(shape_color) - _luminance(c)) for c in background) >= 50:
            break
    else:  # a background spanning black to white leaves no contrasting colour: use a flat one
        background = (background[0], background[0])
        shape_color = (255, 255, 255) if _luminance(background[0]) < 128 else (0, 0, 0)
    return ShapeImageParams(
        shape, width, height, (float(center[0]), float(center[1])), float(radius),
        angle_degrees=float(rng.uniform(-20, 20)), shape_color=shape_color, background_colors=background,
        gradient_angle_degrees=float(rng.uniform(0, 360)), noise_std=float(rng.uniform(0, 14)),
        noise_seed=int(rng.integers(0, 2**31)),
    )  # fmt: skip


def shape_polygon(shape: str, center: tuple[float, float], radius: float, angle_degrees: float):
    """Vertices of a (non-circle) shape, rotated about its center."""
    if shape == "square":
        unit = [(math.cos(a), math.sin(a)) for a in np.arange(4) * math.pi / 2 + math.pi / 4]
    elif shape == "triangle":
        unit = [(math.cos(a), math.sin(a)) for a in np.arange(3) * 2 * math.pi / 3 - math.pi / 2]
    elif shape == "star":
        unit = [
            (r * math.cos(a), r * math.sin(a))
            for a, r in zip(np.arange(10) * math.pi / 5 - math.pi / 2, [1.0, 0.42] * 5, strict=True)
        ]
    elif shape == "cross":
        arm = 0.32
        quarter = [(1.0, -arm), (1.0, arm), (arm, arm)]
        unit = []
        for k in range(4):  # the same three corners, turned four times
            c, s = math.cos(k * math.pi / 2), math.sin(k * math.pi / 2)
            unit += [(x * c - y * s, x * s + y * c) for x, y in quarter]
        unit = [(u / math.hypot(1.0, arm), v / math.hypot(1.0, arm)) for u, v in unit]
    else:
        raise ValueError(f"unknown shape {shape!r}")
    theta = math.radians(angle_degrees)
    c, s = math.cos(theta), math.sin(theta)
    cx, cy = center
    return [(cx + radius * (x * c - y * s), cy + radius * (x * s + y * c)) for x, y in unit]


def _draw(draw: ImageDraw.ImageDraw, shape: str, center, radius: float, angle_degrees: float, fill) -> None:
    if shape == "circle":
        (cx, cy), r = center, radius
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon(shape_polygon(shape, center, radius, angle_degrees), fill=fill)


def render_shape_image(params: ShapeImageParams, *, transparent_background: bool = False) -> Image.Image:
    """The upright image described by `params`: RGB, or RGBA with alpha 0 off the shape."""
    h, w = params.height, params.width
    theta = math.radians(params.gradient_angle_degrees)
    xs = (np.arange(w, dtype=np.float32) - w / 2) * math.cos(theta)
    ys = (np.arange(h, dtype=np.float32) - h / 2) * math.sin(theta)
    t = ys[:, None, None] + xs[None, :, None]
    t = (t - t.min()) / max(float(t.max() - t.min()), 1.0)
    start, end = (np.asarray(c, np.float32) for c in params.background_colors)
    background = start + t * (end - start)

    mask_image = Image.new("L", (w, h), 0)
    _draw(ImageDraw.Draw(mask_image), params.shape, params.center, params.radius, params.angle_degrees, 255)
    mask = np.asarray(mask_image, np.float32)[..., None] / 255.0
    pixels = background * (1 - mask) + np.asarray(params.shape_color, np.float32) * mask
    noise = np.random.default_rng(params.noise_seed).standard_normal((h, w, 3), dtype=np.float32)
    pixels = np.clip(pixels + params.noise_std * noise, 0, 255).round().astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    if transparent_background:
        image.putalpha(mask_image)
    return image


# ---------------------------------------------------------------- encoding


def _encode(
    image: Image.Image, image_format: str, rng: np.random.Generator, exif: bytes | None = None
) -> bytes:
    """Bytes of `image` in `image_format` (one of _SAVE_OPTIONS), with every encoder setting fixed."""
    options = dict(_SAVE_OPTIONS[image_format])
    if image_format == "JPEG":
        options.update(quality=int(rng.integers(75, 96)), **({"exif": exif} if exif is not None else {}))
    elif image_format == "GIF":
        # Fast octree quantization: the adaptive one costs ten times the rest of the file.
        image = image.quantize(colors=128, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, image_format, **options)
    return out.getvalue()


def _png_chunk(chunk_type: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + chunk_type + data + struct.pack(">I", zlib.crc32(chunk_type + data))


def make_bomb_png(png: bytes, width: int = BOMB_SIDE, height: int = BOMB_SIDE) -> bytes:
    """`png` with its IHDR rewritten to claim width x height, CRC still valid: a tiny file that hurts only a
    decoder that trusts the header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("not a PNG starting with IHDR")
    (length,) = struct.unpack(">I", png[8:12])
    ihdr = struct.pack(">II", width, height) + png[24 : 16 + length]
    return png[:8] + _png_chunk(b"IHDR", ihdr) + png[16 + length + 4 :]


# ---------------------------------------------------------------- sample corpus


def _special_kinds(images_per_class: int) -> list[str]:
    """Kinds of one class's images: a few of each special kind, the rest good."""
    kinds: list[str] = []
    for kind, share in (
        (EXIF_ROTATED, 0.06),
        (GRAYSCALE, 0.08),
        (RGBA, 0.05),
        (PNG_NAMED_JPG, 0.01),
        (CMYK, 0.01),
    ):
        kinds += [kind] * min(math.ceil(share * images_per_class), images_per_class - len(kinds))
    return kinds + [GOOD] * (images_per_class - len(kinds))


def _render_file(kind: str, params: ShapeImageParams, rng: np.random.Generator):
    """(bytes, content format, extension, exif orientation) of one usable file."""
    if kind not in USABLE_KINDS:
        raise ValueError(f"not a usable kind: {kind!r}")
    image = render_shape_image(params, transparent_background=kind == RGBA)  # draws nothing from `rng`
    image_format, orientation, exif = "PNG", None, None  # RGBA, PNG_NAMED_JPG
    if kind == GOOD:
        image_format = str(rng.choice(["JPEG"] * 12 + ["PNG"] * 5 + ["WEBP", "BMP", "GIF"]))
    elif kind == GRAYSCALE:
        image, image_format = image.convert("L"), ("JPEG" if rng.random() < 0.5 else "PNG")
    elif kind == CMYK:
        image, image_format = image.convert("CMYK"), "JPEG"
    elif kind == EXIF_ROTATED:
        orientation = int(
            rng.choice([3, 6, 8, 2, 5, 7, 4], p=[0.25, 0.25, 0.25, 0.0625, 0.0625, 0.0625, 0.0625])
        )
        image, image_format, exif = image.transpose(INVERSE_TRANSPOSE[orientation]), "JPEG", Image.Exif()
        exif[EXIF_ORIENTATION_TAG] = orientation
        exif = exif.tobytes()
    extension = "jpg" if kind == PNG_NAMED_JPG else _FORMAT_EXTENSIONS[image_format]
    return _encode(image, image_format, rng, exif), image_format, extension, orientation


class _CorpusWriter:
    """Writes files under a root and records them; names are <class>/<class>_NNNN.<ext>."""

    def __init__(self, root: str, class_names: Sequence[str]):
        self.root = root
        self.files: list[CorpusFile] = []
        self._next_index = dict.fromkeys(class_names, 0)
        for name in class_names:
            os.makedirs(os.path.join(root, name), exist_ok=True)

    def write(self, class_name: str, extension: str, data: bytes, **record) -> CorpusFile:
        index = self._next_index[class_name]
        self._next_index[class_name] += 1
        path = f"{class_name}/{class_name}_{index:04d}.{extension}"
        with open(os.path.join(self.root, class_name, path.split("/")[1]), "wb") as f:
            f.write(data)
        record.setdefault("expected_error", EXPECTED_REASONS.get(record["kind"]))
        corpus_file = CorpusFile(
            path=path, class_name=class_name, sha256=hashlib.sha256(data).hexdigest(), **record
        )
        self.files.append(corpus_file)
        return corpus_file


def write_sample_corpus(
    root: str,
    *,
    images_per_class: int = 120,
    seed: int = 0,
    include_broken: bool = True,
    near_duplicates: bool = False,
) -> CorpusInfo:
    """Write the shape corpus under `root/<class>/` and say what was written: `images_per_class` usable images
    per class, 3 exact duplicates, and with `include_broken` 6 broken files (EXPECTED_REASONS). Deterministic."""
    if images_per_class < 1:
        raise ValueError("images_per_class must be at least 1")
    class_names = list(SHAPES)
    writer = _CorpusWriter(root, class_names)
    data_of: dict[str, bytes] = {}

    for class_index, class_name in enumerate(class_names):
        # One stream per class orders the kinds; one per image renders it, so
        # image i of a class is the same whatever images_per_class is.
        kinds = _special_kinds(images_per_class)
        np.random.default_rng([seed, class_index]).shuffle(kinds)
        for image_index, kind in enumerate(kinds):
            rng = np.random.default_rng([seed, class_index, image_index])
            params = sample_shape_params(rng, class_name)
            data, image_format, extension, orientation = _render_file(kind, params, rng)
            written = writer.write(class_name, extension, data, kind=kind, format=image_format,
                                   exif_orientation=orientation, params=params)  # fmt: skip
            data_of[written.path] = data

    # Extra files get their own streams, apart from the per-image ones.
    extras = np.random.default_rng([seed, 1_000_000])
    originals = [f for f in writer.files if f.kind == GOOD]
    for source_index in sorted(extras.choice(len(originals), size=min(3, len(originals)), replace=False)):
        source = originals[source_index]
        writer.write(source.class_name, source.path.rsplit(".", 1)[1], data_of[source.path], kind=DUPLICATE,
                     format=source.format, duplicate_of=source.path, params=source.params)  # fmt: skip

    if near_duplicates:
        _write_altered_copies(
            writer, class_names, originals, data_of, np.random.default_rng([seed, 2_000_000])
        )
    if include_broken:
        _write_broken_files(writer, class_names, extras)
    return CorpusInfo(root=root, class_names=class_names, files=writer.files)


# How each altered copy is made from its original (an RGB image): (file extension, PIL format, save options,
# change, class shift: 1 files it under the next class, a likely label error).
_ALTERATIONS = (
    ("jpg", "JPEG", {"quality": 75}, lambda image: image.resize((image.width * 3 // 4, image.height * 3 // 4)), 0),
    ("png", "PNG", {}, lambda image: ImageEnhance.Brightness(image).enhance(1.1), 0),
    ("jpg", "JPEG", {"quality": 85}, lambda image: image, 1),
)  # fmt: skip


def _write_altered_copies(writer, class_names, originals, data_of, rng) -> None:
    """Altered copies of three good images, for the near-duplicate audit to find: a smaller JPEG and a
    brighter PNG in their originals' classes, and a re-encoded JPEG filed under the next class (a likely
    label error). Stage 1 writes them all (--near-duplicates keep), each in its original's split."""
    if len(originals) < len(_ALTERATIONS):
        return
    chosen = sorted(rng.choice(len(originals), size=len(_ALTERATIONS), replace=False))
    for source_index, (extension, image_format, options, change, class_shift) in zip(
        chosen, _ALTERATIONS, strict=True
    ):
        source = originals[source_index]
        with Image.open(io.BytesIO(data_of[source.path])) as opened:
            altered = change(opened.convert("RGB"))
        out = io.BytesIO()
        altered.save(out, format=image_format, **options)
        class_name = class_names[(class_names.index(source.class_name) + class_shift) % len(class_names)]
        writer.write(class_name, extension, out.getvalue(), kind=NEAR_DUPLICATE, format=image_format,
                     altered_from=source.path, params=source.params)  # fmt: skip


def _write_broken_files(writer: _CorpusWriter, class_names: list[str], rng: np.random.Generator) -> None:
    """One file of each broken kind, spread over the class folders."""

    def owner(i: int) -> str:
        return class_names[i % len(class_names)]

    # Cut in the middle of the entropy-coded data: the headers are intact, so
    # the file opens and fails only when decoded, as an interrupted upload does.
    jpeg = _encode(render_shape_image(sample_shape_params(rng, owner(0))), "JPEG", rng)
    writer.write(owner(0), "jpg", jpeg[: len(jpeg) // 2], kind=TRUNCATED, format="JPEG")
    writer.write(owner(1), "jpg", b"", kind=EMPTY, format=None)
    text = b"This is a text file with an image's extension, not an image.\n"
    writer.write(owner(2), "png", text, kind=NOT_AN_IMAGE, format=None)
    small = _encode(render_shape_image(sample_shape_params(rng, owner(3))).resize((64, 64)), "PNG", rng)
    writer.write(owner(3), "png", make_bomb_png(small), kind=TOO_MANY_PIXELS, format="PNG")
    params = sample_shape_params(rng, owner(4))
    conflicting = _encode(render_shape_image(params), "JPEG", rng)
    original = writer.write(
        owner(4), "jpg", conflicting, kind=CONFLICTING_ORIGINAL, format="JPEG", params=params
    )
    writer.write(owner(5), "jpg", conflicting, kind=CONFLICTING_DUPLICATE, format="JPEG", params=params,
                 duplicate_of=original.path)  # fmt: skip


# ---------------------------------------------------------------- manifests


def split_for_content(sha256: str) -> str:
    """train / validation / test (0.8 / 0.1 / 0.1) from the content hash: copies share a split."""
    position = int(sha256[:8], 16) / 2**32 if sha256 else 0.0
    return "train" if position < 0.8 else "validation" if position < 0.9 else "test"


def _manifest_rows(info: CorpusInfo, with_split: bool) -> list[dict]:
    split = (lambda f: {"split": split_for_content(f.sha256)}) if with_split else (lambda f: {})
    return [{"uri": info.uri(f), "label": f.class_name, **split(f)} for f in info.files]


def write_manifest_csv(info: CorpusInfo, path: str, with_split: bool = False) -> None:
    """A `uri,label[,split]` CSV (with that header row) listing every file of the corpus."""
    columns = ["uri", "label"] + (["split"] if with_split else [])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(_manifest_rows(info, with_split))


def write_manifest_jsonl(info: CorpusInfo, path: str, with_split: bool = False) -> None:
    """One `{"uri", "label"[, "split"]}` object per line for every file of the corpus."""
    with open(path, "w", encoding="utf-8") as f:
        for row in _manifest_rows(info, with_split):
            f.write(json.dumps(row, sort_keys=True) + "\n")


# ---------------------------------------------------------------- photo corpus


def _upsampled_noise(rng: np.random.Generator, grid: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """Smooth random field: coarse noise on a grid, bicubically enlarged to (width, height)."""
    coarse = rng.integers(0, 256, size=(grid[1], grid[0], 3), dtype=np.uint8)
    field = Image.fromarray(coarse, "RGB").resize(size, Image.Resampling.BICUBIC)
    return (np.asarray(field, np.float32) - 127.5) / 127.5


def render_photo(rng: np.random.Generator, shape: str, megapixels: tuple[float, float]) -> Image.Image:
    """A photo-like RGB image (gradient sky, texture, soft shapes, grain) whose JPEG is a real photo's size."""
    pixels = rng.uniform(*megapixels) * 1e6
    aspect = float(rng.choice([4 / 3, 3 / 2, 16 / 9, 1.0]))
    if rng.random() < 0.3:
        aspect = 1 / aspect
    width = int(round(math.sqrt(pixels * aspect)))
    height = int(round(pixels / width))

    top, bottom = (np.asarray(_random_color(rng), np.float32) for _ in range(2))
    t = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    image = top + t * (bottom - top) + np.zeros((1, width, 1), np.float32)
    for cells, amplitude in ((3, 40.0), (12, 25.0), (60, 16.0), (300, 10.0), (900, 7.0)):
        grid = (
            max(2, int(cells * width / max(width, height))),
            max(2, int(cells * height / max(width, height))),
        )
        image += amplitude * _upsampled_noise(rng, grid, (width, height))

    canvas = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(canvas)
    short = min(width, height)
    for i in range(int(rng.integers(2, 5))):
        # The class's shape first and largest, then smaller ones of any kind.
        kind = shape if i == 0 else str(rng.choice(SHAPES))
        radius = short * (rng.uniform(0.2, 0.35) if i == 0 else rng.uniform(0.04, 0.15))
        center = (float(rng.uniform(radius, width - radius)), float(rng.uniform(radius, height - radius)))
        fill = _random_color(rng)  # drawn before the angle, which only a polygon draws from `rng`
        _draw(draw, kind, center, radius, 0.0 if kind == "circle" else float(rng.uniform(0, 360)), fill)
    canvas = canvas.filter(ImageFilter.GaussianBlur(1.2))  # lens softness: no razor edges

    grain = rng.standard_normal((height, width, 3), dtype=np.float32) * float(rng.uniform(4.5, 6.5))
    return Image.fromarray(
        np.clip(np.asarray(canvas, np.float32) + grain, 0, 255).round().astype(np.uint8), "RGB"
    )


def _photo_jpeg(task: tuple[int, int, str, tuple[float, float], int]) -> bytes:
    seed, index, shape, megapixels, quality = task
    image = render_photo(np.random.default_rng([seed, index]), shape, megapixels)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, optimize=False, progressive=False)
    return out.getvalue()


def write_photo_corpus(
    root: str,
    *,
    num_images: int,
    megapixels: tuple[float, float] = (1, 3),
    quality: int = 90,
    classes: int = 4,
    seed: int = 0,
    processes: int = 1,
) -> CorpusInfo:
    """Write `num_images` photo-like JPEGs under `root/<class>/`, round-robin over classes (class i's feature
    shape i); `processes` > 1 renders in parallel, the same bytes."""
    if classes < 1:
        raise ValueError("classes must be at least 1")
    class_names = [SHAPES[i] if classes <= len(SHAPES) else f"class_{i:03d}" for i in range(classes)]
    tasks = [
        (seed, i, SHAPES[(i % classes) % len(SHAPES)], tuple(megapixels), quality) for i in range(num_images)
    ]
    if processes > 1:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            jpegs = pool.imap(_photo_jpeg, tasks, chunksize=4)
            return _write_photos(root, class_names, jpegs)
    return _write_photos(root, class_names, map(_photo_jpeg, tasks))


def _write_photos(root: str, class_names: list[str], jpegs) -> CorpusInfo:
    writer = _CorpusWriter(root, class_names)
    for i, data in enumerate(jpegs):
        writer.write(class_names[i % len(class_names)], "jpg", data, kind=PHOTO, format="JPEG")
    return CorpusInfo(root=root, class_names=class_names, files=writer.files)


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> CorpusInfo:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the corpus into")
    parser.add_argument("--kind", choices=["sample", "photos"], default="sample")
    parser.add_argument(
        "--num", type=int, help="images per class (sample, default 120) or in all (photos, default 100)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-broken", action="store_true", help="sample: leave out the broken files")
    parser.add_argument("--manifest", help="also write a uri,label,split manifest (.csv or .jsonl) here")
    parser.add_argument("--processes", type=int, default=1, help="photos: render in parallel")
    args = parser.parse_args(argv)

    if args.kind == "sample":
        info = write_sample_corpus(
            args.out, images_per_class=args.num or 120, seed=args.seed, include_broken=not args.no_broken
        )
    else:
        info = write_photo_corpus(
            args.out, num_images=args.num or 100, seed=args.seed, processes=args.processes
        )
    if args.manifest:
        write = write_manifest_jsonl if args.manifest.endswith(".jsonl") else write_manifest_csv
        write(info, args.manifest, with_split=True)
    print(
        f"wrote {info.num_found} files in {len(info.class_names)} classes to {args.out}: "
        f"{info.num_usable} usable, {info.num_duplicates} duplicates, {info.num_failed} broken"
    )
    return info


if __name__ == "__main__":
    main(sys.argv[1:])
