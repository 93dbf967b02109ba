"""Stage 1's per-image decode and resize, rebuilt from TF ops for the serving signature, in bounded memory.

How it matches stage 1 and bounds memory: docs/internals.md.
"""

import dataclasses
import typing

import tensorflow as tf

from dataset_contract import geometry, image_errors
from train.serving import exif_orientation, graph_bytes, image_header

# What decoding one image may cost, beyond the bytes it came in (the decoder's output and working
# memory, from the header): with the output-sized work around it, a serving process grows by less
# than 300 MB for any single image (benchmarks/serving_memory.py). A progressive 10000x10000 JPEG
# (libjpeg keeps 300 MB of coefficients) or a 10000x10000 PNG (300 MB of RGB) is over it.
DEFAULT_MAX_DECODE_BYTES = 200 * 2**20

# Rows of the source a band of the resize reads, in pixels: bounds the RGB conversion and alpha blend
# (int32, a few copies) to tens of MB whatever the image.
_BAND_SOURCE_PIXELS = 1 << 20
_JPEG_SCALE_RATIOS = (1, 2, 4, 8)
# What decode_window returns besides the pixels: how to make them RGB.
_CHANNELS_AS_DECODED, _PALETTE_INDICES, _DROP_FOURTH_CHANNEL = range(3)


@dataclasses.dataclass(frozen=True)
class ServingLimits:
    """What the serving signature refuses (as too_large or too_many_pixels) before decoding an image."""

    max_pixels: int = image_errors.DEFAULT_MAX_PIXELS  # width x height from the header, as stage 1
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES  # the decoder's memory for the header's size
    max_file_bytes: int = image_errors.DEFAULT_MAX_FILE_BYTES  # the encoded image's length, as stage 1


class DecodePlan(typing.NamedTuple):
    """What to decode and resize for one image (scalar tensors; `window` is [4])."""

    image_format: tf.Tensor  # int32, image_header's format index
    payload: tf.Tensor  # string: the bytes to decode
    channels: tf.Tensor  # int32: the decoder's `channels`
    ratio: tf.Tensor  # int32: JPEG DCT scale denominator (1 for other formats)
    decoded_height: tf.Tensor  # int64: the whole image as decoded (stored orientation, DCT-scaled)
    decoded_width: tf.Tensor  # int64
    window: tf.Tensor  # int64 [top, left, bottom, right] of the decoded image to read
    resized_height: tf.Tensor  # int64: what stage 1 resizes the (stored) image to
    resized_width: tf.Tensor  # int64
    output_top: tf.Tensor  # int64: the part of the resized image kept (crop window, or all of it)
    output_left: tf.Tensor  # int64
    output_height: tf.Tensor  # int64
    output_width: tf.Tensor  # int64
    orientation: tf.Tensor  # int64: EXIF orientation 1-8
    problem: tf.Tensor  # int32 index into image_header.PROBLEMS
    detail: tf.Tensor  # string
    looks_truncated: tf.Tensor  # bool


_PLAN_SIGNATURE = DecodePlan(
    **{
        name: tf.TensorSpec([4] if name == "window" else [], dtype)
        for name, dtype in {
            "image_format": tf.int32,
            "payload": tf.string,
            "channels": tf.int32,
            "ratio": tf.int32,
            "decoded_height": tf.int64,
            "decoded_width": tf.int64,
            "window": tf.int64,
            "resized_height": tf.int64,
            "resized_width": tf.int64,
            "output_top": tf.int64,
            "output_left": tf.int64,
            "output_height": tf.int64,
            "output_width": tf.int64,
            "orientation": tf.int64,
            "problem": tf.int32,
            "detail": tf.string,
            "looks_truncated": tf.bool,
        }.items()
    }
)


class DecodedBatch(typing.NamedTuple):
    pixels: tf.Tensor  # uint8 [batch, size, size, 3]; zeros where not valid
    valid: tf.Tensor  # bool [batch]
    error: tf.Tensor  # string [batch]: "<reason>: <detail>", "" where valid


