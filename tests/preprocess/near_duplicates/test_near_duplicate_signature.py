"""preprocess/near_duplicates/signature.py: altered copies of real photographs stay within the default distance,
distinct photographs stay far, and a signature is the same int on every call and every machine.

The photographs are the ones scikit-image and matplotlib ship (installed, never downloaded), signed after
stage 1's own decode (`load_image_with_source`: the upright source at the DCT scale a 224 resize allows), as
stage 1 signs them. The quality figures per
kind of alteration, on hundreds of images, are benchmarks/near_duplicate_quality.py's (RESULTS.md).
"""

import dataclasses
import gzip
import io
import itertools
import os
import random

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter, ImageFont

from benchmarks.near_duplicate_bands import product_image, products, same_picture
from benchmarks.near_duplicate_quality import photo_paths
from dataset_contract import geometry, image_errors
from pipelines.sample_corpus import ShapeImageParams, render_shape_image
from preprocess.decode.image import load_image, load_image_with_source
from preprocess.near_duplicates import grouping, signature
from preprocess.near_duplicates.signature import (
    CANDIDATE_BITS,
    DEFAULT_MAX_DISTANCE,
    SIGNATURE_BITS,
    distance,
    grey_hash,
    hamming,
    image_signature,
    is_low_information,
    near,
    source_signature,
)

GREY_MASK = (1 << CANDIDATE_BITS) - 1
DIGITS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "data", "digits.csv.gz")

PHOTOS = (
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "camera.png",
    "coins.png",
    "grace_hopper.jpg",
)
# A stereo pair: the same scene from two viewpoints, the hardest distinct pair of the lot.
STEREO_PAIR = ("motorcycle_left.png", "motorcycle_right.png")


