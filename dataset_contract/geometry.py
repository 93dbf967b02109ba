"""Resize geometry shared by the offline job (PIL) and the serving model (TF)."""

CROP = "crop"  # aspect-preserving resize of the short side, then center crop
PAD = "pad"  # aspect-preserving resize of the long side, then letterbox
RESIZE_METHODS = (CROP, PAD)

# Transparent pixels are composited onto white before anything else (a logo on
# a transparent background looks like it does in a browser); letterbox bars
# are black.
ALPHA_BACKGROUND = (255, 255, 255)
PAD_VALUE = 0

# The largest --image-size any command takes. A 2048 px uint8 image is 12.6 MB a record (50 MB in
# float32), and a model at that size needs a batch of a few images per accelerator; past it is a typo
# (100000 for 1000 filled 20 GB of memory before the kernel ended stage 1).
MAX_IMAGE_SIZE = 2048


def image_size_problem(size: int) -> str | None:
    """Why `size` cannot be an --image-size (not positive, or past MAX_IMAGE_SIZE); None if it can."""
    if size < 1:
        return f"expected a positive number of pixels, got {size}"
    if size > MAX_IMAGE_SIZE:
        return (
            f"{size} px is past the limit of {MAX_IMAGE_SIZE} (a {size}x{size} uint8 image is "
            f"{size * size * 3 / 1e6:,.0f} MB a record); classifiers take 224-512"
        )
    return None


def _scaled(length, target, reference):
    """round(length * target / reference), half up, in integer arithmetic."""
    return (2 * length * target + reference) // (2 * reference)


def resized_shape(height, width, size, method, minimum=min, maximum=max):
    """The (height, width) an image is resized to before crop (short side to `size`) or pad (long side); the
    other side keeps the aspect ratio, at least 1 pixel."""
    if method == CROP:
        reference = minimum(height, width)
        return (
            maximum(_scaled(height, size, reference), size),
            maximum(_scaled(width, size, reference), size),
        )
    if method == PAD:
        reference = maximum(height, width)
        return (
            minimum(maximum(_scaled(height, size, reference), 1), size),
            minimum(maximum(_scaled(width, size, reference), 1), size),
        )
    raise ValueError(f"unknown resize method {method!r}; expected one of {RESIZE_METHODS}")


def stored_size(crop_size: int, crop_margin: float) -> int:
    """round(crop_size * (1 + crop_margin)), half up: the square stage 1 stores for a crop margin (training
    cuts random `crop_size` windows from it, evaluation and serving the center one)."""
    if crop_margin < 0:
        raise ValueError(f"crop margin must be >= 0, got {crop_margin}")
    return int(crop_size * (1.0 + crop_margin) + 0.5)


def center_crop_offset(stored, crop_size):
    """Top (= left) offset of the centered `crop_size` window in a `stored` x `stored` square."""
    return (stored - crop_size) // 2


def center_crop_window(height, width, stored, crop_size, minimum=min, maximum=max):
    """(resized height, resized width, top, left) of the evaluation/serving window of a height x width image:
    what stage 1 stores (`stored`), then its center `crop_size` crop, each step rounding its offset down."""
    resized_height, resized_width = resized_shape(height, width, stored, CROP, minimum, maximum)
    top, left = crop_offsets(resized_height, resized_width, stored)
    inner = center_crop_offset(stored, crop_size)
    return resized_height, resized_width, top + inner, left + inner


def crop_offsets(resized_height, resized_width, size):
    """Top-left corner of the centered `size` x `size` window (crop)."""
    return (resized_height - size) // 2, (resized_width - size) // 2


def pad_offsets(resized_height, resized_width, size):
    """Top-left corner where the resized image sits in the canvas (pad)."""
    return (size - resized_height) // 2, (size - resized_width) // 2
