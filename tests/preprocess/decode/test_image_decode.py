"""Stage 1's per-image decode: formats, colour modes, orientation, geometry, bad input."""

import io
import json
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from dataset_contract import geometry
from preprocess import errors
from preprocess.decode.image import decode_image, load_image, resize_image, sniff_format
from tests.exif import orientation_exif, stored_for_orientation

MAX_PIXELS = 50_000_000


def encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def quadrants(height: int = 32, width: int = 48) -> np.ndarray:
    """An upright test picture: red, green / blue, white quadrants (top-left is red)."""
    image = np.empty((height, width, 3), np.uint8)
    half_height, half_width = height // 2, width // 2
    image[:half_height, :half_width] = (255, 0, 0)
    image[:half_height, half_width:] = (0, 255, 0)
    image[half_height:, :half_width] = (0, 0, 255)
    image[half_height:, half_width:] = (255, 255, 255)
    return image


def gradient(height: int, width: int) -> np.ndarray:
    """A smooth photo-like image (no sharp edges, so lossy codecs stay close)."""
    rows, columns = np.mgrid[:height, :width]
    return np.stack(
        [
            columns * 255 // max(width - 1, 1),
            rows * 255 // max(height - 1, 1),
            (rows + columns) * 127 // (height + width),
        ],
        axis=-1,
    ).astype(np.uint8)


def decode(data: bytes, **options) -> np.ndarray:
    return decode_image(data, max_pixels=MAX_PIXELS, **options)


def reason_for(data: bytes, **options) -> str:
    with pytest.raises(errors.ImageError) as raised:
        load_image(data, size=16, method=geometry.CROP, max_pixels=options.pop("max_pixels", MAX_PIXELS))
    return raised.value.reason


def png_with_declared_size(width: int, height: int) -> bytes:
    """A real 1x1 PNG whose IHDR claims width x height (with a valid CRC)."""
    data = bytearray(encode(Image.new("RGB", (1, 1)), "PNG"))
    ihdr = data[12:29]  # type + 13 bytes of data
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    return bytes(data)


# --- formats ---------------------------------------------------------------------------------------

FORMAT_SAMPLES = {
    "jpeg": ("JPEG", {"quality": 95}),
    "png": ("PNG", {}),
    "gif": ("GIF", {}),
    "bmp": ("BMP", {}),
    "webp": ("WEBP", {"lossless": True}),
}


@pytest.mark.parametrize("name", sorted(FORMAT_SAMPLES))
def test_sniff_format_recognises_each_format_by_its_magic_bytes(name):
    pil_format, options = FORMAT_SAMPLES[name]
    assert sniff_format(encode(Image.fromarray(quadrants()), pil_format, **options)) == name


def test_png_bytes_in_a_file_named_jpg_are_recognised_and_decoded_as_png(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(encode(Image.fromarray(quadrants()), "PNG"))
    data = path.read_bytes()
    assert sniff_format(data) == "png"
    np.testing.assert_array_equal(decode(data), quadrants())


def test_sniff_format_returns_none_for_unknown_content():
    assert sniff_format(b"%PDF-1.7 not an image") is None
    assert sniff_format(b"") is None


@pytest.mark.parametrize("name", sorted(FORMAT_SAMPLES))
def test_each_format_decodes_to_its_rgb_pixels(name):
    pil_format, options = FORMAT_SAMPLES[name]
    decoded = decode(encode(Image.fromarray(quadrants()), pil_format, **options))
    assert decoded.dtype == np.uint8 and decoded.shape == (32, 48, 3)
    tolerance = 8 if name == "jpeg" else 0  # JPEG ringing at the quadrant edges
    assert np.abs(decoded.astype(int) - quadrants()).mean() <= tolerance


def test_lossy_webp_decodes_close_to_its_source():
    source = gradient(40, 60)
    decoded = decode(encode(Image.fromarray(source), "WEBP", quality=95))
    assert decoded.shape == (40, 60, 3)
    assert np.abs(decoded.astype(int) - source).mean() < 3


def test_gif_decodes_the_first_frame_of_an_animation():
    frames = [Image.new("RGB", (8, 8), colour) for colour in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    np.testing.assert_array_equal(decode(data), np.full((8, 8, 3), (255, 0, 0), np.uint8))


# --- colour modes ----------------------------------------------------------------------------------


def test_fully_transparent_rgba_becomes_the_white_background():
    data = encode(Image.new("RGBA", (4, 4), (255, 0, 0, 0)), "PNG")
    np.testing.assert_array_equal(decode(data), np.full((4, 4, 3), 255, np.uint8))


def test_half_transparent_rgba_is_blended_onto_white():
    data = encode(Image.new("RGBA", (4, 4), (255, 0, 0, 128)), "PNG")
    np.testing.assert_array_equal(decode(data)[0, 0], (255, 127, 127))


def test_gray_with_alpha_is_blended_onto_white():
    data = encode(Image.new("LA", (4, 4), (0, 64)), "PNG")
    np.testing.assert_array_equal(decode(data)[0, 0], (191, 191, 191))


def test_grayscale_becomes_equal_rgb_channels():
    np.testing.assert_array_equal(decode(encode(Image.new("L", (4, 4), 77), "PNG"))[0, 0], (77, 77, 77))


def test_bilevel_becomes_black_and_white():
    image = Image.new("1", (4, 4), 0)
    image.putpixel((0, 0), 1)
    decoded = decode(encode(image, "PNG"))
    np.testing.assert_array_equal(decoded[0, 0], (255, 255, 255))
    np.testing.assert_array_equal(decoded[1, 1], (0, 0, 0))


def palette_image() -> Image.Image:
    image = Image.fromarray(np.array([[0, 1], [2, 1]], np.uint8), "P")
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255])
    return image


