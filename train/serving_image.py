"""Stage 1's per-image decode and resize, rebuilt from TF ops for the serving signature.

The exported SavedModel takes encoded image bytes, so it must turn them into
the tensor stage 1 would have written, in a fresh process with no Python:
pure graph ops, no `py_function`, no PIL. Each step mirrors
`preprocess/image_decode.py`:

1. Format by content (magic bytes): JPEG, PNG, GIF (first frame), BMP, WebP;
   anything else is an InvalidArgumentError.
2. JPEG is decoded at 1/2, 1/4 or 1/8 scale by the same rule as PIL's
   `draft`, with the accurate integer IDCT PIL uses.
3. EXIF orientation is parsed in-graph (JPEG APP1 "Exif", PNG eXIf before the
   image data, WebP EXIF chunk), and the image is transposed/flipped upright.
   Missing or garbage metadata means upright, never an error.
4. Gray becomes RGB; alpha (RGBA, gray+alpha, palette or colour-key
   transparency, GIF transparency) is composited onto white with PIL's
   integer blend; 16-bit PNG keeps the high byte; BMP alpha is ignored.
5. Resize with the shared integer geometry (`dataset_contract.geometry`,
   computed from the full-resolution size), bilinear with antialiasing,
   then center crop or letterbox with PAD_VALUE.

Tolerance against `preprocess.image_decode.load_image` on the same bytes:
the decoded pixels are identical (same libjpeg-turbo accurate IDCT, at every
DCT scale, baseline and progressive; same libwebp, libpng, GIF palettes),
except CMYK JPEG, where TF's CMYK->RGB rounds differently (at most 1 level).
The resize adds at most 1 level per pixel (mean under 0.2) in every case
measured, including noise and upscaling, because PIL rounds to 8 bits between
its horizontal and vertical passes and TF does not; the tests in
tests/train/test_serving_image.py hold mean <= 0.5 and max <= 2.

Known gaps: a GIF whose first frame does not cover the canvas (TF fills the
rest black, PIL with the background), 1/4/16-bit or RLE BMPs (TF cannot
decode them: InvalidArgumentError), orientation given only in XMP (ignored by
both stages), an animated WebP with more than _MAX_WEBP_CHUNKS chunks before
its EXIF chunk, and no pixel-count limit (stage 1's max_pixels): a
decompression bomb costs the server memory.
"""

import tensorflow as tf

from dataset_contract import geometry

# Index of each format in the tf.switch_case below.
_JPEG, _PNG, _GIF, _BMP, _WEBP, _UNKNOWN = range(6)

# Bounds on the in-graph metadata walks: far above what real files use, so
# they only cut short garbage (which then reads as "upright").
_MAX_JPEG_SEGMENTS = 256
_MAX_PNG_CHUNKS = 1024
_MAX_WEBP_CHUNKS = 256
_MAX_GIF_BLOCKS = 4096
_MAX_IFD_ENTRIES = 64

_EXIF_ORIENTATION_TAG = 0x0112
_JPEG_SCALE_RATIOS = (1, 2, 4, 8)

# Every byte value as a one-byte string, so a computed byte can be spliced
# into a string tensor with tf.strings.substr.
_ALL_BYTES = bytes(range(256))


def decode_and_resize(image_bytes: tf.Tensor, size: int, method: str) -> tf.Tensor:
    """Encoded image bytes (a scalar string) -> uint8 [size, size, 3], as stage 1 makes it."""
    if method not in geometry.RESIZE_METHODS:
        raise ValueError(f"unknown resize method {method!r}; expected one of {geometry.RESIZE_METHODS}")
    data = tf.convert_to_tensor(image_bytes, dtype=tf.string)
    branches = {
        _JPEG: lambda: _decode_jpeg(data, size, method),
        _PNG: lambda: _decode_png(data),
        _GIF: lambda: _decode_gif(data),
        _BMP: lambda: _decode_bmp(data),
        _WEBP: lambda: _decode_webp(data),
        _UNKNOWN: lambda: _refuse_unknown_format(data),
    }
    rgb, height, width, tiff_offset = tf.switch_case(
        _format_index(data), [branches[index] for index in sorted(branches)]
    )
    orientation = _exif_orientation(data, tiff_offset)
    upright = _apply_orientation(rgb, orientation)
    swaps_axes = orientation >= 5
    upright_height = tf.where(swaps_axes, width, height)
    upright_width = tf.where(swaps_axes, height, width)
    return _resize_crop_or_pad(upright, upright_height, upright_width, size, method)


