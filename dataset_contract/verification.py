"""Check a dataset directory against its published manifest: every shard whole, every record sound.

Shared by training (`--verify-data`) and `python -m preprocess.verify`; TensorFlow only, no Beam. The three
levels of checks: docs/internals.md."""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import posixpath
import struct
from collections.abc import Iterator

import google_crc32c
import ml_dtypes
import numpy as np
import tensorflow as tf

from dataset_contract import commit_log, features
from dataset_contract import manifest as manifest_lib

MISSING = "missing"
WRONG_SIZE = "wrong_size"
WRONG_SHA256 = "wrong_sha256"
CORRUPT_RECORDS = "corrupt_records"  # framing, checksum or truncation: the reader would fail here
WRONG_RECORD_COUNT = "wrong_record_count"
BAD_EXAMPLE = "bad_example"  # a record that does not parse with the schema
BAD_IMAGE = "bad_image"  # wrong payload length, undecodable jpeg, NaN or inf
BAD_LABEL = "bad_label"  # out of range, or not the index of its class_name
WRONG_CLASS_COUNTS = "wrong_class_counts"  # a split's shards disagree with num_examples_per_class

# Large reads keep a full pass over GCS at streaming speed.
_READ_CHUNK_BYTES = 8 << 20
# Records checked per vectorized parse and decode, up to a size that keeps a
# few shards checked at once well inside memory (224x224 float32 is 588 KiB).
_BATCH_RECORDS = 256
_BATCH_BYTES = 32 << 20
# Records quoted per problem; the rest are counted.
_QUOTED_RECORDS = 3
# What the shard messages hold a shard to: the manifest of the newest commit (or an older layout's dataset.json).
PUBLISHED = "the published dataset"

_HEADER = struct.Struct("<QI")  # record length, masked CRC32C of the length
_FOOTER = struct.Struct("<I")  # masked CRC32C of the data
_CRC_MASK_DELTA = 0xA282EAD8

_RAW_DTYPES = {
    features.BFLOAT16: np.dtype(ml_dtypes.bfloat16).newbyteorder("<"),
    features.FLOAT32: np.dtype("<f4"),
    features.UINT8: np.dtype("u1"),
}


@dataclasses.dataclass(frozen=True)
class ShardProblem:
    """One shard (or, for a split-wide count, the manifest) that does not match the manifest."""

    path: str  # the shard's full path (local or gs://)
    kind: str  # one of the constants above
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


class RecordError(Exception):
    """The TFRecord framing is broken: "record INDEX (byte OFFSET): what"."""


def read_published_bytes(data_dir: str) -> tuple[bytes, str]:
    """The published manifest's exact bytes, and its path; ManifestError if there is none.

    The newest commit of `manifests/`, or `dataset.json` in the older
    layouts: the one reader, dataset_contract/commit_log.py, through
    `tf.io.gfile`.
    """
    published = commit_log.read_published(data_dir, commit_log.TensorFlowFiles())
    if published is None:
        path = manifest_lib.join(data_dir, manifest_lib.MANIFEST_FILE)
        raise manifest_lib.ManifestError(f"{path}: not found. {_not_a_dataset_hint(data_dir)}")
    return published.data, published.path


# Sub-folders of a directory looked into for images, when saying what a directory without a manifest holds.
_HINT_FOLDERS = 8


def _holds_images(directory: str) -> bool:
    """Whether `directory` holds image files, directly or in one of its first few sub-folders (a class tree,
    or a pre-split one: one level further)."""
    folders, depth = [directory], 0
    while folders and depth < 3:
        next_folders = []
        for folder in folders[:_HINT_FOLDERS]:
            try:
                names = tf.io.gfile.listdir(folder)
            except tf.errors.OpError:
                continue
            if any(
                posixpath.splitext(name.rstrip("/"))[1].lower() in features.SOURCE_IMAGE_EXTENSIONS
                for name in names
            ):
                return True
            next_folders += [
                manifest_lib.join(folder, name.rstrip("/"))
                for name in sorted(names)
                if not name.startswith(".") and tf.io.gfile.isdir(manifest_lib.join(folder, name.rstrip("/")))
            ][:_HINT_FOLDERS]
        folders, depth = next_folders, depth + 1
    return False


