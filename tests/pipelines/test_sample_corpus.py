"""The corpus generators write what their CorpusInfo claims, byte for byte the same every time."""

import csv
import hashlib
import json
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError

from pipelines import sample_corpus as sc
from preprocess import errors

IMAGES_PER_CLASS = 6


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> sc.CorpusInfo:
    return sc.write_sample_corpus(str(tmp_path_factory.mktemp("shapes")), images_per_class=IMAGES_PER_CLASS)


def _listing(root: str) -> dict[str, str]:
    """Relative path -> sha256 of every file under root."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root).replace(os.sep, "/")] = hashlib.sha256(f.read()).hexdigest()
    return found


def _read(info: sc.CorpusInfo, corpus_file: sc.CorpusFile) -> bytes:
    with open(info.uri(corpus_file), "rb") as f:
        return f.read()


def _only(info: sc.CorpusInfo, kind: str) -> sc.CorpusFile:
    (corpus_file,) = info.files_of_kind(kind)
    return corpus_file


def test_same_seed_writes_byte_identical_files(tmp_path):
    first = sc.write_sample_corpus(str(tmp_path / "a"), images_per_class=4, seed=7)
    second = sc.write_sample_corpus(str(tmp_path / "b"), images_per_class=4, seed=7)
    assert _listing(first.root) == _listing(second.root)
    assert first.files == second.files


def test_different_seeds_write_different_images(tmp_path):
    first = sc.write_sample_corpus(str(tmp_path / "a"), images_per_class=2, seed=0, include_broken=False)
    second = sc.write_sample_corpus(str(tmp_path / "b"), images_per_class=2, seed=1, include_broken=False)
    assert not set(_listing(first.root).values()) & set(_listing(second.root).values())


def test_info_lists_exactly_the_files_on_disk(corpus):
    assert _listing(corpus.root) == {f.path: f.sha256 for f in corpus.files}
    assert all(f.path.split("/")[0] == f.class_name for f in corpus.files)


def test_every_class_has_images_per_class_usable_images(corpus):
    assert corpus.class_names == ["circle", "cross", "square", "star", "triangle"]
    assert corpus.usable_per_class() == dict.fromkeys(corpus.class_names, IMAGES_PER_CLASS)
    assert corpus.num_duplicates == 3
    assert corpus.num_failed == 6
    assert corpus.num_found == corpus.num_usable + corpus.num_failed + corpus.num_duplicates


def test_every_usable_image_decodes_in_the_format_its_content_says(corpus):
    for corpus_file in corpus.files:
        if corpus_file.kind in sc.USABLE_KINDS + (sc.DUPLICATE,):
            with Image.open(corpus.uri(corpus_file)) as image:
                image.load()
                assert image.format == corpus_file.format, corpus_file.path


def test_corpus_has_every_usable_kind_and_several_formats(corpus):
    kinds = {f.kind for f in corpus.files}
    assert set(sc.USABLE_KINDS) <= kinds
    assert {"JPEG", "PNG"} <= {f.format for f in corpus.files}


def test_png_named_jpg_is_png_content_behind_a_jpg_extension(corpus):
    for corpus_file in corpus.files_of_kind(sc.PNG_NAMED_JPG):
        assert corpus_file.path.endswith(".jpg")
        assert _read(corpus, corpus_file).startswith(b"\x89PNG\r\n\x1a\n")


def test_image_modes_match_their_kind(corpus):
    modes = {sc.GRAYSCALE: "L", sc.CMYK: "CMYK", sc.RGBA: "RGBA"}
    for kind, mode in modes.items():
        for corpus_file in corpus.files_of_kind(kind):
            with Image.open(corpus.uri(corpus_file)) as image:
                assert image.mode == mode, corpus_file.path


def test_rgba_images_are_transparent_off_the_shape_and_opaque_on_it(corpus):
    for corpus_file in corpus.files_of_kind(sc.RGBA):
        with Image.open(corpus.uri(corpus_file)) as image:
            alpha = image.getchannel("A")
            center = tuple(round(c) for c in corpus_file.params.center)
            assert alpha.getpixel((0, 0)) == 0
            assert alpha.getpixel(center) == 255


def test_shapes_lie_inside_the_central_square_that_center_crop_keeps(corpus):
    for corpus_file in corpus.files:
        params = corpus_file.params
        if params is None:
            continue
        short = min(params.width, params.height)
        for center, side in ((params.center[0], params.width), (params.center[1], params.height)):
            assert (side - short) / 2 <= center - params.radius
            assert center + params.radius <= (side + short) / 2


def _thumbnail(image: Image.Image) -> np.ndarray:
    """32x32 box-filtered RGB: averages away pixel noise and JPEG loss, keeps the layout."""
    return np.asarray(image.convert("RGB").resize((32, 32), Image.Resampling.BOX), np.float32)


def test_exif_rotated_jpegs_turn_upright_with_their_orientation(corpus):
    rotated = corpus.files_of_kind(sc.EXIF_ROTATED)
    assert rotated
    for corpus_file in rotated:
        expected = sc.render_shape_image(corpus_file.params)
        with Image.open(corpus.uri(corpus_file)) as stored:
            assert stored.getexif()[sc.EXIF_ORIENTATION_TAG] == corpus_file.exif_orientation
            upright = ImageOps.exif_transpose(stored)
            assert upright.size == expected.size
            upright_error = np.abs(_thumbnail(upright) - _thumbnail(expected)).mean()
            stored_error = np.abs(_thumbnail(stored) - _thumbnail(expected)).mean()
        assert upright_error < 4, corpus_file.path
        assert stored_error > 3 * upright_error, corpus_file.path  # the pixels really are stored turned


def test_duplicates_repeat_the_bytes_of_a_file_of_the_same_class(corpus):
    by_path = {f.path: f for f in corpus.files}
    for corpus_file in corpus.files_of_kind(sc.DUPLICATE):
        original = by_path[corpus_file.duplicate_of]
        assert original.kind == sc.GOOD
        assert original.class_name == corpus_file.class_name
        assert _read(corpus, original) == _read(corpus, corpus_file)
        assert corpus_file.expected_error is None


def test_broken_files_expect_reason_codes_of_the_errors_module(corpus):
    assert set(corpus.expected_errors.values()) == {
        errors.TRUNCATED,
        errors.EMPTY_FILE,
        errors.NOT_AN_IMAGE,
        errors.TOO_MANY_PIXELS,
        errors.CONFLICTING_LABELS,
    }
    assert set(corpus.expected_errors.values()) <= set(errors.REASONS)


def test_truncated_jpeg_opens_but_fails_to_load(corpus):
    truncated = _only(corpus, sc.TRUNCATED)
    assert _read(corpus, truncated).startswith(b"\xff\xd8")
    with Image.open(corpus.uri(truncated)) as image:
        assert image.format == "JPEG"
        with pytest.raises(OSError, match="truncated"):
            image.load()


def test_empty_file_has_zero_bytes(corpus):
    assert os.path.getsize(corpus.uri(_only(corpus, sc.EMPTY))) == 0


def test_text_named_png_is_not_an_image(corpus):
    not_an_image = _only(corpus, sc.NOT_AN_IMAGE)
    assert not_an_image.path.endswith(".png")
    with pytest.raises(UnidentifiedImageError):
        Image.open(corpus.uri(not_an_image))


def test_bomb_png_claims_a_huge_size_in_a_header_with_a_valid_crc(corpus):
    data = _read(corpus, _only(corpus, sc.TOO_MANY_PIXELS))
    assert len(data) < 100_000
    (length,) = struct.unpack(">I", data[8:12])
    chunk_type, ihdr = data[12:16], data[16 : 16 + length]
    (crc,) = struct.unpack(">I", data[16 + length : 20 + length])
    assert chunk_type == b"IHDR"
    assert crc == zlib.crc32(chunk_type + ihdr)
    width, height = struct.unpack(">II", ihdr[:8])
    assert (width, height) == (sc.BOMB_SIDE, sc.BOMB_SIDE)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(corpus.uri(_only(corpus, sc.TOO_MANY_PIXELS)))


def test_conflicting_copies_have_the_same_bytes_under_different_classes(corpus):
    original = _only(corpus, sc.CONFLICTING_ORIGINAL)
    copy = _only(corpus, sc.CONFLICTING_DUPLICATE)
    assert copy.duplicate_of == original.path
    assert copy.class_name != original.class_name
    assert _read(corpus, copy) == _read(corpus, original)
    assert original.expected_error == copy.expected_error == errors.CONFLICTING_LABELS


def test_without_broken_files_every_file_is_usable_or_a_duplicate(tmp_path):
    info = sc.write_sample_corpus(str(tmp_path), images_per_class=2, include_broken=False)
    assert info.expected_errors == {}
    assert {f.kind for f in info.files} <= set(sc.USABLE_KINDS) | {sc.DUPLICATE}


def test_altered_copies_are_other_bytes_of_the_same_picture_one_under_another_class(tmp_path):
    info = sc.write_sample_corpus(str(tmp_path), images_per_class=6, near_duplicates=True)
    copies = info.files_of_kind(sc.NEAR_DUPLICATE)
    assert len(copies) == 3
    by_path = {f.path: f for f in info.files}
    for copy in copies:
        original = by_path[copy.altered_from]
        assert original.kind == sc.GOOD and copy.sha256 != original.sha256
        with Image.open(info.uri(copy)) as altered, Image.open(info.uri(original)) as source:
            # The same picture: at the copy's size, the two differ by little on average.
            source = source.convert("RGB").resize(altered.size)
            difference = np.abs(np.asarray(altered.convert("RGB"), np.int16) - np.asarray(source, np.int16))
            assert difference.mean() < 20, (copy.path, difference.mean())
    assert [copy.class_name == by_path[copy.altered_from].class_name for copy in copies] == [
        True,
        True,
        False,
    ]
    # Without the flag, the corpus is what it was.
    plain = sc.write_sample_corpus(str(tmp_path / "plain"), images_per_class=6)
    assert not plain.files_of_kind(sc.NEAR_DUPLICATE)


def test_csv_manifest_lists_every_file_with_a_header_and_content_split(corpus, tmp_path):
    sc.write_manifest_csv(corpus, str(tmp_path / "manifest.csv"), with_split=True)
    with open(tmp_path / "manifest.csv", newline="") as f:
        assert f.readline().strip() == "uri,label,split"
        f.seek(0)
        rows = list(csv.DictReader(f))
    assert [(row["uri"], row["label"]) for row in rows] == [
        (corpus.uri(f), f.class_name) for f in corpus.files
    ]
    assert {row["split"] for row in rows} <= {"train", "validation", "test"}
    split_of = {row["uri"]: row["split"] for row in rows}
    for duplicate in corpus.files_of_kind(sc.DUPLICATE):
        original = corpus.uri(next(f for f in corpus.files if f.path == duplicate.duplicate_of))
        assert split_of[corpus.uri(duplicate)] == split_of[original]


def test_csv_manifest_without_split_has_two_columns(corpus, tmp_path):
    sc.write_manifest_csv(corpus, str(tmp_path / "manifest.csv"))
    with open(tmp_path / "manifest.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["uri", "label"]
    assert len(rows) == corpus.num_found + 1


def test_jsonl_manifest_has_one_object_per_file(corpus, tmp_path):
    sc.write_manifest_jsonl(corpus, str(tmp_path / "manifest.jsonl"))
    with open(tmp_path / "manifest.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert rows == [{"uri": corpus.uri(f), "label": f.class_name} for f in corpus.files]


def test_photo_corpus_writes_jpegs_within_the_megapixel_range(tmp_path):
    info = sc.write_photo_corpus(str(tmp_path), num_images=3, megapixels=(1, 1.5), classes=2)
    assert [f.class_name for f in info.files] == ["circle", "cross", "circle"]
    assert _listing(str(tmp_path)) == {f.path: f.sha256 for f in info.files}
    for corpus_file in info.files:
        with Image.open(info.uri(corpus_file)) as image:
            assert image.format == "JPEG"
            assert image.mode == "RGB"
            assert 0.99e6 <= image.width * image.height <= 1.51e6
        # Photo-like texture, not a flat fill: about 1.5-2.5 bits per pixel at q90.
        assert os.path.getsize(info.uri(corpus_file)) > 150_000


def test_main_writes_a_sample_corpus_and_a_manifest(tmp_path):
    info = sc.main(
        ["--out", str(tmp_path / "out"), "--num", "1", "--no-broken", "--manifest", str(tmp_path / "m.jsonl")]
    )
    assert info.usable_per_class() == dict.fromkeys(sc.SHAPES, 1)
    with open(tmp_path / "m.jsonl") as f:
        assert len(f.readlines()) == info.num_found
