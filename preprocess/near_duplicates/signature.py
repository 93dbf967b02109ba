"""A 64-bit perceptual signature of a decoded image, and the distance between two.

Stage 1 signs every image it decodes, on the resized pixels it already holds,
so that copies which are not byte-identical (re-encoded, resized, cropped by a
few pixels, brightened, blurred, captioned) can be grouped at Beam scale
(`grouping.py`): two images whose signatures differ in at most
`DEFAULT_MAX_DISTANCE` bits are taken as near-duplicates.

The signature is a DCT hash ("pHash"): grey, a 32x32 thumbnail, its 2-D DCT,
and one bit per low-frequency coefficient (1 when above their median). The DC
term is left out: it only measures brightness, so its bit would always be 1,
and a brightened copy must not move the median. Low frequencies survive
re-encoding, rescaling, blur and small crops; a uniform brightness or contrast
change shifts or scales every AC coefficient alike and leaves the bits alone.

Determinism: signatures are compared across workers, machines and runs (a
resumed run must find the same groups), so no bit may depend on float
rounding. Everything after the thumbnail is integer arithmetic: PIL's grey
conversion and 8-bit box resize are fixed-point, and the DCT is a product with
a matrix rounded to integers once at import (`_dct_table` refuses a table
whose rounding a last-bit difference in `cos` could change), so equal
coefficients compare equal on every machine, and a coefficient equal to the
median is a 0.
"""

import numpy as np
from PIL import Image

SIGNATURE_BITS = 64
# Chosen by benchmarks/near_duplicate_quality.py on half of its source photos
# (the other half reports the figures): see benchmarks/RESULTS.md.
DEFAULT_MAX_DISTANCE = 10

_THUMBNAIL_SIZE = 32
# The DCT matrix scaled by 2**12 and rounded: enough precision to order the
# coefficients of a 32x32 grey thumbnail, and the products stay far below 2**63
# (255 * 32 * 4096 * 32 * 4096 < 2**53).
_DCT_SCALE_BITS = 12
# AC coefficients in zigzag order (by u + v, then u): the first 64 lie on the
# diagonals u + v <= 10.
_HIGHEST_DIAGONAL = 10


def _zigzag_ac(count: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the first `count` AC coefficients by increasing frequency."""
    order = sorted(
        ((u + v, u, v) for u in range(_HIGHEST_DIAGONAL + 1) for v in range(_HIGHEST_DIAGONAL + 1) if u + v),
    )[:count]
    return np.array([u for _, u, _ in order]), np.array([v for _, _, v in order])


def _dct_table(size: int, rows: int) -> np.ndarray:
    """The first `rows` rows of the orthonormal DCT-II matrix of `size`, times 2**_DCT_SCALE_BITS, as int64."""
    k = np.arange(rows, dtype=np.float64)[:, None]
    i = np.arange(size, dtype=np.float64)[None, :]
    scaled = np.cos(np.pi * (2 * i + 1) * k / (2 * size)) * np.sqrt(2.0 / size) * (1 << _DCT_SCALE_BITS)
    scaled[0] /= np.sqrt(2.0)
    # A value this close to a rounding boundary could round the other way where
    # libm's cos differs in its last bit; then the table would differ by machine.
    fraction = np.abs(scaled - np.floor(scaled) - 0.5)
    if fraction.min() < 1e-6:
        raise AssertionError("the DCT table has an entry at a rounding boundary; change _DCT_SCALE_BITS")
    return np.rint(scaled).astype(np.int64)


_DCT = _dct_table(_THUMBNAIL_SIZE, _HIGHEST_DIAGONAL + 1)
_ROWS, _COLS = _zigzag_ac(SIGNATURE_BITS)


def image_signature(pixels: np.ndarray) -> int:
    """uint8 [height, width, 3] -> an int in [0, 2**SIGNATURE_BITS): bit i is the i-th coefficient's."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [height, width, 3] pixels, got {pixels.dtype} {pixels.shape}")
    grey = Image.fromarray(pixels).convert("L")
    thumbnail = np.asarray(
        grey.resize((_THUMBNAIL_SIZE, _THUMBNAIL_SIZE), Image.Resampling.BOX), dtype=np.int64
    )
    coefficients = (_DCT @ thumbnail @ _DCT.T)[_ROWS, _COLS]
    ordered = np.sort(coefficients)
    middle = SIGNATURE_BITS // 2
    # Above the median <=> twice the value above the sum of the two middle ones: integers, no halves.
    bits = 2 * coefficients > ordered[middle - 1] + ordered[middle]
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def hamming(a: int, b: int) -> int:
    """The number of bits in which two signatures differ."""
    return (a ^ b).bit_count()
