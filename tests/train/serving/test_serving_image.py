"""The serving signature's decode/resize gives stage 1's pixels, from graph ops only; a batch gives per-image results.

Tolerance, per image, against `preprocess.decode.image.load_image` on the same
bytes: mean absolute difference <= MEAN_TOLERANCE and every pixel within
MAX_TOLERANCE levels. Measured: max 1, mean <= 0.2 (PIL rounds to 8 bits
between its two resize passes, TF does not; TF's CMYK conversion rounds
differently). `decode_batch` gives every image its own result: stage 1's
reason for what it refuses (truncated files cut from real ones, corrupt
streams, limits), stage 1's pixels for what it accepts, damaged or not, and
never an error for the batch.
"""

import functools
import io
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from dataset_contract import geometry
from preprocess.decode.image import load_image
from preprocess.errors import ImageError
from tests.exif import orientation_exif, stored_for_orientation
from train.serving.decode import ServingLimits, decode_and_resize, decode_batch

SIZE = 48
MEAN_TOLERANCE = 0.5
MAX_TOLERANCE = 2

# Some cases carry deliberately broken EXIF; PIL warns about it, as expected.
pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")


def encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def photo(height: int = 60, width: int = 90) -> np.ndarray:
    """A smooth gradient with a red block near the top-left corner (asymmetric on purpose)."""
    rows, columns = np.mgrid[:height, :width]
    image = np.stack(
        [columns * 255 // width, rows * 255 // height, (rows + columns) * 255 // (height + width)], axis=-1
    ).astype(np.uint8)
    image[height // 10 : height // 3, width // 10 : width // 4] = (255, 0, 0)
    return image


def tiff_with_orientation(byte_order: str = "<", field_type: int = 3, value: int = 6) -> bytes:
    """A minimal EXIF TIFF block: IFD0 with one Orientation entry of the given type."""
    value_bytes = {1: struct.pack(byte_order + "B3x", value), 3: struct.pack(byte_order + "H2x", value)}.get(
        field_type, struct.pack(byte_order + "I", value)
    )
    header = (b"II*\x00" if byte_order == "<" else b"MM\x00*") + struct.pack(byte_order + "I", 8)
    entry = struct.pack(byte_order + "HHI", 0x0112, field_type, 1) + value_bytes
    return header + struct.pack(byte_order + "H", 1) + entry + struct.pack(byte_order + "I", 0)


def jpeg_with_exif(exif: bytes | Image.Exif, orientation: int = 6) -> bytes:
    """The test photo stored for `orientation`, as a JPEG carrying `exif`."""
    stored = stored_for_orientation(photo(), orientation)
    return encode(Image.fromarray(stored), "JPEG", quality=92, exif=exif)


def png_chunk(chunk_type: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + chunk_type
        + payload
        + struct.pack(">I", zlib.crc32(chunk_type + payload))
    )


def png_with_exif_after_image_data() -> bytes:
    """Orientation 6 in an eXIf chunk placed after IDAT: ignored by both stages."""
    data = encode(Image.fromarray(photo()), "PNG")
    return data[:-12] + png_chunk(b"eXIf", tiff_with_orientation()) + data[-12:]


def palette_image() -> Image.Image:
    indices = (np.arange(60 * 90).reshape(60, 90) // 7 % 4).astype(np.uint8)
    image = Image.fromarray(indices, "P")
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 40, 40, 40])
    return image


def rgba_image() -> Image.Image:
    alpha = (np.arange(60 * 90).reshape(60, 90) % 256).astype(np.uint8)
    return Image.fromarray(np.dstack([photo(), alpha]))


def animated_gif() -> bytes:
    frames = [Image.fromarray(photo()), Image.new("RGB", (90, 60), (0, 255, 0))]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)