def decode_and_resize_batch(bytes_batch: tf.Tensor, size: int, method: str) -> tf.Tensor:
    """A [batch] string tensor of encoded images -> uint8 [batch, size, size, 3]."""
    return tf.map_fn(
        lambda image_bytes: decode_and_resize(image_bytes, size, method),
        bytes_batch,
        fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8),
    )


# --- format ---------------------------------------------------------------------------------------


def _format_index(data):
    head = _read_bytes(data, 0, 12)
    is_format = tf.stack(
        [
            _matches(head[:3], b"\xff\xd8\xff"),
            _matches(head[:8], b"\x89PNG\r\n\x1a\n"),
            _matches(head[:6], b"GIF87a") | _matches(head[:6], b"GIF89a"),
            _matches(head[:2], b"BM"),
            _matches(head[:4], b"RIFF") & _matches(head[8:12], b"WEBP"),
            tf.constant(True),
        ]
    )
    # argmax returns the first True: the format, or _UNKNOWN.
    return tf.cast(tf.argmax(tf.cast(is_format, tf.int32)), tf.int32)


def _refuse_unknown_format(data):
    check = tf.debugging.Assert(
        tf.constant(False),
        ["not a supported image (JPEG, PNG, GIF, BMP, WebP); starts with", tf.strings.substr(data, 0, 16)],
    )
    with tf.control_dependencies([check]):
        return _with_full_size(tf.zeros([0, 0, 3], tf.uint8), tiff_offset=tf.constant(-1, tf.int64))


# --- per-format decoding: each returns (rgb uint8 [h, w, 3], full height, full width, TIFF offset) ---