def _encode(image, fmt="JPEG", **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _captioned(image):
    width, height = image.size
    band = height * 12 // 100
    captioned = image.copy()
    draw = ImageDraw.Draw(captioned)
    draw.rectangle((0, height - band, width, height), fill=(255, 255, 255))
    draw.text(
        (width // 30, height - band),
        "Photo: J. Smith",
        fill=(0, 0, 0),
        font=ImageFont.load_default(size=band * 7 // 10),
    )
    return captioned


def _letterboxed(image, share=0.12):
    bar = round(image.height * share)
    boxed = Image.new("RGB", (image.width, image.height + 2 * bar), (0, 0, 0))
    boxed.paste(image, (0, bar))
    return boxed


def _cropped(image, share=0.03):
    width, height = image.size
    dx, dy = round(width * share), round(height * share)
    return image.crop((dx, dy, width - dx, height - dy))


ALTERATIONS = {
    "jpeg q20": lambda image: _encode(image, quality=20),
    "downscale to half": lambda image: _encode(
        image.resize((image.width // 2, image.height // 2)), quality=90
    ),
    "crop 3% per side": lambda image: _encode(_cropped(image), quality=90),
    "png": lambda image: _encode(image, "PNG"),
    "brightness x1.3": lambda image: _encode(ImageEnhance.Brightness(image).enhance(1.3), quality=90),
    "darker x0.75": lambda image: _encode(ImageEnhance.Brightness(image).enhance(0.75), quality=90),
    "blur 1%": lambda image: _encode(
        image.filter(ImageFilter.GaussianBlur(min(image.size) / 100)), quality=90
    ),
    "caption band 12%": lambda image: _encode(_captioned(image), quality=90),
    "mirrored": lambda image: _encode(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), quality=90),
    "grayscale": lambda image: _encode(image.convert("L").convert("RGB"), quality=90),
    "warmer cast": lambda image: _encode(
        Image.fromarray(np.clip(np.asarray(image, np.float64) * [1.15, 1.0, 0.85], 0, 255).astype(np.uint8)),
        quality=90,
    ),
    "letterboxed": lambda image: _encode(_letterboxed(image), quality=90),
}


def _sign(data: bytes, size: int = 224) -> int:
    """As stage 1 signs: the decoded source (at the DCT scale the resize to `size` allows), not the output."""
    _, source_size, source = load_image_with_source(
        data, size=size, method=geometry.CROP, max_pixels=image_errors.DEFAULT_MAX_PIXELS
    )
    return source_signature(source, source_size)


@pytest.fixture(scope="module")
def originals():
    """{name: (the original file's bytes, its decoded image)}: each photo as a JPEG at quality 95."""
    paths = photo_paths(PHOTOS + STEREO_PAIR)
    files = {}
    for name in PHOTOS + STEREO_PAIR:
        with Image.open(paths[name]) as source:
            data = _encode(source.convert("RGB"), quality=95)
        with Image.open(io.BytesIO(data)) as decoded:
            files[name] = (data, decoded.convert("RGB"))
    return files


@pytest.fixture(scope="module")
def signatures(originals):
    return {name: _sign(data) for name, (data, _) in originals.items()}


@pytest.mark.parametrize("alteration", ALTERATIONS)
def test_altered_copies_are_within_the_default_distance(originals, signatures, alteration):
    distances = {
        name: distance(signatures[name], _sign(ALTERATIONS[alteration](image)))
        for name, (_, image) in originals.items()
        if name in PHOTOS
    }
    missed = [name for name, distance in distances.items() if distance > DEFAULT_MAX_DISTANCE]
    # A caption band covers what a crop would cut and more: found at 0.935 on the benchmark's held-out
    # photos (RESULTS.md), so one of these seven may be missed; every other alteration, none.
    assert len(missed) <= (1 if alteration == "caption band 12%" else 0), distances


def test_distinct_photos_are_far_apart(signatures):
    # Well over the threshold (the nearer of the straight and the mirrored hash): a distinct pair is not one
    # noisy copy away from being grouped.
    distances = {
        (a, b): distance(signatures[a], signatures[b]) for a, b in itertools.combinations(signatures, 2)
    }
    assert min(distances.values()) >= 2 * DEFAULT_MAX_DISTANCE, sorted(
        distances.items(), key=lambda item: item[1]
    )[:3]


def test_the_stereo_pair_is_not_a_near_duplicate(signatures):
    assert distance(*(signatures[name] for name in STEREO_PAIR)) > DEFAULT_MAX_DISTANCE


def test_a_signature_is_an_int_of_signature_bits_with_half_of_its_grey_bits_set(signatures):
    for value in signatures.values():
        assert type(value) is int and 0 <= value < 2**SIGNATURE_BITS
        # One grey bit per coefficient above the median: half of them, when no coefficient ties with it.
        assert (value & GREY_MASK).bit_count() == CANDIDATE_BITS // 2


def test_the_same_pixels_give_the_same_signature_whatever_their_memory_layout(originals):
    data, _ = originals["astronaut.png"]
    pixels = load_image(data, size=224, method=geometry.CROP, max_pixels=image_errors.DEFAULT_MAX_PIXELS)
    first = image_signature(pixels)
    assert image_signature(pixels.copy()) == first
    assert image_signature(np.asfortranarray(pixels)) == first
    assert image_signature(pixels[::-1][::-1]) == first  # a strided view
    assert all(image_signature(pixels) == first for _ in range(3))


def _synthetic_image(size=224):
    """Integer-only pixels, the same on every machine (no decoder, no resize): gradients and a disc."""
    y, x = np.mgrid[0:size, 0:size]
    disc = ((x - 140) ** 2 + (y - 90) ** 2 < 50**2) * 120
    red = (x * 255 // (size - 1) + disc) % 256
    green = (y * 255 // (size - 1)) % 256
    blue = ((x * y) // 97 + disc // 2) % 256
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def test_a_fixed_image_has_a_pinned_signature():
    # Signatures are compared across workers, machines and runs (a resumed run must find the same groups as
    # the first attempt), so any change to this value must be deliberate: it changes every dataset's groups.
    # The image is made from integers alone, so only the signature itself (PIL's grey conversion and box
    # resize, the integer tables) can move it.
    # Version 2 (grey hash + colour layout) and version 3 (+ mirrored hash, 8x8 thumbnail, low-information
    # bit, taken from a 128 px base of the source) changed it deliberately; version 1's 0x0AA5FFAC04ADCBC8 is
    # still its grey hash, the low 64 bits. Version 4 added the content box and its proportions above them
    # (this image has no uniform border: the whole 128 px base, proportions 1024 / 1024) and left the
    # version 3 bits as they were. Version 6 added the detail hash and its mirror's (the next 64 coefficients)
    # above them, and left the rest as it was (this image is no flat object: its grey hash is its own).
    value = image_signature(_synthetic_image())
    assert value & GREY_MASK == 0x0AA5FFAC04ADCBC8
    assert value & ((1 << VERSION_3_BITS) - 1) == PINNED_SIGNATURE_VERSION_3
    assert (
        value & ((1 << VERSION_6_SHIFT) - 1) == PINNED_SIGNATURE_VERSION_3 | 0x400_80800000 << VERSION_3_BITS
    )
    assert value >> VERSION_6_SHIFT == 0xFA5500542ABFF16A10EFAA017EEABBC0


VERSION_3_BITS = 897
VERSION_6_SHIFT = 946
PINNED_SIGNATURE_VERSION_3 = 0xCFC2B6BFB9AC9F92BBAFB3B3A79B8E82A7ABA09D95897E72A677718493786D628B6D647296675C527B5B515F83554B4271513E4B5B443B325E5549423B332A2286817F83837B80837A788183817E8384807D7A74817C7D76807C837A89848680A030AAFEAF089F710AA5FFAC04ADCBC8


def test_flat_images_have_low_information_and_are_near_only_when_their_pixels_agree():
    black, dark, white = (image_signature(np.full((224, 224, 3), level, np.uint8)) for level in (0, 3, 255))
    assert all(is_low_information(value) and grey_hash(value) == 0 for value in (black, dark, white))
    # The same 64 bits (all 0), yet a black and a white image are not copies of one another.
    assert near(black, dark, DEFAULT_MAX_DISTANCE) == 0
    assert near(black, white, DEFAULT_MAX_DISTANCE) is None


def _png_bytes(pixels):
    return _encode(Image.fromarray(pixels), "PNG")


def test_tiny_scans_need_equal_pixels_not_only_close_hashes():
    # scikit-learn's digits (tests/data/README.md): distinct 8x8 scans, many of whose hashes are close.
    with gzip.open(DIGITS, "rt") as handle:
        rows = np.loadtxt(handle, delimiter=",", dtype=np.int64, max_rows=300)
    scans = [(row[:64].reshape(8, 8) * 255 // 16).astype(np.uint8) for row in rows]
    signed = [_sign(_png_bytes(scan), size=32) for scan in scans]
    assert all(is_low_information(value) for value in signed)
    close = [
        (a, b)
        for a, b in itertools.combinations(range(len(signed)), 2)
        if hamming(grey_hash(signed[a]), grey_hash(signed[b])) <= DEFAULT_MAX_DISTANCE
    ]
    assert len(close) > 50  # the hash alone would join many distinct scans
    assert all(near(signed[a], signed[b], DEFAULT_MAX_DISTANCE) is None for a, b in close)
    # The same scan saved again, or upscaled to 64 px and saved as a JPEG, is a copy.
    upscaled = _encode(Image.fromarray(scans[0]).resize((64, 64), Image.Resampling.NEAREST), quality=95)
    assert near(signed[0], _sign(_png_bytes(scans[0]), size=32), DEFAULT_MAX_DISTANCE) == 0
    assert near(signed[0], _sign(upscaled, size=32), DEFAULT_MAX_DISTANCE) is not None


def test_the_signature_does_not_depend_on_the_image_size(originals):
    data, image = originals["astronaut.png"]
    png = _encode(image, "PNG")
    assert _sign(png, size=64) == _sign(png, size=96) == _sign(png, size=224)
    # A JPEG is decoded at the DCT scale each size allows: the same picture, rounded differently.
    assert near(_sign(data, size=64), _sign(data, size=96), 2) is not None


def _shape_image(**colours):
    """A star on a gentle gradient, as the sample corpus draws them: mid-tone colours, so brightening does not clip."""
    params = ShapeImageParams(
        shape="star",
        width=240,
        height=200,
        center=(110.0, 100.0),
        radius=70.0,
        angle_degrees=10.0,
        shape_color=(40, 150, 30),
        background_colors=((180, 110, 130), (200, 120, 150)),
        gradient_angle_degrees=30.0,
        noise_std=4.0,
        noise_seed=1,
    )
    return render_shape_image(dataclasses.replace(params, **colours))


def test_distinct_images_of_the_same_grey_structure_but_other_colours_are_far():
    # The sample corpus's failure of a grey-only hash: a green star on pink and a yellow star on blue, of the
    # same luminances, are one grey picture. Colour must count.
    green_on_pink = _sign(_encode(_shape_image(), quality=90))
    yellow_on_blue = _sign(
        _encode(
            _shape_image(shape_color=(120, 110, 10), background_colors=((100, 130, 220), (115, 140, 245))),
            quality=90,
        )
    )
    assert hamming(green_on_pink & GREY_MASK, yellow_on_blue & GREY_MASK) <= DEFAULT_MAX_DISTANCE
    assert distance(green_on_pink, yellow_on_blue) > DEFAULT_MAX_DISTANCE


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_a_brightness_copy_of_a_colour_image_is_near(originals, factor):
    # Brightness scales R, G and B alike: the chromaticities of the colour layout are ratios, so they hold.
    for image in (_shape_image(), originals["astronaut.png"][1]):
        original = _sign(_encode(image, quality=95))
        brighter = _sign(_encode(ImageEnhance.Brightness(image).enhance(factor), quality=90))
        assert distance(original, brighter) <= DEFAULT_MAX_DISTANCE


def test_distance_is_the_grey_hamming_distance_when_colours_agree_and_the_vectorized_one_agrees(signatures):
    values = list(signatures.values())
    values.append(values[0] ^ 0b1011)  # 3 grey bits away, same colours
    assert distance(values[0], values[-1]) == 3
    matrix = signature.pairwise_distances(values)
    for a, b in itertools.product(range(len(values)), repeat=2):
        assert matrix[a, b] == distance(values[a], values[b])


def test_pixels_that_are_not_uint8_rgb_are_refused():
    with pytest.raises(ValueError, match="uint8"):
        image_signature(np.zeros((32, 32, 3), np.float32))
    with pytest.raises(ValueError, match="uint8"):
        image_signature(np.zeros((32, 32), np.uint8))


def test_hamming_counts_differing_bits():
    assert hamming(0, 2**SIGNATURE_BITS - 1) == SIGNATURE_BITS
    assert hamming(0b1011, 0b0110) == hamming(0b0110, 0b1011) == 3
    assert hamming(12345, 12345) == 0


def test_a_table_entry_at_a_rounding_boundary_is_refused():
    # The tables are rounded once at import; an entry within 1e-6 of .5 could round differently where libm
    # differs in its last bit, so it is refused rather than left to the platform.
    with pytest.raises(AssertionError, match="rounding boundary"):
        signature._rounded(np.array([0.25, 2.5 / 4096]), 12)
    assert signature._rounded(np.array([0.25, 2.4 / 4096]), 12).tolist() == [1024, 2]


def test_the_mirrored_hashes_taken_from_one_transform_are_those_of_the_mirrored_thumbnail(originals):
    # The mirror's grey and detail hashes come from the image's own coefficients, the odd horizontal
    # frequencies negated (one DCT instead of two, the audit's cost): the same bits as transforming the
    # mirrored thumbnail, on noise, flat and two-level thumbnails and the test photos' own.
    rng = np.random.default_rng(7)
    thumbnails = [rng.integers(0, 256, (32, 32)) for _ in range(200)]
    thumbnails += [np.full((32, 32), 17), np.kron(rng.integers(0, 2, (4, 4)) * 255, np.ones((8, 8), int))]
    for _, decoded in originals.values():
        base = decoded.resize((signature.BASE_SIZE,) * 2, Image.Resampling.BOX)
        thumbnails.append(signature._region(base, (0, 0, signature.BASE_SIZE, signature.BASE_SIZE))[1])
    for thumbnail in thumbnails:
        thumbnail = thumbnail.astype(np.int64)
        grey, detail, mirrored_grey, mirrored_detail = signature._grey_hashes(thumbnail)
        assert signature._grey_hashes(thumbnail[:, ::-1]) == (mirrored_grey, mirrored_detail, grey, detail)


@pytest.mark.parametrize("shape", [(1, 1, 3), (8, 8, 3), (16, 16, 3), (224, 100, 3), (2000, 10, 3)])
def test_any_stored_size_signs(shape):
    # Stage 1 signs what it stores: --image-size and --crop-margin make any square, and the thumbnail is
    # boxed from whatever is there (a 1-pixel image is flat: 0).
    pixels = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    value = image_signature(pixels)
    assert 0 <= value < 2**SIGNATURE_BITS
    assert (value & GREY_MASK == 0) == (shape[:2] == (1, 1))


def _on_white(fill: Image.Image, box, shape="disc", size=(256, 256)) -> np.ndarray:
    """A product photo: `fill` cut as a disc or a box into `box` (left, top, right, bottom) on white."""
    left, top, right, bottom = box
    image = Image.new("RGB", size, (255, 255, 255))
    mask = Image.new("L", (right - left, bottom - top), 0)
    draw = ImageDraw.Draw(mask)
    if shape == "disc":
        draw.ellipse((0, 0, right - left - 1, bottom - top - 1), fill=255)
    else:
        draw.rectangle((0, 0, right - left, bottom - top), fill=255)
    image.paste(fill.resize((right - left, bottom - top)), (left, top), mask)
    return np.asarray(image)


def _jpeg_copy(pixels: np.ndarray, scale=0.75) -> np.ndarray:
    image = Image.fromarray(pixels)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.LANCZOS)
    return np.asarray(Image.open(io.BytesIO(_encode(image, quality=70))).convert("RGB"))


def test_objects_on_white_are_near_only_when_they_are_one_picture(originals):
    # Product photos on white (issue 30): the white, not the object, filled the hash. Now the white is
    # trimmed off, two objects must have the same proportions, and a flat object (its outline is all it
    # shows) is signed whole: only near-equal pixels make it a copy.
    navy = Image.new("RGB", (8, 8), (30, 50, 110))
    flat = image_signature(_on_white(navy, (40, 60, 200, 170)))
    assert signature.is_flat_object(flat) and not is_low_information(flat)
    copy = image_signature(_jpeg_copy(_on_white(navy, (40, 60, 200, 170))))
    assert near(flat, copy, DEFAULT_MAX_DISTANCE) is not None
    # The same colour and outline, other proportions; the same proportions elsewhere and smaller.
    assert near(flat, image_signature(_on_white(navy, (60, 40, 180, 200))), DEFAULT_MAX_DISTANCE) is None
    assert near(flat, image_signature(_on_white(navy, (120, 120, 200, 175))), DEFAULT_MAX_DISTANCE) is None

    _, photo = originals["grace_hopper.jpg"]
    product = _on_white(photo.crop((0, 0, 200, 120)), (30, 50, 230, 170), shape="box")
    signed = image_signature(product)
    assert not is_low_information(signed) and not signature.is_flat_object(signed)
    for copy in (_jpeg_copy(product), product[:, ::-1], product[10:-10, 10:-10]):
        assert near(signed, image_signature(np.ascontiguousarray(copy)), DEFAULT_MAX_DISTANCE) is not None
    # The next part of the photo, cut to other proportions: another product.
    other = _on_white(photo.crop((200, 0, 320, 200)), (70, 20, 190, 220), shape="box")
    assert near(signed, image_signature(other), DEFAULT_MAX_DISTANCE) is None


def test_product_style_images_on_white_are_not_near_one_another():
    # The benchmark's product-style images (benchmarks/near_duplicate_bands.py): version 3 found 17 pairs of
    # different pictures among these 600 near (two objects of one outline on white), version 4 none.
    pieces = []
    signed, _ = products(600, seed=2, pieces=pieces)
    close = np.triu(signature.pairwise_distances(signed) <= DEFAULT_MAX_DISTANCE, 1)
    false = [
        (i, j) for i, j in zip(*np.nonzero(close), strict=True) if not same_picture(pieces[i], pieces[j])
    ]
    assert false == []


def test_a_brightened_copy_of_a_product_with_a_light_shadow_is_near():
    # A catalogue photo's light shadow (215 on white) is whitened by a brighter copy (x1.2): version 4 trimmed
    # the white down to the shadow, so the copy's content box lost it and moved by a few percent of the object
    # (found 0.34 of the benchmark's products); the shadow is background now. Flat objects are left out here:
    # a brighter plain object is not near-equal, by design (test_objects_on_white_are_near_only_when_...).
    rng = random.Random(7)
    photos = [Image.open(path).convert("RGB") for _, path in sorted(photo_paths().items())]
    found = total = 0
    while total < 40:
        original = product_image(rng, photos, rng.randrange(len(photos)))
        signed = image_signature(np.asarray(original))
        if signature.is_flat_object(signed):
            continue
        brighter = np.asarray(ImageEnhance.Brightness(original).enhance(1.2))
        found += near(signed, image_signature(brighter), DEFAULT_MAX_DISTANCE) is not None
        total += 1
    assert found >= 30, found  # 17 with version 4


def test_faint_objects_in_other_places_are_not_near_and_a_blank_image_keeps_its_whole_box():
    # An object fainter than the trim tolerance leaves nothing but background to trim: version 5 at first
    # trimmed such an image to its bottom-right corner, so every one of them showed the same blank corner and
    # they grouped whatever they showed (the second product generator's largest false group, 7 at 20,000).
    def faint(box):
        image = Image.new("RGB", (256, 256), (245, 245, 245))
        ImageDraw.Draw(image).ellipse(box, fill=(228, 228, 228))
        return image_signature(np.asarray(image))

    left, right = faint((20, 40, 110, 200)), faint((150, 60, 240, 220))
    assert near(left, right, DEFAULT_MAX_DISTANCE) is None
    assert near(left, faint((20, 40, 110, 200)), DEFAULT_MAX_DISTANCE) is not None
    blank = image_signature(np.full((64, 64, 3), 250, np.uint8))
    frame = tuple(((blank >> signature._FRAME_SHIFT) & 0xFFFFFFFF).to_bytes(4, "little"))
    assert frame == (0, 0, signature.BASE_SIZE, signature.BASE_SIZE)


class _Scripted:
    """Stands in for product_image's random.Random: returns the recorded draws in order."""

    def __init__(self, draws):
        self._draws = list(draws)

    def _next(self, *_):
        return self._draws.pop(0)

    randint = uniform = choice = _next


# Pairs of the benchmark's product-style images (benchmarks/near_duplicate_bands.py, seed 2: images 13344 and
# 13949, 6093 and 7069, 9216 and 13982) that version 5 found near though they are different pictures: pieces
# of one photo that do not overlap (two patches of the clock), or of two grey photos, cut as boxes, discs or
# tiles of like proportions. (source photo, product_image's draws) each.
_FALSE_PRODUCT_PAIRS = (
    (
        (5, (133, 176, 43, 58, 0.5311163175028195, 200, 166, "tile")),
        (5, (99, 128, 62, 74, 0.6354010561829269, 146, 170, "disc")),
    ),
    (
        (5, (128, 132, 28, 101, 1.614508352863234, 186, 19, "box")),
        (5, (150, 163, 9, 22, 1.364682659809978, 33, 19, "box")),
    ),
    (
        (7, (153, 174, 95, 68, 0.6922330200750867, 164, 146, "disc")),
        (3, (158, 166, 26, 61, 1.5482694504219037, 291, 278, "box")),
    ),
)


def test_two_pieces_of_one_texture_on_white_are_not_near_but_copies_of_each_are():
    # Version 6: two objects on a background must agree in the mid frequencies too (the detail hash, within
    # DETAIL_MAX_DISTANCE): these pairs agree in the low frequencies, the colours and the 8x8 thumbnail.
    photos = [Image.open(path).convert("RGB") for _, path in sorted(photo_paths().items())]
    for first, second in _FALSE_PRODUCT_PAIRS:
        images = [
            np.asarray(product_image(_Scripted(draws), photos, source)) for source, draws in (first, second)
        ]
        a, b = (image_signature(image) for image in images)
        assert signature.grey_distance(a, b)[0] <= DEFAULT_MAX_DISTANCE
        assert near(a, b, DEFAULT_MAX_DISTANCE) is None
        for image, signed in zip(images, (a, b), strict=True):
            for copy in (_jpeg_copy(image), image[:, ::-1]):
                assert (
                    near(signed, image_signature(np.ascontiguousarray(copy)), DEFAULT_MAX_DISTANCE)
                    is not None
                )


def test_distinct_flat_objects_on_white_rarely_share_a_band():
    # A flat object is signed whole, and its low frequencies are its place and size, which many distinct
    # objects share: version 5's bands of 300 plain discs and boxes on white matched in 54 pairs (20x what
    # uniform bits give). Version 6 takes a flat object's grey hash from the mid frequencies (its outline).
    rng = random.Random(30)
    signed = []
    for _ in range(300):
        image = Image.new("RGB", (256, 256), (255, 255, 255))
        width, height = rng.randint(50, 180), rng.randint(50, 180)
        left, top = rng.randint(4, 252 - width), rng.randint(4, 252 - height)
        colour = tuple(rng.randrange(0, 200) for _ in range(3))
        draw = ImageDraw.Draw(image)
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(
            (left, top, left + width, top + height), colour
        )
        signed.append(image_signature(np.asarray(image)))
    assert all(signature.is_flat_object(value) for value in signed)
    masks = grouping.band_masks(grouping.default_bands())
    values = [[grouping.band_value(grey_hash(value), positions) for positions in masks] for value in signed]
    sharing = sum(
        any(x == y for x, y in zip(a, b, strict=True)) for a, b in itertools.combinations(values, 2)
    )
    uniform = len(signed) * (len(signed) - 1) / 2 * len(masks) / 2**16  # 2.7
    assert sharing <= 3 * uniform, sharing  # 6


def test_a_brighter_or_darker_copy_of_a_coloured_flat_object_is_near_and_a_lighter_grey_one_is_not():
    # A plain object on white is near-equal only to itself (its outline is all it shows); a brighter or
    # darker copy of a coloured one keeps its box, its chromaticity and its cells but for a gain, and is near
    # too (version 5 missed it). A lighter grey disc in the place of a grey disc is another disc: not near.
    navy = Image.new("RGB", (8, 8), (30, 50, 110))
    product = _on_white(navy, (40, 60, 200, 170))
    flat = image_signature(product)
    assert signature.is_flat_object(flat)
    for factor in (1.2, 0.8):
        copy = np.asarray(ImageEnhance.Brightness(Image.fromarray(product)).enhance(factor))
        assert near(flat, image_signature(_jpeg_copy(copy, scale=1.0)), DEFAULT_MAX_DISTANCE) is not None
    # The same colour elsewhere (its box moved by 8 px).
    assert near(flat, image_signature(_on_white(navy, (48, 60, 208, 170))), DEFAULT_MAX_DISTANCE) is None
    grey = Image.new("RGB", (8, 8), (90, 90, 90))
    grey_disc = _on_white(grey, (40, 60, 200, 170))
    lighter = np.asarray(ImageEnhance.Brightness(Image.fromarray(grey_disc)).enhance(1.2))
    assert near(image_signature(grey_disc), image_signature(lighter), DEFAULT_MAX_DISTANCE) is None
