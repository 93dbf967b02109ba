"""The last step of the job: build the manifest naming the run's files where they are, and publish it
(preprocess.publish.commit)."""

import datetime
import logging

from dataset_contract import image_errors
from dataset_contract import manifest as manifest_lib
from dataset_contract.features import CHANNELS
from preprocess.config import DEFAULT_MAX_FAILED_FRACTION, DEFAULT_RETENTION_DAYS, NEAR_DUPLICATES_OFF
from preprocess.decode import outcomes, source_sizes
from preprocess.errors import TooManyFailuresError
from preprocess.near_duplicates.limits import DEFAULT_MAX_GROUP_SIZE, DEFAULT_MAX_MOVED_SHARE
from preprocess.near_duplicates.signature import SIGNATURE_VERSION
from preprocess.publish.commit import SupersededRunError, publish_run
from preprocess.publish.fingerprint import compute_fingerprint
from preprocess.publish.runs import RunPaths, run_started_at
from preprocess.write.transform_output import read_label_vocabulary

# How many moved images the manifest names (all are counted).
MOVES_NAMED = 20
_TRANSFORM_DIRS = (manifest_lib.TRANSFORM_FN_DIR, manifest_lib.TRANSFORMED_METADATA_DIR)


def build_manifest(
    *,
    config: dict,
    run_id: str,
    labels,
    stats,
    shards,
    class_counts,
    num_found,
    failures,
    num_duplicates,
    num_near_duplicates=0,
    error_files=(),
    skipped_by_extension=None,
    skipped_at_root=0,
    near_duplicates=None,
    near_duplicate_files=(),
    source_image_sizes=None,
    num_decoded=None,
    num_reused=0,
    ledger_files=(),
    moved=(),
):
    """The manifest dict, from the job's config and the facts the pipeline gathered (shards.WriteShards' and
    WriteErrorLog's entries, outcomes.tally's skips, the near-duplicate summary, source_sizes')."""
    run = RunPaths(config["output"], run_id)
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
    near_duplicates = near_duplicates or {"mode": NEAR_DUPLICATES_OFF}
    if near_duplicates.get("mode", NEAR_DUPLICATES_OFF) != NEAR_DUPLICATES_OFF:
        # The split fractions the run realised (beside split_fractions, the requested ones): how far the
        # audit's moves took them, rounded to 4 places.
        realised = {split: round(info["num_examples"] / num_written, 4) if num_written else 0.0
                    for split, info in splits.items()}  # fmt: skip
        near_duplicates = {**near_duplicates, "realised_split_fractions": realised}
    num_failed = sum(failures.values())
    mean, std = stats
    # What each field means: docs/dataset_format.md.
    return {
        "format_version": manifest_lib.FORMAT_VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run": {
            "id": run_id,
            "started_at": run_started_at(run_id),
            "dir": run.relative_dir,
            "built_from": config.get("built_from"),
            "full_rebuild": config.get("full_rebuild", "the first version"),
        },
        "source": {"input": config["input"], "kind": config["input_kind"]},
        "image": {
            "height": config["image_size"],
            "width": config["image_size"],
            "channels": CHANNELS,
            "encoding": config["encoding"],
            "resize_method": config["resize_method"],
            "max_pixels": config["max_pixels"],
            "max_file_bytes": config.get("max_file_bytes", image_errors.DEFAULT_MAX_FILE_BYTES),
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
            "num_near_duplicates": num_near_duplicates,
            "num_decoded": num_decoded,
            "num_reused": num_reused,
            "num_moved_by_named_split": len(moved),
            "moved_by_named_split": sorted(moved, key=lambda move: move["uri"])[:MOVES_NAMED],
            "failures_by_reason": dict(sorted(failures.items())),
            "skipped_by_extension": dict(sorted((skipped_by_extension or {}).items())),
            "skipped_at_root": skipped_at_root,
        },
        "split_fractions": config["split_fractions"],
        "transform": {name: run.relative(name) for name in _TRANSFORM_DIRS},
        "error_files": sorted(error_files, key=lambda entry: entry["path"]),
        "near_duplicates": near_duplicates,
        "near_duplicate_files": sorted(near_duplicate_files, key=lambda entry: entry["path"]),
        "ledger_files": sorted(ledger_files, key=lambda entry: entry["path"]),
        "source_image_sizes": source_image_sizes or empty_source_sizes(),
    }


def empty_source_sizes() -> dict:
    """`source_image_sizes` when no image was decoded."""
    return source_sizes.SourceImageSizesFn().extract_output(
        source_sizes.SourceImageSizesFn().create_accumulator()
    )