def _decode_jpeg(data, size, method):
    shape = tf.image.extract_jpeg_shape(data, output_type=tf.int64)
    height, width = shape[0], shape[1]
    # The same choice PIL's JpegImageFile.draft makes for the same request:
    # the largest of 1/8, 1/4, 1/2 that keeps both sides >= the resize target.
    target_height, target_width = geometry.resized_shape(
        height, width, size, method, minimum=tf.minimum, maximum=tf.maximum
    )
    scale = tf.minimum(width // target_width, height // target_height)
    ratio_index = tf.reduce_sum(tf.cast(scale >= tf.constant([2, 4, 8], tf.int64), tf.int32))
    rgb = tf.switch_case(
        ratio_index,
        [
            (
                lambda ratio=ratio: tf.io.decode_jpeg(
                    data, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE"
                )
            )
            for ratio in _JPEG_SCALE_RATIOS
        ],
    )
    return rgb, height, width, _jpeg_tiff_offset(data)


def _decode_png(data):
    tiff_offset, has_transparency_chunk = _png_metadata(data)
    # channels=0 keeps the native channels (alpha only where the file has
    # it). A tRNS chunk (palette, gray or RGB colour key) only becomes alpha
    # when asking for 4 channels; TF's 4-channel output of a PNG without tRNS
    # has a wrong filler alpha, hence the branch. uint8 output of a 16-bit
    # PNG keeps the high byte, like PIL.
    image = tf.cond(
        has_transparency_chunk,
        lambda: tf.io.decode_png(data, channels=4),
        lambda: tf.io.decode_png(data, channels=0),
    )
    return _with_full_size(_composite_onto_background(image), tiff_offset)


def _decode_gif(data):
    rgb = tf.io.decode_image(_gif_with_opaque_background_colour(data), channels=3, expand_animations=False)
    return _with_full_size(rgb, tiff_offset=tf.constant(-1, tf.int64))


def _decode_bmp(data):
    image = tf.io.decode_bmp(data, channels=0)
    rgb = tf.cond(
        tf.shape(image)[2] == 1,
        lambda: _apply_bmp_palette(data, image),
        # 32-bit: the fourth byte is ignored, as stage 1 does (usually undefined).
        lambda: image[:, :, :3],
    )
    return _with_full_size(rgb, tiff_offset=tf.constant(-1, tf.int64))


def _decode_webp(data):
    image = tf.io.decode_image(data, channels=0, expand_animations=False)
    return _with_full_size(_composite_onto_background(image), _webp_tiff_offset(data))


def _with_full_size(rgb, tiff_offset):
    rgb = tf.ensure_shape(rgb, [None, None, 3])
    shape = tf.shape(rgb, out_type=tf.int64)
    return rgb, shape[0], shape[1], tiff_offset


def _apply_bmp_palette(data, indices):
    """TF decodes an 8-bit BMP to its palette indices; look the colours up."""
    info_header_length = _little_endian(_read_bytes(data, 14, 4))
    palette_bgrx = tf.reshape(_read_bytes(data, 14 + info_header_length, 256 * 4), [256, 4])
    # A gather, not a [:, 2::-1] slice: grappler's layout pass logs a spurious
    # error for negative-stride slices in a saved graph.
    palette_rgb = tf.cast(tf.gather(palette_bgrx, [2, 1, 0], axis=1), tf.uint8)
    return tf.gather(palette_rgb, tf.cast(indices[:, :, 0], tf.int32))


def _composite_onto_background(image):
    """[h, w, 1-4] uint8 -> [h, w, 3]: gray to RGB, alpha blended onto ALPHA_BACKGROUND."""
    image = tf.ensure_shape(image, [None, None, None])
    channels = tf.shape(image)[2]
    color = tf.gather(image, tf.where(channels < 3, [0, 0, 0], [0, 1, 2]), axis=2)
    has_alpha = channels % 2 == 0
    return tf.cond(has_alpha, lambda: _blend_onto_background(color, image[:, :, -1:]), lambda: color)


def _blend_onto_background(color, alpha):
    # PIL's paste-with-mask arithmetic, exactly: DIV255(bg * (255 - a) + fg * a).
    alpha = tf.cast(alpha, tf.int32)
    background = tf.constant(geometry.ALPHA_BACKGROUND, tf.int32)
    blended = background * (255 - alpha) + tf.cast(color, tf.int32) * alpha + 128
    shift = tf.bitwise.right_shift
    return tf.cast(shift(shift(blended, 8) + blended, 8), tf.uint8)


def _gif_with_opaque_background_colour(data):
    """GIF bytes whose first frame draws its transparent colour as opaque ALPHA_BACKGROUND.

    TF's GIF decoder paints transparent pixels of the first frame black and
    reports no alpha; stage 1 composites them onto white. Rewriting the
    colour-table entry of the transparent index and clearing the
    transparency flag makes TF paint exactly that.
    """
    screen = _read_bytes(data, 10, 1)[0]
    global_table_length = tf.where(screen >= 0x80, _colour_table_length(screen), tf.constant(0, tf.int64))

    def keep_going(step, position, in_sub_blocks, control_extension, image_descriptor):
        return (step < _MAX_GIF_BLOCKS) & (position >= 0) & (image_descriptor < 0)

    def next_block(step, position, in_sub_blocks, control_extension, image_descriptor):
        head = _read_bytes(data, position, 3)
        # Inside an extension: a run of length-prefixed sub-blocks ending at 0.
        after_sub_block = tf.where(head[0] == 0, position + 1, position + 1 + head[0])
        is_extension = head[0] == 0x21
        is_control_extension = is_extension & (head[1] == 0xF9) & (head[2] == 4)
        is_image = head[0] == 0x2C
        next_position = tf.where(
            in_sub_blocks, after_sub_block, tf.where(is_extension, position + 2, tf.constant(-1, tf.int64))
        )
        return (
            step + 1,
            next_position,
            tf.where(in_sub_blocks, head[0] != 0, is_extension),
            tf.where(~in_sub_blocks & is_control_extension, position, control_extension),
            tf.where(~in_sub_blocks & is_image, position, image_descriptor),
        )

    none = tf.constant(-1, tf.int64)
    _, _, _, control_extension, image_descriptor = tf.while_loop(
        keep_going,
        next_block,
        (tf.constant(0), 13 + global_table_length, tf.constant(False), none, none),
    )
    control = _read_bytes(data, control_extension, 7)  # 21 F9 04 <flags> <delay:2> <index>
    has_transparency = (control_extension >= 0) & (control[3] % 2 == 1)
    transparent_index = control[6]
    local = _read_bytes(data, image_descriptor + 9, 1)[0]
    has_local_table = local >= 0x80
    global_table_offset = tf.where(global_table_length > 0, tf.constant(13, tf.int64), none)
    table_offset = tf.where(has_local_table, image_descriptor + 10, global_table_offset)
    table_length = tf.where(has_local_table, _colour_table_length(local), global_table_length)
    patchable = (
        has_transparency
        & (image_descriptor >= 0)
        & (table_offset >= 0)
        & (3 * transparent_index < table_length)
    )

    def patched():
        background = bytes(geometry.ALPHA_BACKGROUND)
        with_colour = _replace_bytes(data, table_offset + 3 * transparent_index, tf.constant(background))
        flags_without_transparency = tf.strings.substr(_ALL_BYTES, control[3] - 1, tf.constant(1, tf.int64))
        return _replace_bytes(with_colour, control_extension + 3, flags_without_transparency)

    return tf.cond(patchable, patched, lambda: data)


# --- EXIF orientation -----------------------------------------------------------------------------


def _jpeg_tiff_offset(data):
    """Offset of the TIFF header in the first APP1 "Exif\\0\\0" segment, or -1."""

    def keep_going(step, position, found):
        return (step < _MAX_JPEG_SEGMENTS) & (position >= 0) & (found < 0)

    def next_segment(step, position, found):
        head = _read_bytes(data, position, 10)  # FF <marker> <length:2> <payload...>
        marker = head[1]
        segment_length = _big_endian(head[2:4])
        is_fill = marker == 0xFF
        is_standalone = (marker == 0x01) | ((marker >= 0xD0) & (marker <= 0xD8))
        is_exif = (marker == 0xE1) & _matches(head[4:10], b"Exif\x00\x00")
        stops = (
            (head[0] != 0xFF)
            | (marker == 0xDA)  # start of scan: the metadata is over
            | (marker == 0xD9)
            | (~is_fill & ~is_standalone & (segment_length < 2))
        )
        next_position = tf.where(
            is_fill, position + 1, tf.where(is_standalone, position + 2, position + 2 + segment_length)
        )
        return (
            step + 1,
            tf.where(stops | is_exif, tf.constant(-1, tf.int64), next_position),
            tf.where(is_exif, position + 10, found),
        )

    none = tf.constant(-1, tf.int64)
    _, _, found = tf.while_loop(keep_going, next_segment, (tf.constant(0), tf.constant(0, tf.int64), none))
    return found


def _png_metadata(data):
    """(offset of the eXIf TIFF data or -1, whether a tRNS chunk exists), from chunks before IDAT."""
    length = _length(data)

    def keep_going(step, position, found, has_transparency):
        return (step < _MAX_PNG_CHUNKS) & (position >= 0)

    def next_chunk(step, position, found, has_transparency):
        head = _read_bytes(data, position, 8)  # <length:4> <type:4>
        chunk_type = head[4:8]
        stops = _matches(chunk_type, b"IDAT") | _matches(chunk_type, b"IEND") | (position + 8 > length)
        next_position = position + 12 + _big_endian(head[:4])
        return (
            step + 1,
            tf.where(stops, tf.constant(-1, tf.int64), next_position),
            tf.where(~stops & _matches(chunk_type, b"eXIf"), position + 8, found),
            has_transparency | _matches(chunk_type, b"tRNS"),
        )

    _, _, found, has_transparency = tf.while_loop(
        keep_going,
        next_chunk,
        (tf.constant(0), tf.constant(8, tf.int64), tf.constant(-1, tf.int64), tf.constant(False)),
    )
    return found, has_transparency


def _webp_tiff_offset(data):
    """Offset of the TIFF header in the RIFF "EXIF" chunk, or -1."""
    length = _length(data)

    def keep_going(step, position, found):
        return (step < _MAX_WEBP_CHUNKS) & (position >= 0) & (found < 0)

    def next_chunk(step, position, found):
        head = _read_bytes(data, position, 8)  # <fourcc:4> <size:4 little-endian>
        chunk_size = _little_endian(head[4:])
        is_exif = _matches(head[:4], b"EXIF")
        stops = position + 8 > length
        next_position = position + 8 + chunk_size + chunk_size % 2
        return (
            step + 1,
            tf.where(stops, tf.constant(-1, tf.int64), next_position),
            tf.where(~stops & is_exif, position + 8, found),
        )

    _, _, found = tf.while_loop(
        keep_going, next_chunk, (tf.constant(0), tf.constant(12, tf.int64), tf.constant(-1, tf.int64))
    )
    # Some writers keep the JPEG-style "Exif\0\0" prefix; PIL skips it too.
    has_prefix = (found >= 0) & _matches(_read_bytes(data, found, 6), b"Exif\x00\x00")
    return tf.where(has_prefix, found + 6, found)


def _exif_orientation(data, tiff_offset):
    """The orientation tag (1-8) of IFD0 of the TIFF block at tiff_offset; 1 if absent or invalid."""
    head = _read_bytes(data, tiff_offset, 8)
    little = _matches(head[:2], b"II")
    big = _matches(head[:2], b"MM")
    magic_ok = (_matches(head[2:4], b"*\x00") | _matches(head[2:4], b"\x00*")) & (little | big)

    def to_int(byte_values):
        return tf.where(little, _little_endian(byte_values), _big_endian(byte_values))

    ifd = tiff_offset + to_int(head[4:8])
    entry_count = to_int(_read_bytes(data, ifd, 2))
    entries = tf.reshape(_read_bytes(data, ifd + 2, 12 * _MAX_IFD_ENTRIES), [_MAX_IFD_ENTRIES, 12])
    tags = _to_int_rows(entries[:, 0:2], little)
    types = _to_int_rows(entries[:, 2:4], little)
    counts = _to_int_rows(entries[:, 4:8], little)
    # The value sits in the entry itself when it fits in 4 bytes; its width depends on the type.
    values = tf.where(
        types == 1,
        entries[:, 8],
        tf.where(types == 3, _to_int_rows(entries[:, 8:10], little), _to_int_rows(entries[:, 8:12], little)),
    )
    entry_indices = tf.range(_MAX_IFD_ENTRIES, dtype=tf.int64)
    is_orientation = (
        (entry_indices < entry_count)
        & (tags == _EXIF_ORIENTATION_TAG)
        & ((types == 1) | (types == 3) | (types == 4))
        & (counts == 1)
    )
    # PIL keeps the last of repeated tags.
    last = tf.reduce_max(tf.where(is_orientation, entry_indices, tf.constant(-1, tf.int64)))
    value = tf.gather(values, tf.maximum(last, 0))
    valid = (tiff_offset >= 0) & magic_ok & (last >= 0) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, tf.constant(1, tf.int64))


