"""Which read failures are an input's error (recorded) and which are raised for the runner to retry.

Local files and a real GCS emulator; on GCS the `gcs_read_faults` forwarder answers chosen object reads
with an error status (tests/gcs_emulator.py). The DoFns are the pipeline's own, called directly.
"""

import hashlib
import io
import os

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import storage
from PIL import Image

from preprocess import errors
from preprocess.decode.stage import DecodeImagesFn
from preprocess.inputs.content import HashContentFn, KeyContentFn, UniqueInput
from preprocess.inputs.listing import InputRecord
from preprocess.inputs.reading import (
    content_key,
    hash_file,
    is_deterministic_read_failure,
    key_of_md5,
    read_file_bytes,
)
from tests.gcs_emulator import ReadFaults
from tests.python_heap import peak_heap_bytes


def _jpeg(size=(24, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 60)).save(buffer, "JPEG")
    return buffer.getvalue()


def _decode_fn() -> DecodeImagesFn:
    return DecodeImagesFn(image_size=8, resize_method="crop", max_pixels=10_000_000)


def _outputs(fn, element):
    """(errors as (uri, reason, detail), main outputs) of one DoFn call."""
    failed, main = [], []
    for output in fn.process(element):
        if getattr(output, "tag", None) == "errors":
            failed.append((output.value.uri, output.value.reason, output.value.detail))
        else:
            main.append(output)
    return failed, main


def _unique(uri: str) -> UniqueInput:
    return UniqueInput(uri=uri, label="cat", split="train")


def _listing_readers():
    """The two DoFns that read an InputRecord before decoding: its content key, its full hash."""
    return (KeyContentFn({"train": 1.0}), HashContentFn())


# ------------------------------------------------------------------------------------------- local files


def test_a_missing_local_file_is_recorded_as_unreadable_by_every_stage(tmp_path):
    missing = str(tmp_path / "cat" / "gone.jpg")
    for reader in _listing_readers():
        failed, main = _outputs(reader, InputRecord(missing, "cat"))
        assert main == [] and failed == [(missing, errors.UNREADABLE, failed[0][2])]
        assert failed[0][2].startswith("FileNotFoundError")
    failed, main = _outputs(_decode_fn(), _unique(missing))
    assert main == [] and [(uri, reason) for uri, reason, _ in failed] == [(missing, errors.UNREADABLE)]


def test_a_directory_where_a_file_was_listed_is_unreadable(tmp_path):
    with pytest.raises(errors.ImageError) as raised:
        read_file_bytes(str(tmp_path))
    assert raised.value.reason == errors.UNREADABLE and "IsADirectoryError" in raised.value.detail


def test_a_uri_no_filesystem_serves_is_unreadable():
    with pytest.raises(errors.ImageError) as raised:
        hash_file("nosuchscheme://bucket/cat/a.jpg")
    assert raised.value.reason == errors.UNREADABLE


@pytest.mark.parametrize(
    "failure",
    [
        FileNotFoundError(2, "gone"),
        PermissionError(13, "denied"),
        api_exceptions.NotFound("x"),
        api_exceptions.Forbidden("x"),
    ],
    ids=["not-found", "permission", "gcs-404", "gcs-403"],
)
def test_missing_and_access_denied_are_deterministic(failure):
    # (A real PermissionError cannot be made here: the tests may run as root, which reads any file.)
    assert is_deterministic_read_failure(failure)


@pytest.mark.parametrize(
    "failure",
    [
        api_exceptions.ServiceUnavailable("503"),
        api_exceptions.TooManyRequests("429"),
        api_exceptions.InternalServerError("500"),
        api_exceptions.RetryError("Timeout of 120.0s exceeded", None),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("timed out"),
        MemoryError(),
        OSError(5, "Input/output error"),
    ],
    ids=["503", "429", "500", "retries-exhausted", "connection-reset", "timeout", "memory", "eio"],
)
def test_transient_failures_are_not_deterministic(failure):
    assert not is_deterministic_read_failure(failure)


def test_an_io_error_while_reading_is_raised_not_recorded():
    # Reading /proc/self/mem from offset 0 fails with a real EIO: an I/O error of the device, not of the file.
    record = InputRecord("/proc/self/mem", "cat")
    with pytest.raises(OSError) as raised:
        _outputs(HashContentFn(), record)
    assert raised.value.errno == 5 and not isinstance(raised.value, errors.ImageError)
    with pytest.raises(OSError):
        _outputs(_decode_fn(), _unique(record.uri))