CASES = {
    **{
        f"jpeg_orientation_{orientation}": functools.partial(
            jpeg_with_exif, orientation_exif(orientation), orientation
        )
        for orientation in range(1, 9)
    },
    "jpeg_progressive": lambda: encode(Image.fromarray(photo()), "JPEG", quality=90, progressive=True),
    "jpeg_grayscale": lambda: encode(Image.fromarray(photo()).convert("L"), "JPEG", quality=90),
    "jpeg_cmyk": lambda: encode(Image.fromarray(photo()).convert("CMYK"), "JPEG", quality=90),
    "jpeg_large_reduced_dct_scale": lambda: encode(Image.fromarray(photo(1200, 1600)), "JPEG", quality=90),
    "jpeg_big_endian_exif": lambda: jpeg_with_exif(b"Exif\x00\x00" + tiff_with_orientation(">")),
    "jpeg_exif_long_orientation": lambda: jpeg_with_exif(b"Exif\x00\x00" + tiff_with_orientation("<", 4)),
    "jpeg_exif_orientation_of_wrong_type": lambda: jpeg_with_exif(
        b"Exif\x00\x00" + tiff_with_orientation("<", 2)
    ),
    "jpeg_exif_ifd_past_the_end": lambda: jpeg_with_exif(b"Exif\x00\x00II*\x00\xff\xff\xff\x7f"),
    "jpeg_exif_garbage": lambda: jpeg_with_exif(b"Exif\x00\x00" + bytes(range(200))),
    "png_rgb": lambda: encode(Image.fromarray(photo()), "PNG"),
    "png_rgba": lambda: encode(rgba_image(), "PNG"),
    "png_grayscale": lambda: encode(Image.fromarray(photo()).convert("L"), "PNG"),
    "png_gray_alpha": lambda: encode(rgba_image().convert("LA"), "PNG"),
    "png_palette": lambda: encode(palette_image(), "PNG"),
    "png_palette_transparency": lambda: encode(palette_image(), "PNG", transparency=1),
    "png_colour_key_transparency": lambda: encode(
        palette_image().convert("RGB"), "PNG", transparency=(0, 0, 255)
    ),
    "png_16_bit_gray": lambda: encode(Image.fromarray(photo()[:, :, 0].astype(np.uint16) * 256 + 100), "PNG"),
    "png_exif_orientation_6": lambda: encode(
        Image.fromarray(stored_for_orientation(photo(), 6)), "PNG", exif=orientation_exif(6)
    ),
    "png_exif_after_image_data": png_with_exif_after_image_data,
    "gif": lambda: encode(palette_image(), "GIF"),
    "gif_transparency": lambda: encode(palette_image(), "GIF", transparency=2),
    "gif_animated_first_frame": animated_gif,
    "bmp_24_bit": lambda: encode(Image.fromarray(photo()), "BMP"),
    "bmp_8_bit_palette": lambda: encode(palette_image(), "BMP"),
    "bmp_32_bit_alpha_ignored": lambda: encode(rgba_image(), "BMP"),
    "webp_lossy": lambda: encode(Image.fromarray(photo()), "WEBP", quality=90),
    "webp_lossless_rgba": lambda: encode(rgba_image(), "WEBP", lossless=True),
    "webp_exif_orientation_6": lambda: encode(
        Image.fromarray(stored_for_orientation(photo(), 6)), "WEBP", lossless=True, exif=orientation_exif(6)
    ),
}


@functools.cache
def case_bytes(name: str) -> bytes:
    return CASES[name]()


def assert_matches_stage_one(served, data: bytes, method: str):
    expected = load_image(data, size=SIZE, method=method, max_pixels=10**8).astype(int)
    served = np.asarray(served)
    assert served.shape == (SIZE, SIZE, 3) and served.dtype == np.uint8
    difference = np.abs(served.astype(int) - expected)
    assert difference.mean() <= MEAN_TOLERANCE, difference.mean()
    assert difference.max() <= MAX_TOLERANCE, difference.max()


