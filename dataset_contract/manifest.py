"""The manifest `dataset.json`: names, layout and a structural check.

Stage 1 writes the manifest last, after every shard is final; stage 2 reads
exactly the shards it lists. This module holds only what both need to agree
on; each stage does its own I/O (Beam `FileSystems` in stage 1, `tf.io.gfile`
in stage 2), so nothing here imports either.
"""

import posixpath

FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)

MANIFEST_FILE = "dataset.json"
ERRORS_FILE = "errors.jsonl"
TRANSFORM_FN_DIR = "transform_fn"
TRANSFORMED_METADATA_DIR = "transformed_metadata"

TRAIN = "train"
VALIDATION = "validation"
TEST = "test"
SPLITS = (TRAIN, VALIDATION, TEST)

SHARD_SUFFIX = ".tfrecord"


def shard_file_name(split: str, index: int, num_shards: int) -> str:
    """`train-00003-of-00016.tfrecord`: the name of one shard of a split."""
    return f"{split}-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}"


def shard_glob(split: str) -> str:
    """Pattern matching every shard name of a split, whatever its count.

    Only for removing shards of an earlier run; readers use the manifest.
    """
    return f"{split}-?????-of-?????{SHARD_SUFFIX}"


def join(directory: str, *names: str) -> str:
    """Join path parts for local paths and `gs://` URIs alike."""
    return posixpath.join(directory, *names) if directory else posixpath.join(*names)


def crop_size(image: dict) -> int:
    """The side of the square the model sees: `image.crop_size`, or the stored height without a crop margin.

    Stage 1's --crop-margin stores `height` x `width` = round(crop_size * (1 + margin)) squares; training
    takes random crop_size windows of them, evaluation and serving the center one. Manifests written
    before the margin existed have no `crop_size`: the model sees the stored image.
    """
    return int(image.get("crop_size") or image["height"])


class ManifestError(ValueError):
    """The manifest is missing, malformed or of an unknown format."""


_REQUIRED_KEYS = ("format_version", "image", "labels", "normalization", "splits", "inputs")


def check_manifest(manifest: dict, where: str = MANIFEST_FILE) -> None:
    """Raise ManifestError naming the first structural problem, if any."""
    missing = [key for key in _REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ManifestError(f"{where}: missing keys {missing}; was it written by this project's preprocess?")
    version = manifest["format_version"]
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise ManifestError(
            f"{where}: format_version {version!r} is not supported by this version of the code "
            f"(supported: {list(SUPPORTED_FORMAT_VERSIONS)}); re-run preprocess with this version, "
            "or use the version of train that matches the dataset"
        )
    image = manifest["image"]
    for key in ("height", "width", "channels", "encoding", "resize_method"):
        if key not in image:
            raise ManifestError(f"{where}: image.{key} is missing")
    crop = image.get("crop_size")
    if crop is not None and not (isinstance(crop, int) and 1 <= crop <= min(image["height"], image["width"])):
        raise ManifestError(
            f"{where}: image.crop_size {crop!r} must be a positive integer no larger than the stored "
            f"{image['height']}x{image['width']}"
        )
    for split, info in manifest["splits"].items():
        for key in ("num_examples", "num_examples_per_class", "shards"):
            if key not in info:
                raise ManifestError(f"{where}: splits.{split}.{key} is missing")
        for shard in info["shards"]:
            for key in ("path", "num_examples", "num_bytes", "sha256"):
                if key not in shard:
                    raise ManifestError(f"{where}: a shard of split {split} has no {key!r}")
            if "/" in shard["path"] or shard["path"].startswith("."):
                raise ManifestError(f"{where}: shard path {shard['path']!r} must be a plain file name")
    inputs = manifest["inputs"]
    found = inputs.get("num_found")
    accounted = inputs.get("num_written", 0) + inputs.get("num_failed", 0) + inputs.get("num_duplicates", 0)
    if found != accounted:
        raise ManifestError(
            f"{where}: inputs do not add up: num_found={found} but written+failed+duplicates={accounted}"
        )