def _not_a_dataset_hint(data_dir: str) -> str:
    """What a directory without a manifest is, and what to do: a workdir (its dataset/ is one level down),
    a folder of images (stage 1 has not run on it), or neither."""
    data_dir = data_dir.rstrip("/")
    inner = manifest_lib.join(data_dir, "dataset")
    if tf.io.gfile.exists(manifest_lib.join(inner, manifest_lib.MANIFEST_FILE)) or tf.io.gfile.exists(
        manifest_lib.join(inner, manifest_lib.MANIFESTS_DIR)
    ):
        return f"Did you mean {inner}? (the dataset a workflow writes into its --workdir)"
    if not tf.io.gfile.isdir(data_dir):
        return f"{data_dir} does not exist: give the --output of a finished `python -m preprocess` run"
    if _holds_images(data_dir):
        return (
            f"{data_dir} holds images, not a dataset: run `python -m preprocess --input {data_dir} --output "
            "DATASET_DIR` first, then give DATASET_DIR"
        )
    return (
        f"Stage 1 publishes last (a commit in {manifest_lib.MANIFESTS_DIR}/), after every shard is final, so a "
        "directory without one is not a dataset (wrong path, or preprocess has not finished)"
    )


def read_manifest(data_dir: str) -> dict:
    """The parsed, structurally checked published manifest of `data_dir`; ManifestError if there is none."""
    data, path = read_published_bytes(data_dir)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise manifest_lib.ManifestError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict):
        raise manifest_lib.ManifestError(f"{path}: expected a JSON object, found {type(manifest).__name__}")
    manifest_lib.check_manifest(manifest, where=path)
    return manifest


# ------------------------------------------------------------------ records


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


class _ChunkedReader:
    """Exact-size reads from a GFile in large chunks, hashing every byte it reads."""

    def __init__(self, handle, digest=None):
        self._handle = handle
        self._digest = digest
        self._buffer = b""
        self._position = 0

    def read(self, size: int) -> bytes:
        """`size` bytes, or fewer only at the end of the file."""
        parts = []
        while size > 0:
            if self._position == len(self._buffer):
                self._buffer = self._handle.read(_READ_CHUNK_BYTES)
                self._position = 0
                if not self._buffer:
                    break
                if self._digest is not None:
                    self._digest.update(self._buffer)
            part = self._buffer[self._position : self._position + size]
            self._position += len(part)
            size -= len(part)
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def drain(self):
        """Read to the end of the file (so that the hash covers all of it)."""
        while self.read(_READ_CHUNK_BYTES):
            pass


def _records(reader: _ChunkedReader) -> Iterator[bytes]:
    index = offset = 0

    def broken(what: str) -> RecordError:
        return RecordError(f"record {index} (byte {offset}): {what}")

    while True:
        header = reader.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise broken("the file ends inside a record header (truncated)")
        length, length_crc = _HEADER.unpack(header)
        if _masked_crc(header[:8]) != length_crc:
            raise broken("the record length fails its checksum (corrupted)")
        body = reader.read(length + _FOOTER.size)
        if len(body) < length + _FOOTER.size:
            missing = length + _FOOTER.size - len(body)
            raise broken(f"the file ends inside the record: {missing} of its bytes are missing (truncated)")
        data = body[:length]
        if _masked_crc(data) != _FOOTER.unpack(body[length:])[0]:
            raise broken("the record data fails its checksum (corrupted)")
        yield data
        index += 1
        offset += _HEADER.size + length + _FOOTER.size


def read_records(path: str) -> Iterator[bytes]:
    """The serialized records of one TFRecord file, checksums verified; RecordError where framing breaks.

    Streams: stopping the iteration early reads no further.
    """
    with tf.io.gfile.GFile(path, "rb") as handle:
        yield from _records(_ChunkedReader(handle))


