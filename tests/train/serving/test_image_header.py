"""In-graph header inspection: sizes as PIL reads them, problems named as stage 1 names them, never an error."""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests.exif import orientation_exif
from train.serving import image_header
from train.serving.image_header import PROBLEMS


def encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def photo(height=60, width=90) -> Image.Image:
    rows, columns = np.mgrid[:height, :width]
    return Image.fromarray(
        np.stack([columns * 255 // width, rows * 255 // height, (rows * columns) % 256], -1).astype(np.uint8)
    )


def frames(count=3, size=(90, 60)):
    return [Image.new("RGB", size, (40 * index, 200 - 40 * index, 90)) for index in range(count)]


FILES = {
    "jpeg": lambda: encode(photo(), "JPEG"),
    "jpeg_progressive": lambda: encode(photo(), "JPEG", progressive=True),
    "jpeg_gray": lambda: encode(photo().convert("L"), "JPEG"),
    "jpeg_cmyk": lambda: encode(photo().convert("CMYK"), "JPEG"),
    "jpeg_exif": lambda: encode(photo(), "JPEG", exif=orientation_exif(6)),
    "png": lambda: encode(photo(), "PNG"),
    "png_rgba": lambda: encode(photo().convert("RGBA"), "PNG"),
    "png_palette": lambda: encode(photo().convert("P"), "PNG"),
    "png_16_bit": lambda: encode(Image.fromarray(np.full((60, 90), 40000, np.uint16)), "PNG"),
    "gif": lambda: encode(photo().convert("P"), "GIF"),
    "gif_animated": lambda: encode(frames()[0], "GIF", save_all=True, append_images=frames()[1:]),
    "bmp": lambda: encode(photo(), "BMP"),
    "bmp_8_bit": lambda: encode(photo().convert("P"), "BMP"),
    "bmp_32_bit": lambda: encode(photo().convert("RGBA"), "BMP"),
    "webp": lambda: encode(photo(), "WEBP"),
    "webp_lossless": lambda: encode(photo(), "WEBP", lossless=True),
    "webp_extended": lambda: encode(photo(), "WEBP", exif=orientation_exif(6)),
    "webp_animated": lambda: encode(
        frames()[0], "WEBP", save_all=True, append_images=frames()[1:], lossless=True
    ),
}


@pytest.fixture(scope="module")
def inspect():
    """image_header.inspect traced once (as the signature runs it); returns numpy values."""
    traced = tf.function(
        image_header.inspect, input_signature=[tf.TensorSpec([], tf.string)], autograph=False
    )

    def run(data: bytes) -> image_header.ImageHeader:
        return image_header.ImageHeader(*(value.numpy() for value in traced(tf.constant(data))))

    return run


def problem_of(header) -> str:
    return PROBLEMS[header.problem]


@pytest.mark.parametrize("name", sorted(FILES))
def test_size_is_read_from_the_header_as_pil_reads_it(inspect, name):
    data = FILES[name]()
    header = inspect(data)
    assert problem_of(header) == "", header.detail
    with Image.open(io.BytesIO(data)) as image:
        assert (header.width, header.height) == image.size


def test_a_progressive_jpeg_needs_all_its_coefficients_and_a_baseline_one_none(inspect):
    # 800x600, 4:2:0: luma 100x76 blocks (padded to the 2x2 sampling), chroma 50x38 each, 128 bytes a block.
    progressive = inspect(encode(photo(600, 800), "JPEG", progressive=True))
    assert progressive.decode_bytes == (100 * 76 + 2 * 50 * 38) * 128
    assert inspect(encode(photo(600, 800), "JPEG")).decode_bytes == 0


def test_decode_memory_per_pixel_follows_the_format(inspect):
    pixels = 60 * 90
    assert inspect(FILES["png"]()).decode_bytes == 3 * pixels
    assert inspect(FILES["png_rgba"]()).decode_bytes == 4 * pixels
    assert inspect(FILES["webp_lossless"]()).decode_bytes == (3 + 4) * pixels  # libwebp's ARGB copy too
    assert (
        inspect(FILES["gif_animated"]()).decode_bytes == 3 * pixels + pixels
    )  # canvas + one frame's indices


@pytest.mark.parametrize(
    "name, cut, problem",
    [
        ("jpeg", 30, "truncated"),
        ("png", 20, "truncated"),
        ("gif", 12, "truncated"),
        ("gif", 800, "truncated"),  # inside the first frame's data
        ("bmp", 1000, "truncated"),
        ("webp", 100, "truncated"),
    ],
)
def test_data_ending_early_is_named_truncated_from_the_header(inspect, name, cut, problem):
    header = inspect(FILES[name]()[:cut])
    assert problem_of(header) == problem, header.detail


def test_a_jpeg_without_its_end_marker_looks_truncated(inspect):
    data = FILES["jpeg"]()
    assert not inspect(data).looks_truncated
    assert inspect(data[: len(data) // 2]).looks_truncated


def test_unknown_and_empty_content_get_stage_ones_reasons(inspect):
    assert problem_of(inspect(b"")) == "empty_file"
    header = inspect(b"%PDF-1.7 not an image")
    assert problem_of(header) == "not_an_image"
    assert header.detail.decode().endswith("0x255044462d312e37")
    assert header.image_format == image_header.UNKNOWN


def payload_image(inspect, data) -> Image.Image:
    image = Image.open(io.BytesIO(inspect(data).payload))
    image.load()
    return image


def test_a_gif_is_handed_to_the_decoder_cut_after_its_first_frame(inspect):
    data = FILES["gif_animated"]()
    with Image.open(io.BytesIO(data)) as original:
        assert original.n_frames == 3
        first = np.asarray(original.convert("RGB"))
    cut = payload_image(inspect, data)
    assert getattr(cut, "n_frames", 1) == 1
    np.testing.assert_array_equal(np.asarray(cut.convert("RGB")), first)


def test_an_animated_webp_is_handed_to_the_decoder_as_its_first_frame(inspect):
    data = FILES["webp_animated"]()
    still = payload_image(inspect, data)
    assert not getattr(still, "is_animated", False)
    with Image.open(io.BytesIO(data)) as original:
        np.testing.assert_array_equal(np.asarray(still.convert("RGB")), np.asarray(original.convert("RGB")))


def test_a_png_cut_inside_its_end_chunk_gets_a_whole_one(inspect):
    data = FILES["png"]()
    header = inspect(data[:-6])
    assert problem_of(header) == "" and header.looks_truncated
    np.testing.assert_array_equal(np.asarray(payload_image(inspect, data[:-6])), np.asarray(photo()))


def test_bytes_after_a_bmps_pixels_are_dropped(inspect):
    data = FILES["bmp"]()
    assert inspect(data + b"\x00" * 50).payload == data


@pytest.mark.parametrize(
    "data, detail",
    [
        (lambda: encode(photo(), "BMP")[:14] + b"\x0c" + b"\x00" * 80, "OS/2"),
        (lambda: encode(Image.new("1", (90, 60)), "BMP"), "1-bit BMP"),
        (
            lambda: encode(photo(), "PNG")[:25] + b"\x07" + encode(photo(), "PNG")[26:],
            "bit depth 8 with colour type 7",
        ),
        (lambda: b"\xff\xd8\xff\xc3\x00\x0b\x08\x00\x10\x00\x10\x01\x01\x11\x00\xff\xda", "SOF3"),
    ],
)
def test_what_the_decoder_cannot_take_is_a_decode_error_before_decoding(inspect, data, detail):
    header = inspect(data())
    assert problem_of(header) == "decode_error"
    assert detail in header.detail.decode()


def test_no_content_makes_inspection_raise(inspect):
    """Garbage after each magic number, and random damage to real files: always an answer, never an error."""
    rng = np.random.default_rng(0)
    samples = [FILES[name]() for name in sorted(FILES)]
    inputs = [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"BM", b"RIFF\x00\x00\x00\x00WEBP"]
    inputs = [
        magic + rng.integers(0, 256, length, dtype=np.uint8).tobytes()
        for magic in inputs
        for length in (0, 3, 40, 400)
    ]
    for data in samples:
        for _ in range(8):
            damaged = bytearray(data)
            for position in rng.integers(0, len(data), 6):
                damaged[position] = rng.integers(0, 256)
            inputs.append(bytes(damaged[: rng.integers(1, len(data) + 1)]))
    for data in inputs:
        header = inspect(data)
        assert 0 <= header.problem < len(PROBLEMS)
        assert header.decode_bytes >= 0 or header.problem != 0


def test_a_zero_sampling_factor_is_a_decode_error_not_a_division_by_zero(inspect):
    data = bytearray(FILES["jpeg"]())
    frame = data.index(b"\xff\xc0")
    data[frame + 11] = 0x00  # the first component's sampling factors
    header = inspect(bytes(data))
    assert problem_of(header) == "decode_error" and header.detail == b"invalid sampling factors"


def test_an_animated_webp_whose_first_frame_leaves_canvas_uncovered_is_refused_before_decoding(inspect):
    # TF's own decoder crashes the process on animated WebP: such a file must never reach it.
    data = bytearray(FILES["webp_animated"]())
    frame = data.index(b"ANMF")
    data[frame + 14 : frame + 17] = (44).to_bytes(3, "little")  # frame width 45 of a 90-wide canvas
    header = inspect(bytes(data))
    assert problem_of(header) == "decode_error"
    assert b"does not cover the canvas" in header.detail


def test_the_reason_codes_are_stage_ones():
    from preprocess import errors  # noqa: PLC0415

    assert [reason for reason in PROBLEMS if reason] == [
        errors.EMPTY_FILE,
        errors.NOT_AN_IMAGE,
        errors.TRUNCATED,
        errors.DECODE_ERROR,
        errors.TOO_MANY_PIXELS,
        errors.TOO_LARGE,
    ]
    assert set(PROBLEMS[1:]) <= set(errors.REASONS)
