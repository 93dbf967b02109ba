"""Image files built to cost a server memory: what the serving memory benchmark and tests send.

Each is a real, well-formed file (decoders accept it) that is small on the
wire and large, or long, once decoded:

- 1xW images (tens of bytes): with `crop`, the short side is scaled to the
  output size, so a naive resize-then-crop makes a (size x W*size) tensor;
- a 23000x23000 RGBA PNG of a few MB (2.1 GB of pixels);
- a 100-frame GIF (giflib reads every frame before the first is drawn);
- a progressive 10000x10000 JPEG (libjpeg keeps every DCT coefficient of a
  progressive image, 2 bytes per sample, whatever scale it decodes at);
- a CMYK JPEG (another colour conversion path);
- the largest RGB PNG under the default decode budget: the worst an
  accepted image costs.

`ADVERSARIAL_IMAGES` maps a name to (what it is, a function making the
bytes). Making the 10000x10000 JPEG takes a few seconds; the PNGs are built
by hand (a deflate stream of zeros repeated), so they take none.
"""

import io
import struct
import zlib

import numpy as np
from PIL import Image

_ZEROS_CHUNK = 1 << 24


def encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def one_row_png(width: int) -> bytes:
    """A 1 x `width` RGB PNG (83 bytes for 1000, 88 for 3000)."""
    return encode(Image.new("RGB", (width, 1), (40, 120, 200)), "PNG", optimize=True)


def one_row_jpeg(width: int = 65500) -> bytes:
    """A 1 x `width` JPEG; 65500 is the most libjpeg writes or reads (65535 cannot be either)."""
    return encode(Image.new("RGB", (width, 1), (200, 50, 50)), "JPEG", quality=90)


def black_png(width: int, height: int, *, alpha: bool) -> bytes:
    """A black (transparent, with alpha) PNG of any size, built without holding its pixels.

    Every row is a filter byte 0 and zeros, so the zlib stream is that many
    zeros: one compressed chunk of zeros ending in a full flush (byte-aligned,
    no reference before it) repeated, then the rest, then the Adler-32 of
    zeros (a = 1, b = count mod 65521).
    """
    channels = 4 if alpha else 3
    total = height * (1 + width * channels)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = compressor.compress(bytes(_ZEROS_CHUNK)) + compressor.flush(zlib.Z_FULL_FLUSH)
    full_chunks, rest = divmod(total, _ZEROS_CHUNK)
    tail_compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = tail_compressor.compress(bytes(rest)) + tail_compressor.flush(zlib.Z_FINISH)
    adler = ((total % 65521) << 16) | 1
    stream = b"\x78\xda" + chunk * full_chunks + tail + struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", width, height, 8, 6 if alpha else 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", stream)
        + _png_chunk(b"IEND", b"")
    )


def _png_chunk(chunk_type: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + chunk_type
        + payload
        + struct.pack(">I", zlib.crc32(chunk_type + payload))
    )


def animated_gif(frames: int = 100, side: int = 1000) -> bytes:
    """A `frames`-frame GIF, `side` x `side`, each frame one colour (a few hundred KB for 100 x 1000^2)."""
    palette = [value for index in range(256) for value in (index, 255 - index, (7 * index) % 256)]
    images = [Image.new("P", (side, side), index % 256) for index in range(frames)]
    for image in images:
        image.putpalette(palette)
    return encode(images[0], "GIF", save_all=True, append_images=images[1:], duration=40, optimize=False)


def gradient(height: int, width: int) -> np.ndarray:
    """A smooth RGB test pattern, made a row band at a time (no int64 copies of a 10k x 10k image)."""
    rows = np.arange(height, dtype=np.uint32)[:, None]
    columns = np.arange(width, dtype=np.uint32)[None, :]
    image = np.empty((height, width, 3), np.uint8)
    image[..., 0] = (columns // 40) % 256
    image[..., 1] = (rows // 40) % 256
    image[..., 2] = ((rows + columns) // 80) % 256
    return image


def ordinary_jpeg() -> bytes:
    """An ordinary 640x480 photo-like JPEG (the control next to the adversarial files)."""
    return encode(Image.fromarray(gradient(480, 640)), "JPEG", quality=90)


def progressive_jpeg(side: int = 10_000) -> bytes:
    return encode(Image.fromarray(gradient(side, side)), "JPEG", quality=75, progressive=True)


def cmyk_jpeg(height: int = 3000, width: int = 4000) -> bytes:
    return encode(Image.fromarray(gradient(height, width)).convert("CMYK"), "JPEG", quality=90)


ADVERSARIAL_IMAGES = {
    "png_1x1000": ("1x1000 RGB PNG", lambda: one_row_png(1000)),
    "png_1x3000": ("1x3000 RGB PNG", lambda: one_row_png(3000)),
    "jpeg_1x65500": ("1x65500 JPEG (libjpeg's largest side)", one_row_jpeg),
    "png_23000_rgba": ("23000x23000 RGBA PNG", lambda: black_png(23000, 23000, alpha=True)),
    "gif_100_frames": ("100-frame 1000x1000 GIF", animated_gif),
    "jpeg_progressive_10000": ("progressive 10000x10000 JPEG", progressive_jpeg),
    "jpeg_cmyk": ("4000x3000 CMYK JPEG", cmyk_jpeg),
    # 8192^2 x 3 bytes = 192 MiB: the largest square RGB PNG under the default 200 MiB decode budget.
    "png_8192_at_budget": (
        "8192x8192 RGB PNG (just under the decode budget)",
        lambda: black_png(8192, 8192, alpha=False),
    ),
}