def decode_and_resize(image_bytes, size: int, method: str, limits: ServingLimits = ServingLimits()):
    """Encoded image bytes (a scalar string) -> uint8 [size, size, 3], as stage 1 makes it.

    One image, no safety net: an unusable image raises InvalidArgumentError
    ("<reason>: <detail>"). Serving uses `decode_batch`.
    """
    _check_method(method)
    data = tf.convert_to_tensor(image_bytes, tf.string)
    image_plan = plan(data, image_header.inspect(data), size, method, limits)
    check = tf.debugging.Assert(
        image_plan.problem == 0, [_error_message(image_plan.problem, image_plan.detail)]
    )
    with tf.control_dependencies([check]):
        return decode_planned(image_plan, size, method)


def decode_batch(
    bytes_batch, size: int, method: str, limits: ServingLimits = ServingLimits()
) -> DecodedBatch:
    """A [batch] string tensor of encoded images -> per-image pixels, validity and error. Never raises."""
    _check_method(method)
    bytes_batch = tf.convert_to_tensor(bytes_batch, tf.string)
    # Inspecting is string ops on a few header bytes; one image at a time keeps its copies of the bytes
    # (a repaired payload is at most the file's size) to one image's worth.
    plans = tf.map_fn(
        lambda data: plan(data, image_header.inspect(data), size, method, limits),
        bytes_batch,
        fn_output_signature=_PLAN_SIGNATURE,
        parallel_iterations=1,
    )
    batch_size = tf.shape(bytes_batch, out_type=tf.int64)[0]
    to_decode = tf.where(plans.problem == 0)[:, 0]
    pixels, decoded = _decode_ignoring_errors(plans, to_decode, batch_size, size, method)
    failed = (plans.problem == 0) & ~decoded
    problem = tf.where(
        failed,
        tf.where(plans.looks_truncated, image_header.TRUNCATED, image_header.DECODE_ERROR),
        plans.problem,
    )
    format_names = tf.gather(tf.constant(image_header.FORMAT_NAMES), plans.image_format)
    detail = tf.where(
        failed,
        tf.strings.join(
            [
                "the ",
                format_names,
                tf.where(
                    plans.looks_truncated,
                    " decoder failed and the data lacks its end marker",
                    " decoder rejected the data",
                ),
            ]
        ),
        plans.detail,
    )
    valid = problem == 0
    error = tf.where(valid, "", _error_message(problem, detail))
    return DecodedBatch(pixels, valid, error)


def _decode_ignoring_errors(plans, to_decode, batch_size, size, method):
    """(pixels [batch, size, size, 3], decoded [batch]) of the images at `to_decode`, one at a time."""
    # Sequential on purpose: a request's peak memory is then one image's decode, not the batch's; TF
    # Serving runs requests (and batches) in parallel on its own threads.
    selected = tf.nest.map_structure(lambda field: tf.gather(field, to_decode), plans)
    decoded = tf.data.Dataset.from_tensor_slices((to_decode, selected)).map(
        lambda index, image_plan: (index, decode_planned(DecodePlan(*image_plan), size, method))
    )
    # A decoder error drops that image; every other image still comes out.
    decoded = decoded.ignore_errors()
    # One element that always comes out, so the single batch below exists even when every decode failed.
    sentinel = tf.data.Dataset.from_tensors((tf.constant(-1, tf.int64), tf.zeros([size, size, 3], tf.uint8)))
    options = tf.data.Options()
    options.autotune.enabled = False  # nothing to tune, no background thread per request
    options.deterministic = True
    indices, images = (
        decoded.concatenate(sentinel).batch(batch_size + 1).with_options(options).get_single_element()
    )
    keep = indices >= 0
    indices, images = tf.boolean_mask(indices, keep), tf.boolean_mask(images, keep)
    pixels = tf.scatter_nd(indices[:, None], images, tf.stack([batch_size, size, size, 3]))
    decoded_mask = tf.scatter_nd(indices[:, None], tf.ones_like(indices, tf.bool), [batch_size])
    return tf.ensure_shape(pixels, [None, size, size, 3]), decoded_mask


def _error_message(problem, detail):
    return tf.strings.join([image_header.problem_name(problem), ": ", detail])


def _check_method(method):
    if method not in geometry.RESIZE_METHODS:
        raise ValueError(f"unknown resize method {method!r}; expected one of {geometry.RESIZE_METHODS}")


# --- plan -------------------------------------------------------------------------------------------


