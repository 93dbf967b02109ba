"""What an encoded image says about itself, read in-graph before any pixel is decoded.

The serving signature inspects each image with string ops that cannot fail (format, size, the bytes its
decoder will need, a problem with stage 1's reason code) before decoding it (why: docs/internals.md).
"""

import typing

import tensorflow as tf

from dataset_contract import geometry, image_errors
from train.serving import graph_bytes as gb

# Index of each format (the order of the tf.switch_case branches).
JPEG, PNG, GIF, BMP, WEBP, UNKNOWN = range(6)
FORMAT_NAMES = ("JPEG", "PNG", "GIF", "BMP", "WebP", "unknown")

# problem values: an index into PROBLEMS; 0 is "no problem".
PROBLEMS = (
    "",
    image_errors.EMPTY_FILE,
    image_errors.NOT_AN_IMAGE,
    image_errors.TRUNCATED,
    image_errors.DECODE_ERROR,
    image_errors.TOO_MANY_PIXELS,
    image_errors.TOO_LARGE,
)
NO_PROBLEM, EMPTY_FILE, NOT_AN_IMAGE, TRUNCATED, DECODE_ERROR, TOO_MANY_PIXELS, TOO_LARGE = range(
    len(PROBLEMS)
)

# Bounds on the header walks: far above what real files use, so they only cut short garbage.
_MAX_JPEG_SEGMENTS = 1024
_MAX_PNG_CHUNKS = 1 << 16
_MAX_WEBP_CHUNKS = 256
_MAX_GIF_EXTENSIONS = 4096
# GIF image data comes in sub-blocks of at most 255 bytes, chained by their
# length bytes; every encoder writes full 255-byte blocks, which the walk
# skips _GIF_RUN at a time. Files of short sub-blocks cost a step each, and are
# refused past this many steps (a CPU bound: each step costs ~30 us).
_MAX_GIF_SUB_BLOCK_STEPS = 1 << 14
_GIF_RUN = 1024
# libjpeg refuses larger sides.
_JPEG_MAX_DIMENSION = 65500
_PNG_IEND_CHUNK = b"\x00\x00\x00\x00IEND\xaeB`\x82"


class ImageHeader(typing.NamedTuple):
    """Facts about one encoded image, all scalar tensors."""

    image_format: tf.Tensor  # int32: JPEG, PNG, GIF, BMP, WEBP or UNKNOWN
    height: tf.Tensor  # int64, as stored (before EXIF orientation), at full resolution
    width: tf.Tensor  # int64
    problem: tf.Tensor  # int32 index into PROBLEMS
    detail: tf.Tensor  # string: what is wrong ("" when nothing)
    payload: tf.Tensor  # string: the bytes to decode
    decode_bytes: tf.Tensor  # int64: memory the decoder needs for the full image
    channels: tf.Tensor  # int32: the `channels` to ask the decoder for (0: the file's own)
    tiff_offset: tf.Tensor  # int64: where the EXIF TIFF block starts, or -1
    looks_truncated: tf.Tensor  # bool: if the decoder fails, call it truncated


def inspect(data) -> ImageHeader:
    """Inspect one encoded image (a scalar string tensor). Never raises on any content."""
    data = tf.convert_to_tensor(data, tf.string)
    branches = [_inspect_jpeg, _inspect_png, _inspect_gif, _inspect_bmp, _inspect_webp, _inspect_unknown]
    header = ImageHeader(
        tf.constant(0), *tf.switch_case(sniff_format(data), [lambda f=f: f(data) for f in branches])
    )
    is_empty = gb.length(data) == 0
    return header._replace(
        image_format=sniff_format(data),
        problem=tf.where(is_empty, EMPTY_FILE, header.problem),
        detail=tf.where(is_empty, "the file is empty", header.detail),
    )


def sniff_format(data):
    """The format index by content (magic bytes), whatever the file is named."""
    head = gb.read_bytes(data, 0, 12)
    is_format = tf.stack(
        [
            gb.matches(head[:3], b"\xff\xd8\xff"),
            gb.matches(head[:8], b"\x89PNG\r\n\x1a\n"),
            gb.matches(head[:6], b"GIF87a") | gb.matches(head[:6], b"GIF89a"),
            gb.matches(head[:2], b"BM"),
            gb.matches(head[:4], b"RIFF") & gb.matches(head[8:12], b"WEBP"),
            tf.constant(True),
        ]
    )
    # argmax returns the first True: the format, or UNKNOWN.
    return tf.cast(tf.argmax(tf.cast(is_format, tf.int32)), tf.int32)