@pytest.mark.parametrize("method", geometry.RESIZE_METHODS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_decode_matches_stage_one(name, method):
    data = case_bytes(name)
    assert_matches_stage_one(decode_and_resize(tf.constant(data), SIZE, method), data, method)


@pytest.mark.parametrize("method", geometry.RESIZE_METHODS)
def test_decode_inside_dataset_map_matches_stage_one(method):
    names = sorted(CASES)
    dataset = tf.data.Dataset.from_tensor_slices([case_bytes(name) for name in names]).map(
        lambda image_bytes: decode_and_resize(image_bytes, SIZE, method)
    )
    assert dataset.element_spec.shape == (SIZE, SIZE, 3)
    for name, served in zip(names, dataset.as_numpy_iterator(), strict=True):
        assert_matches_stage_one(served, case_bytes(name), method)


@pytest.mark.parametrize("method", geometry.RESIZE_METHODS)
def test_batch_decode_inside_tf_function_matches_stage_one(method):
    names = sorted(CASES)
    decode = tf.function(lambda batch: decode_batch(batch, SIZE, method))
    served = decode(tf.constant([case_bytes(name) for name in names]))
    assert served.valid.numpy().all(), dict(zip(names, served.error.numpy(), strict=True))
    assert served.pixels.shape == (len(names), SIZE, SIZE, 3)
    for name, image in zip(names, served.pixels.numpy(), strict=True):
        assert_matches_stage_one(image, case_bytes(name), method)


def test_orientation_is_applied_not_ignored_by_both_stages():
    # Parity alone would also hold if both ignored EXIF; the red block must be top-left.
    served = decode_and_resize(tf.constant(case_bytes("jpeg_orientation_6")), SIZE, geometry.PAD).numpy()
    expected = load_image(
        encode(Image.fromarray(photo()), "PNG"), size=SIZE, method=geometry.PAD, max_pixels=10**8
    )
    assert np.abs(served.astype(int) - expected).mean() < 2


def test_unknown_content_is_an_invalid_argument_error_for_a_single_image():
    with pytest.raises(tf.errors.InvalidArgumentError, match="not_an_image: unrecognised content"):
        decode_and_resize(tf.constant(b"%PDF-1.7 definitely not an image"), SIZE, geometry.CROP)


def test_unknown_resize_method_is_refused_when_building():
    with pytest.raises(ValueError, match="unknown resize method"):
        decode_and_resize(tf.constant(case_bytes("png_rgb")), SIZE, "stretch")


def all_op_types(graph_def) -> set[str]:
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def test_serving_graph_has_no_python_ops():
    decode = tf.function(lambda batch: decode_batch(batch, SIZE, geometry.CROP).pixels)
    graph_def = decode.get_concrete_function(tf.TensorSpec([None], tf.string)).graph.as_graph_def()
    op_types = all_op_types(graph_def)
    assert "DecodeAndCropJpeg" in op_types  # the walk reached the function bodies (tf.data map too)
    assert not op_types & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


@pytest.mark.slow  # a second Python process importing TensorFlow: ~10 s
def test_saved_model_signature_decodes_in_a_fresh_process_without_project_code(tmp_path):
    module = tf.Module()
    module.decode = tf.function(
        lambda batch: {"image": decode_batch(batch, SIZE, geometry.CROP).pixels},
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.decode})
    names = ["jpeg_orientation_6", "png_rgba", "gif_transparency", "webp_lossy"]
    for index, name in enumerate(names):
        (tmp_path / f"{index}.img").write_bytes(case_bytes(name))
    script = textwrap.dedent(
        f"""
        import numpy as np, tensorflow as tf
        signature = tf.saved_model.load("model").signatures["serving_default"]
        batch = tf.constant([open(f"{{i}}.img", "rb").read() for i in range({len(names)})])
        np.save("served.npy", signature(batch)["image"].numpy())
        """
    )
    # cwd is the temporary directory and PYTHONPATH is unset: the project's code is not importable there.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True, capture_output=True)
    served = np.load(tmp_path / "served.npy")
    for name, image in zip(names, served, strict=True):
        assert_matches_stage_one(image, case_bytes(name), geometry.CROP)


# --- per-image results (decode_batch) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def decode_many():
    """decode_batch at SIZE, crop, traced once (the limits are inputs); returns (pixels, valid, error) as numpy."""
    traced = tf.function(
        lambda batch, max_pixels, max_decode_bytes, max_file_bytes: decode_batch(
            batch, SIZE, geometry.CROP, ServingLimits(max_pixels, max_decode_bytes, max_file_bytes)
        ),
        input_signature=[
            tf.TensorSpec([None], tf.string),
            tf.TensorSpec([], tf.int64),
            tf.TensorSpec([], tf.int64),
            tf.TensorSpec([], tf.int64),
        ],
        autograph=False,
    )

    def run(datas, limits=None):
        limits = limits or ServingLimits()
        result = traced(tf.constant(datas), limits.max_pixels, limits.max_decode_bytes, limits.max_file_bytes)
        errors = [error.decode() for error in result.error.numpy()]
        return result.pixels.numpy(), result.valid.numpy(), errors

    return run


def stage_one_reason(data: bytes) -> str:
    try:
        load_image(data, size=SIZE, method=geometry.CROP, max_pixels=10**8)
    except ImageError as error:
        return error.reason
    return ""


TRUNCATABLE = [
    "jpeg_orientation_1",
    "jpeg_progressive",
    "png_rgb",
    "png_rgba",
    "gif",
    "bmp_24_bit",
    "webp_lossy",
]


