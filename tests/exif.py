"""EXIF orientation for tests, from the EXIF 2.3 table itself: written independently of both decoders
(stage 1's PIL path and serving's TF path), so that tests of either catch a wrong table."""

import numpy as np
from PIL import Image

ORIENTATION_TAG = 0x0112


def stored_for_orientation(upright: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels a camera stores so that EXIF `orientation` displays as `upright` (EXIF 2.3 table)."""
    return {
        1: lambda u: u,
        2: lambda u: u[:, ::-1],
        3: lambda u: u[::-1, ::-1],
        4: lambda u: u[::-1, :],
        5: lambda u: u.transpose(1, 0, 2),
        6: lambda u: np.rot90(u, 1),
        7: lambda u: u[::-1, ::-1].transpose(1, 0, 2),
        8: lambda u: np.rot90(u, -1),
    }[orientation](upright)


def orientation_exif(orientation: int) -> Image.Exif:
    """An EXIF block holding only `orientation`, for PIL's save(..., exif=...)."""
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = orientation
    return exif