def plan(data, header: image_header.ImageHeader, size: int, method: str, limits: ServingLimits) -> DecodePlan:
    """The decode plan for one inspected image, with the limits applied. Never raises."""
    height, width = header.height, header.width
    orientation = exif_orientation.exif_orientation(data, header.tiff_offset)
    swaps = exif_orientation.swaps_axes(orientation)
    upright_height, upright_width = tf.where(swaps, width, height), tf.where(swaps, height, width)
    # Geometry from the full-resolution upright size, as stage 1 (so DCT scaling does not change it).
    target_height, target_width = geometry.resized_shape(
        tf.maximum(upright_height, 1),
        tf.maximum(upright_width, 1),
        size,
        method,
        minimum=tf.minimum,
        maximum=tf.maximum,
    )
    resized_height, resized_width = (
        tf.where(swaps, target_width, target_height),
        tf.where(swaps, target_height, target_width),
    )

    # The same DCT scale PIL's JpegImageFile.draft picks for that target: the largest of 1/8, 1/4, 1/2
    # that keeps both sides >= the resize target.
    scale = tf.minimum(width // resized_width, height // resized_height)
    is_jpeg = header.image_format == image_header.JPEG
    ratio = tf.where(
        is_jpeg,
        tf.gather(
            tf.constant(_JPEG_SCALE_RATIOS, tf.int64), tf.reduce_sum(tf.cast(scale >= [2, 4, 8], tf.int32))
        ),
        tf.constant(1, tf.int64),
    )
    decoded_height, decoded_width = (height + ratio - 1) // ratio, (width + ratio - 1) // ratio

    if method == geometry.CROP:
        output_top, output_left = _stored_crop_offsets(target_height, target_width, size, orientation)
        output_height = output_width = tf.constant(size, tf.int64)
    else:
        output_top = output_left = tf.constant(0, tf.int64)
        output_height, output_width = resized_height, resized_width
    top, bottom = _source_span(output_top, output_height, resized_height, decoded_height)
    left, right = _source_span(output_left, output_width, resized_width, decoded_width)

    # JPEG decodes only the window (a single-scan JPEG streams; a multi-scan one adds its coefficients).
    decode_bytes = header.decode_bytes + tf.where(is_jpeg, (bottom - top) * (right - left) * 3, 0)
    pixels = height * width
    problem, detail = header.problem, header.detail
    # Python ints in an export; tensors work too (the tests vary the limits without retracing).
    max_pixels = tf.cast(limits.max_pixels, tf.int64)
    max_decode_bytes = tf.cast(limits.max_decode_bytes, tf.int64)
    over_pixels = (problem == 0) & (pixels > max_pixels)
    over_budget = (problem == 0) & ~over_pixels & (decode_bytes > max_decode_bytes)
    format_name = tf.gather(tf.constant(image_header.FORMAT_NAMES), header.image_format)
    problem = tf.where(over_pixels | over_budget, image_header.TOO_MANY_PIXELS, problem)
    detail = tf.where(
        over_pixels,
        tf.strings.join(
            [_int(width), "x", _int(height), " = ", _int(pixels), " pixels > ", _int(max_pixels)]
        ),
        tf.where(
            over_budget,
            tf.strings.join(
                [
                    "decoding this ",
                    _int(width),
                    "x",
                    _int(height),
                    " ",
                    format_name,
                    " needs ",
                    _int(_ceil_megabytes(decode_bytes)),
                    " MB, over the serving limit of ",
                    _int(_ceil_megabytes(max_decode_bytes)),
                    " MB",
                ]
            ),
            detail,
        ),
    )
    # Over the file size limit, whatever its header says: stage 1 refuses such a file before reading it.
    num_bytes = tf.cast(graph_bytes.length(data), tf.int64)
    max_file_bytes = tf.cast(limits.max_file_bytes, tf.int64)
    too_large = num_bytes > max_file_bytes
    problem = tf.where(too_large, image_header.TOO_LARGE, problem)
    detail = tf.where(
        too_large,
        tf.strings.join([_int(num_bytes), " bytes, over the limit of ", _int(max_file_bytes), " bytes"]),
        detail,
    )
    return DecodePlan(
        image_format=header.image_format,
        payload=header.payload,
        channels=header.channels,
        ratio=tf.cast(ratio, tf.int32),
        decoded_height=decoded_height,
        decoded_width=decoded_width,
        window=tf.stack([top, left, bottom, right]),
        resized_height=resized_height,
        resized_width=resized_width,
        output_top=output_top,
        output_left=output_left,
        output_height=output_height,
        output_width=output_width,
        orientation=orientation,
        problem=problem,
        detail=detail,
        looks_truncated=header.looks_truncated,
    )


def _stored_crop_offsets(target_height, target_width, size, orientation):
    """The center crop's corner in the resized image *as stored*, for the upright crop stage 1 takes.

    Resizing commutes with the transpose and flips of an orientation, so the
    upright crop is the stored crop of the mirrored window, turned upright.
    """
    top, left = geometry.crop_offsets(target_height, target_width, size)
    top = tf.where(exif_orientation.flips_top_bottom(orientation), target_height - top - size, top)
    left = tf.where(exif_orientation.flips_left_right(orientation), target_width - left - size, left)
    swaps = exif_orientation.swaps_axes(orientation)
    return tf.where(swaps, left, top), tf.where(swaps, top, left)


def _source_span(output_start, output_length, resized_length, source_length):
    """[first, end) of the source rows (or columns) that output rows [start, start + length) are made of.

    The bilinear filter of an antialiased resize by s reaches max(1, 1/s)
    source pixels either side of a sample (ScaleAndTranslate's span), plus a
    pixel of margin against float rounding.
    """
    scale = tf.cast(
        tf.cast(resized_length, tf.float32) / tf.cast(tf.maximum(source_length, 1), tf.float32), tf.float64
    )
    reach = tf.maximum(1.0 / scale, 1.0)
    start = tf.cast(output_start, tf.float64)
    end = start + tf.cast(output_length, tf.float64)
    first = tf.cast(tf.math.floor((start + 0.5) / scale - reach - 0.5), tf.int64) - 1
    last = tf.cast(tf.math.ceil((end - 0.5) / scale + reach - 0.5), tf.int64) + 2
    return tf.clip_by_value(first, 0, source_length), tf.clip_by_value(last, 0, source_length)


def _int(value):
    return tf.strings.as_string(tf.cast(value, tf.int64))


def _ceil_megabytes(num_bytes):
    return (num_bytes + 10**6 - 1) // 10**6


# --- decode -----------------------------------------------------------------------------------------


def decode_planned(image_plan: DecodePlan, size: int, method: str):
    """Decode and resize one planned image -> uint8 [size, size, 3]. Raises if the decoder does."""
    window, kind, palette = decode_window(image_plan)
    stored = resize_window(window, kind, palette, image_plan)
    upright = exif_orientation.apply_orientation(stored, image_plan.orientation)
    if method == geometry.CROP:
        result = upright
    else:
        upright_height, upright_width = tf.shape(upright)[0], tf.shape(upright)[1]
        top, left = geometry.pad_offsets(upright_height, upright_width, size)
        paddings = [[top, size - top - upright_height], [left, size - left - upright_width], [0, 0]]
        result = tf.pad(upright, paddings, constant_values=geometry.PAD_VALUE)
    return tf.ensure_shape(result, [size, size, 3])


def decode_window(image_plan: DecodePlan):
    """(the plan's window of the decoded image, uint8 [h, w, channels], how to make it RGB, BMP palette)."""
    branches = {
        image_header.JPEG: lambda: _decode_jpeg_window(image_plan),
        image_header.PNG: lambda: _decode_png(image_plan),
        image_header.GIF: lambda: _as_decoded(
            tf.io.decode_image(image_plan.payload, channels=3, expand_animations=False)
        ),
        image_header.BMP: lambda: _decode_bmp(image_plan),
        image_header.WEBP: lambda: _as_decoded(
            tf.io.decode_image(image_plan.payload, channels=0, expand_animations=False)
        ),
    }
    # Unknown formats are never planned for decoding; the branch only makes the switch total.
    branches[image_header.UNKNOWN] = lambda: _as_decoded(tf.zeros([0, 0, 3], tf.uint8))
    image, kind, palette = tf.switch_case(
        tf.clip_by_value(image_plan.image_format, 0, image_header.UNKNOWN),
        [branches[index] for index in sorted(branches)],
    )
    image = tf.ensure_shape(image, [None, None, None])
    top, left, bottom, right = tf.unstack(image_plan.window)
    is_jpeg = image_plan.image_format == image_header.JPEG
    # JPEG came out as the window already; the others whole, as large as their header said.
    checks = [
        tf.debugging.assert_equal(
            tf.shape(image, out_type=tf.int64)[:2],
            tf.where(
                is_jpeg,
                tf.stack([bottom - top, right - left]),
                tf.stack([image_plan.decoded_height, image_plan.decoded_width]),
            ),
            message="the decoded image is not the size its header declares",
        )
    ]
    with tf.control_dependencies(checks):
        window = tf.cond(
            is_jpeg,
            lambda: tf.identity(image),
            lambda: tf.slice(image, tf.stack([top, left, 0]), tf.stack([bottom - top, right - left, -1])),
        )
    return window, kind, palette


def _as_decoded(image, kind=_CHANNELS_AS_DECODED, palette=None):
    if palette is None:
        palette = tf.zeros([256, 3], tf.uint8)
    return image, tf.constant(kind) if isinstance(kind, int) else kind, palette


def _decode_jpeg_window(image_plan):
    top, left, bottom, right = tf.unstack(tf.cast(image_plan.window, tf.int32))
    crop_window = tf.stack([top, left, bottom - top, right - left])
    ratio_index = tf.reduce_sum(tf.cast(image_plan.ratio >= [2, 4, 8], tf.int32))
    image = tf.switch_case(
        ratio_index,
        [
            (
                lambda ratio=ratio: tf.io.decode_and_crop_jpeg(
                    image_plan.payload, crop_window, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE"
                )
            )
            for ratio in _JPEG_SCALE_RATIOS
        ],
    )
    return _as_decoded(image)


def _decode_png(image_plan):
    # uint8 output of a 16-bit PNG keeps the high byte, like stage 1.
    image = tf.cond(
        image_plan.channels == 4,
        lambda: tf.io.decode_png(image_plan.payload, channels=4),
        lambda: tf.io.decode_png(image_plan.payload, channels=0),
    )
    return _as_decoded(image)


def _decode_bmp(image_plan):
    image = tf.io.decode_bmp(image_plan.payload, channels=0)
    channels = tf.shape(image)[2]
    # TF decodes an 8-bit BMP to its palette indices; 32-bit: the fourth byte is ignored, as stage 1
    # does (usually undefined).
    kind = tf.where(
        channels == 1, _PALETTE_INDICES, tf.where(channels == 4, _DROP_FOURTH_CHANNEL, _CHANNELS_AS_DECODED)
    )
    return _as_decoded(image, kind, _bmp_palette(image_plan.payload))


def _bmp_palette(data):
    info_header_length = graph_bytes.little_endian(graph_bytes.read_bytes(data, 14, 4))
    palette_bgrx = tf.reshape(graph_bytes.read_bytes(data, 14 + info_header_length, 256 * 4), [256, 4])
    # A gather, not a [:, 2::-1] slice: grappler's layout pass logs a spurious error for negative-stride
    # slices in a saved graph.
    return tf.cast(tf.gather(palette_bgrx, [2, 1, 0], axis=1), tf.uint8)


# --- resize -----------------------------------------------------------------------------------------


def resize_window(window, kind, palette, image_plan: DecodePlan):
    """The plan's output part of the resized image (stored orientation), uint8 [out_h, out_w, 3].

    Gray and RGB windows are resized as they are (ScaleAndTranslate reads
    uint8; its only buffer is [out_h, window width] floats), gray made RGB
    after. Windows that need converting first (alpha, palette, a fourth
    BMP byte) are done band by band of output rows, each band from only the
    source rows it needs, so the conversion never copies the whole image.
    """
    channels = tf.shape(window)[2]
    as_they_are = (kind == _CHANNELS_AS_DECODED) & ((channels == 1) | (channels == 3))
    resized = tf.cond(
        as_they_are,
        lambda: _resize_whole_window(window, image_plan),
        lambda: _resize_window_in_bands(window, kind, palette, image_plan),
    )
    resized = tf.gather(resized, tf.where(tf.shape(resized)[2] == 1, [0, 0, 0], [0, 1, 2]), axis=2)
    # Half up, as PIL rounds (tf.round rounds half to even).
    return tf.cast(tf.floor(tf.clip_by_value(resized, 0.0, 255.0) + 0.5), tf.uint8)


def _scales(image_plan):
    """tf.image.resize's scales: float32(new) / float32(old), rows then columns."""
    return (
        tf.cast(image_plan.resized_height, tf.float32) / tf.cast(image_plan.decoded_height, tf.float32),
        tf.cast(image_plan.resized_width, tf.float32) / tf.cast(image_plan.decoded_width, tf.float32),
    )


def _resize_whole_window(window, image_plan):
    row_scale, column_scale = _scales(image_plan)
    resized = tf.raw_ops.ScaleAndTranslate(
        images=window[None],
        size=tf.cast(tf.stack([image_plan.output_height, image_plan.output_width]), tf.int32),
        scale=tf.stack([row_scale, column_scale]),
        translation=tf.stack(
            [
                _translation(image_plan.window[0], row_scale, image_plan.output_top),
                _translation(image_plan.window[1], column_scale, image_plan.output_left),
            ]
        ),
        kernel_type="triangle",
        antialias=True,
    )
    return tf.ensure_shape(resized[0], [None, None, None])


def _resize_window_in_bands(window, kind, palette, image_plan):
    window_height = tf.cast(tf.shape(window)[0], tf.int64)
    window_width = tf.cast(tf.shape(window)[1], tf.int64)
    top, left = image_plan.window[0], image_plan.window[1]
    row_scale, column_scale = _scales(image_plan)
    output_height, output_width = image_plan.output_height, image_plan.output_width
    # Output rows per band: as many as keep the band's source rows under _BAND_SOURCE_PIXELS.
    row_scale_64 = tf.cast(row_scale, tf.float64)
    reach = tf.maximum(1.0 / row_scale_64, 1.0)
    rows_that_fit = tf.cast(_BAND_SOURCE_PIXELS, tf.float64) / tf.cast(
        tf.maximum(window_width, 1), tf.float64
    )
    band_rows = tf.clip_by_value(
        tf.cast(tf.math.floor((rows_that_fit - 2 * reach - 4) * row_scale_64), tf.int64), 1, output_height
    )
    num_bands = (output_height + band_rows - 1) // band_rows
    column_translation = _translation(left, column_scale, image_plan.output_left)

    def resize_band(band_index, bands):
        first_row = band_index * band_rows
        end_row = tf.minimum(first_row + band_rows, output_height)
        source_first, source_end = _source_span(
            image_plan.output_top + first_row,
            end_row - first_row,
            image_plan.resized_height,
            image_plan.decoded_height,
        )
        source_first = tf.clip_by_value(source_first - top, 0, window_height)
        source_end = tf.clip_by_value(source_end - top, source_first, window_height)
        band = _to_rgb(window[source_first:source_end], kind, palette)
        resized = tf.raw_ops.ScaleAndTranslate(
            images=band[None],
            size=tf.cast(tf.stack([end_row - first_row, output_width]), tf.int32),
            scale=tf.stack([row_scale, column_scale]),
            translation=tf.stack(
                [
                    _translation(top + source_first, row_scale, image_plan.output_top + first_row),
                    column_translation,
                ]
            ),
            kernel_type="triangle",
            antialias=True,
        )
        return band_index + 1, bands.write(tf.cast(band_index, tf.int32), resized[0])

    bands = tf.TensorArray(
        tf.float32, size=tf.cast(num_bands, tf.int32), infer_shape=False, element_shape=[None, None, 3]
    )
    _, bands = tf.while_loop(
        lambda index, _: index < num_bands, resize_band, (tf.constant(0, tf.int64), bands)
    )
    return tf.ensure_shape(bands.concat(), [None, None, 3])


def _translation(source_start, scale, output_start):
    """ScaleAndTranslate's translation making output pixel 0 the resized pixel `output_start`, from a
    source starting at `source_start` (computed in float64: the two terms can be millions)."""
    return tf.cast(
        tf.cast(source_start, tf.float64) * tf.cast(scale, tf.float64) - tf.cast(output_start, tf.float64),
        tf.float32,
    )


def _to_rgb(band, kind, palette):
    """[rows, width, channels] uint8 as decoded -> [rows, width, 3] uint8 RGB."""
    return tf.switch_case(
        kind,
        [
            lambda: _composite_onto_background(band),
            lambda: tf.gather(palette, tf.cast(band[:, :, 0], tf.int32)),
            lambda: band[:, :, :3],
        ],
    )


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