def _to_int_rows(byte_rows, little):
    """Unsigned integers from rows of bytes, in the TIFF block's byte order."""
    width = byte_rows.shape[1]
    weights = tf.constant([256**i for i in range(width)], tf.int64)
    little_values = tf.reduce_sum(byte_rows * weights, axis=1)
    big_values = tf.reduce_sum(
        byte_rows * tf.constant([256**i for i in reversed(range(width))], tf.int64), axis=1
    )
    return tf.where(little, little_values, big_values)


def _apply_orientation(image, orientation):
    """Turn a stored image upright, as PIL's exif_transpose does for orientations 1-8."""
    # Orientations 5-8 swap the axes; then 2,3,6,7 mirror left-right and 3,4,7,8 top-bottom.
    image = tf.cond(orientation >= 5, lambda: tf.transpose(image, [1, 0, 2]), lambda: image)
    flips_left_right = tf.reduce_any(orientation == tf.constant([2, 3, 6, 7], tf.int64))
    flips_top_bottom = tf.reduce_any(orientation == tf.constant([3, 4, 7, 8], tf.int64))
    image = tf.cond(flips_left_right, lambda: tf.reverse(image, [1]), lambda: image)
    return tf.cond(flips_top_bottom, lambda: tf.reverse(image, [0]), lambda: image)