def test_a_truncated_image_is_a_decode_failure_not_a_read_failure(tmp_path):
    # PIL raises OSError for a truncated image: as the bytes are already in memory, it is recorded.
    path = tmp_path / "cut.jpg"
    path.write_bytes(_jpeg((64, 64))[:300])
    failed, main = _outputs(_decode_fn(), _unique(str(path)))
    assert main == [] and [reason for _, reason, _ in failed] == [errors.TRUNCATED]


def test_memory_error_while_decoding_is_raised(tmp_path, monkeypatch):
    path = tmp_path / "a.jpg"
    path.write_bytes(_jpeg())

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("preprocess.decode.stage.load_image_and_source_size", out_of_memory)
    with pytest.raises(MemoryError):
        _outputs(_decode_fn(), _unique(str(path)))


def test_an_unexpected_decoder_exception_on_bytes_in_memory_is_a_decode_error(tmp_path, monkeypatch):
    path = tmp_path / "a.jpg"
    path.write_bytes(_jpeg())

    def broken_decoder(*args, **kwargs):
        raise ValueError("tile cannot extend outside image")

    monkeypatch.setattr("preprocess.decode.stage.load_image_and_source_size", broken_decoder)
    failed, _ = _outputs(_decode_fn(), _unique(str(path)))
    assert [(reason, detail) for _, reason, detail in failed] == [
        (errors.DECODE_ERROR, "ValueError: tile cannot extend outside image")
    ]


def test_a_file_whose_name_ends_in_gz_is_read_raw(tmp_path):
    path = tmp_path / "photo.jpg.gz"
    data = _jpeg()
    path.write_bytes(data)
    assert read_file_bytes(str(path)) == data


# --------------------------------------------------------------------------------------------------- GCS


def _upload(gcs_emulator, url: str, data: bytes) -> str:
    name = url.removeprefix(f"gs://{gcs_emulator.bucket}/")
    storage.Client().bucket(gcs_emulator.bucket).blob(name).upload_from_string(data)
    return name


def test_a_missing_gcs_object_is_recorded_as_unreadable(gcs_dir):
    missing = f"{gcs_dir}/cat/gone.jpg"
    for reader in _listing_readers():
        failed, main = _outputs(reader, InputRecord(missing, "cat"))
        assert main == [] and [(uri, reason) for uri, reason, _ in failed] == [(missing, errors.UNREADABLE)]
        assert failed[0][2].startswith("NotFound: 404")


def test_a_gcs_object_that_answers_403_is_recorded_as_unreadable(gcs_emulator, gcs_dir, gcs_read_faults):
    url = f"{gcs_dir}/cat/secret.jpg"
    name = _upload(gcs_emulator, url, _jpeg())
    gcs_read_faults.faults = ReadFaults(media={name: 403})
    # Its key needs no download (its MD5 is in its metadata): the reads that download it record it.
    _, keyed = _outputs(KeyContentFn({"train": 1.0}), InputRecord(url, "cat"))
    assert [record.uri for _, record in keyed] == [url]
    for fn, element in ((HashContentFn(), InputRecord(url, "cat")), (_decode_fn(), _unique(url))):
        failed, main = _outputs(fn, element)
        assert main == [] and [(uri, reason) for uri, reason, _ in failed] == [(url, errors.UNREADABLE)]
        assert failed[0][2].startswith("Forbidden: 403")


def test_a_503_that_outlasts_the_client_retries_is_raised_out_of_both_stages(
    gcs_emulator, gcs_dir, gcs_read_faults, short_gcs_retries
):
    url = f"{gcs_dir}/cat/busy.jpg"
    name = _upload(gcs_emulator, url, _jpeg())
    gcs_read_faults.faults = ReadFaults(media={name: 503})
    # Listed without an MD5 (a composite object), its key is a download too.
    for reader, record in (
        (KeyContentFn({"train": 1.0}), InputRecord(url, "cat", size=700)),
        (HashContentFn(), InputRecord(url, "cat")),
    ):
        with pytest.raises(api_exceptions.RetryError) as raised:
            _outputs(reader, record)
        assert "503" in repr(raised.value.cause)
    with pytest.raises(api_exceptions.RetryError):
        _outputs(_decode_fn(), _unique(url))
    # The client did retry (exponential back-off within the deadline) before giving up.
    assert len([read for read, status in gcs_read_faults.injected if read.name == name]) >= 4


