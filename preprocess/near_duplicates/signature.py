"""A perceptual signature of a decoded image, and the check of whether two signatures are near-duplicates.

`near(a, b, max_distance)` is the one judgement: a distance, or None. The signature (version 5, one int of
`SIGNATURE_BITS` bits laid out by the constants below) is taken from the source image boxed to `BASE_SIZE`, so
it does not depend on --image-size; every bit is integer arithmetic, the same on every machine. Its parts and
their history: docs/internals.md, "preprocess/near_duplicates/signature.py"; docs/near_duplicates.md.
"""

import functools
import operator
from typing import NamedTuple

import numpy as np
from PIL import Image

# The grey DCT hash: the low bits, which the grouping's candidate bands are cut from.
# Recorded in the manifest (near_duplicates.signature_version): a re-run carries a published image's
# signature over from its ledger only when this is the version that took it (preprocess/reuse/previous.py).
SIGNATURE_VERSION = 6
CANDIDATE_BITS = 64
_GREY_MASK = (1 << CANDIDATE_BITS) - 1
# The colour layout: a 4x4 grid of cells, two opponent chromaticities each, one byte each.
_COLOUR_GRID = 4
_COLOUR_CELLS = _COLOUR_GRID * _COLOUR_GRID
_COLOUR_VALUES = 2 * _COLOUR_CELLS
# The strict check's grey thumbnail.
_CHECK_GRID = 8
_CHECK_VALUES = _CHECK_GRID * _CHECK_GRID
_MIRROR_SHIFT = CANDIDATE_BITS
_COLOUR_SHIFT = 2 * CANDIDATE_BITS
_CHECK_SHIFT = _COLOUR_SHIFT + 8 * _COLOUR_VALUES
_LOW_INFORMATION_BIT = _CHECK_SHIFT + 8 * _CHECK_VALUES
# The content box in the base square (left, top, right, bottom: a byte each), and its proportions in the
# source (width / height, in 1/1024, 16 bits).
_FRAME_SHIFT = _LOW_INFORMATION_BIT + 1
_ASPECT_SHIFT = _FRAME_SHIFT + 32
_ASPECT_UNIT = 1024
# A flat object on a background (signed whole: its outline and place are all it shows).
_FLAT_OBJECT_BIT = _ASPECT_SHIFT + 16
# The detail hash: the next CANDIDATE_BITS AC coefficients (mid frequencies), and the same of the mirror.
_DETAIL_SHIFT = _FLAT_OBJECT_BIT + 1
_MIRRORED_DETAIL_SHIFT = _DETAIL_SHIFT + CANDIDATE_BITS
SIGNATURE_BITS = _MIRRORED_DETAIL_SHIFT + CANDIDATE_BITS
# Chosen by benchmarks/near_duplicate_quality.py on half of its source photos
# (the other half reports the figures): see benchmarks/RESULTS.md.
DEFAULT_MAX_DISTANCE = 8
# Two colour layouts agree when the sum of their mean-free values' absolute differences is at most this.
COLOUR_TOLERANCE = 40
# A layout whose every value is within this of neutral is grey: its colours are not compared.
GREY_CHROMA = 2
# The strict check: the 8x8 thumbnails' correlation (inner 6x6 cells) must be at least this; for a pair whose
# colours differ (a grayscale or colour-cast copy), the second.
MIN_CORRELATION_PER_MILLE = 600
RECOLOURED_MIN_CORRELATION_PER_MILLE = 985
# A match through the mirrored hash is a second chance for any pair to meet: it takes stronger agreement.
MIRRORED_MIN_CORRELATION_PER_MILLE = 900
# Low-information images: a tiny source, or a flat one; then thumbnails must agree within this per cell.
TINY_SOURCE_SIDE = 24
FLAT_SPREAD = 6
LOW_INFORMATION_TOLERANCE = 6
# An object on a uniform background (its borders trimmed): two such images are copies only when their objects'
# proportions agree within this (per mille).
ASPECT_TOLERANCE_PER_MILLE = 80
# An object is flat when the grey spread of its inner pixels in the 32x32 thumbnail is under this (a plain
# colour with a shading), or when it has fewer inner pixels than the second.
OBJECT_FLAT_SPREAD = 8
MIN_OBJECT_PIXELS = 16
# Two flat objects are copies when their whole 8x8 thumbnails differ by at most the first per cell on
# average and the second in any cell.
FLAT_OBJECT_TOLERANCE = 2
FLAT_OBJECT_MAX_DIFFERENCE = 32
# Or a brighter or darker copy of a coloured flat object: the same content box (within the first, in base
# pixels, per side), and whole 8x8 thumbnails that correlate at least the second, the one's cells an affine
# function of the other's with a slope within FLAT_OBJECT_GAIN (numerator, denominator) and its inverse. Not
# for a grey one (every colour value within GREY_CHROMA of neutral): a brighter grey disc is another grey disc,
# lighter (tried for every flat object, dbc18d1: images in false groups grew with the corpus, 0.17% -> 0.28%
# and 0.065% -> 0.36% at 20,000); a coloured object keeps its chromaticity when brightened, which the colour
# check compares.
FLAT_OBJECT_FRAME_TOLERANCE = 1
FLAT_OBJECT_MIN_CORRELATION_PER_MILLE = 985
FLAT_OBJECT_GAIN = (5, 3)
# Two objects on a background (both trimmed on all four sides: product photos on white) are near only when
# their detail hashes are within this many bits too: two pieces of one texture, or two objects of one outline,
# agree in the low frequencies and the 8x8 thumbnail, not in the mid frequencies
# (benchmarks/near_duplicate_bands.py: the false pairs of product-style images fall 37 -> 10 and 17 -> 4 at
# 20,000 images; their altered copies lose 0.7-1.2%).
DETAIL_MAX_DISTANCE = 16
# What `distance` returns when the pair is not near whatever the grey distance: above any grey Hamming distance.
COLOUR_MISMATCH = CANDIDATE_BITS + 1
# --near-duplicate-distance is at most this (version 1's precision at 16 was 0.65 on the benchmark); pairs
# further apart are not checked further.
MAX_COLOUR_CHECKED_DISTANCE = CANDIDATE_BITS // 4
# Chromaticity = difference * scale // (R + G + B + damping): the damping keeps dark cells' noise small.
_CHROMA_DAMPING = 96
_CHROMA_OFFSET = 128  # stored as a byte: value + 128

