"""Why an input image is unusable: the reason codes both stages report, and the pixel limit.

Stage 1 writes these codes to errors.jsonl (preprocess/errors.py imports
them and adds the reasons that are not about an image's bytes); the serving signature returns them
per image in its `error` output. Users and clients match on them, so they
never change meaning.
"""

EMPTY_FILE = "empty_file"  # zero bytes
NOT_AN_IMAGE = "not_an_image"  # content is not any supported image format
TRUNCATED = "truncated"  # a supported format, but the data ends early
DECODE_ERROR = "decode_error"  # a supported format that the decoder rejects
TOO_MANY_PIXELS = "too_many_pixels"  # over the pixel limit (decompression bomb guard)

# Stage 1's --max-pixels default, and what serving assumes for a dataset whose
# manifest predates image.max_pixels.
DEFAULT_MAX_PIXELS = 100_000_000