def _batches(records: Iterator[bytes]) -> Iterator[list[bytes]]:
    """`records` in lists of up to _BATCH_RECORDS records or _BATCH_BYTES bytes."""
    batch, batch_bytes = [], 0
    for record in records:
        batch.append(record)
        batch_bytes += len(record)
        if len(batch) >= _BATCH_RECORDS or batch_bytes >= _BATCH_BYTES:
            yield batch
            batch, batch_bytes = [], 0
    if batch:
        yield batch


# ----------------------------------------------------------------- examples

_IDENTITY_KEYS = (features.SHA256, features.URI, features.CLASS_NAME)
# The parse spec of a record: every key of `dataset_contract.features`, one value each.
_EXAMPLE_SPEC = {
    key: tf.io.FixedLenFeature([], tf.int64 if key == features.LABEL else tf.string)
    for key in (features.IMAGE, features.LABEL, *_IDENTITY_KEYS)
}
# What names an image across versions (its sha256, the content of its source) and what a version says of it.
_IDENTITY_SPEC = {key: _EXAMPLE_SPEC[key] for key in _IDENTITY_KEYS}


def parse_examples(serialized: list[bytes], spec: dict = _EXAMPLE_SPEC) -> dict[str, np.ndarray]:
    """Parse a batch of records (tf.errors.InvalidArgumentError if any does not fit the schema)."""
    parsed = tf.io.parse_example(tf.constant(serialized, dtype=tf.string), spec)
    return {key: value.numpy() for key, value in parsed.items()}


def read_identities(path: str) -> Iterator[tuple[str, str, str]]:
    """(sha256, uri, class_name) of each record of one shard, in order, without parsing the image.

    Streams, in batches. RecordError where the framing breaks;
    tf.errors.InvalidArgumentError for a record without those features.
    """
    for batch in _batches(read_records(path)):
        parsed = parse_examples(batch, _IDENTITY_SPEC)
        for sha256, uri, class_name in zip(*(parsed[key] for key in _IDENTITY_KEYS), strict=True):
            yield (
                sha256.decode("ascii"),
                uri.decode("utf-8", "replace"),
                class_name.decode("utf-8", "replace"),
            )


def decode_image(payload: bytes, image: dict) -> np.ndarray:
    """The `image` feature as float32 [height, width, 3], in the stored units.

    Normalized values for bfloat16/float32, 0-255 pixels for uint8/jpeg;
    `image` is the manifest's `image` entry. ValueError for a payload of the
    wrong length, tf.errors.InvalidArgumentError for a jpeg that does not decode.
    """
    shape = (image["height"], image["width"], features.CHANNELS)
    if image["encoding"] == features.JPEG:
        return tf.io.decode_jpeg(payload, channels=features.CHANNELS).numpy().astype(np.float32)
    dtype = _RAW_DTYPES[image["encoding"]]
    expected = features.raw_bytes_per_image(image["encoding"], image["height"], image["width"])
    if len(payload) != expected:
        raise ValueError(f"image is {len(payload)} bytes, expected {expected}")
    return np.frombuffer(payload, dtype=dtype).astype(np.float32).reshape(shape)


@dataclasses.dataclass
class _RecordFindings:
    """What the record checks of one shard found."""

    num_records: int = 0
    class_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    bad: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))  # kind -> messages
    broken: RecordError | None = None  # where the framing broke: no record after it was read

    def add(self, kind: str, index: int, message: str):
        self.bad[kind].append(f"record {index}: {message}")

    def readable(self, records: Iterator[bytes]) -> Iterator[bytes]:
        """`records` up to a RecordError, kept in `broken`."""
        try:
            yield from records
        except RecordError as exc:
            self.broken = exc


def _image_problem(payload: bytes, image: dict) -> str | None:
    expected = features.raw_bytes_per_image(image["encoding"], image["height"], image["width"])
    if expected is not None:
        if len(payload) != expected:
            return (
                f"image is {len(payload)} bytes, but {image['height']}x{image['width']}x{features.CHANNELS} "
                f"{image['encoding']} takes {expected}"
            )
        return None  # values are checked a batch at a time
    try:
        decoded = tf.io.decode_jpeg(payload, channels=features.CHANNELS)
    except tf.errors.InvalidArgumentError as exc:
        return f"image does not decode as jpeg ({exc.message.splitlines()[0]})"
    shape = (image["height"], image["width"], features.CHANNELS)
    if tuple(decoded.shape) != shape:
        return f"jpeg decodes to {tuple(decoded.shape)}, expected {shape}"
    return None