# --- resize ---------------------------------------------------------------------------------------


def _resize_crop_or_pad(image, height, width, size, method):
    """Resize to the geometry of a height x width image, then crop or letterbox to size x size."""
    target_height, target_width = geometry.resized_shape(
        height, width, size, method, minimum=tf.minimum, maximum=tf.maximum
    )
    target = tf.cast(tf.stack([target_height, target_width]), tf.int32)
    resized = tf.image.resize(image, target, method="bilinear", antialias=True)
    # Half up, as PIL rounds (tf.round rounds half to even).
    resized = tf.cast(tf.floor(tf.clip_by_value(resized, 0.0, 255.0) + 0.5), tf.uint8)
    target_height, target_width = target[0], target[1]
    if method == geometry.CROP:
        top, left = geometry.crop_offsets(target_height, target_width, size)
        result = tf.slice(resized, tf.stack([top, left, 0]), [size, size, 3])
    else:
        top, left = geometry.pad_offsets(target_height, target_width, size)
        paddings = [[top, size - top - target_height], [left, size - left - target_width], [0, 0]]
        result = tf.pad(resized, paddings, constant_values=geometry.PAD_VALUE)
    return tf.ensure_shape(result, [size, size, 3])


# --- bytes ----------------------------------------------------------------------------------------