@pytest.mark.parametrize("name", TRUNCATABLE)
def test_a_real_truncated_file_is_its_own_truncated_error_as_in_stage_one(decode_many, name):
    data = case_bytes(name)
    truncated = data[: len(data) // 2]
    _, valid, errors = decode_many([data, truncated, data])
    assert valid.tolist() == [True, False, True]
    assert errors[1].split(":")[0] == stage_one_reason(truncated) == "truncated", errors[1]


@pytest.mark.parametrize(
    "name, damage",
    [
        ("png_rgb", lambda data: data[:-6]),  # cut inside IEND: PIL reads it, libpng would not
        ("png_rgba", lambda data: data[:-12]),  # no IEND at all
        ("gif", lambda data: data[:-1]),  # no trailer
        ("gif_animated_first_frame", lambda data: data[: len(data) - 40]),  # a later frame cut
        ("bmp_24_bit", lambda data: data + b"\x00" * 100),  # bytes after the pixels
        ("jpeg_orientation_1", lambda data: data + b"trailing bytes"),
    ],
)
def test_what_stage_one_accepts_despite_damage_serves_the_same_pixels(decode_many, name, damage):
    data = damage(case_bytes(name))
    assert stage_one_reason(data) == ""
    pixels, valid, errors = decode_many([data])
    assert valid[0], errors[0]
    assert_matches_stage_one(pixels[0], data, geometry.CROP)


def test_an_animated_webp_serves_its_first_frame_as_stage_one_does(decode_many):
    frames = [Image.fromarray(photo()), Image.new("RGB", (90, 60), (0, 255, 0))]
    data = encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    pixels, valid, errors = decode_many([data])
    assert valid[0], errors[0]
    assert_matches_stage_one(pixels[0], data, geometry.CROP)


def test_a_corrupt_stream_is_a_decode_error_for_that_image_only(decode_many):
    data = case_bytes("png_rgb")
    corrupt = data[: len(data) // 2] + bytes(64) + data[len(data) // 2 + 64 :]
    pixels, valid, errors = decode_many([data, corrupt])
    assert valid.tolist() == [True, False]
    assert errors[1].startswith("decode_error: the PNG decoder rejected the data")
    assert stage_one_reason(corrupt) == "decode_error"
    assert not pixels[1].any()


def test_over_the_pixel_limit_is_too_many_pixels_as_in_stage_one(decode_many):
    data = case_bytes("png_rgb")  # 90x60 = 5400 pixels
    _, valid, errors = decode_many([data], ServingLimits(max_pixels=5399))
    assert not valid[0] and errors[0] == "too_many_pixels: 90x60 = 5400 pixels > 5399"
    assert decode_many([data], ServingLimits(max_pixels=5400))[1][0]


def test_over_the_file_size_limit_is_too_large_as_in_stage_one(decode_many):
    data = case_bytes("png_rgb")
    assert decode_many([data], ServingLimits(max_file_bytes=len(data)))[1][0]
    pixels, valid, errors = decode_many([data, data], ServingLimits(max_file_bytes=len(data) - 1))
    assert valid.tolist() == [False, False] and not pixels.any()
    assert errors[0] == f"too_large: {len(data)} bytes, over the limit of {len(data) - 1} bytes"


def test_the_decode_budget_refuses_by_the_memory_the_header_implies(decode_many):
    data = case_bytes("png_rgb")  # RGB: 3 bytes a pixel
    assert decode_many([data], ServingLimits(max_decode_bytes=5400 * 3))[1][0]
    _, valid, errors = decode_many([data], ServingLimits(max_decode_bytes=5400 * 3 - 1))
    assert not valid[0] and errors[0].startswith("too_many_pixels: decoding this 90x60 PNG needs 1 MB")


def test_no_damage_to_any_file_fails_the_batch(decode_many):
    """Random bytes overwritten and cuts, in every format: each image gets a result, the batch never raises."""
    rng = np.random.default_rng(1)
    originals = [case_bytes(name) for name in sorted(CASES)]
    batch = []
    for data in originals * 2:
        damaged = bytearray(data)
        for position in rng.integers(0, len(data), 4):
            damaged[position] = rng.integers(0, 256)
        batch.append(bytes(damaged[: rng.integers(len(data) // 2, len(data) + 1)]))
    _, valid, errors = decode_many(batch)
    reasons = {error.split(":")[0] for error in errors}
    assert reasons <= {"", "truncated", "decode_error", "not_an_image", "too_many_pixels"}
    assert len(errors) == len(batch) and (valid == [error == "" for error in errors]).all()
