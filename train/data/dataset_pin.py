"""The dataset run a model dir trains on: pinned at its first start, kept by every resume.

Stage 1 publishes a run by replacing `dataset.json`; the files of the run it
supersedes stay for a retention period (`preprocess --retention-days`) and are
removed after it (docs/dataset_format.md). Training reads `dataset.json` once
per process and re-opens the shards every epoch. Without a pin, a resume after
a re-run of stage 1 would silently train on another dataset (other labels,
other normalization) with the same checkpoint, and a job whose run was removed
would die on a raw NotFoundError.

So the first start in a model dir records what it read:

    MODEL_DIR/dataset_pin.json            run_id, manifest_sha256, data_dir, created_at, pinned_at
    MODEL_DIR/dataset_pin.manifest.json   the manifest's exact bytes (their sha256 is manifest_sha256)

and every later start in it (a resume) trains on the pinned manifest, not on
whatever `dataset.json` names now:

- `dataset.json` still holds the pinned bytes: nothing changes;
- it names another run, and the pinned run's shards are all still there:
  training goes on with the pinned run, and a warning names both;
- some pinned shards are gone: DatasetError naming both runs and what to do.

It never switches runs silently. While training, `explain_vanished_shards`
turns the NotFoundError of a pinned shard that disappeared into a
DatasetError naming the run. The pin's fields (`lineage`) also go into
metrics.json and the export's `assets.extra/dataset_lineage.json`.

Only the chief writes the pin (`record_pin`), after the dataset checks pass,
and the manifest copy before the pin that names its sha256, each file
atomically: a crash leaves no pin or a complete one. Every worker resolves
the pin at its own start.
"""

import concurrent.futures
import contextlib
import dataclasses
import datetime
import json
import logging
import uuid

import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train.data import checks
from train.errors import DatasetError
from train.loop.checkpoints import CHECKPOINT_DIR

PIN_FILE = "dataset_pin.json"
PINNED_MANIFEST_FILE = "dataset_pin.manifest.json"
# The splits training reads, whose shards must exist for a pinned run to be usable.
TRAINING_SPLITS = (manifest_lib.TRAIN, manifest_lib.VALIDATION)
# Existence checks in flight at once (one HEAD request each on GCS).
_STAT_THREADS = 16

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PinnedDataset:
    """The manifest a model dir trains on, and what identifies it."""

    data_dir: str
    manifest: dict
    manifest_bytes: bytes
    pinned_at: str
    # Whether MODEL_DIR already holds this pin (a resume), or record_pin still has to write it.
    recorded: bool

    @property
    def run_id(self) -> str | None:
        return manifest_lib.manifest_run_id(self.manifest)

    @property
    def manifest_sha256(self) -> str:
        return manifest_lib.manifest_sha256(self.manifest_bytes)

    @property
    def lineage(self) -> dict:
        """What metrics.json and the export record about the dataset run trained on."""
        return {
            "run_id": self.run_id,
            "manifest_sha256": self.manifest_sha256,
            "data_dir": self.data_dir,
            "created_at": self.manifest.get("created_at"),
            "pinned_at": self.pinned_at,
        }


def describe_run(manifest: dict | None, sha256: str) -> str:
    """'run <id>', or for a format 1 manifest (no run id) its sha256's first digits."""
    run_id = manifest_lib.manifest_run_id(manifest) if manifest else None
    return f"run {run_id}" if run_id else f"the manifest with sha256 {sha256[:12]}..."


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ files


def _write_atomically(path: str, data: bytes) -> None:
    """Write `path` so that a reader sees either no file or all of it."""
    if path.startswith("gs://"):
        # One object upload: the object appears when complete.
        with tf.io.gfile.GFile(path, "wb") as handle:
            handle.write(data)
        return
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    with tf.io.gfile.GFile(temporary, "wb") as handle:
        handle.write(data)
    tf.io.gfile.rename(temporary, path, overwrite=True)


def _read_bytes_or_none(path: str) -> bytes | None:
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read()
    except tf.errors.NotFoundError:
        return None


def missing_shards(data_dir: str, manifest: dict, splits=TRAINING_SPLITS) -> list[str]:
    """The shards of `splits` the manifest lists that do not exist (full paths); one stat each, in parallel."""
    paths = [manifest_lib.join(data_dir, path) for path in manifest_lib.shard_paths(manifest, splits)]
    with concurrent.futures.ThreadPoolExecutor(_STAT_THREADS) as pool:
        exists = list(pool.map(tf.io.gfile.exists, paths))
    return [path for path, present in zip(paths, exists, strict=True) if not present]


def read_pin(model_dir: str, data_dir: str) -> PinnedDataset | None:
    """The model dir's pin, or None if it has none; DatasetError if it is damaged."""
    pin_path = manifest_lib.join(model_dir, PIN_FILE)
    pin_data = _read_bytes_or_none(pin_path)
    if pin_data is None:
        return None
    copy_path = manifest_lib.join(model_dir, PINNED_MANIFEST_FILE)
    start_over = "use a new --model-dir to start training over"
    try:
        pin = json.loads(pin_data.decode("utf-8"))
        expected_sha256 = pin["manifest_sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{pin_path}: damaged ({exc}); {start_over}") from exc
    copy = _read_bytes_or_none(copy_path)
    if copy is None or manifest_lib.manifest_sha256(copy) != expected_sha256:
        raise DatasetError(
            f"{copy_path}: {'missing' if copy is None else 'not the manifest'} that {pin_path} pins "
            f"(sha256 {expected_sha256}); {start_over}"
        )
    return PinnedDataset(
        data_dir=data_dir,
        manifest=checks.parse_manifest(copy, where=copy_path),
        manifest_bytes=copy,
        pinned_at=pin.get("pinned_at") or "",
        recorded=True,
    )


