"""Turn the bytes of one image file into the fixed-size RGB array stage 1 writes."""

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from dataset_contract import geometry
from preprocess import errors

JPEG = "jpeg"
PNG = "png"
GIF = "gif"
BMP = "bmp"
WEBP = "webp"
FORMATS = (JPEG, PNG, GIF, BMP, WEBP)

# (offset, magic bytes) of each format's content; WebP's RIFF header also needs "WEBP" at 8.
_MAGIC = (
    (JPEG, 0, b"\xff\xd8\xff"),
    (PNG, 0, b"\x89PNG\r\n\x1a\n"),
    (GIF, 0, b"GIF87a"),
    (GIF, 0, b"GIF89a"),
    (BMP, 0, b"BM"),
    (WEBP, 8, b"WEBP"),
)

# Raise it when a change here may accept bytes it rejected before (or reject others): a re-run then reads
# again the inputs whose decoding failed, instead of carrying their failure over (reuse/ledger.py).
DECODE_VERSION = 1

EXIF_ORIENTATION_TAG = 0x0112
TRANSPOSE_FOR_ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_AXES = (5, 6, 7, 8)

_SIXTEEN_BIT_GRAY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_MODES_WITH_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")
# `crop` scales the short side to the target, so a long thin image becomes a
# huge intermediate (a 1x65500 JPEG at 224 would be 224x14.7M px, 9.9 GB) of
# which the crop keeps one square. Beyond this many squares' worth, only the
# window is resized; below it, the whole image (the usual path) costs little.
_WHOLE_RESIZE_MAX_WINDOWS = 4


def sniff_format(data: bytes) -> str | None:
    """The image format by content (magic bytes), whatever the file is named."""
    for image_format, offset, magic in _MAGIC:
        if data[offset : offset + len(magic)] == magic and (image_format != WEBP or data[:4] == b"RIFF"):
            return image_format
    return None


def decode_image(
    data: bytes, *, target_size: int | None = None, method: str = geometry.CROP, max_pixels: int
) -> np.ndarray:
    """Decode, orient and convert to RGB: uint8 [height, width, 3]; with `target_size`, a JPEG may be decoded
    at 1/2, 1/4 or 1/8 scale, never below what the resize needs. Raises `errors.ImageError`."""
    image, _ = _decode(data, target_size, method, max_pixels)
    return np.asarray(image)


def resize_image(image: np.ndarray, size: int, method: str) -> np.ndarray:
    """Resize an RGB uint8 array to [size, size, 3]: crop or letterbox (see geometry)."""
    height, width = image.shape[:2]
    return _resize_to_target(
        Image.fromarray(image), geometry.resized_shape(height, width, size, method), size, method
    )


def load_image(data: bytes, *, size: int, method: str, max_pixels: int) -> np.ndarray:
    """Bytes of an image file -> uint8 [size, size, 3]; raises `errors.ImageError` (`max_pixels` is checked
    from the header, before any pixel is decoded)."""
    return load_image_and_source_size(data, size=size, method=method, max_pixels=max_pixels)[0]


def load_image_and_source_size(
    data: bytes, *, size: int, method: str, max_pixels: int
) -> tuple[np.ndarray, tuple[int, int]]:
    """As `load_image`, plus the upright source image's (width, height), from the same decode."""
    return load_image_with_source(data, size=size, method=method, max_pixels=max_pixels)[:2]


