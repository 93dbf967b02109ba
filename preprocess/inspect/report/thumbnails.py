"""Small embedded images for the report: pixels, or a source file, as a data: URI."""

import base64
import dataclasses
import io

import numpy as np
from PIL import Image

from dataset_contract import geometry, image_errors
from preprocess import errors
from preprocess.decode import image as image_decode
from preprocess.inputs import reading

# Thumbnails are drawn at most this many pixels on their longest side.
THUMBNAIL_SIZE = 128
# Smaller stored images are embedded as they are (PNG, exact pixels) and enlarged by the browser.
_EXACT_UP_TO = 64
_JPEG_QUALITY = 85
# A source larger than this is not read for a thumbnail (a report reads a bounded amount).
MAX_SOURCE_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True)
class Thumbnail:
    """A data: URI to show, or why there is none."""

    data_uri: str | None = None
    problem: str | None = None


@dataclasses.dataclass
class ReadBudget:
    """What the source thumbnails may still read, in bytes, over the whole report."""

    remaining: int
    num_read: int = 0
    bytes_read: int = 0

    def spend(self, num_bytes: int):
        self.remaining -= num_bytes
        self.bytes_read += num_bytes
        self.num_read += 1


def data_uri(image: Image.Image) -> str:
    """An RGB image as a data: URI: PNG when small (exact pixels), JPEG otherwise (small files)."""
    buffer = io.BytesIO()
    exact = max(image.size) <= _EXACT_UP_TO
    image.save(buffer, format="PNG" if exact else "JPEG", **({} if exact else {"quality": _JPEG_QUALITY}))
    return f"data:image/{'png' if exact else 'jpeg'};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def pixels_thumbnail(pixels: np.ndarray) -> Thumbnail:
    """uint8 [height, width, 3] pixels (a stored example, de-normalized) -> a thumbnail, at most
    THUMBNAIL_SIZE on its longest side (aspect kept; a smaller image as it is)."""
    image = Image.fromarray(pixels, "RGB")
    image.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE), Image.Resampling.BILINEAR)
    return Thumbnail(data_uri=data_uri(image))


def source_thumbnail(uri: str, budget: ReadBudget) -> Thumbnail:
    """The source image at `uri`, decoded and shrunk, or the reason it cannot be shown."""
    spent = Thumbnail(problem="not read: the report's read budget for sources (--max-read-mb) is spent")
    if budget.remaining <= 0:
        return spent
    limit = min(MAX_SOURCE_BYTES, budget.remaining)
    try:
        # Stage 1's own reader: gs:// through the thread's one client, reading no further than the limit.
        data = reading.read_file_bytes(uri, max_bytes=limit)
    except errors.ImageError as exc:
        if exc.reason != errors.TOO_LARGE:
            return Thumbnail(problem=f"cannot read the source: {_why_unreadable(exc)}")
        if limit < MAX_SOURCE_BYTES:
            return spent
        return Thumbnail(problem=f"larger than {MAX_SOURCE_BYTES >> 20} MB: not read for a thumbnail")
    except Exception as exc:  # noqa: BLE001 - a source failing after the client's retries costs its thumbnail, not the page
        return Thumbnail(problem=f"cannot read the source: {type(exc).__name__}: {errors.first_line(exc)}")
    budget.spend(len(data))
    try:
        pixels = image_decode.decode_image(
            data,
            target_size=THUMBNAIL_SIZE,
            method=geometry.PAD,
            max_pixels=image_errors.DEFAULT_MAX_PIXELS,
        )
    except errors.ImageError as exc:
        return Thumbnail(problem=f"cannot decode the source: {exc.reason}: {errors.first_line(exc.detail)}")
    return pixels_thumbnail(pixels)


def _why_unreadable(error: errors.ImageError) -> str:
    """A few words for a placeholder: 'not found', 'access denied', or the reader's first line."""
    cause = error.__cause__
    if isinstance(cause, FileNotFoundError) or type(cause).__name__ == "NotFound":
        return "not found"
    if isinstance(cause, PermissionError) or type(cause).__name__ == "Forbidden":
        return "access denied"
    return errors.first_line(error.detail)
