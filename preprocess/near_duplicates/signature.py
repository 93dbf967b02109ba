"""A 64-bit perceptual signature of a decoded image, and the distance between two.

Stage 1 signs every image it decodes, on the resized pixels it already holds,
so that copies which are not byte-identical (re-encoded, resized, cropped by a
few percent, brightened, blurred, captioned) can be grouped at Beam scale
(`grouping.py`): two images whose signatures differ in at most
`DEFAULT_MAX_DISTANCE` bits are taken as near-duplicates.

The signature is a DCT hash ("pHash") of the image's centre: grey, the central
80% (a tenth cut from each side) boxed down to 32x32, its mean subtracted,
weighted by a sine window (sin(pi x) sin(pi y)), its 2-D DCT, and one bit per low-frequency AC
coefficient (1 when above their median; the DC term, brightness only, is left
out). Low frequencies survive re-encoding, rescaling and blur; a uniform
brightness or contrast change shifts or scales the thumbnail alike and leaves
the bits alone. The window is there for crops and captions: both change the
borders, which it weighs least, while a plain DCT hash weighs every pixel alike
and loses a copy with a caption band or a few percent cut from each side
(benchmarks/near_duplicate_quality.py measures each kind).

Determinism: signatures are compared across workers, machines and runs (a
resumed run must find the same groups), so no bit may depend on float
rounding. Everything after the thumbnail is integer arithmetic: PIL's grey
conversion and 8-bit box resize are fixed-point, and the window and the DCT
are tables rounded to integers once at import (`_rounded` refuses a table whose
rounding a last-bit difference in `sin`/`cos` could change), so equal
coefficients compare equal on every machine, and a coefficient equal to the
median is a 0.
"""

import numpy as np
from PIL import Image

SIGNATURE_BITS = 64
# Chosen by benchmarks/near_duplicate_quality.py on half of its source photos
# (the other half reports the figures): see benchmarks/RESULTS.md.
DEFAULT_MAX_DISTANCE = 8

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
_ROWS, _COLS = _zigzag_ac(SIGNATURE_BITS)


def image_signature(pixels: np.ndarray) -> int:
    """uint8 [height, width, 3] -> an int in [0, 2**SIGNATURE_BITS): bit i is the i-th coefficient's."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [height, width, 3] pixels, got {pixels.dtype} {pixels.shape}")
    height, width = pixels.shape[:2]
    box = (
        width // _MARGIN_DIVISOR,
        height // _MARGIN_DIVISOR,
        width - width // _MARGIN_DIVISOR,
        height - height // _MARGIN_DIVISOR,
    )
    grey = Image.fromarray(pixels).convert("L")
    thumbnail = np.asarray(
        grey.resize((_THUMBNAIL_SIZE, _THUMBNAIL_SIZE), Image.Resampling.BOX, box=box), dtype=np.int64
    )
    centred = thumbnail * thumbnail.size - thumbnail.sum()
    first_pass = (_DCT @ (centred * _WINDOW)) >> _SHIFT_BETWEEN_PASSES
    coefficients = (first_pass @ _DCT.T)[_ROWS, _COLS]
    ordered = np.sort(coefficients)
    middle = SIGNATURE_BITS // 2
    # Above the median <=> twice the value above the sum of the two middle ones: integers, no halves.
    bits = 2 * coefficients > ordered[middle - 1] + ordered[middle]
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def hamming(a: int, b: int) -> int:
    """The number of bits in which two signatures differ."""
    return (a ^ b).bit_count()
