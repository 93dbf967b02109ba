"""The last step of the job: put the new dataset in place and write the manifest.

Runs once, after every shard, the error log and the transform graph are
complete in the run's staging directory. In order:

1. delete the old `dataset.json`, so a reader sees an incomplete directory
   (not an old manifest over new files) from here on;
2. delete everything an earlier run wrote (shards of any count, errors.jsonl,
   transform_fn/, transformed_metadata/);
3. move the new files from staging into place (a rename on local disk, a copy
   + delete per object on GCS: each object appears whole or not at all);
4. write `dataset.json` (to a temporary name, then renamed), and remove staging.
"""

import datetime
import json
import posixpath

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from dataset_contract.features import CHANNELS
from preprocess.transform import LABEL_VOCABULARY_FILE

_TRANSFORM_DIRS = (manifest_lib.TRANSFORM_FN_DIR, manifest_lib.TRANSFORMED_METADATA_DIR)


def list_files(directory: str) -> list[str]:
    """Every file below `directory`, recursively (local or gs://)."""
    pattern = manifest_lib.join(directory, "**")
    return [metadata.path for metadata in FileSystems.match([pattern])[0].metadata_list]


def _ensure_parent(path: str):
    parent = posixpath.dirname(path)
    if parent and not FileSystems.exists(parent):
        try:
            FileSystems.mkdirs(parent)
        except OSError:
            pass  # created concurrently, or an object store with no directories


def delete_tree(directory: str):
    files = list_files(directory)
    if files:
        FileSystems.delete(files)
    if FileSystems.exists(directory):  # local disk keeps empty directories
        FileSystems.delete([directory])


def move_file(source: str, destination: str):
    _ensure_parent(destination)
    FileSystems.rename([source], [destination])


def delete_previous_dataset(output_dir: str):
    """Remove every file an earlier run may have left, manifest first."""
    manifest_path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    if FileSystems.exists(manifest_path):
        FileSystems.delete([manifest_path])
    stale = []
    for split in manifest_lib.SPLITS:
        pattern = manifest_lib.join(output_dir, manifest_lib.shard_glob(split))
        stale += [metadata.path for metadata in FileSystems.match([pattern])[0].metadata_list]
    errors_path = manifest_lib.join(output_dir, manifest_lib.ERRORS_FILE)
    if FileSystems.exists(errors_path):
        stale.append(errors_path)
    if stale:
        FileSystems.delete(stale)
    for name in _TRANSFORM_DIRS:
        delete_tree(manifest_lib.join(output_dir, name))


def read_label_vocabulary(transform_dir: str) -> list[str]:
    path = manifest_lib.join(transform_dir, manifest_lib.TRANSFORM_FN_DIR, "assets", LABEL_VOCABULARY_FILE)
    with FileSystems.open(path) as handle:
        return [line for line in handle.read().decode("utf-8").split("\n") if line]


def build_manifest(*, config: dict, labels, stats, shards, class_counts, num_found, failures, num_duplicates):
    """The manifest dict, from the job's config and the facts the pipeline gathered."""
    splits = {}
    for split in manifest_lib.SPLITS:
        split_shards = sorted((shard for shard in shards if shard["split"] == split), key=lambda s: s["path"])
        per_class = {label: 0 for label in labels}
        for (count_split, class_name), count in class_counts:
            if count_split == split:
                per_class[class_name] = per_class.get(class_name, 0) + count
        splits[split] = {
            "num_examples": sum(shard["num_examples"] for shard in split_shards),
            "num_examples_per_class": per_class,
            "shards": [
                {key: shard[key] for key in ("path", "num_examples", "num_bytes", "sha256")}
                for shard in split_shards
            ],
        }
    num_written = sum(info["num_examples"] for info in splits.values())
    num_failed = sum(failures.values())
    mean, std = stats
    return {
        "format_version": manifest_lib.FORMAT_VERSION,
        "created_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": {"input": config["input"], "kind": config["input_kind"]},
        "image": {
            "height": config["image_size"],
            "width": config["image_size"],
            "channels": CHANNELS,
            "encoding": config["encoding"],
            "resize_method": config["resize_method"],
            # The model's square: random crops of it in training, the center one in evaluation and
            # serving. Equal to height/width without a margin.
            "crop_size": config.get("crop_size", config["image_size"]),
            "crop_margin": config.get("crop_margin", 0.0),
            "jpeg_quality": config["jpeg_quality"] if config["encoding"] == "jpeg" else None,
        },
        "labels": list(labels),
        "normalization": {
            "mean": list(mean),
            "std": list(std),
            "units": "0-255 pixel values",
            "computed_on": manifest_lib.TRAIN,
        },
        "splits": splits,
        "inputs": {
            "num_found": num_found,
            "num_written": num_written,
            "num_failed": num_failed,
            "num_duplicates": num_duplicates,
            "failures_by_reason": dict(sorted(failures.items())),
        },
        "split_fractions": config["split_fractions"],
        "transform": {name: name for name in _TRANSFORM_DIRS},
        "errors": manifest_lib.ERRORS_FILE,
    }


def finalize_dataset(
    _,
    *,
    config,
    staging_dir,
    shards,
    class_counts,
    stats,
    num_found,
    failures,
    num_duplicates,
    errors_files,
    transform_written,
):
    """Move the staged dataset into `config['output']` and write its manifest; returns the manifest."""
    del errors_files, transform_written  # side inputs only to order this step after those writes
    output_dir = config["output"]
    if not stats:
        raise ValueError(
            "no training example was written: every input failed or the split gave train nothing; "
            f"see {manifest_lib.join(staging_dir, manifest_lib.ERRORS_FILE)}"
        )
    if len(set(stats)) != 1:
        raise AssertionError(f"the transform applied different statistics to different batches: {set(stats)}")
    labels = read_label_vocabulary(staging_dir)

    delete_previous_dataset(output_dir)
    for shard in shards:
        move_file(manifest_lib.join(staging_dir, shard["path"]), manifest_lib.join(output_dir, shard["path"]))
    staged_errors = manifest_lib.join(staging_dir, manifest_lib.ERRORS_FILE)
    move_file(staged_errors, manifest_lib.join(output_dir, manifest_lib.ERRORS_FILE))
    for name in _TRANSFORM_DIRS:
        source_dir = manifest_lib.join(staging_dir, name)
        for source in list_files(source_dir):
            move_file(source, manifest_lib.join(output_dir, name, source[len(source_dir) + 1 :]))

    manifest = build_manifest(
        config=config,
        labels=labels,
        stats=next(iter(stats)),
        shards=shards,
        class_counts=class_counts,
        num_found=num_found,
        failures=dict(failures),
        num_duplicates=num_duplicates,
    )
    manifest_lib.check_manifest(manifest)
    manifest_path = manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)
    temporary_path = manifest_path + ".tmp"
    with FileSystems.create(temporary_path) as handle:
        handle.write(json.dumps(manifest, indent=2).encode("utf-8"))
    FileSystems.rename([temporary_path], [manifest_path])
    try:
        delete_tree(staging_dir)
    except BeamIOError:
        pass  # leftovers in staging do not affect the dataset; the next run's cleanup is by name
    return manifest