def test_palette_image_becomes_its_palette_colours():
    np.testing.assert_array_equal(
        decode(encode(palette_image(), "PNG")), [[[255, 0, 0], [0, 255, 0]], [[0, 0, 255], [0, 255, 0]]]
    )


@pytest.mark.parametrize("pil_format", ["PNG", "GIF"])
def test_palette_transparency_becomes_the_white_background(pil_format):
    decoded = decode(encode(palette_image(), pil_format, transparency=1))
    np.testing.assert_array_equal(decoded, [[[255, 0, 0], [255, 255, 255]], [[0, 0, 255], [255, 255, 255]]])


def test_rgb_colour_key_transparency_becomes_the_white_background():
    pixels = np.zeros((2, 2, 3), np.uint8)
    pixels[0, 0] = (10, 20, 30)
    decoded = decode(encode(Image.fromarray(pixels), "PNG", transparency=(10, 20, 30)))
    np.testing.assert_array_equal(decoded[0, 0], (255, 255, 255))
    np.testing.assert_array_equal(decoded[1, 1], (0, 0, 0))


def test_cmyk_jpeg_red_decodes_to_red():
    # PIL writes CMYK JPEGs Adobe-style (inverted), which exercises that path too.
    data = encode(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG", quality=95)
    assert b"Adobe" in data
    assert np.abs(decode(data).astype(int) - (255, 0, 0)).max() <= 2


def test_sixteen_bit_gray_png_keeps_the_high_byte_instead_of_clipping():
    data = encode(Image.fromarray(np.full((4, 4), 0x12FF, np.uint16)), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    np.testing.assert_array_equal(decode(data)[0, 0], (0x12, 0x12, 0x12))


def test_bmp_alpha_is_ignored():
    data = encode(Image.new("RGBA", (4, 4), (10, 20, 30, 0)), "BMP")
    np.testing.assert_array_equal(decode(data)[0, 0], (10, 20, 30))


# --- EXIF orientation ------------------------------------------------------------------------------


@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_exif_orientation_turns_the_image_upright(orientation):
    stored = stored_for_orientation(quadrants(), orientation)
    data = encode(Image.fromarray(stored), "JPEG", quality=95, exif=orientation_exif(orientation))
    decoded = decode(data)
    assert decoded.shape == quadrants().shape
    assert np.abs(decoded.astype(int) - quadrants()).mean() < 8
    # The red quadrant is top-left, where an upright view puts it.
    assert np.abs(decoded[4, 4].astype(int) - (255, 0, 0)).max() < 16


@pytest.mark.parametrize("pil_format, options", [("PNG", {}), ("WEBP", {"lossless": True})])
def test_png_and_webp_exif_orientation_turns_the_image_upright(pil_format, options):
    stored = stored_for_orientation(quadrants(), 6)
    data = encode(Image.fromarray(stored), pil_format, exif=orientation_exif(6), **options)
    np.testing.assert_array_equal(decode(data), quadrants())


def test_png_exif_after_the_image_data_is_ignored_as_the_serving_parser_does():
    # The serving signature's chunk walk stops at IDAT, so stage 1 reads the
    # orientation before loading the pixels (which is when PIL reads later chunks).
    stored = stored_for_orientation(quadrants(), 6)
    data = encode(Image.fromarray(stored), "PNG")
    tiff = orientation_exif(6).tobytes()[len(b"Exif\x00\x00") :]
    chunk = struct.pack(">I", len(tiff)) + b"eXIf" + tiff + struct.pack(">I", zlib.crc32(b"eXIf" + tiff))
    end_of_header = 8 + 25  # signature + IHDR chunk
    np.testing.assert_array_equal(decode(data[:end_of_header] + chunk + data[end_of_header:]), quadrants())
    np.testing.assert_array_equal(decode(data[:-12] + chunk + data[-12:]), stored)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")
def test_garbage_exif_is_treated_as_upright():
    image = Image.fromarray(quadrants())
    data = encode(image, "JPEG", quality=95, exif=b"Exif\x00\x00MM\x00*\xff\xff\xff\xff garbage")
    assert np.abs(decode(data).astype(int) - quadrants()).mean() < 8


def test_out_of_range_orientation_is_treated_as_upright():
    data = encode(Image.fromarray(quadrants()), "PNG", exif=orientation_exif(9))
    np.testing.assert_array_equal(decode(data), quadrants())


# --- resize geometry -------------------------------------------------------------------------------


def bands(height: int, width: int, axis: int) -> np.ndarray:
    """Three equal bands red / green / blue along `axis` (0: top to bottom, 1: left to right)."""
    image = np.zeros((height, width, 3), np.uint8)
    length = image.shape[axis]
    for band, channel in enumerate(range(3)):
        index = [slice(None), slice(None)]
        index[axis] = slice(band * length // 3, (band + 1) * length // 3)
        image[tuple(index) + (channel,)] = 255
    return image


@pytest.mark.parametrize("height, width, axis", [(300, 100, 0), (100, 300, 1)])
def test_crop_keeps_the_center_of_a_tall_or_wide_image(height, width, axis):
    resized = resize_image(bands(height, width, axis), 30, geometry.CROP)
    assert resized.shape == (30, 30, 3) and resized.dtype == np.uint8
    # The long side was scaled to 90 and its middle third (the green band)
    # kept; the antialiasing filter lets a little of the neighbours in at the edges.
    assert resized[:, :, 1].min() >= 200
    assert resized[:, :, [0, 2]].max() <= 60


def _whole_resize_then_crop(image: np.ndarray, size: int) -> np.ndarray:
    height, width = image.shape[:2]
    target_height, target_width = geometry.resized_shape(height, width, size, geometry.CROP)
    whole = np.asarray(
        Image.fromarray(image).resize((target_width, target_height), Image.Resampling.BILINEAR)
    )
    top, left = geometry.crop_offsets(target_height, target_width, size)
    return whole[top : top + size, left : left + size]


@pytest.mark.parametrize("height, width", [(3, 2000), (1500, 7), (40, 900), (1, 700)])
def test_a_long_thin_image_is_cropped_as_if_resized_whole(height, width):
    """Past 4 windows' worth, only the window is resized: the pixels are those of the whole resize."""
    rng = np.random.default_rng(height * width)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    resized = resize_image(image, 32, geometry.CROP)
    assert resized.shape == (32, 32, 3)
    difference = np.abs(resized.astype(int) - _whole_resize_then_crop(image, 32).astype(int))
    assert difference.max() <= 1  # float rounding of the window's coordinates, at most


def test_a_1x65500_jpeg_is_cropped_at_224_in_bounded_memory(tmp_path):
    """Resized whole, its crop would need a 224 x 14.7M px intermediate, 9.9 GB."""
    path = tmp_path / "thin.jpg"
    Image.fromarray(np.full((1, 65500, 3), 90, np.uint8)).save(path, "JPEG")
    script = (
        "import json, resource\n"
        "from preprocess.decode.image import load_image\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"pixels = load_image(open({str(path)!r}, 'rb').read(), size=224, method='crop', max_pixels=10**8)\n"
        "grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(json.dumps({'shape': pixels.shape, 'mean': float(pixels.mean()), 'grown_mib': grown_kib / 1024}))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout)
    assert result["shape"] == [224, 224, 3] and abs(result["mean"] - 90) <= 2
    assert result["grown_mib"] < 100, result


def test_pad_letterboxes_a_wide_image_with_black_bars_and_centers_it():
    resized = resize_image(np.full((100, 200, 3), 200, np.uint8), 64, geometry.PAD)
    assert resized.shape == (64, 64, 3)
    # resized to 32 x 64, placed at row 16
    assert resized[:16].max() == geometry.PAD_VALUE and resized[48:].max() == geometry.PAD_VALUE
    np.testing.assert_array_equal(resized[16:48], 200)


def test_pad_letterboxes_a_tall_image_with_black_bars_and_centers_it():
    resized = resize_image(np.full((150, 50, 3), 200, np.uint8), 60, geometry.PAD)
    assert resized.shape == (60, 60, 3)
    # resized to 60 x 20, placed at column 20
    assert resized[:, :20].max() == geometry.PAD_VALUE and resized[:, 40:].max() == geometry.PAD_VALUE
    np.testing.assert_array_equal(resized[:, 20:40], 200)


@pytest.mark.parametrize("method", geometry.RESIZE_METHODS)
def test_small_images_are_upscaled_to_the_target_size(method):
    resized = resize_image(quadrants(8, 12), 64, method)
    assert resized.shape == (64, 64, 3)


def test_load_image_is_decode_then_resize():
    data = encode(Image.fromarray(gradient(90, 130)), "PNG")
    np.testing.assert_array_equal(
        load_image(data, size=40, method=geometry.PAD, max_pixels=MAX_PIXELS),
        resize_image(decode(data), 40, geometry.PAD),
    )


# --- JPEG DCT scaling (draft) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def large_jpeg() -> bytes:
    return encode(Image.fromarray(gradient(3000, 4000)), "JPEG", quality=90)


def test_large_jpeg_is_decoded_at_reduced_dct_scale_when_a_small_target_is_given(large_jpeg):
    assert decode(large_jpeg, target_size=224, method=geometry.CROP).shape == (375, 500, 3)  # 1/8
    assert decode(large_jpeg).shape == (3000, 4000, 3)


def test_reduced_scale_decode_still_matches_a_full_decode_after_resize(large_jpeg):
    for method in geometry.RESIZE_METHODS:
        scaled = load_image(large_jpeg, size=224, method=method, max_pixels=MAX_PIXELS).astype(int)
        full = resize_image(decode(large_jpeg), 224, method).astype(int)
        assert np.abs(scaled - full).mean() < 1.0
        assert np.abs(scaled - full).max() <= 4


@pytest.mark.parametrize("method", geometry.RESIZE_METHODS)
@pytest.mark.parametrize("width, height", [(1000, 700), (700, 1000), (2001, 1999), (640, 480), (5000, 900)])
def test_reduced_scale_never_goes_below_what_the_resize_needs(width, height, method):
    data = encode(Image.new("RGB", (width, height), (90, 90, 90)), "JPEG", quality=50)
    decoded_height, decoded_width = decode(data, target_size=224, method=method).shape[:2]
    needed_height, needed_width = geometry.resized_shape(height, width, 224, method)
    assert decoded_height >= needed_height and decoded_width >= needed_width


def test_reduced_scale_decode_of_a_rotated_jpeg_is_upright():
    stored = stored_for_orientation(gradient(1200, 1600), 6)  # stored 1600 high, 1200 wide
    data = encode(Image.fromarray(stored), "JPEG", quality=90, exif=orientation_exif(6))
    decoded = decode(data, target_size=100, method=geometry.CROP)
    assert decoded.shape == (150, 200, 3)  # 1/8 of the upright 1200 x 1600
    reference = resize_image(gradient(1200, 1600), 100, geometry.CROP).astype(int)
    assert (
        np.abs(load_image(data, size=100, method=geometry.CROP, max_pixels=MAX_PIXELS) - reference).mean() < 2
    )


# --- bad input -------------------------------------------------------------------------------------


def test_empty_file_is_refused_as_empty_file():
    assert reason_for(b"") == errors.EMPTY_FILE


def test_random_bytes_are_refused_as_not_an_image():
    assert reason_for(np.random.default_rng(0).bytes(1000)) == errors.NOT_AN_IMAGE


def test_a_header_claiming_too_many_pixels_is_refused_before_decoding():
    data = png_with_declared_size(100_000, 100_000)
    start = time.perf_counter()
    assert reason_for(data) == errors.TOO_MANY_PIXELS
    # PIL's own guard refuses it at open too, whatever max_pixels says.
    assert reason_for(data, max_pixels=10**12) == errors.TOO_MANY_PIXELS
    assert time.perf_counter() - start < 1.0


def test_an_image_over_max_pixels_is_refused_as_too_many_pixels():
    data = png_with_declared_size(5000, 4000)
    assert reason_for(data, max_pixels=19_999_999) == errors.TOO_MANY_PIXELS


@pytest.mark.parametrize("name", sorted(FORMAT_SAMPLES))
def test_data_cut_in_the_middle_is_refused_as_truncated(name):
    pil_format, options = FORMAT_SAMPLES[name]
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = encode(Image.fromarray(noise), pil_format, **options)
    assert reason_for(data[: len(data) // 2]) == errors.TRUNCATED


@pytest.mark.parametrize("cut", [4, 20, 40])
def test_data_cut_inside_the_header_is_refused_as_truncated(cut):
    data = encode(Image.fromarray(quadrants()), "JPEG")
    assert reason_for(data[:cut]) == errors.TRUNCATED


def test_a_corrupt_header_after_valid_magic_bytes_is_a_decode_error():
    assert reason_for(b"\x89PNG\r\n\x1a\n" + b"\x00" * 200) == errors.DECODE_ERROR


def test_errors_carry_a_human_readable_detail():
    with pytest.raises(errors.ImageError) as raised:
        load_image(b"\xff\xd8\xff\xe0", size=16, method=geometry.CROP, max_pixels=MAX_PIXELS)
    assert "jpeg" in raised.value.detail