def _check_batch(serialized: list[bytes], manifest: dict, findings: _RecordFindings):
    first_index = findings.num_records
    findings.num_records += len(serialized)
    indices = list(range(first_index, first_index + len(serialized)))
    try:
        parsed = parse_examples(serialized)
    except tf.errors.InvalidArgumentError:
        # Find which records fail; check the rest as usual.
        good = []
        for index, record in zip(indices, serialized, strict=True):
            try:
                parse_examples([record])
                good.append(index)
            except tf.errors.InvalidArgumentError as exc:
                findings.add(BAD_EXAMPLE, index, exc.message.splitlines()[0])
        if not good:
            return
        parsed = parse_examples([serialized[index - first_index] for index in good])
        indices = good

    image, labels = manifest["image"], manifest["labels"]
    finite_checked = []
    for position, (index, payload) in enumerate(zip(indices, parsed[features.IMAGE], strict=True)):
        problem = _image_problem(payload, image)
        if problem:
            findings.add(BAD_IMAGE, index, problem)
        elif image["encoding"] in features.NORMALIZED_ENCODINGS:
            finite_checked.append(position)
    if finite_checked:
        payloads = b"".join(parsed[features.IMAGE][position] for position in finite_checked)
        values = np.frombuffer(payloads, dtype=_RAW_DTYPES[image["encoding"]]).reshape(
            len(finite_checked), -1
        )
        not_finite = (~np.isfinite(values.astype(np.float32))).sum(axis=1)
        for position, count in zip(finite_checked, not_finite, strict=True):
            if count:
                findings.add(BAD_IMAGE, indices[position], f"image has {count} NaN or infinite values")

    for index, label, class_name in zip(
        indices, parsed[features.LABEL], parsed[features.CLASS_NAME], strict=True
    ):
        name = class_name.decode("utf-8", errors="replace")
        findings.class_counts[name] += 1
        if not 0 <= label < len(labels):
            findings.add(
                BAD_LABEL, index, f"label {label} is outside [0, {len(labels)}) (class_name {name!r})"
            )
        elif labels[label] != name:
            expected = (
                f" (label {labels.index(name)})" if name in labels else ", which is not among the labels"
            )
            findings.add(
                BAD_LABEL,
                index,
                f"label {label} is {labels[label]!r} in {PUBLISHED}, but class_name is {name!r}{expected}",
            )


def _summarize(messages: list[str]) -> str:
    quoted = "; ".join(messages[:_QUOTED_RECORDS])
    more = len(messages) - _QUOTED_RECORDS
    prefix = f"{len(messages)} records: " if len(messages) > 1 else ""
    return prefix + quoted + (f"; and {more} more" if more > 0 else "")


# ------------------------------------------------------------------- shards


def verify_named_files(data_dir: str, manifest: dict) -> list[ShardProblem]:
    """The other files a manifest names (error log, tf.Transform's output) that are absent."""
    paths = [
        manifest_lib.join(data_dir, relative) for relative in manifest_lib.other_required_files(manifest)
    ]
    return [
        ShardProblem(path, MISSING, f"named in {PUBLISHED} but absent")
        for path in paths
        if not tf.io.gfile.exists(path)
    ]