def problem_name(problem):
    """The reason code (string tensor) of a problem index."""
    return tf.gather(tf.constant(PROBLEMS), problem)


# --- helpers ----------------------------------------------------------------------------------------


def _fields(height, width, problem, detail, payload, decode_bytes, channels, tiff_offset, looks_truncated):
    """ImageHeader's fields after image_format, in fixed dtypes (the branches of a switch_case must agree)."""
    return (
        tf.cast(height, tf.int64),
        tf.cast(width, tf.int64),
        tf.cast(problem, tf.int32),
        tf.convert_to_tensor(detail, tf.string),
        tf.convert_to_tensor(payload, tf.string),
        tf.cast(decode_bytes, tf.int64),
        tf.cast(channels, tf.int32),
        tf.cast(tiff_offset, tf.int64),
        tf.convert_to_tensor(looks_truncated, tf.bool),
    )


def _first_problem(checks):
    """(problem, detail) of the first (condition, problem, detail) whose condition holds; else none."""
    problem, detail = tf.constant(NO_PROBLEM), tf.constant("")
    for condition, check_problem, check_detail in reversed(checks):
        problem = tf.where(condition, tf.constant(check_problem), problem)
        detail = tf.where(condition, tf.convert_to_tensor(check_detail, tf.string), detail)
    return problem, detail


def _text(*parts):
    """A detail message from strings and integer tensors."""
    return tf.strings.join(
        [part if isinstance(part, str) else tf.strings.as_string(tf.cast(part, tf.int64)) for part in parts]
    )


def _none():
    return tf.constant(-1, tf.int64)


def _int64(value):
    """An int64 literal for tf.where next to int64 tensors (a Python int becomes int32 in a graph)."""
    return tf.constant(value, tf.int64)


def _ceil_div(a, b):
    return (a + b - 1) // b


# --- unknown ----------------------------------------------------------------------------------------


def _inspect_unknown(data):
    detail = tf.strings.join(
        ["unrecognised content (not JPEG, PNG, GIF, BMP or WebP), starts with 0x", gb.hex_prefix(data, 8)]
    )
    return _fields(0, 0, NOT_AN_IMAGE, detail, data, 0, 0, _none(), False)


# --- JPEG -------------------------------------------------------------------------------------------

_WALKING, _FOUND, _RAN_OUT, _GARBAGE = range(4)
# SOF0 baseline, SOF1 extended, SOF2 progressive (Huffman), SOF9/SOF10 the same with arithmetic coding.
_JPEG_DECODABLE_PROCESSES = (0xC0, 0xC1, 0xC2, 0xC9, 0xCA)
_JPEG_PROGRESSIVE_PROCESSES = (0xC2, 0xCA)


