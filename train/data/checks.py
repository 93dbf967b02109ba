"""Read `dataset.json` and check a dataset directory before the first training step.

A run that dies an hour in on a missing shard, or trains happily on the
wrong image size, wastes a TPU; everything that can be known from the
manifest and a stat of each shard is checked here, up front, and reported
as a DatasetError that names the file or the mismatch.
"""

import json

from dataset_contract import features, verification
from dataset_contract import manifest as manifest_lib
from train.config import paths_off_gcs
from train.errors import ConfigError, DatasetError
from train.model import models


def read_manifest(data_dir: str) -> dict:
    """The parsed and structurally checked published manifest of `data_dir`."""
    data, path = read_published_manifest(data_dir)
    return parse_manifest(data, where=path)


def read_manifest_bytes(data_dir: str) -> bytes:
    """The bytes of the published manifest of `data_dir`, as they are now (DatasetError if there is none)."""
    return read_published_manifest(data_dir)[0]


def read_published_manifest(data_dir: str) -> tuple[bytes, str]:
    """The published manifest's bytes and path: `dataset.json`, or in the never-overwrite layout the
    newest of `manifests/` it points to (docs/dataset_format.md). DatasetError if there is none."""
    try:
        return verification.read_published_bytes(data_dir)
    except manifest_lib.ManifestError as exc:
        raise DatasetError(str(exc).replace("(wrong path,", "(wrong --data path,")) from exc


def parse_manifest(data: bytes, where: str) -> dict:
    """A manifest's bytes, parsed and structurally checked; DatasetError naming `where` if they are not one."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict):
        raise DatasetError(f"{where}: expected a JSON object, found {type(manifest).__name__}")
    try:
        manifest_lib.check_manifest(manifest, where=where)
    except manifest_lib.ManifestError as exc:
        raise DatasetError(str(exc)) from exc
    return manifest


def check_dataset(
    data_dir: str,
    manifest: dict,
    splits=(manifest_lib.TRAIN, manifest_lib.VALIDATION),
    verify_sha256: bool = False,
) -> None:
    """Raise DatasetError naming every problem that would stop or spoil training on `splits`."""
    where = manifest_lib.join(data_dir, manifest_lib.MANIFEST_FILE)
    image = manifest["image"]
    if image["encoding"] not in features.ENCODINGS:
        raise DatasetError(
            f"{where}: image.encoding {image['encoding']!r} is not one this code can decode "
            f"({', '.join(features.ENCODINGS)})"
        )
    if image["channels"] != features.CHANNELS:
        raise DatasetError(
            f"{where}: image.channels is {image['channels']}, expected {features.CHANNELS} (RGB)"
        )
    if image["height"] != image["width"]:
        # The serving signature resizes to a square (as stage 1's --image-size does);
        # finding out at export time would waste the whole run.
        raise DatasetError(
            f"{where}: images are {image['height']}x{image['width']}; training and serving expect square images"
        )
    if not manifest["labels"]:
        raise DatasetError(f"{where}: labels is empty; there is nothing to classify")
    normalization = manifest["normalization"]
    for key in ("mean", "std"):
        values = normalization.get(key)
        if not isinstance(values, list) or len(values) != features.CHANNELS:
            raise DatasetError(
                f"{where}: normalization.{key} must list {features.CHANNELS} per-channel values"
            )
    if min(normalization["std"]) <= 0:
        raise DatasetError(f"{where}: normalization.std {normalization['std']} has a non-positive value")
    for split in splits:
        info = manifest["splits"].get(split)
        if info is None or not info["shards"] or info["num_examples"] < 1:
            raise DatasetError(f"{where}: split {split!r} has no examples; training needs {list(splits)}")
        listed = sum(shard["num_examples"] for shard in info["shards"])
        if listed != info["num_examples"]:
            raise DatasetError(
                f"{where}: split {split!r} says num_examples={info['num_examples']} "
                f"but its shards add up to {listed}"
            )
    # --verify-data reads every byte anyway: the record-level checks share that read.
    problems = verification.verify_shards(
        data_dir,
        manifest,
        splits=splits,
        check_sha256=verify_sha256,
        check_records=verify_sha256,
        num_workers=8,
    )
    if problems:
        raise DatasetError(
            f"{len(problems)} shard(s) do not match {where}:\n"
            + "\n".join(f"  {problem}" for problem in problems)
        )


def check_model_fits(model_name: str, manifest: dict) -> None:
    """Raise DatasetError if `model_name` cannot take the dataset's images."""
    # With a crop margin the model sees crop_size x crop_size windows of the stored images.
    height = width = manifest_lib.crop_size(manifest["image"])
    minimum = models.min_image_size(model_name)
    if height < minimum or width < minimum:
        raise DatasetError(
            f"model {model_name!r} needs images of at least {minimum}x{minimum}, but the dataset's images are "
            f"{height}x{width}; re-run preprocess with a larger --image-size or pick another --model"
        )


def check_paths_for_hosts(data_dir: str, model_dir: str, num_machines: int, shared_filesystem: bool) -> None:
    """Refuse local --data / --model-dir when training spans several machines.

    Every host reads its own shards of --data, and checkpoints must outlive
    the machine that wrote them (a preempted TPU or spot VM loses its disk):
    on more than one machine both belong on gs://, unless every host mounts
    the same filesystem at the same path (--shared-filesystem).
    """
    if num_machines <= 1 or shared_filesystem:
        return
    named = paths_off_gcs(data_dir, model_dir)
    if named:
        raise ConfigError(
            f"{named}: not on gs://, but this training spans {num_machines} machines. Every host reads its own "
            "shards and the checkpoints must survive any one machine (a preempted VM loses its disk): put the "
            "dataset and the model dir on gs://BUCKET/..., or pass --shared-filesystem if every host mounts the "
            "same filesystem at these paths (NFS, Filestore, gcsfuse)"
        )