def _length(data):
    return tf.cast(tf.strings.length(data), tf.int64)


def _read_bytes(data, position, count):
    """`count` bytes of `data` from `position` as int64; zeros where out of range, never an error."""
    length = _length(data)
    position = tf.cast(position, tf.int64)
    position = tf.where((position >= 0) & (position <= length), position, length)
    raw = tf.io.decode_raw(tf.strings.substr(data, position, tf.constant(count, tf.int64)), tf.uint8)
    raw = tf.pad(raw, [[0, count - tf.shape(raw)[0]]])
    return tf.cast(tf.reshape(raw, [count]), tf.int64)


def _replace_bytes(data, position, replacement):
    """`data` with the bytes at `position` overwritten by `replacement` (same length)."""
    end = position + tf.cast(tf.strings.length(replacement), tf.int64)
    return tf.strings.join(
        [
            tf.strings.substr(data, tf.constant(0, tf.int64), position),
            replacement,
            tf.strings.substr(data, end, _length(data) - end),
        ]
    )


def _colour_table_length(flags):
    """Bytes in a GIF colour table: 3 * 2 ** (1 + the low three bits of its flags byte)."""
    return 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), tf.bitwise.bitwise_and(flags, 7))


def _matches(byte_values, expected: bytes):
    return tf.reduce_all(tf.equal(byte_values, tf.constant(list(expected), tf.int64)))


def _big_endian(byte_values):
    weights = tf.constant([256**i for i in reversed(range(byte_values.shape[0]))], tf.int64)
    return tf.reduce_sum(byte_values * weights)


def _little_endian(byte_values):
    weights = tf.constant([256**i for i in range(byte_values.shape[0])], tf.int64)
    return tf.reduce_sum(byte_values * weights)
