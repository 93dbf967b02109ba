"""A perceptual signature of a decoded image (grey structure and colour layout), and the distance between two.

Stage 1 signs every image it decodes, on the resized pixels it already holds,
so that copies which are not byte-identical (re-encoded, resized, cropped by a
few pixels, brightened, blurred, captioned) can be grouped at Beam scale
(`grouping.py`): two images at `distance` at most `DEFAULT_MAX_DISTANCE` are
taken as near-duplicates.

The signature (version 2) is one int of `SIGNATURE_BITS` bits holding two
signatures, read together by `distance`:

- bits 0-63 (`CANDIDATE_BITS`): a DCT hash ("pHash") of the image's grey
  centre, as in version 1: the central 80% (a tenth cut from each side)
  boxed down to 32x32, its mean subtracted, weighted by a sine window
  (sin(pi x) sin(pi y)), its 2-D DCT, and one bit per low-frequency AC
  coefficient (1 when above their median; the DC term, brightness only, is
  left out). Low frequencies survive re-encoding, rescaling and blur; a
  uniform brightness or contrast change leaves the bits alone; the window
  weighs the borders, which crops cut and captions cover, least. The
  grouping's LSH bands are cut from these bits only.
- bits 64-319: a colour layout: the same central region boxed down to 4x4
  cells, and per cell two opponent chromaticities, (R - G) and
  (R + G - 2B) over (R + G + B + 96), scaled and stored in one byte each
  (32 bytes). A chromaticity is a ratio, so a brightness change leaves it
  nearly alone (bar clipping); the damping term (96) keeps a dark cell's
  noise small; a grey image's are all near 0, so two near-grey images
  agree on colour and are judged by their grey hash alone (no chroma noise
  to lose them by); JPEG's chroma subsampling and loss average out over a
  cell of 50x50 pixels.

`distance(a, b)` is the Hamming distance of the grey hashes when the colour
layouts agree (the sum of the 32 bytes' absolute differences is at most
`COLOUR_TOLERANCE`), and `COLOUR_MISMATCH` (above any grey distance) when they
do not. Why both: a grey hash alone puts distinct images with the same grey
structure together (on the sample shape corpus, a green ellipse on pink and
a yellow circle on dark green are 2-4 bits apart); a colour layout alone
cannot tell two textures of the same colours apart. Measured in
benchmarks/near_duplicate_quality.py (RESULTS.md, "Issue 24").

Determinism: signatures are compared across workers, machines and runs (a
resumed run must find the same groups), so no bit may depend on float
rounding. Everything after the thumbnails is integer arithmetic: PIL's grey
conversion and 8-bit box resizes are fixed-point, the chromaticities are
integer floor divisions, and the window and the DCT are tables rounded to
integers once at import (`_rounded` refuses a table whose rounding a
last-bit difference in `sin`/`cos` could change), so equal coefficients
compare equal on every machine, and a coefficient equal to the median is a 0.
"""

import numpy as np
from PIL import Image

# The grey DCT hash: the low bits, which the grouping's candidate bands are cut from.
CANDIDATE_BITS = 64
# The colour layout: a 4x4 grid of cells, two opponent chromaticities each, one byte each.
_COLOUR_GRID = 4
_COLOUR_VALUES = 2 * _COLOUR_GRID * _COLOUR_GRID
SIGNATURE_BITS = CANDIDATE_BITS + 8 * _COLOUR_VALUES
# Chosen by benchmarks/near_duplicate_quality.py on half of its source photos
# (the other half reports the figures): see benchmarks/RESULTS.md.
DEFAULT_MAX_DISTANCE = 8
# Two colour layouts agree when the sum of their bytes' absolute differences is at most this. Measured (RESULTS.md):
# altered copies are at 0-57 (99% of brightness copies at most 39, of every other kind at most 24), distinct
# shape images of the sample corpus whose grey hashes are within 10 bits at 41 or more.
COLOUR_TOLERANCE = 40
# What `distance` returns when the colour layouts disagree: above any grey Hamming distance.
COLOUR_MISMATCH = CANDIDATE_BITS + 1
# Pairs whose grey hashes differ in more bits than this are not near at any sensible threshold (version 1's
# precision at 16 was 0.65 on the benchmark): their colour is not compared and their grey distance is
# returned. That keeps `distance` cheap (and --near-duplicate-distance is at most this) for the grouping's candidate pairs, most of which are 20-30 bits apart.
MAX_COLOUR_CHECKED_DISTANCE = CANDIDATE_BITS // 4
# Chromaticity = difference * scale // (R + G + B + damping): the damping keeps dark cells' noise small.
_CHROMA_DAMPING = 96
_CHROMA_OFFSET = 128  # stored as a byte: value + 128