# The source is boxed to this square first, whatever its size: the signature does not see --image-size.
BASE_SIZE = 128
# Uniform borders: a row or column is trimmed while every pixel is within this of the corners' colour (on
# black; more on white: _background_tolerance), as long as this share of the side is left.
_TRIM_TOLERANCE = 12
# On white, a light shadow (a catalogue photo's, 40 levels under white) is background too: a brightened copy
# whitens it, and its content box would otherwise shrink by the shadow. (36 was tried: JPEG noise on the
# shadow then moved the box of downscaled copies; products' 0.5x copies were found 0.930 of the time, 0.980 at 48.)
_SHADOW_TOLERANCE = 48
MIN_CONTENT = 0.125
_THUMBNAIL_SIZE = 32
# A tenth of each side is left out: borders are what crops cut and captions cover.
_MARGIN_DIVISOR = 10
# AC coefficients in zigzag order (by u + v, then u): the first 64 (the grey hash) lie on the diagonals
# u + v <= 10, the next 64 (the detail hash) on u + v <= 15.
_HIGHEST_DIAGONAL = 15
# Integer scales: see version 2 (the window by 2**8 per axis, the DCT by 2**12; all exact in int64).
_WINDOW_SCALE_BITS = 8
_DCT_SCALE_BITS = 12
_SHIFT_BETWEEN_PASSES = 20


def _rounded(values: np.ndarray, scale_bits: int) -> np.ndarray:
    """round(values * 2**scale_bits) as int64, refusing any value near a rounding boundary."""
    scaled = values * (1 << scale_bits)
    # A value this close to .5 could round the other way where libm's sin or cos
    # differs in its last bit; then the table, and every signature, would differ by machine.
    if np.abs(scaled - np.floor(scaled) - 0.5).min() < 1e-6:
        raise AssertionError("a signature table has an entry at a rounding boundary; change its scale")
    return np.rint(scaled).astype(np.int64)


def _dct_table(size: int, rows: int) -> np.ndarray:
    """The first `rows` rows of the orthonormal DCT-II matrix of `size`, scaled to integers."""
    k = np.arange(rows, dtype=np.float64)[:, None]
    i = np.arange(size, dtype=np.float64)[None, :]
    matrix = np.cos(np.pi * (2 * i + 1) * k / (2 * size)) * np.sqrt(2.0 / size)
    matrix[0] /= np.sqrt(2.0)
    return _rounded(matrix, _DCT_SCALE_BITS)


def _sine_window(size: int) -> np.ndarray:
    """sin(pi x) sin(pi y) over pixel centres, scaled to integers: [size, size]."""
    centres = (np.arange(size, dtype=np.float64) + 0.5) / size
    one_axis = _rounded(np.sin(np.pi * centres), _WINDOW_SCALE_BITS)
    return one_axis[:, None] * one_axis[None, :]


