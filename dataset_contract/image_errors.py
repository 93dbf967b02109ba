"""Why an input image is unusable: the reason codes both stages report (stage 1's error log, the serving
signature's `error`), and the size limits. Users match on them: they never change meaning."""

EMPTY_FILE = "empty_file"  # zero bytes
NOT_AN_IMAGE = "not_an_image"  # content is not any supported image format
TRUNCATED = "truncated"  # a supported format, but the data ends early
DECODE_ERROR = "decode_error"  # a supported format that the decoder rejects
TOO_MANY_PIXELS = "too_many_pixels"  # over the pixel limit (decompression bomb guard)
TOO_LARGE = "too_large"  # more bytes than the file size limit; never read

# Stage 1's --max-pixels default, and what serving assumes for a dataset whose
# manifest predates image.max_pixels.
DEFAULT_MAX_PIXELS = 100_000_000

# Stage 1's --max-file-mb default (MB = 10^6 bytes): a file larger than this is refused
# (too_large) without being read, so that one stray multi-GB file cannot take a worker's
# memory. Serving refuses larger requests the same way; for a dataset whose manifest predates
# image.max_file_bytes, it assumes this.
DEFAULT_MAX_FILE_MB = 256
DEFAULT_MAX_FILE_BYTES = DEFAULT_MAX_FILE_MB * 10**6
