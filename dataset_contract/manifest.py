"""The manifest `dataset.json`: names, layout and a structural check, without Beam or TensorFlow (the
formats and the commit log: docs/internals.md, docs/dataset_format.md)."""

import hashlib
import posixpath

from dataset_contract import image_errors

FORMAT_VERSION = 2
# 3: format 3's layout (see above), where dataset.json was a pointer to the newest of manifests/.
SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)

MANIFEST_FILE = "dataset.json"
ERRORS_FILE = "errors.jsonl"
TRANSFORM_FN_DIR = "transform_fn"
TRANSFORMED_METADATA_DIR = "transformed_metadata"
# Each run's files, under RUNS_DIR/<run id>/ (format 2).
RUNS_DIR = "runs"
# The commit log: the published manifests, one object each, never replaced.
MANIFESTS_DIR = "manifests"
MANIFESTS_LAYOUT = "manifests"

TRAIN = "train"
VALIDATION = "validation"
TEST = "test"
SPLITS = (TRAIN, VALIDATION, TEST)

SHARD_SUFFIX = ".tfrecord"


def shard_file_name(split: str, index: int, num_shards: int) -> str:
    """`train-00003-of-00016.tfrecord`: how format 1 named the shards of a split (readers never parse names)."""
    return f"{split}-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}"


def shard_glob(split: str) -> str:
    """Every format 1 shard name of a split: only for removing a format 1 dataset's top-level shards."""
    return f"{split}-?????-of-?????{SHARD_SUFFIX}"


def run_dir(run_id: str) -> str:
    """`runs/<run id>`: where one run's files live, relative to the dataset directory."""
    return posixpath.join(RUNS_DIR, run_id)


def join(directory: str, *names: str) -> str:
    """Join path parts for local paths and `gs://` URIs alike."""
    return posixpath.join(directory, *names) if directory else posixpath.join(*names)


def is_pointer(manifest: dict | None) -> bool:
    """Whether a parsed `dataset.json` is format 3's pointer to `manifests/` rather than a manifest."""
    return isinstance(manifest, dict) and manifest.get("layout") == MANIFESTS_LAYOUT


def manifest_sha256(data: bytes) -> str:
    """The hex sha256 of a manifest's exact bytes as read (never re-serialized): what identifies it."""
    return hashlib.sha256(data).hexdigest()


def manifest_run_id(manifest: dict) -> str | None:
    """The id of the run whose files a manifest names; None for a format 1 manifest (before runs)."""
    return (manifest.get("run") or {}).get("id") or None


def shard_paths(manifest: dict, splits=SPLITS) -> list[str]:
    """The shards (relative paths) a manifest lists for `splits`, in manifest order."""
    return [
        shard["path"] for split in splits for shard in (manifest["splits"].get(split) or {}).get("shards", [])
    ]


def crop_size(image: dict) -> int:
    """The side of the square the model sees: `image.crop_size`, or the stored height (no crop margin)."""
    return int(image.get("crop_size") or image["height"])


def max_file_bytes(image: dict) -> int:
    """The file size limit (bytes) stage 1 held the inputs to (`image.max_file_bytes`, else the default)."""
    return int(image.get("max_file_bytes") or image_errors.DEFAULT_MAX_FILE_BYTES)


class ManifestError(ValueError):
    """The manifest is missing, malformed or of an unknown format."""


def relative_path_problem(path) -> str | None:
    """Why `path` is not relative, '/'-separated, without '', '.' or '..' parts (so that it can only name a
    file below the dataset directory); None if it is."""
    if not isinstance(path, str) or not path:
        return "must be a non-empty string"
    if "://" in path or path.startswith("/") or "\\" in path:
        return "must be relative to the dataset directory ('/'-separated, no scheme, no leading '/')"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "must not have empty, '.' or '..' parts"
    return None


def _check_path(path, what: str, where: str) -> None:
    problem = relative_path_problem(path)
    if problem:
        raise ManifestError(f"{where}: {what} {path!r} {problem}")


def transform_output_dir(manifest: dict) -> str:
    """The directory, relative to the dataset's, for `tft.TFTransformOutput`: `runs/<run id>` or '' (format 1)."""
    transform = manifest.get("transform") or {}
    return posixpath.dirname(transform.get(TRANSFORM_FN_DIR, TRANSFORM_FN_DIR))


def error_file_paths(manifest: dict) -> list[str]:
    """The error log's files (relative paths): `error_files`, else format 2's `errors` or format 1's file."""
    if "error_files" in manifest:
        return [entry["path"] for entry in manifest["error_files"]]
    return [manifest.get("errors", ERRORS_FILE)]