def _zigzag_ac(count: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the first `count` AC coefficients by increasing frequency."""
    diagonals = range(_HIGHEST_DIAGONAL + 1)
    order = sorted((u + v, u, v) for u in diagonals for v in diagonals if u + v)[:count]
    return np.array([u for _, u, _ in order]), np.array([v for _, _, v in order])


_DCT = _dct_table(_THUMBNAIL_SIZE, _HIGHEST_DIAGONAL + 1)
_WINDOW = _sine_window(_THUMBNAIL_SIZE)
_ROWS, _COLS = _zigzag_ac(2 * CANDIDATE_BITS)
# A horizontal mirror flips the sign of every coefficient of odd horizontal frequency (_grey_hashes).
_MIRROR_SIGNS = np.where(_COLS % 2 == 0, 1, -1).reshape(2, CANDIDATE_BITS)
# What makes that exact, held on every machine as the rounding is (_rounded): were either table off by one
# entry, the mirrored hashes would differ from those of the mirrored thumbnail.
if not (
    np.array_equal(_DCT[:, ::-1], _DCT * np.where(np.arange(len(_DCT)) % 2 == 0, 1, -1)[:, None])
    and np.array_equal(_WINDOW, _WINDOW[:, ::-1])
):
    raise AssertionError("the DCT table is not antisymmetric in its odd rows, or the window not symmetric")


def source_signature(image: Image.Image, source_size: tuple[int, int] | None = None) -> int:
    """The decoded source image (upright; any size, e.g. JPEG DCT-scaled) -> an int in [0, 2**SIGNATURE_BITS).

    `source_size` is its (width, height) at full resolution (a DCT-scaled decode is smaller): a tiny source
    is a low-information image.
    """
    if image.mode != "RGB":
        image = image.convert("RGB")
    width, height = source_size or image.size
    # reducing_gap: an integer box reduction first (several times cheaper on a large source), then the box
    # resize; a function of the pixels alone.
    base = image.resize((BASE_SIZE, BASE_SIZE), Image.Resampling.BOX, reducing_gap=1.0)
    pixels = np.asarray(base, dtype=np.int16)
    left, top, right, bottom = frame = _content_box(pixels, _SHADOW_TOLERANCE)
    rgb, thumbnail, check = _region(base, frame)
    if _spread(thumbnail) < FLAT_SPREAD:
        # Trimmed with the shadow's tolerance, a faint object can vanish into its background: it is trimmed to
        # the pixels that differ from the background by more than a JPEG's ringing.
        narrow = _content_box(pixels)
        if narrow != frame:
            left, top, right, bottom = frame = narrow
            rgb, thumbnail, check = _region(base, frame)
    flat_object = _is_object(frame) and _flat_object(rgb, thumbnail, check, _corner_colour(pixels))
    if flat_object:
        # A flat object on a background (a plain disc on white) shows only its outline, and trimmed to it
        # its hash is noise: it is signed whole, where it lies, and only near-equal pixels of the whole image
        # make two such images copies (thumbnails_agree).
        # (The central 96 px: 3x3 pixels per thumbnail pixel, so a mirrored copy's thumbnail is mirrored exactly.)
        rgb, thumbnail, check = _region(base, (4, 4, BASE_SIZE - 4, BASE_SIZE - 4))
    low_information = min(width, height) < TINY_SOURCE_SIDE or _spread(thumbnail) < FLAT_SPREAD
    aspect = min((1 << 16) - 1, (right - left) * width * _ASPECT_UNIT // ((bottom - top) * height))
    grey, detail, mirrored_grey, mirrored_detail = _grey_hashes(thumbnail)
    if flat_object:
        # A flat object's low frequencies are its place and size, which many other objects share (their bands
        # collided 13-16x as often as uniform bits); its outline's detail tells it apart (1.7-2.3x), and a
        # copy of it, near-equal pixels, keeps that detail within the distance.
        grey, mirrored_grey = detail, mirrored_detail
    return (
        grey
        | mirrored_grey << _MIRROR_SHIFT
        | _colour_layout(rgb) << _COLOUR_SHIFT
        | int.from_bytes(check.tobytes(), "little") << _CHECK_SHIFT
        | int(low_information) << _LOW_INFORMATION_BIT
        | int.from_bytes(bytes((left, top, right, bottom)), "little") << _FRAME_SHIFT
        | aspect << _ASPECT_SHIFT
        | int(flat_object) << _FLAT_OBJECT_BIT
        | detail << _DETAIL_SHIFT
        | mirrored_detail << _MIRRORED_DETAIL_SHIFT
    )


def _block_means(values: np.ndarray, grid: int) -> np.ndarray:
    """[n, n, ...] integers -> [grid, grid, ...]: the floor of each block's mean."""
    size = values.shape[0] // grid
    blocks = values.reshape(grid, size, grid, size, *values.shape[2:]).sum(axis=(1, 3))
    return blocks // (size * size)


def image_signature(pixels: np.ndarray, source_size: tuple[int, int] | None = None) -> int:
    """uint8 [height, width, 3] pixels -> `source_signature` of them."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [height, width, 3] pixels, got {pixels.dtype} {pixels.shape}")
    return source_signature(Image.fromarray(np.ascontiguousarray(pixels)), source_size)


def _spread(thumbnail: np.ndarray) -> float:
    """The mean absolute deviation of a grey thumbnail from its mean, in grey levels (integer arithmetic)."""
    scaled = thumbnail * thumbnail.size - thumbnail.sum()
    return float(np.abs(scaled).sum() // (thumbnail.size * thumbnail.size))


def _region(base: Image.Image, frame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the 32x32 RGB thumbnail, its grey, the 8x8 check thumbnail) of the central 80% of `frame`."""
    left, top, right, bottom = frame
    margin_x, margin_y = (right - left) // _MARGIN_DIVISOR, (bottom - top) // _MARGIN_DIVISOR
    box = (left + margin_x, top + margin_y, right - margin_x, bottom - margin_y)
    # One resize; the grey thumbnail, the colour cells and the check thumbnail are integer means of it.
    rgb = np.asarray(
        base.resize((_THUMBNAIL_SIZE, _THUMBNAIL_SIZE), Image.Resampling.BOX, box=box), dtype=np.int64
    )
    # ITU-R 601-2 luma, as PIL's "L", in integers.
    thumbnail = (rgb[:, :, 0] * 299 + rgb[:, :, 1] * 587 + rgb[:, :, 2] * 114 + 500) // 1000
    return rgb, thumbnail, _block_means(thumbnail, _CHECK_GRID).astype(np.uint8)


def _background_tolerance(background: np.ndarray, light: int = _TRIM_TOLERANCE) -> int:
    """How far a pixel may be from the background's colour and still be background: _TRIM_TOLERANCE on black,
    _TRIM_TOLERANCE + `light` on white (a JPEG's ringing around an object on white reaches further than 12
    levels, and dark content beside black bars is close to them)."""
    return _TRIM_TOLERANCE + int(background.max()) * light // 255


def _corner_colour(base: np.ndarray) -> np.ndarray:
    corners = base[[0, 0, -1, -1], [0, -1, 0, -1]].astype(np.int64)
    return corners.min(axis=0) + (corners.max(axis=0) - corners.min(axis=0)) // 2


def _flat_object(rgb: np.ndarray, thumbnail: np.ndarray, check: np.ndarray, background: np.ndarray) -> bool:
    """Whether the object in the thumbnail is flat: the central 4x4 cells of the check thumbnail are (a plain
    disc or box), or the object's pixels (those not of the background's colour, less their edge) have a grey
    spread under OBJECT_FLAT_SPREAD (a plain triangle), or are too few to tell."""
    inner = _CHECK_GRID // 4
    if _spread(check[inner:-inner, inner:-inner].astype(np.int64)) < FLAT_SPREAD:
        return True
    solid = (np.abs(rgb - background) > _background_tolerance(background)).any(axis=2)
    inside = solid.copy()
    inside[1:, :] &= solid[:-1, :]
    inside[:-1, :] &= solid[1:, :]
    inside[:, 1:] &= solid[:, :-1]
    inside[:, :-1] &= solid[:, 1:]
    values = thumbnail[inside]
    if values.size < MIN_OBJECT_PIXELS:
        return True
    return (
        int(np.abs(values * values.size - values.sum()).sum())
        < OBJECT_FLAT_SPREAD * values.size * values.size
    )


def _content_box(base: np.ndarray, light: int = _TRIM_TOLERANCE) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the base square without its uniform borders (of the corners' colour).

    Borders are trimmed only when the four corners agree (letterbox bars, a product on white); at least
    MIN_CONTENT of each side is kept.
    """
    size = base.shape[0]
    corners = base[[0, 0, -1, -1], [0, -1, 0, -1]]
    if int((corners.max(axis=0) - corners.min(axis=0)).max()) > _TRIM_TOLERANCE:
        return 0, 0, size, size
    reference = corners.min(axis=0) + (corners.max(axis=0) - corners.min(axis=0)) // 2
    uniform = (np.abs(base - reference) <= _background_tolerance(reference, light)).all(axis=2)
    if uniform.all():
        # Nothing but background (a blank image, or an object fainter than the tolerance): trimmed to the
        # limit it would be a corner of it, and every such image would show the same blank corner.
        return 0, 0, size, size
    rows, columns = uniform.all(axis=1), uniform.all(axis=0)
    # What may be trimmed in all, across both sides: at least MIN_CONTENT of the side is kept.
    limit = size - int(size * MIN_CONTENT)

    def run(flags, most):
        count = 0
        while count < most and flags[count]:
            count += 1
        return count

    top = run(rows, limit)
    bottom = run(rows[::-1], limit - top)
    left = run(columns, limit)
    right = run(columns[::-1], limit - left)
    return left, top, size - right, size - bottom


def _grey_hashes(thumbnail: np.ndarray) -> tuple[int, int, int, int]:
    """(the grey hash, the detail hash, the same two of the mirrored thumbnail) of the windowed grey thumbnail:
    bit i of the grey hash, whether the i-th low-frequency AC coefficient is above the median of the first
    CANDIDATE_BITS; of the detail hash, the same for the next CANDIDATE_BITS coefficients and their median.

    The mirrored image's coefficients are these with the sign of every odd horizontal frequency flipped,
    exactly: the integer DCT table is antisymmetric in its odd rows (T[v, n - 1 - x] = (-1)**v T[v, x], its
    entries rounded away from .5; checked at import) and the window symmetric, and the first pass's shift acts
    on each value alone. One transform instead of two, the same bits
    (tests/preprocess/near_duplicates/test_near_duplicate_signature.py).
    """
    centred = thumbnail * thumbnail.size - thumbnail.sum()
    first_pass = (_DCT @ (centred * _WINDOW)) >> _SHIFT_BETWEEN_PASSES
    coefficients = (first_pass @ _DCT.T)[_ROWS, _COLS].reshape(2, CANDIDATE_BITS)
    # Rows: the grey and detail coefficients, then the mirrored image's.
    coefficients = np.concatenate([coefficients, coefficients * _MIRROR_SIGNS])
    ordered = np.sort(coefficients, axis=1)
    middle = CANDIDATE_BITS // 2
    # Above the median <=> twice the value above the sum of the two middle ones: integers, no halves.
    bits = 2 * coefficients > (ordered[:, middle - 1] + ordered[:, middle])[:, None]
    packed = np.packbits(bits, axis=1, bitorder="little")
    return tuple(int.from_bytes(row.tobytes(), "little") for row in packed)


def _colour_layout(rgb: np.ndarray) -> int:
    """Byte i < 16: cell i's (R - G) chromaticity; byte 16 + i: its (R + G - 2B) one; cells in row order."""
    cells = _block_means(rgb, _COLOUR_GRID).reshape(-1, 3)
    red, green, blue = cells[:, 0], cells[:, 1], cells[:, 2]
    total = red + green + blue + _CHROMA_DAMPING
    # (R - G) / total lies in [-1, 1] and (R + G - 2B) / total in [-2, 1]: scaled to [-32, 32] and [-32, 16].
    red_green = (red - green) * 32 // total
    yellow_blue = (red + green - 2 * blue) * 16 // total
    values = np.concatenate([red_green, yellow_blue]) + _CHROMA_OFFSET
    return int.from_bytes(values.astype(np.uint8).tobytes(), "little")


def hamming(a: int, b: int) -> int:
    """The number of bits in which two ints differ."""
    return (a ^ b).bit_count()


def grey_hash(value: int) -> int:
    """The candidate bits: the grey hash the grouping's bands are cut from."""
    return value & _GREY_MASK


def mirrored_grey_hash(value: int) -> int:
    """The grey hash of the mirrored image."""
    return (value >> _MIRROR_SHIFT) & _GREY_MASK


def is_low_information(value: int) -> bool:
    return bool(value >> _LOW_INFORMATION_BIT & 1)


def is_flat_object(value: int) -> bool:
    return bool(value >> _FLAT_OBJECT_BIT & 1)


def _is_object(frame) -> bool:
    """Whether a content box is an object on a background: trimmed on all four sides (a letterbox is
    trimmed on two, a photo on none). The same for the mirrored box."""
    left, top, right, bottom = frame
    return left > 0 and top > 0 and right < BASE_SIZE and bottom < BASE_SIZE


class _Fields(NamedTuple):
    """What the pair check reads of one signature, unpacked once (`_fields`). Byte fields stay bytes: a
    bytes object is compact and iterates as small ints, which `map` compares at C speed."""

    is_object: bool
    aspect: int
    colours: bytes  # the colour layout, each value + _CHROMA_OFFSET
    mirrored_colours: bytes
    grey_layout: bool  # every colour value within GREY_CHROMA of neutral
    thumbnail: bytes  # the 8x8 check thumbnail, row by row
    mirrored_thumbnail: bytes
    inner: bytes  # its inner 6x6 cells
    mirrored_inner: bytes
    inner_sum: int  # the same for the mirrored inner cells
    inner_variance: int  # count * sum of squares - sum^2
    low_information: bool
    flat_object: bool
    detail: int  # the detail hash
    mirrored_detail: int
    frame: tuple[int, int, int, int]  # the content box (left, top, right, bottom) in the base square
    mirrored_frame: tuple[int, int, int, int]
    thumbnail_sum: int  # the whole check thumbnail's (the mirrored one's too)
    thumbnail_variance: int  # count * sum of squares - sum^2


def _field_bytes(value: int, shift: int, count: int) -> bytes:
    return ((value >> shift) & ((1 << (8 * count)) - 1)).to_bytes(count, "little")


def _mirrored_rows(values: bytes, width: int) -> bytes:
    return b"".join(values[row : row + width][::-1] for row in range(0, len(values), width))


_MIRRORED_CELLS = tuple(
    row * _COLOUR_GRID + column for row in range(_COLOUR_GRID) for column in reversed(range(_COLOUR_GRID))
)
_MIRRORED_COLOURS = _MIRRORED_CELLS + tuple(cell + _COLOUR_CELLS for cell in _MIRRORED_CELLS)
# The pair check meets each signature in many pairs (every pair of its buckets): it unpacks each once. Above
# the grouping's bucket cap (grouping.DEFAULT_MAX_BUCKET_SIZE, 2,000), so that a bucket's pairs, taken in
# order, find every signature of it still held; a few KiB each.
_FIELDS_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=_FIELDS_CACHE_SIZE)
def _fields(value: int) -> _Fields:
    colours = _field_bytes(value, _COLOUR_SHIFT, _COLOUR_VALUES)
    thumbnail = _field_bytes(value, _CHECK_SHIFT, _CHECK_VALUES)
    mirrored_thumbnail = _mirrored_rows(thumbnail, _CHECK_GRID)
    inner_width = _CHECK_GRID - 2

    def inner_cells(cells: bytes) -> bytes:
        rows = range(_CHECK_GRID, _CHECK_VALUES - _CHECK_GRID, _CHECK_GRID)
        return b"".join(cells[row + 1 : row + 1 + inner_width] for row in rows)

    inner = inner_cells(thumbnail)
    inner_sum = sum(inner)
    left, top, right, bottom = ((value >> _FRAME_SHIFT) & 0xFFFFFFFF).to_bytes(4, "little")
    thumbnail_sum = sum(thumbnail)
    return _Fields(
        is_object=_is_object(((value >> _FRAME_SHIFT) & 0xFFFFFFFF).to_bytes(4, "little")),
        aspect=value >> _ASPECT_SHIFT & 0xFFFF,
        colours=colours,
        mirrored_colours=bytes(colours[index] for index in _MIRRORED_COLOURS),
        grey_layout=max(abs(byte - _CHROMA_OFFSET) for byte in colours) <= GREY_CHROMA,
        thumbnail=thumbnail,
        mirrored_thumbnail=mirrored_thumbnail,
        inner=inner,
        mirrored_inner=inner_cells(mirrored_thumbnail),
        inner_sum=inner_sum,
        inner_variance=len(inner) * sum(map(operator.mul, inner, inner)) - inner_sum * inner_sum,
        low_information=bool(value >> _LOW_INFORMATION_BIT & 1),
        flat_object=bool(value >> _FLAT_OBJECT_BIT & 1),
        detail=(value >> _DETAIL_SHIFT) & _GREY_MASK,
        mirrored_detail=(value >> _MIRRORED_DETAIL_SHIFT) & _GREY_MASK,
        frame=(left, top, right, bottom),
        mirrored_frame=(BASE_SIZE - right, top, BASE_SIZE - left, bottom),
        thumbnail_sum=thumbnail_sum,
        thumbnail_variance=_CHECK_VALUES * sum(map(operator.mul, thumbnail, thumbnail)) - thumbnail_sum**2,
    )


def _largest_difference(first: bytes, second: bytes) -> int:
    return max(map(abs, map(operator.sub, first, second)))


def _total_difference(first, second) -> int:
    return sum(map(abs, map(operator.sub, first, second)))


def objects_agree(a: int, b: int, mirrored: bool = False) -> bool:
    """Whether two objects on a background (both framed: their borders trimmed) have the same proportions,
    within ASPECT_TOLERANCE_PER_MILLE, and detail hashes within DETAIL_MAX_DISTANCE (b's mirrored one when
    `mirrored`); true when either is not such an object. (Mirroring a content box keeps its proportions and
    whether it is an object.)"""
    fields_a, fields_b = _fields(a), _fields(b)
    if fields_a.is_object and fields_b.is_object:
        aspect_a, aspect_b = fields_a.aspect, fields_b.aspect
        if 1000 * abs(aspect_a - aspect_b) > ASPECT_TOLERANCE_PER_MILLE * min(aspect_a, aspect_b):
            return False
        detail_b = fields_b.mirrored_detail if mirrored else fields_b.detail
        if (fields_a.detail ^ detail_b).bit_count() > DETAIL_MAX_DISTANCE:
            return False
    return True


def colour_difference(a: int, b: int, mirrored: bool = False) -> int:
    """The sum of the absolute differences of two colour layouts (b's mirrored when `mirrored`)."""
    fields_b = _fields(b)
    return _total_difference(_fields(a).colours, fields_b.mirrored_colours if mirrored else fields_b.colours)


def _deviations(colours: bytes) -> list[int]:
    """Each value's deviation from its chromaticity's mean, scaled by the cell count to stay an integer (the
    byte offset cancels out)."""
    deviations = []
    for start in (0, _COLOUR_CELLS):
        channel = colours[start : start + _COLOUR_CELLS]
        total = sum(channel)
        deviations.extend(value * _COLOUR_CELLS - total for value in channel)
    return deviations


def cast_difference(a: int, b: int, mirrored: bool = False) -> int:
    """How far two colour layouts are apart once a colour cast is taken out: the sum over both
    chromaticities of the absolute differences of the cells' deviations from their mean; 0 when either
    layout is grey (every value within GREY_CHROMA of neutral: a grayscale copy has no colour to compare)."""
    fields_a, fields_b = _fields(a), _fields(b)
    if fields_a.grey_layout or fields_b.grey_layout:
        return 0
    colours_b = fields_b.mirrored_colours if mirrored else fields_b.colours
    return _total_difference(_deviations(fields_a.colours), _deviations(colours_b)) // _COLOUR_CELLS


def thumbnails_agree(
    a: int, b: int, mirrored: bool = False, min_per_mille: int = MIN_CORRELATION_PER_MILLE
) -> bool:
    """The strict check: the 8x8 thumbnails' inner 6x6 cells correlate (at least `min_per_mille` / 1000; the outer
    ring, which captions and crops change most, is left out), or, when either image has low information,
    all 8x8 cells are equal within LOW_INFORMATION_TOLERANCE; when either is a flat object, the whole
    thumbnails are near-equal, or, both coloured, one is a brighter or darker copy of the other in the same
    box."""
    fields_a, fields_b = _fields(a), _fields(b)
    first = fields_a.thumbnail
    second = fields_b.mirrored_thumbnail if mirrored else fields_b.thumbnail
    if fields_a.low_information or fields_b.low_information:
        return _largest_difference(first, second) <= LOW_INFORMATION_TOLERANCE
    if fields_a.flat_object or fields_b.flat_object:
        # Its outline, colour and place are all a flat object shows: every cell of the whole image is
        # compared, with room for its edge to move by a pixel or so (a resize, a JPEG's ringing).
        if (
            _total_difference(first, second) <= FLAT_OBJECT_TOLERANCE * _CHECK_VALUES
            and _largest_difference(first, second) <= FLAT_OBJECT_MAX_DIFFERENCE
        ):
            return True
        # Or a brighter or darker copy of a coloured one: the same box, the same cells but for a gain.
        if fields_a.grey_layout or fields_b.grey_layout:
            return False
        frame_b = fields_b.mirrored_frame if mirrored else fields_b.frame
        return _largest_difference(
            fields_a.frame, frame_b
        ) <= FLAT_OBJECT_FRAME_TOLERANCE and _brighter_or_darker(fields_a, fields_b, first, second)
    first, second = fields_a.inner, fields_b.mirrored_inner if mirrored else fields_b.inner
    variance_a, variance_b = fields_a.inner_variance, fields_b.inner_variance
    if variance_a == 0 or variance_b == 0:
        return _largest_difference(first, second) <= LOW_INFORMATION_TOLERANCE
    # Integer correlation: cov / sqrt(var_a var_b) >= p / 1000 <=> 1000^2 cov^2 >= p^2 var_a var_b, cov > 0.
    covariance = len(first) * sum(map(operator.mul, first, second)) - fields_a.inner_sum * fields_b.inner_sum
    return covariance > 0 and 1000**2 * covariance * covariance >= min_per_mille**2 * variance_a * variance_b


def _brighter_or_darker(fields_a: _Fields, fields_b: _Fields, first: bytes, second: bytes) -> bool:
    """Whether the whole thumbnail `second` is a brighter or darker copy of `first`: they correlate at least
    FLAT_OBJECT_MIN_CORRELATION_PER_MILLE / 1000, the slope of the one on the other within FLAT_OBJECT_GAIN.
    (Integers: cov / sqrt(var_a var_b) >= p / 1000, and slope = cov / var_a; a mirrored thumbnail has the
    same sum and variance.)"""
    variance_a, variance_b = fields_a.thumbnail_variance, fields_b.thumbnail_variance
    if variance_a == 0 or variance_b == 0:
        return False
    covariance = (
        _CHECK_VALUES * sum(map(operator.mul, first, second))
        - fields_a.thumbnail_sum * fields_b.thumbnail_sum
    )
    most, least = FLAT_OBJECT_GAIN
    minimum = FLAT_OBJECT_MIN_CORRELATION_PER_MILLE
    return (
        covariance > 0
        and 1000**2 * covariance * covariance >= minimum**2 * variance_a * variance_b
        and least * variance_a <= most * covariance
        and least * covariance <= most * variance_a
    )


def grey_hashes(value: int) -> tuple[int, int]:
    """(the grey hash, the mirrored one) of a signature: what `hashes_distance` compares. A caller that meets
    one signature in many pairs (a bucket) takes them once, not per pair."""
    return value & _GREY_MASK, (value >> _MIRROR_SHIFT) & _GREY_MASK


def hashes_distance(hashes_a: tuple[int, int], hashes_b: tuple[int, int]) -> tuple[int, bool]:
    """`grey_distance` of two signatures from their `grey_hashes` (64-bit ints: no wide int is made)."""
    straight = (hashes_a[0] ^ hashes_b[0]).bit_count()
    mirrored = (hashes_a[0] ^ hashes_b[1]).bit_count()
    return (mirrored, True) if mirrored < straight else (straight, False)


def grey_distance(a: int, b: int) -> tuple[int, bool]:
    """(the smaller Hamming distance of a's grey hash to b's or to b's mirrored one, whether mirrored won)."""
    straight = ((a ^ b) & _GREY_MASK).bit_count()
    mirrored = ((a ^ (b >> _MIRROR_SHIFT)) & _GREY_MASK).bit_count()
    return (mirrored, True) if mirrored < straight else (straight, False)


def near(a: int, b: int, max_distance: int) -> int | None:
    """The grey distance of two signatures when they are near-duplicates at `max_distance`, else None.

    Near: the grey hashes (or one and the other's mirror) within `max_distance` bits, the colour layouts
    agree (in the same orientation), and the strict thumbnail check passes (stricter through the mirror).
    Colours that disagree still pass for a grayscale or colour-cast copy: the layouts agree once the cast is
    taken out, and the structure agrees much more closely (half the distance, RECOLOURED_MIN_CORRELATION).
    """
    grey, mirrored = grey_distance(a, b)
    return near_at(a, b, grey, mirrored, max_distance)


def near_at(a: int, b: int, grey: int, mirrored: bool, max_distance: int) -> int | None:
    """`near(a, b, max_distance)` for a caller that has `grey_distance(a, b)` already, as (grey, mirrored):
    the grouping computes it for every pair of a bucket first (its histogram and reach), and the rest of the
    checks here only for the few within reach; it is not computed again."""
    if grey > max_distance or not objects_agree(a, b, mirrored):
        return None
    if colour_difference(a, b, mirrored) <= COLOUR_TOLERANCE:
        minimum = MIRRORED_MIN_CORRELATION_PER_MILLE if mirrored else MIN_CORRELATION_PER_MILLE
        return grey if thumbnails_agree(a, b, mirrored, minimum) else None
    # Other colours: a grayscale or colour-cast copy, or another picture of the same grey structure. Only a
    # copy keeps its structure this exactly.
    if (
        grey <= max_distance // 2
        and cast_difference(a, b, mirrored) <= COLOUR_TOLERANCE
        and thumbnails_agree(a, b, mirrored, RECOLOURED_MIN_CORRELATION_PER_MILLE)
    ):
        return grey
    return None


def distance(a: int, b: int) -> int:
    """The grey distance when the pair passes the colour and thumbnail checks, else COLOUR_MISMATCH.

    Pairs more than MAX_COLOUR_CHECKED_DISTANCE apart keep their grey distance unchecked.
    """
    grey, mirrored = grey_distance(a, b)
    if grey > MAX_COLOUR_CHECKED_DISTANCE:
        return grey
    return grey if near_at(a, b, grey, mirrored, grey) is not None else COLOUR_MISMATCH


def pairwise_distances(signatures) -> np.ndarray:
    """`distance` of every pair of `signatures`: uint8 [n, n] (for benchmarks and audits in memory)."""
    values = list(signatures)
    grey = np.array([value & _GREY_MASK for value in values], dtype=np.uint64)
    mirrored = np.array([(value >> _MIRROR_SHIFT) & _GREY_MASK for value in values], dtype=np.uint64)
    result = np.minimum(
        np.bitwise_count(grey[:, None] ^ grey[None, :]), np.bitwise_count(grey[:, None] ^ mirrored[None, :])
    ).astype(np.uint8)
    for i, j in zip(*np.nonzero(result <= MAX_COLOUR_CHECKED_DISTANCE), strict=True):
        if i != j:
            result[i, j] = distance(values[i], values[j])
    return result