def test_503s_the_client_retries_away_lose_nothing(gcs_emulator, gcs_dir, gcs_read_faults):
    data = {f"{gcs_dir}/cat/{i}.jpg": _jpeg((10 + i, 10)) for i in range(6)}
    for url, content in data.items():
        _upload(gcs_emulator, url, content)
    prefix = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    gcs_read_faults.faults = ReadFaults(fraction=0.3, prefix=prefix)
    for url, content in data.items():
        for reader in _listing_readers():
            failed, main = _outputs(reader, InputRecord(url, "cat"))
            assert failed == [] and len(main) == 1
        assert read_file_bytes(url) == content
    assert len(gcs_read_faults.injected) >= 0.25 * (
        len(gcs_read_faults.injected) + len(gcs_read_faults.forwarded_reads)
    )
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs_read_faults.url


def test_the_content_key_of_a_gcs_object_is_its_md5_from_metadata_without_a_download(
    gcs_emulator, gcs_dir, gcs_read_faults, tmp_path
):
    """The key is the object's MD5, which GCS keeps: no byte of the object is downloaded for it."""
    url = f"{gcs_dir}/cat/large.bin"
    data = os.urandom(1 << 20)
    name = _upload(gcs_emulator, url, data)
    gcs_read_faults.media_bytes.clear()
    key, size = content_key(url)
    assert (key, size) == (key_of_md5(hashlib.md5(data).hexdigest()), len(data))
    assert gcs_read_faults.media_bytes[name] == 0
    local = tmp_path / "large.bin"
    local.write_bytes(data)
    assert content_key(str(local)) == (key, size)  # the same key wherever the file is
    gcs_read_faults.media_bytes.clear()
    assert read_file_bytes(url) == data
    assert gcs_read_faults.media_bytes[name] == len(data)


def test_a_composite_object_without_an_md5_is_keyed_by_hashing_it(gcs_emulator, gcs_dir, gcs_read_faults):
    url = f"{gcs_dir}/cat/composite.bin"
    data = os.urandom(50_000)
    name = _upload(gcs_emulator, url, data)
    gcs_read_faults.media_bytes.clear()
    # The listing of a composite object gives its size and no md5Hash.
    assert content_key(url, size=len(data), md5=None) == (
        key_of_md5(hashlib.md5(data).hexdigest()),
        len(data),
    )
    assert gcs_read_faults.media_bytes[name] == len(data)


# ------------------------------------------------------------------------------------ the file size limit


def test_a_file_over_the_size_limit_is_too_large_and_never_opened():
    # /proc/self/mem fails every read from offset 0 with EIO: recorded as too_large, it was never read.
    record = InputRecord("/proc/self/mem", "cat", size=2_000_000)  # a size as the listing gives it
    failed, main = _outputs(KeyContentFn({"train": 1.0}, max_file_bytes=1_000_000), record)
    assert main == []
    assert failed == [
        (record.uri, errors.TOO_LARGE, "2000000 bytes, over the limit of 1000000 bytes (--max-file-mb 1)")
    ]