def _verify_shard(data_dir: str, manifest: dict, shard: dict, check_sha256: bool, check_records: bool):
    """(problems, class counts or None if the records were not all read) of one shard."""
    path = manifest_lib.join(data_dir, shard["path"])
    if not tf.io.gfile.exists(path):
        return [ShardProblem(path, MISSING, f"listed in {PUBLISHED} but absent")], None
    problems = []

    def problem(kind: str, detail: str):
        problems.append(ShardProblem(path, kind, detail))

    size = tf.io.gfile.stat(path).length
    if size != shard["num_bytes"]:
        problem(
            WRONG_SIZE,
            f"{size} bytes, but {PUBLISHED} says {shard['num_bytes']} (truncated, still being written, or from "
            "another run)",
        )
    # A shard of the wrong size is not hashed: it is already known to be wrong.
    digest = hashlib.sha256() if check_sha256 and size == shard["num_bytes"] else None
    if digest is None and not check_records:
        return problems, None
    findings = _RecordFindings()
    with tf.io.gfile.GFile(path, "rb") as handle:
        reader = _ChunkedReader(handle, digest)
        if check_records:
            for batch in _batches(findings.readable(_records(reader))):
                _check_batch(batch, manifest, findings)
        if digest is not None:
            reader.drain()
    if digest is not None and digest.hexdigest() != shard["sha256"]:
        problem(
            WRONG_SHA256,
            f"sha256 {digest.hexdigest()}, but {PUBLISHED} says {shard['sha256']} (the content changed after it "
            "was written)",
        )
    if not check_records:
        return problems, None
    if findings.broken is not None:
        problem(
            CORRUPT_RECORDS,
            f"{findings.broken}; {findings.num_records} records before it are readable, {PUBLISHED} lists "
            f"{shard['num_examples']}",
        )
    elif findings.num_records != shard["num_examples"]:
        problem(
            WRONG_RECORD_COUNT,
            f"{findings.num_records} records, but {PUBLISHED} says {shard['num_examples']}",
        )
    for kind in (BAD_EXAMPLE, BAD_IMAGE, BAD_LABEL):
        if findings.bad[kind]:
            problem(kind, _summarize(findings.bad[kind]))
    return problems, (findings.class_counts if findings.broken is None else None)


def _split_problems(data_dir: str, manifest: dict, split: str, class_counts: list) -> list[ShardProblem]:
    """The split's examples per class, once all of its shards were read whole."""
    if not class_counts or any(counts is None for counts in class_counts):
        return []
    found = sum(class_counts, collections.Counter())
    listed = manifest["splits"][split]["num_examples_per_class"]
    differ = sorted(name for name in set(found) | set(listed) if found.get(name, 0) != listed.get(name, 0))
    if not differ:
        return []
    shown = differ[:10]
    return [
        ShardProblem(
            manifest_lib.join(data_dir, manifest_lib.MANIFEST_FILE),
            WRONG_CLASS_COUNTS,
            f"split {split!r}: the shards hold "
            + ", ".join(f"{name} {found.get(name, 0)}" for name in shown)
            + "; the manifest says "
            + ", ".join(f"{name} {listed.get(name, 0)}" for name in shown)
            + (f" (and {len(differ) - len(shown)} more classes differ)" if len(differ) > len(shown) else ""),
        )
    ]


def verify_shards(
    data_dir: str,
    manifest: dict,
    splits=manifest_lib.SPLITS,
    check_sha256: bool = False,
    check_records: bool = False,
    num_workers: int = 1,
) -> list[ShardProblem]:
    """Every problem with the listed shards of `splits` (all of them, not just the first).

    Existence and size cost one stat per shard; `check_sha256` and `check_records` read every byte (once,
    whichever are asked for): minutes for a large dataset on GCS, so they are opt-in. `num_workers` shards are
    read at a time.
    """
    jobs = [
        (split, shard) for split in splits for shard in manifest["splits"].get(split, {}).get("shards", [])
    ]
    with concurrent.futures.ThreadPoolExecutor(max(1, num_workers)) as pool:
        results = list(
            pool.map(lambda job: _verify_shard(data_dir, manifest, job[1], check_sha256, check_records), jobs)
        )
    problems = [problem for shard_problems, _ in results for problem in shard_problems]
    for split in splits if check_records else ():
        if split in manifest["splits"]:
            counts = [
                counts
                for (job_split, _), (_, counts) in zip(jobs, results, strict=True)
                if job_split == split
            ]
            problems += _split_problems(data_dir, manifest, split, counts)
    return problems