def near_duplicate_summary(config: dict, stats: dict | None) -> dict:
    """The manifest's `near_duplicates`: the mode, the distance, the guards and the grouping's counts
    ({"mode": "off"} when the audit was off). build_manifest adds the realised split fractions."""
    mode = config.get("near_duplicates", NEAR_DUPLICATES_OFF)
    if mode == NEAR_DUPLICATES_OFF:
        return {"mode": NEAR_DUPLICATES_OFF}
    return {
        "mode": mode,
        "signature_version": SIGNATURE_VERSION,
        "max_distance": config["near_duplicate_distance"],
        "max_group": config.get("near_duplicate_max_group", DEFAULT_MAX_GROUP_SIZE),
        "max_moved": config.get("near_duplicate_max_moved", DEFAULT_MAX_MOVED_SHARE),
        **dict(sorted((stats or {}).items())),
    }


def check_failed_fraction(counts: dict, max_failed_fraction: float, run: RunPaths):
    """Raise TooManyFailuresError if the run's failed inputs (`counts`, as outcomes.tally gives them) exceed
    `max_failed_fraction` of those found; the same message at every retry."""
    found, failed = counts["num_found"], sum(counts["failures"].values())
    if not found or failed / found <= max_failed_fraction:
        return
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(counts["failures"].items()))
    raise TooManyFailuresError(
        f"run {run.run_id}: {failed} of the {found} inputs found failed ({failed / found:.1%}), more than "
        f"--max-failed-fraction {max_failed_fraction:g} allows: {reasons}. Nothing was published "
        f"(the published dataset is unchanged). See which files and why in the error log, {run.final('errors-*.jsonl')}; "
        "fix the inputs (read access, the manifest's URIs), or re-run with a higher --max-failed-fraction "
        "if that many failures are expected."
    )


def finalize_dataset(
    _,
    *,
    config,
    run_id,
    labels,
    stats,
    shards,
    errors_log,
    outcome_counts,
    near_duplicate_stats=None,
    near_duplicate_files=(),
    source_image_sizes=None,
    ledger_files=(),
    moved=(),
):
    """Build the manifest of run `run_id` and publish it in `config['output']`; returns the manifest. The
    arguments are the facts the pipeline gathered (build_manifest); `stats` is read back from the run's graph."""
    run = RunPaths(config["output"], run_id)
    counts = outcomes.tally(outcome_counts)
    check_failed_fraction(counts, config.get("max_failed_fraction", DEFAULT_MAX_FAILED_FRACTION), run)
    if not labels or not any(shard["split"] == manifest_lib.TRAIN for shard in shards):
        raise ValueError(
            "no training example was written: every input failed or the split gave train nothing; "
            f"see the error log, {run.final('errors-*.jsonl')}"
        )
    analyzed = read_label_vocabulary(run.final(manifest_lib.TRANSFORM_FN_DIR))
    if analyzed != list(labels):
        # Only when every train image of a class failed to decode: the records were labelled from
        # the train inputs before decoding, tf.Transform's vocabulary from the decoded ones.
        logging.warning(
            "classes %s have train inputs but no decoded train image: their index is kept, and the "
            "label vocabulary in %s lacks them",
            sorted(set(labels) - set(analyzed)),
            run.final(manifest_lib.TRANSFORM_FN_DIR),
        )
    manifest = build_manifest(
        config=config,
        run_id=run_id,
        labels=labels,
        stats=stats,
        shards=shards,
        error_files=errors_log,
        near_duplicates=near_duplicate_summary(config, near_duplicate_stats),
        near_duplicate_files=near_duplicate_files,
        source_image_sizes=source_image_sizes,
        ledger_files=ledger_files,
        moved=moved,
        **counts,
    )
    # None, with a warning, if the inputs cannot be listed now: a dataset without one is only built again by
    # a workflow, never refused.
    try:
        fingerprint = compute_fingerprint(config)
    except Exception as exc:  # noqa: BLE001 - an optional field must not stop a finished run from publishing
        logging.warning("no build fingerprint for the manifest (listing %s failed: %s)", config["input"], exc)
        fingerprint = None
    manifest["build"] = {"fingerprint": fingerprint}
    manifest_lib.check_manifest(manifest)
    try:
        return publish_run(
            config["output"],
            run_id,
            manifest,
            tft_build_id=config.get("build_id"),
            retention_days=config.get("retention_days", DEFAULT_RETENTION_DAYS),
        )
    except SupersededRunError as exc:
        # Not a failure to retry (every retry would say the same): the job ends, and the launcher reads
        # the log and says that a newer run superseded this one.
        logging.warning("%s", exc)
        return None