def test_a_gcs_object_over_the_size_limit_is_too_large_without_a_download(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    url = f"{gcs_dir}/cat/huge.jpg"
    name = _upload(gcs_emulator, url, _jpeg() + bytes(5000))
    gcs_read_faults.faults = ReadFaults(media={name: 403})  # a download would make it `unreadable`
    key_fn = KeyContentFn({"train": 1.0}, max_file_bytes=1000)
    # A manifest's row: the size is asked for (one metadata request), the bytes never.
    failed, main = _outputs(key_fn, InputRecord(url, "cat"))
    assert main == [] and [(uri, reason) for uri, reason, _ in failed] == [(url, errors.TOO_LARGE)]
    assert [read.media for read in gcs_read_faults.forwarded_reads if read.name == name] == [False]
    assert not gcs_read_faults.injected


def test_a_file_that_grew_past_the_limit_is_read_no_further_than_the_limit(
    gcs_emulator, gcs_dir, gcs_read_faults
):
    url = f"{gcs_dir}/cat/grown.bin"
    data = os.urandom(1 << 20)
    name = _upload(gcs_emulator, url, data)
    gcs_read_faults.media_bytes.clear()
    for read in (read_file_bytes, hash_file):
        with pytest.raises(errors.ImageError) as raised:
            read(url, 1000)
        assert raised.value.reason == errors.TOO_LARGE
    assert gcs_read_faults.media_bytes[name] <= 2 * 1001
    assert read_file_bytes(url, len(data)) == data  # at the limit: read whole


# ----------------------------------------------------------------------------- GCS clients and requests


class _ClientConstructions:
    """Counts the google-cloud-storage clients made in this process (the real class, counted)."""

    def __init__(self, monkeypatch):
        self.count = 0
        real_init = storage.Client.__init__

        def counting_init(client, *args, **kwargs):
            self.count += 1
            real_init(client, *args, **kwargs)

        monkeypatch.setattr(storage.Client, "__init__", counting_init)


def test_listed_gcs_objects_are_read_by_one_reused_client_without_metadata_requests(
    gcs_emulator, gcs_dir, gcs_read_faults, monkeypatch
):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from preprocess.inputs.content import DeduplicateByContent
    from preprocess.inputs.listing import ListInputs

    files = {
        f"{gcs_dir}/raw/{label}/{index}.jpg": _jpeg((10 + index, height))
        for label, height in (("cat", 12), ("dog", 13))
        for index in range(15)
    }
    files[f"{gcs_dir}/raw/cat/copy.jpg"] = files[f"{gcs_dir}/raw/cat/3.jpg"]  # a shared key: hashed in full
    for url, data in files.items():
        _upload(gcs_emulator, url, data)
    prefix = gcs_dir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    clients = _ClientConstructions(monkeypatch)
    with TestPipeline() as pipeline:
        listed = pipeline | ListInputs(f"{gcs_dir}/raw")
        deduplicated = listed.records | DeduplicateByContent({"train": 1.0})
        decoded = deduplicated["unique"] | beam.ParDo(_decode_fn()).with_outputs("errors", main="examples")
        assert_that(
            decoded.examples | beam.Map(lambda example: example["uri"]),
            equal_to(sorted(set(files) - {f"{gcs_dir}/raw/cat/copy.jpg"})),
        )
    reads = [read for read in gcs_read_faults.forwarded_reads if read.name.startswith(prefix)]
    # Each object once, whole, when decoded: its key is the listing's MD5 (the copy and its original,
    # which share one, are hashed in full too). Before the key came from the listing: 2 reads an object.
    assert reads and all(read.media for read in reads)
    assert len(reads) == len(files) - 1 + 2
    # Beam's reader made a client (so a TLS connection) and asked for the metadata at every open.
    assert clients.count <= 4


# ------------------------------------------------------------------------------------------------ memory


def test_a_gcs_object_read_whole_takes_about_its_size_in_memory(gcs_emulator, gcs_dir):
    # Not through the forwarder: it runs in this process and holds each response whole.
    url = f"{gcs_dir}/cat/big.bin"
    data = os.urandom(6 << 20)
    _upload(gcs_emulator, url, data)
    # At the size the listing gave (decode_stage.py passes it).
    read, peak = peak_heap_bytes(lambda: read_file_bytes(url, size=len(data)))
    assert read == data
    assert peak <= 1.2 * len(data), f"peak {peak / len(data):.2f}x the file"


def test_opening_an_image_does_not_copy_its_bytes():
    from preprocess.decode.image import _ShortReadTrackingBytesIO

    data = bytearray(_jpeg((16, 16)) + bytes(4 << 20))  # a JPEG with 4 MiB of trailing data
    reader, peak = peak_heap_bytes(lambda: Image.open(_ShortReadTrackingBytesIO(data), formats=["JPEG"]))
    assert reader.size == (16, 16)
    assert peak < 0.1 * len(data), f"peak {peak / len(data):.2f}x the file"


def test_a_gcs_object_of_unknown_size_read_whole_takes_about_its_size_in_memory(gcs_emulator, gcs_dir):
    url = f"{gcs_dir}/cat/unsized.bin"
    data = os.urandom(12 << 20)  # over one 8 MiB part: parts joined into one bytes took 2x
    _upload(gcs_emulator, url, data)
    read, peak = peak_heap_bytes(lambda: read_file_bytes(url))
    assert read == data
    assert peak <= 1.2 * len(data), f"peak {peak / len(data):.2f}x the file"