def load_image_with_source(
    data: bytes, *, size: int, method: str, max_pixels: int
) -> tuple[np.ndarray, tuple[int, int], Image.Image]:
    """As `load_image_and_source_size`, plus the decoded upright RGB source image itself (possibly at a
    JPEG DCT scale): the near-duplicate signature is taken from it, not from the resized pixels."""
    image, (height, width) = _decode(data, size, method, max_pixels)
    # From the full-resolution size, not the DCT-scaled one (its sides rounded up): the same geometry with
    # or without scaling, and the serving signature's.
    target_shape = geometry.resized_shape(height, width, size, method)
    return _resize_to_target(image, target_shape, size, method), (width, height), image


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8) of an opened image, read before `load()` as the serving parser reads it; 1
    when absent or invalid."""
    raw = image.info.get("exif")
    if not raw:
        return 1
    exif = Image.Exif()
    try:
        exif.load(raw)
        orientation = exif.get(EXIF_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - broken metadata must not cost the image; treat as upright
        return 1
    return orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1


def _decode(data: bytes, target_size: int | None, method: str, max_pixels: int):
    """(upright RGB PIL image, possibly DCT-scaled; (height, width) of it at full resolution)."""
    if not data:
        raise errors.ImageError(errors.EMPTY_FILE, "the file is empty")
    image_format = sniff_format(data)
    if image_format is None:
        raise errors.ImageError(errors.NOT_AN_IMAGE, f"unrecognised content, starts with {bytes(data[:8])!r}")

    reader = _ShortReadTrackingBytesIO(data)
    try:
        # Only the sniffed plugin (PIL's name is the upper case): never a decoder the file was not meant for.
        image = Image.open(reader, formats=[image_format.upper()])
    except Image.DecompressionBombError as error:
        raise errors.ImageError(errors.TOO_MANY_PIXELS, str(error)) from None
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - decoders raise many types on bad headers
        raise _decode_failure(error, image_format, data, header_hit_end=reader.hit_end) from None

    # No `with image:` - closing a PIL image destroys the pixels it returns;
    # the BytesIO needs no closing.
    width, height = image.size
    if width * height > max_pixels:
        raise errors.ImageError(
            errors.TOO_MANY_PIXELS, f"{width}x{height} = {width * height} pixels > {max_pixels}"
        )
    orientation = exif_orientation(image)
    if target_size is not None and image_format == JPEG:
        # Draft works on the stored (not yet rotated) image; resized_shape
        # is symmetric in height and width, so the stored-orientation
        # target is the rotated target, transposed.
        target_height, target_width = geometry.resized_shape(height, width, target_size, method)
        image.draft("RGB", (target_width, target_height))
    try:
        image.load()
        rgb = _to_rgb(image, image_format)
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - decoders raise many types on bad data
        raise _decode_failure(error, image_format, data, header_hit_end=False) from None

    transpose = TRANSPOSE_FOR_ORIENTATION.get(orientation)
    if transpose is not None:
        rgb = rgb.transpose(transpose)
    if orientation in _SWAPS_AXES:
        height, width = width, height
    return rgb, (height, width)


def _to_rgb(image: Image.Image, image_format: str) -> Image.Image:
    """Any PIL mode -> RGB, compositing transparency onto geometry.ALPHA_BACKGROUND."""
    mode = image.mode
    if mode == "RGB" and "transparency" not in image.info:
        return image
    if mode in _SIXTEEN_BIT_GRAY_MODES:
        # PIL's own I;16 -> L conversion clips at 255; keep the high byte
        # instead, as PIL already does for 16-bit RGB and as TF does.
        high_byte = (np.asarray(image).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
        return Image.fromarray(high_byte).convert("RGB")
    if image_format == BMP:
        return image.convert("RGB")
    if mode in _MODES_WITH_ALPHA or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, geometry.ALPHA_BACKGROUND)
        background.paste(rgba, mask=rgba)
        return background
    return image.convert("RGB")


def _resize_to_target(image: Image.Image, target_shape, size: int, method: str) -> np.ndarray:
    """Bilinear (antialiased when shrinking) resize to target_shape, then crop or pad to size."""
    target_height, target_width = target_shape
    if method == geometry.CROP and target_height * target_width > _WHOLE_RESIZE_MAX_WINDOWS * size * size:
        return _resize_crop_window(image, target_shape, size)
    if image.size != (target_width, target_height):
        image = image.resize((target_width, target_height), Image.Resampling.BILINEAR)
    resized = np.asarray(image)
    if method == geometry.CROP:
        top, left = geometry.crop_offsets(target_height, target_width, size)
        return np.ascontiguousarray(resized[top : top + size, left : left + size])
    top, left = geometry.pad_offsets(target_height, target_width, size)
    canvas = np.full((size, size, 3), geometry.PAD_VALUE, dtype=np.uint8)
    canvas[top : top + target_height, left : left + target_width] = resized
    return canvas


def _resize_crop_window(image: Image.Image, target_shape, size: int) -> np.ndarray:
    """The centered size x size window of `image` resized to `target_shape`, resampling only the source
    region under it (PIL's `box`): the whole resize's pixels at the cost of the window alone."""
    target_height, target_width = target_shape
    top, left = geometry.crop_offsets(target_height, target_width, size)
    scale_x = image.width / target_width
    scale_y = image.height / target_height
    box = (left * scale_x, top * scale_y, (left + size) * scale_x, (top + size) * scale_y)
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=box))


def _decode_failure(error: Exception, image_format: str, data: bytes, *, header_hit_end: bool):
    """The ImageError for a decoder exception: TRUNCATED when the data ended early."""
    message = str(error) or type(error).__name__
    truncated = (
        isinstance(error, EOFError)
        or "truncated" in message.lower()
        # The header parser ran out of bytes (PIL reports it as unidentified).
        or header_hit_end
        # libwebp only says "could not create decoder object"; the RIFF header
        # says how long the file should be.
        or (image_format == WEBP and 8 + int.from_bytes(data[4:8], "little") > len(data))
    )
    reason = errors.TRUNCATED if truncated else errors.DECODE_ERROR
    if isinstance(error, UnidentifiedImageError):
        message = f"not a valid {image_format} header"
    return errors.ImageError(reason, f"{image_format}: {message}")


class _ShortReadTrackingBytesIO(io.RawIOBase):
    """A seekable reader over the file's bytes, in place (a bytearray or bytes is never copied whole,
    as io.BytesIO copies a bytearray), that remembers whether a sized read came back short (end of data).
    """

    hit_end = False

    def __init__(self, data):
        super().__init__()
        self._view = memoryview(data)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._position + size)
        chunk = self._view[self._position : end].tobytes() if end > self._position else b""
        self._position += len(chunk)
        if size is not None and size > 0 and len(chunk) < size:
            self.hit_end = True
        return chunk

    def readinto(self, buffer) -> int:
        chunk = self.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)