# ------------------------------------------------------------------ resolving


def resolve_dataset(data_dir: str, model_dir: str) -> PinnedDataset:
    """The manifest to train on: the model dir's pinned one on a resume, else `dataset.json` now.

    Reads `dataset.json` once. Raises DatasetError when the model dir is
    pinned to a run other than the published one and that run's shards are
    gone (see the module docstring); never switches to the published run.
    """
    manifest_path = manifest_lib.join(data_dir, manifest_lib.MANIFEST_FILE)
    pinned = read_pin(model_dir, data_dir)
    if pinned is None:
        data, where = checks.read_published_manifest(data_dir)
        manifest = checks.parse_manifest(data, where=where)
        if tf.io.gfile.exists(manifest_lib.join(model_dir, CHECKPOINT_DIR)):
            log.warning(
                "%s has checkpoints but no %s (it was started before training pinned its dataset): "
                "pinning %s, the one %s names now",
                model_dir,
                PIN_FILE,
                describe_run(manifest, manifest_lib.manifest_sha256(data)),
                manifest_path,
            )
        return PinnedDataset(data_dir, manifest, data, pinned_at=_utc_now(), recorded=False)

    published = published_bytes_or_none(data_dir)
    if published is not None and manifest_lib.manifest_sha256(published) == pinned.manifest_sha256:
        return pinned
    published_state, published_run = describe_published(published, manifest_path)
    pinned_run = describe_run(pinned.manifest, pinned.manifest_sha256)
    missing = missing_shards(data_dir, pinned.manifest)
    if missing:
        total = len(manifest_lib.shard_paths(pinned.manifest, TRAINING_SPLITS))
        raise DatasetError(
            f"{model_dir} trains on dataset {pinned_run} (pinned at its first start, "
            f"{manifest_lib.join(model_dir, PIN_FILE)}), but {len(missing)} of its {total} train and validation "
            f"shards are gone from {data_dir} (e.g. {missing[0]}), and {published_state}. Training never "
            f"switches datasets silently. To train on {published_run or 'another dataset'}, start a new "
            f"--model-dir; to finish this training, restore {pinned_run}'s files in {data_dir} (the manifest "
            f"they match is {manifest_lib.join(model_dir, PINNED_MANIFEST_FILE)}) and run the same command again"
        )
    log.warning(
        "%s; %s is pinned to dataset %s, whose shards are all still there: training goes on with it. "
        "To train on %s instead, start a new --model-dir",
        published_state,
        model_dir,
        pinned_run,
        published_run or "another dataset",
    )
    return pinned


def published_bytes_or_none(data_dir: str) -> bytes | None:
    """The published manifest's bytes (following format 3's pointer), or None if there is none."""
    try:
        return checks.read_published_manifest(data_dir)[0]
    except DatasetError:
        return None


def describe_published(data: bytes | None, manifest_path: str) -> tuple[str, str | None]:
    """What `dataset.json` holds now ('DIR/dataset.json now names run B'), and that run ('run B') if any."""
    if data is None:
        return f"{manifest_path} is gone", None
    try:
        manifest = checks.parse_manifest(data, where=manifest_path)
    except DatasetError:
        return f"{manifest_path} now holds a manifest this code cannot read", None
    run = describe_run(manifest, manifest_lib.manifest_sha256(data))
    return f"{manifest_path} now names {run}", run


def record_pin(model_dir: str, pinned: PinnedDataset) -> None:
    """Write the pin into `model_dir` unless it holds it already (chief only, after the dataset checks)."""
    if pinned.recorded:
        return
    _write_atomically(manifest_lib.join(model_dir, PINNED_MANIFEST_FILE), pinned.manifest_bytes)
    pin = json.dumps(pinned.lineage, indent=2, sort_keys=True) + "\n"
    _write_atomically(manifest_lib.join(model_dir, PIN_FILE), pin.encode("utf-8"))
    log.info("pinned dataset %s in %s", describe_run(pinned.manifest, pinned.manifest_sha256), model_dir)


@contextlib.contextmanager
def explain_vanished_shards(pinned: PinnedDataset):
    """Turn the NotFoundError of a pinned shard that disappeared while training into a DatasetError."""
    try:
        yield
    except tf.errors.NotFoundError as exc:
        missing = missing_shards(pinned.data_dir, pinned.manifest)
        if not missing:
            raise
        pinned_run = describe_run(pinned.manifest, pinned.manifest_sha256)
        raise DatasetError(
            f"the files of dataset {pinned_run} vanished from {pinned.data_dir} while training read them "
            f"({len(missing)} train and validation shards gone, e.g. {missing[0]}). Stage 1 removes a "
            "superseded run's files once its retention period (preprocess --retention-days) has passed. "
            f"The checkpoints are kept: restore {pinned_run}'s files and run the same command to resume, "
            "or start a new --model-dir to train on the run dataset.json names now"
        ) from exc