def _inspect_jpeg(data):
    size = gb.length(data)
    sof, sos, tiff_offset, outcome, stopped_at = _walk_jpeg_segments(data)
    frame = gb.read_bytes(data, sof, 22)  # FF Cn <length:2> <P> <Y:2> <X:2> <Nf> (<id> <HV> <Tq>) x 4
    process, precision, height, width = (
        frame[1],
        frame[4],
        gb.big_endian(frame[5:7]),
        gb.big_endian(frame[7:9]),
    )
    num_components = frame[9]
    sampling = tf.reshape(frame[10:22], [4, 3])[:, 1]
    in_frame = tf.range(4, dtype=tf.int64) < num_components
    h_factors = tf.where(in_frame, sampling // 16, _int64(1))
    v_factors = tf.where(in_frame, sampling % 16, _int64(1))
    scan_components = gb.read_byte(data, sos + 4)
    decodable = tf.reduce_any(process == tf.constant(_JPEG_DECODABLE_PROCESSES, tf.int64))
    problem, detail = _first_problem(
        [
            (
                outcome == _RAN_OUT,
                TRUNCATED,
                _text("the data ends inside the JPEG header, at byte ", stopped_at),
            ),
            (
                outcome == _GARBAGE,
                DECODE_ERROR,
                _text("no JPEG marker where one belongs, at byte ", stopped_at),
            ),
            (
                outcome == _WALKING,
                DECODE_ERROR,
                f"more than {_MAX_JPEG_SEGMENTS} segments before the image data",
            ),
            (sof < 0, DECODE_ERROR, "no frame header (SOF) before the image data"),
            (
                ~decodable,
                DECODE_ERROR,
                _text("unsupported JPEG process SOF", process - 0xC0, " (lossless or hierarchical)"),
            ),
            (precision != 8, DECODE_ERROR, _text(precision, "-bit JPEG samples are not supported")),
            ((height == 0) | (width == 0), DECODE_ERROR, _text("a ", width, "x", height, " JPEG")),
            (
                (height > _JPEG_MAX_DIMENSION) | (width > _JPEG_MAX_DIMENSION),
                DECODE_ERROR,
                _text(width, "x", height, f": JPEG sides are at most {_JPEG_MAX_DIMENSION} pixels"),
            ),
            (
                (num_components != 1) & (num_components != 3) & (num_components != 4),
                DECODE_ERROR,
                _text(num_components, " colour components"),
            ),
            (
                tf.reduce_any(
                    in_frame & ((h_factors < 1) | (h_factors > 4) | (v_factors < 1) | (v_factors > 4))
                ),
                DECODE_ERROR,
                "invalid sampling factors",
            ),
            (
                (scan_components < 1) | (scan_components > num_components),
                DECODE_ERROR,
                _text("a scan of ", scan_components, " components in a frame of ", num_components),
            ),
        ]
    )
    # A progressive or multi-scan JPEG keeps every DCT coefficient of the full-resolution image until
    # the last scan (libjpeg's whole-image coefficient buffer, 2 bytes per sample), whatever the scale it
    # is decoded at. A single-scan one streams: what it costs is its (scaled, cropped) output.
    multi_scan = tf.reduce_any(process == tf.constant(_JPEG_PROGRESSIVE_PROCESSES, tf.int64)) | (
        scan_components < num_components
    )
    # Clamped for the arithmetic only (a damaged frame header is refused above, but tf.where computes
    # both sides: a zero factor must not divide by zero and fail the batch).
    h_factors, v_factors = tf.clip_by_value(h_factors, 1, 4), tf.clip_by_value(v_factors, 1, 4)
    h_max, v_max = tf.reduce_max(h_factors), tf.reduce_max(v_factors)
    width_in_blocks = _ceil_div(_ceil_div(width * h_factors, h_max * 8), h_factors) * h_factors
    height_in_blocks = _ceil_div(_ceil_div(height * v_factors, v_max * 8), v_factors) * v_factors
    coefficient_bytes = tf.reduce_sum(tf.where(in_frame, width_in_blocks * height_in_blocks * 128, _int64(0)))
    ends_with_eoi = gb.matches(gb.read_bytes(data, size - 2, 2), b"\xff\xd9")
    return _fields(
        height,
        width,
        problem,
        detail,
        data,
        tf.where(multi_scan, coefficient_bytes, _int64(0)),
        3,
        tiff_offset,
        ~ends_with_eoi,
    )


def _walk_jpeg_segments(data):
    """(SOF position, SOS position, TIFF offset of the first APP1 Exif, outcome, where it stopped)."""
    size = gb.length(data)

    def keep_going(step, position, sof, sos, tiff, outcome):
        return (step < _MAX_JPEG_SEGMENTS) & (outcome == _WALKING)

    def next_segment(step, position, sof, sos, tiff, outcome):
        head = gb.read_bytes(data, position, 10)  # FF <marker> <length:2> <payload...>
        marker = head[1]
        segment_length = gb.big_endian(head[2:4])
        is_fill = marker == 0xFF
        is_standalone = (marker == 0x01) | ((marker >= 0xD0) & (marker <= 0xD8))
        has_length = ~is_fill & ~is_standalone
        is_sof = (marker >= 0xC0) & (marker <= 0xCF) & (marker != 0xC4) & (marker != 0xC8) & (marker != 0xCC)
        is_exif = (marker == 0xE1) & gb.matches(head[4:10], b"Exif\x00\x00")
        next_position = tf.where(
            is_fill, position + 1, tf.where(is_standalone, position + 2, position + 2 + segment_length)
        )
        outcome = tf.where(
            position + 2 > size,
            _RAN_OUT,
            tf.where(
                head[0] != 0xFF,
                _GARBAGE,
                tf.where(
                    marker == 0xDA,
                    _FOUND,
                    tf.where(
                        has_length & (position + 4 > size),
                        _RAN_OUT,
                        tf.where(
                            (marker == 0xD9) | (has_length & (segment_length < 2)),
                            _GARBAGE,
                            tf.where(next_position > size, _RAN_OUT, _WALKING),
                        ),
                    ),
                ),
            ),
        )
        return (
            step + 1,
            tf.where(outcome == _WALKING, next_position, position),
            tf.where(is_sof & (sof < 0) & (outcome == _WALKING), position, sof),
            tf.where(outcome == _FOUND, position, sos),
            tf.where(is_exif & (tiff < 0) & (outcome == _WALKING), position + 10, tiff),
            outcome,
        )

    _, position, sof, sos, tiff, outcome = tf.while_loop(
        keep_going,
        next_segment,
        (tf.constant(0), tf.constant(2, tf.int64), _none(), _none(), _none(), tf.constant(_WALKING)),
    )
    return sof, sos, tiff, outcome, position


# --- PNG --------------------------------------------------------------------------------------------

# Channels TensorFlow's decoder gives per PNG colour type (gray, -, RGB, palette, gray+alpha, -, RGBA).
_PNG_CHANNELS = (1, 0, 3, 3, 2, 0, 4)


def _inspect_png(data):
    size = gb.length(data)
    ihdr = gb.read_bytes(data, 8, 21)  # <length:4> IHDR <width:4> <height:4> <depth> <colour> ...
    width, height = gb.big_endian(ihdr[8:12]), gb.big_endian(ihdr[12:16])
    depth, colour = ihdr[16], ihdr[17]
    valid_depth = tf.where(
        colour == 0,
        tf.reduce_any(depth == tf.constant([1, 2, 4, 8, 16], tf.int64)),
        tf.where(
            colour == 3,
            tf.reduce_any(depth == tf.constant([1, 2, 4, 8], tf.int64)),
            ((colour == 2) | (colour == 4) | (colour == 6)) & ((depth == 8) | (depth == 16)),
        ),
    )
    tiff_offset, has_transparency_chunk, complete, last_whole_chunk_end = _walk_png_chunks(data)
    problem, detail = _first_problem(
        [
            (size < 33, TRUNCATED, _text("the data ends inside the PNG header, at byte ", size)),
            (~gb.matches(ihdr[:8], b"\x00\x00\x00\rIHDR"), DECODE_ERROR, "the PNG does not start with IHDR"),
            ((width == 0) | (height == 0), DECODE_ERROR, _text("a ", width, "x", height, " PNG")),
            (~valid_depth, DECODE_ERROR, _text("PNG bit depth ", depth, " with colour type ", colour)),
        ]
    )
    # A tRNS chunk (palette, gray or RGB colour key) only becomes alpha when asking for 4 channels; TF's
    # 4-channel output of a PNG without tRNS has a wrong filler alpha, hence 0 (native) otherwise.
    channels = tf.where(has_transparency_chunk, 4, 0)
    decoded_channels = tf.where(
        has_transparency_chunk,
        tf.constant(4, tf.int64),
        tf.gather(tf.constant(_PNG_CHANNELS, tf.int64), tf.clip_by_value(colour, 0, 6)),
    )
    # PIL reads a PNG whose image data is whole even when the end (IEND) is missing; libpng insists on
    # IEND. Give it one after the last whole chunk; if image data is missing too, the decode fails.
    payload = tf.cond(
        complete,
        lambda: data,
        lambda: tf.strings.join([gb.substring(data, 0, last_whole_chunk_end), _PNG_IEND_CHUNK]),
    )
    return _fields(
        height,
        width,
        problem,
        detail,
        payload,
        width * height * decoded_channels,
        channels,
        tiff_offset,
        ~complete,
    )


def _walk_png_chunks(data):
    """(eXIf TIFF offset or -1, tRNS seen, whether the chunks end in a whole IEND, end of the last whole chunk).

    Metadata counts only before the first IDAT (as PIL reads it before
    loading). The walk goes on past the image data only when the file does
    not simply end with IEND.
    """
    size = gb.length(data)
    ends_with_iend = gb.matches(gb.read_bytes(data, size - 12, 12), _PNG_IEND_CHUNK)

    def keep_going(step, position, tiff, has_transparency, seen_data, complete, whole_end):
        return (step < _MAX_PNG_CHUNKS) & (position >= 0)

    def next_chunk(step, position, tiff, has_transparency, seen_data, complete, whole_end):
        head = gb.read_bytes(data, position, 8)  # <length:4> <type:4>
        chunk_type = head[4:8]
        end = position + 12 + gb.big_endian(head[:4])
        whole = end <= size
        is_data = gb.matches(chunk_type, b"IDAT")
        is_end = gb.matches(chunk_type, b"IEND")
        before_data = ~seen_data & ~is_data
        stops = ~whole | is_end | (is_data & ends_with_iend)
        return (
            step + 1,
            tf.where(stops, _none(), end),
            tf.where(before_data & whole & (tiff < 0) & gb.matches(chunk_type, b"eXIf"), position + 8, tiff),
            has_transparency | (before_data & gb.matches(chunk_type, b"tRNS")),
            seen_data | is_data,
            tf.where(stops, whole, complete),
            tf.where(whole, end, whole_end),
        )

    _, position, tiff, has_transparency, _, complete, whole_end = tf.while_loop(
        keep_going,
        next_chunk,
        (
            tf.constant(0),
            tf.constant(8, tf.int64),
            _none(),
            tf.constant(False),
            tf.constant(False),
            tf.constant(False),
            tf.constant(8, tf.int64),
        ),
    )
    # A walk cut short by its bound leaves the file as it is.
    return tiff, has_transparency, complete | (position >= 0), whole_end


# --- GIF --------------------------------------------------------------------------------------------


def _inspect_gif(data):
    size = gb.length(data)
    # One zero byte past the end, so every clamped gather is in range.
    raw = tf.pad(tf.cast(tf.io.decode_raw(data, tf.uint8), tf.int64), [[0, 1]])
    screen = gb.read_bytes(data, 6, 5)  # <width:2> <height:2> <flags>
    width, height = gb.little_endian(screen[0:2]), gb.little_endian(screen[2:4])
    global_table_length = tf.where(screen[4] >= 0x80, _colour_table_length(screen[4]), _int64(0))
    descriptor, control_extension, outcome, stopped_at = _find_first_gif_image(
        raw, size, 13 + global_table_length
    )
    image = gb.read_bytes(data, descriptor, 10)  # 2C <left:2> <top:2> <width:2> <height:2> <flags>
    frame_width, frame_height = gb.little_endian(image[5:7]), gb.little_endian(image[7:9])
    local_table_length = tf.where(image[9] >= 0x80, _colour_table_length(image[9]), _int64(0))
    # After the descriptor and its colour table: the LZW minimum code size, then the data sub-blocks.
    frame_end = _skip_gif_sub_blocks(raw, size, descriptor + 10 + local_table_length + 1)
    problem, detail = _first_problem(
        [
            (size < 13, TRUNCATED, _text("the data ends inside the GIF header, at byte ", size)),
            ((width == 0) | (height == 0), DECODE_ERROR, _text("a ", width, "x", height, " GIF")),
            (outcome == _RAN_OUT, TRUNCATED, "the data ends before the first GIF image"),
            (outcome == _GARBAGE, DECODE_ERROR, _text("an unknown GIF block at byte ", stopped_at)),
            (
                outcome == _WALKING,
                DECODE_ERROR,
                f"more than {_MAX_GIF_EXTENSIONS} GIF extensions before the image",
            ),
            (descriptor < 0, DECODE_ERROR, "a GIF without an image"),
            ((frame_width == 0) | (frame_height == 0), DECODE_ERROR, "an empty first GIF frame"),
            (frame_end == -1, TRUNCATED, "the data ends inside the first GIF frame"),
            (
                frame_end < -1,
                DECODE_ERROR,
                "the first GIF frame is split into too many short data sub-blocks",
            ),
        ]
    )
    # giflib reads every frame before TF draws the first: keep only the first (and end the file there).
    first_frame_only = tf.cond(
        gb.read_byte(data, frame_end) == 0x3B,
        lambda: data,
        lambda: tf.strings.join([gb.substring(data, 0, frame_end), b";"]),
    )
    payload = _with_opaque_transparent_colour(
        first_frame_only, control_extension, descriptor, global_table_length, image[9]
    )
    # The canvas TF draws on (3 bytes a pixel) and giflib's index raster of the frame (1 byte a pixel).
    decode_bytes = width * height * 3 + frame_width * frame_height
    return _fields(height, width, problem, detail, payload, decode_bytes, 3, _none(), False)


def _find_first_gif_image(raw, size, start):
    """(first image descriptor, the graphic control extension before it, outcome, where it stopped)."""

    def keep_going(step, position, control, descriptor, outcome):
        return (step < _MAX_GIF_EXTENSIONS) & (outcome == _WALKING)

    def next_block(step, position, control, descriptor, outcome):
        introducer = _byte_at(raw, size, position)
        label = _byte_at(raw, size, position + 1)
        is_extension = introducer == 0x21
        is_control = is_extension & (label == 0xF9) & (_byte_at(raw, size, position + 2) == 4)
        after_extension = tf.cond(
            is_extension,
            lambda: _skip_gif_sub_blocks(raw, size, position + 2),
            lambda: tf.constant(-3, tf.int64),
        )
        outcome = tf.where(
            position >= size,
            _RAN_OUT,
            tf.where(
                introducer == 0x2C,
                _FOUND,
                tf.where(
                    is_extension,
                    tf.where(
                        after_extension == -1, _RAN_OUT, tf.where(after_extension < 0, _GARBAGE, _WALKING)
                    ),
                    _GARBAGE,  # the trailer (3B) before any image, or junk
                ),
            ),
        )
        return (
            step + 1,
            tf.where(outcome == _WALKING, after_extension, position),
            tf.where(is_control & (outcome == _WALKING), position, control),
            tf.where(outcome == _FOUND, position, descriptor),
            outcome,
        )

    _, position, control, descriptor, outcome = tf.while_loop(
        keep_going, next_block, (tf.constant(0), start, _none(), _none(), tf.constant(_WALKING))
    )
    return descriptor, control, outcome, position


def _skip_gif_sub_blocks(raw, size, start):
    """The position after the zero-length block ending a chain of sub-blocks at `start`.

    -1 when the data ends first, -2 past _MAX_GIF_SUB_BLOCK_STEPS steps. A
    run of full (255-byte) sub-blocks is skipped in one step: their length
    bytes sit every 256 bytes.
    """
    run_offsets = 256 * tf.range(_GIF_RUN, dtype=tf.int64)

    def keep_going(step, position):
        return (
            (step < _MAX_GIF_SUB_BLOCK_STEPS)
            & (position >= 0)
            & (position < size)
            & (_byte_at(raw, size, position) != 0)
        )

    def next_step(step, position):
        run_positions = position + run_offsets
        is_full = (run_positions + 256 <= size) & (tf.gather(raw, tf.minimum(run_positions, size)) == 255)
        run = tf.reduce_sum(tf.math.cumprod(tf.cast(is_full, tf.int64)))
        return step + 1, tf.where(run > 0, position + 256 * run, position + 1 + _byte_at(raw, size, position))

    steps, position = tf.while_loop(keep_going, next_step, (tf.constant(0), tf.cast(start, tf.int64)))
    ended = (position >= 0) & (position < size) & (_byte_at(raw, size, position) == 0)
    return tf.where(
        ended, position + 1, tf.where(steps >= _MAX_GIF_SUB_BLOCK_STEPS, tf.constant(-2, tf.int64), _none())
    )


def _byte_at(raw, size, position):
    """raw[position], 0 outside [0, size) (raw has a zero byte at index size)."""
    return tf.gather(raw, tf.where((position >= 0) & (position < size), position, size))


def _with_opaque_transparent_colour(data, control_extension, descriptor, global_table_length, image_flags):
    """GIF bytes whose first frame draws its transparent colour as opaque ALPHA_BACKGROUND.

    TF's GIF decoder paints transparent pixels of the first frame black and
    reports no alpha; stage 1 composites them onto white. Rewriting the
    colour-table entry of the transparent index and clearing the
    transparency flag makes TF paint exactly that.
    """
    control = gb.read_bytes(data, control_extension, 7)  # 21 F9 04 <flags> <delay:2> <index>
    has_transparency = (control_extension >= 0) & (control[3] % 2 == 1)
    transparent_index = control[6]
    has_local_table = image_flags >= 0x80
    global_table_offset = tf.where(global_table_length > 0, tf.constant(13, tf.int64), _none())
    table_offset = tf.where(has_local_table, descriptor + 10, global_table_offset)
    table_length = tf.where(has_local_table, _colour_table_length(image_flags), global_table_length)
    patchable = (
        has_transparency
        & (descriptor >= 0)
        & (table_offset >= 0)
        & (3 * transparent_index + 3 <= table_length)
    )
    patchable = patchable & (table_offset + table_length <= gb.length(data))

    def patched():
        with_colour = gb.replace_bytes(
            data, table_offset + 3 * transparent_index, tf.constant(bytes(geometry.ALPHA_BACKGROUND))
        )
        return gb.replace_bytes(with_colour, control_extension + 3, gb.byte_string(control[3] - 1))

    return tf.cond(patchable, patched, lambda: data)


def _colour_table_length(flags):
    """Bytes in a GIF colour table: 3 * 2 ** (1 + the low three bits of its flags byte)."""
    return 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), tf.bitwise.bitwise_and(flags, 7))