_THUMBNAIL_SIZE = 32
# A tenth of each side is left out: borders are what crops cut and captions cover.
_MARGIN_DIVISOR = 10
# AC coefficients in zigzag order (by u + v, then u): the first 64 lie on the
# diagonals u + v <= 10.
_HIGHEST_DIAGONAL = 10
# Integer scales. The thumbnail's mean is taken out exactly by scaling it by its
# pixel count (1024, 2**10); the window is scaled by 2**8 per axis and the DCT
# by 2**12. Bounds: |thumbnail| < 2**18, windowed < 2**34, one DCT pass (32
# terms) < 2**51, shifted right by 20 bits < 2**31, the second pass < 2**48:
# all exact in int64.
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
_ROWS, _COLS = _zigzag_ac(CANDIDATE_BITS)


def image_signature(pixels: np.ndarray) -> int:
    """uint8 [height, width, 3] -> an int in [0, 2**SIGNATURE_BITS): the grey hash, then the colour layout."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [height, width, 3] pixels, got {pixels.dtype} {pixels.shape}")
    height, width = pixels.shape[:2]
    box = (
        width // _MARGIN_DIVISOR,
        height // _MARGIN_DIVISOR,
        width - width // _MARGIN_DIVISOR,
        height - height // _MARGIN_DIVISOR,
    )
    image = Image.fromarray(pixels)
    return _grey_hash(image, box) | (_colour_layout(image, box) << CANDIDATE_BITS)


def _grey_hash(image: Image.Image, box) -> int:
    """Bit i: whether the i-th low-frequency AC coefficient of the windowed grey thumbnail is above their median."""
    thumbnail = np.asarray(
        image.convert("L").resize((_THUMBNAIL_SIZE, _THUMBNAIL_SIZE), Image.Resampling.BOX, box=box),
        dtype=np.int64,
    )
    centred = thumbnail * thumbnail.size - thumbnail.sum()
    first_pass = (_DCT @ (centred * _WINDOW)) >> _SHIFT_BETWEEN_PASSES
    coefficients = (first_pass @ _DCT.T)[_ROWS, _COLS]
    ordered = np.sort(coefficients)
    middle = CANDIDATE_BITS // 2
    # Above the median <=> twice the value above the sum of the two middle ones: integers, no halves.
    bits = 2 * coefficients > ordered[middle - 1] + ordered[middle]
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def _colour_layout(image: Image.Image, box) -> int:
    """Byte i < 16: cell i's (R - G) chromaticity; byte 16 + i: its (R + G - 2B) one; cells in row order."""
    cells = np.asarray(
        image.resize((_COLOUR_GRID, _COLOUR_GRID), Image.Resampling.BOX, box=box), dtype=np.int64
    ).reshape(-1, 3)
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


_CANDIDATE_MASK = (1 << CANDIDATE_BITS) - 1


def colour_difference(a: int, b: int) -> int:
    """The sum of the absolute differences of two signatures' colour layouts (0 when they are equal)."""
    colours_a = (a >> CANDIDATE_BITS).to_bytes(_COLOUR_VALUES, "little")
    colours_b = (b >> CANDIDATE_BITS).to_bytes(_COLOUR_VALUES, "little")
    return sum(abs(x - y) for x, y in zip(colours_a, colours_b, strict=True))


def distance(a: int, b: int) -> int:
    """The grey hashes' Hamming distance, or COLOUR_MISMATCH when the colour layouts disagree.

    Pairs more than a quarter of the grey bits apart keep their grey distance without
    their colour being compared (they are not near at any sensible threshold).
    """
    grey = ((a ^ b) & _CANDIDATE_MASK).bit_count()
    if grey > MAX_COLOUR_CHECKED_DISTANCE or colour_difference(a, b) <= COLOUR_TOLERANCE:
        return grey
    return COLOUR_MISMATCH


def pairwise_distances(signatures) -> np.ndarray:
    """`distance` of every pair of `signatures`, vectorized: uint8 [n, n] (for benchmarks and audits in memory)."""
    grey = np.array([value & _CANDIDATE_MASK for value in signatures], dtype=np.uint64)
    colours = (
        np.frombuffer(
            b"".join((value >> CANDIDATE_BITS).to_bytes(_COLOUR_VALUES, "little") for value in signatures),
            dtype=np.uint8,
        )
        .reshape(len(signatures), _COLOUR_VALUES)
        .astype(np.int16)
    )
    result = np.bitwise_count(grey[:, None] ^ grey[None, :]).astype(np.uint8)
    difference = np.zeros(result.shape, dtype=np.int32)
    for lane in range(_COLOUR_VALUES):
        difference += np.abs(colours[:, None, lane] - colours[None, :, lane])
    result[(difference > COLOUR_TOLERANCE) & (result <= MAX_COLOUR_CHECKED_DISTANCE)] = COLOUR_MISMATCH
    return result