# The lists of files a manifest names besides the shards, each entry {path, COUNT, num_bytes, sha256}:
# {key: (COUNT, what a path is called)}. The error log (empty when nothing failed); the near-duplicate groups,
# one JSON line per group (absent or empty when the audit found none); the ledger, one JSON line per image
# written, what a re-run reuses (absent before issue 32).
_FILE_LISTS = {
    "error_files": ("num_errors", "error file path"),
    "near_duplicate_files": ("num_groups", "near-duplicate file path"),
    "ledger_files": ("num_images", "ledger_files"),
}


def near_duplicate_file_paths(manifest: dict) -> list[str]:
    """The near-duplicate groups' files, relative paths."""
    return [entry["path"] for entry in manifest.get("near_duplicate_files") or []]


def ledger_file_paths(manifest: dict) -> list[str]:
    """The files of the version's ledger, relative paths."""
    return [entry["path"] for entry in manifest.get("ledger_files") or []]


def describe_error_files(manifest: dict, data_dir: str = "") -> str:
    """Where the error log is, for a person: its one file, or how many files where."""
    paths = [join(data_dir, path) for path in error_file_paths(manifest)]
    if len(paths) == 1:
        return paths[0]
    if not paths:
        return "no error file (nothing failed)"
    directories = sorted({posixpath.dirname(path) for path in paths})
    where = f"{directories[0]}/errors-*.jsonl" if len(directories) == 1 else "error_files"
    return f"{len(paths)} files, {where} (listed in {MANIFEST_FILE}'s error_files)"


def other_required_files(manifest: dict) -> list[str]:
    """Besides the shards, the files (relative paths) its manifest names: the error log, the near-duplicate
    groups, the ledger, and those `tft.TFTransformOutput` cannot load without."""
    required = error_file_paths(manifest) if "error_files" in manifest or "errors" in manifest else []
    required += near_duplicate_file_paths(manifest) + ledger_file_paths(manifest)
    transform = manifest.get("transform") or {}
    if TRANSFORM_FN_DIR in transform:
        required.append(join(transform[TRANSFORM_FN_DIR], "saved_model.pb"))
    if TRANSFORMED_METADATA_DIR in transform:
        required.append(join(transform[TRANSFORMED_METADATA_DIR], "schema.pbtxt"))
    return required


_REQUIRED_KEYS = ("format_version", "image", "labels", "normalization", "splits", "inputs")


def check_manifest(manifest: dict, where: str = MANIFEST_FILE) -> None:
    """Raise ManifestError naming the first structural problem, if any."""
    missing = [key for key in _REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ManifestError(f"{where}: missing keys {missing}; was it written by this project's preprocess?")
    version = manifest["format_version"]
    if is_pointer(manifest):
        raise ManifestError(
            f"{where}: a pointer to {MANIFESTS_DIR}/, not a manifest: the published manifest is the newest "
            f"object of {MANIFESTS_DIR}/ (read the directory with this project's readers)"
        )
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
            _check_path(shard["path"], "shard path", where)
    if "errors" in manifest:
        _check_path(manifest["errors"], "errors", where)
    for list_key, (count, what) in _FILE_LISTS.items():
        for entry in manifest.get(list_key) or []:
            for key in ("path", count, "num_bytes", "sha256"):
                if key not in entry:
                    raise ManifestError(f"{where}: an entry of {list_key} has no {key!r}")
            _check_path(entry["path"], what, where)
    near_duplicates = manifest.get("near_duplicates")
    if near_duplicates is not None and not (isinstance(near_duplicates, dict) and "mode" in near_duplicates):
        raise ManifestError(
            f"{where}: near_duplicates must be an object with a mode, got {near_duplicates!r}"
        )
    for name, path in (manifest.get("transform") or {}).items():
        _check_path(path, f"transform.{name}", where)
    if version >= 2:
        run = manifest.get("run")
        if not isinstance(run, dict) or not run.get("id"):
            raise ManifestError(
                f"{where}: run.id is missing (format_version {version} names the run it publishes)"
            )
    inputs = manifest["inputs"]
    found = inputs.get("num_found")
    # Near-duplicates dropped (--near-duplicates drop) are counted apart from the exact copies.
    accounted = (
        inputs.get("num_written", 0)
        + inputs.get("num_failed", 0)
        + inputs.get("num_duplicates", 0)
        + inputs.get("num_near_duplicates", 0)
    )
    if found != accounted:
        raise ManifestError(
            f"{where}: inputs do not add up: num_found={found} but "
            f"written+failed+duplicates+near_duplicates={accounted}"
        )