# --- BMP --------------------------------------------------------------------------------------------


def _inspect_bmp(data):
    size = gb.length(data)
    head = gb.read_bytes(data, 0, 34)
    pixel_offset = gb.little_endian(head[10:14])
    info_length = gb.little_endian(head[14:18])
    width = gb.signed_32(gb.little_endian(head[18:22]))
    signed_height = gb.signed_32(gb.little_endian(head[22:26]))
    height = tf.abs(signed_height)  # negative: stored top-down
    bits = gb.little_endian(head[28:30])
    compression = gb.little_endian(head[30:34])
    row_bytes = _ceil_div(bits // 8 * width, 4) * 4
    expected_size = pixel_offset + row_bytes * height
    problem, detail = _first_problem(
        [
            (size < 34, TRUNCATED, _text("the data ends inside the BMP header, at byte ", size)),
            (info_length < 40, DECODE_ERROR, _text("a BMP info header of ", info_length, " bytes (OS/2)")),
            ((width <= 0) | (height == 0), DECODE_ERROR, _text("a ", width, "x", signed_height, " BMP")),
            (
                (bits != 8) & (bits != 24) & (bits != 32),
                DECODE_ERROR,
                _text(bits, "-bit BMP: TensorFlow decodes 8, 24 and 32-bit BMPs only"),
            ),
            (
                (compression != 0) & ~((compression == 3) & (bits == 32)),
                DECODE_ERROR,
                _text("BMP compression ", compression, " (RLE) is not supported"),
            ),
            (pixel_offset < 14 + info_length, DECODE_ERROR, "the BMP pixel data overlaps its header"),
            (
                size < expected_size,
                TRUNCATED,
                _text("the BMP pixels end at byte ", expected_size, " of ", size),
            ),
        ]
    )
    # TF's decoder wants exactly the pixel data; PIL ignores bytes after it.
    payload = tf.cond(size > expected_size, lambda: gb.substring(data, 0, expected_size), lambda: data)
    return _fields(height, width, problem, detail, payload, width * height * (bits // 8), 0, _none(), False)


# --- WebP -------------------------------------------------------------------------------------------

_WEBP_ANIMATION_FLAG = 0x02
_WEBP_ALPHA_FLAG = 0x10


def _inspect_webp(data):
    size = gb.length(data)
    riff_end = 8 + gb.little_endian(gb.read_bytes(data, 4, 4))
    first = gb.read_bytes(data, 12, 20)  # <fourcc:4> <size:4> <payload...>
    is_lossy = gb.matches(first[:4], b"VP8 ")
    is_lossless = gb.matches(first[:4], b"VP8L")
    is_extended = gb.matches(first[:4], b"VP8X")
    lossless_bits = gb.little_endian(first[9:13])
    width = tf.where(
        is_lossy,
        gb.little_endian(first[14:16]) % 16384,
        tf.where(is_lossless, lossless_bits % 16384 + 1, gb.little_endian(first[12:15]) + 1),
    )
    height = tf.where(
        is_lossy,
        gb.little_endian(first[16:18]) % 16384,
        tf.where(is_lossless, lossless_bits // 16384 % 16384 + 1, gb.little_endian(first[15:18]) + 1),
    )
    flags = tf.where(is_extended, first[8], 0)
    is_animated = tf.bitwise.bitwise_and(flags, _WEBP_ANIMATION_FLAG) > 0
    tiff_offset, first_frame, has_lossless_image = _walk_webp_chunks(data, size)
    frame = gb.read_bytes(data, first_frame, 24)  # ANMF <size:4> <x:3> <y:3> <width-1:3> <height-1:3> ...
    frame_covers_canvas = (
        (gb.little_endian(frame[8:14]) == 0)
        & (gb.little_endian(frame[14:17]) + 1 == width)
        & (gb.little_endian(frame[17:20]) + 1 == height)
    )
    problem, detail = _first_problem(
        [
            (size < 30, TRUNCATED, _text("the data ends inside the WebP header, at byte ", size)),
            (riff_end > size, TRUNCATED, _text("the WebP data ends at byte ", size, " of ", riff_end)),
            (
                ~is_lossy & ~is_lossless & ~is_extended,
                DECODE_ERROR,
                "no VP8, VP8L or VP8X chunk first in the WebP",
            ),
            (is_lossy & ~gb.matches(first[11:14], b"\x9d\x01\x2a"), DECODE_ERROR, "no VP8 start code"),
            (is_lossless & (first[8] != 0x2F), DECODE_ERROR, "no VP8L signature"),
            ((width == 0) | (height == 0), DECODE_ERROR, _text("a ", width, "x", height, " WebP")),
            (is_animated & (first_frame < 0), DECODE_ERROR, "an animated WebP without frames"),
            (
                is_animated & ~frame_covers_canvas,
                DECODE_ERROR,
                "an animated WebP whose first frame does not cover the canvas (not supported in serving)",
            ),
        ]
    )
    # Never hand TF an animated WebP: its decoder crashes the process on one (TF 2.21). The first frame
    # covering the canvas is a still image of its own.
    payload = tf.cond(
        is_animated & (first_frame >= 0),
        lambda: _webp_still_of_frame(data, first_frame, width, height),
        lambda: data,
    )
    has_alpha = (
        (is_lossless & (lossless_bits // 2**28 % 2 == 1))
        | (tf.bitwise.bitwise_and(flags, _WEBP_ALPHA_FLAG) > 0)
        | is_animated
    )
    # The output, and for lossless images libwebp's own ARGB copy (4 bytes a pixel).
    bytes_per_pixel = tf.where(has_alpha, 4, 3) + tf.where(
        is_lossless | has_lossless_image | is_animated, 4, 0
    )
    return _fields(
        height,
        width,
        problem,
        detail,
        payload,
        width * height * tf.cast(bytes_per_pixel, tf.int64),
        0,
        tiff_offset,
        riff_end > size,
    )


def _walk_webp_chunks(data, size):
    """(EXIF TIFF offset or -1, the first ANMF chunk or -1, whether a VP8L chunk is among the top-level chunks)."""

    def keep_going(step, position, tiff, frame, lossless):
        return (step < _MAX_WEBP_CHUNKS) & (position >= 0)

    def next_chunk(step, position, tiff, frame, lossless):
        head = gb.read_bytes(data, position, 8)  # <fourcc:4> <size:4 little-endian>
        chunk_size = gb.little_endian(head[4:])
        fourcc = head[:4]
        stops = position + 8 > size
        return (
            step + 1,
            tf.where(stops, _none(), position + 8 + chunk_size + chunk_size % 2),
            tf.where(~stops & (tiff < 0) & gb.matches(fourcc, b"EXIF"), position + 8, tiff),
            tf.where(~stops & (frame < 0) & gb.matches(fourcc, b"ANMF"), position, frame),
            lossless | (~stops & gb.matches(fourcc, b"VP8L")),
        )

    _, _, tiff, frame, lossless = tf.while_loop(
        keep_going,
        next_chunk,
        (tf.constant(0), tf.constant(12, tf.int64), _none(), _none(), tf.constant(False)),
    )
    # Some writers keep the JPEG-style "Exif\0\0" prefix; PIL skips it too.
    has_prefix = (tiff >= 0) & gb.matches(gb.read_bytes(data, tiff, 6), b"Exif\x00\x00")
    return tf.where(has_prefix, tiff + 6, tiff), frame, lossless


def _webp_still_of_frame(data, frame, width, height):
    """A still WebP of the ANMF frame at `frame`: a VP8X header (with alpha) and the frame's own chunks."""
    frame_size = gb.little_endian(gb.read_bytes(data, frame + 4, 4))
    frame_chunks = gb.substring(data, frame + 8 + 16, frame + 8 + frame_size)
    extended_header = tf.strings.join(
        [
            b"VP8X\x0a\x00\x00\x00",
            gb.byte_string(_WEBP_ALPHA_FLAG),
            b"\x00\x00\x00",
            gb.little_endian_string(width - 1, 3),
            gb.little_endian_string(height - 1, 3),
        ]
    )
    riff_size = 4 + 18 + gb.length(frame_chunks)
    return tf.strings.join(
        [b"RIFF", gb.little_endian_string(riff_size, 4), b"WEBP", extended_header, frame_chunks]
    )
