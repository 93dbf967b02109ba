"""What a re-run reuses of the version published in its output directory: decided once, as the graph is built.

A record is carried over only when the settings that decide its pixels and its bytes are those the
published version was written with, and the version kept a ledger (ledger.py). Otherwise the run is a
full rebuild, and says why in one line. bfloat16 and float32 records hold pixels normalized with the
train split's statistics, which change with every train image added or removed: those encodings
always rebuild.
"""

import dataclasses
import logging

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess.config import NEAR_DUPLICATES_OFF
from preprocess.near_duplicates.signature import SIGNATURE_VERSION

# (the manifest's `image` field, the job config's key, the flag that sets it): what decides a record's
# pixels and bytes. A record carried over must have been written under the same values.
PIXEL_SETTINGS = (
    ("height", "image_size", "--image-size (the stored square)"),
    ("crop_size", "crop_size", "--image-size"),
    ("crop_margin", "crop_margin", "--crop-margin"),
    ("encoding", "encoding", "--encoding"),
    ("resize_method", "resize_method", "--resize-method"),
)


@dataclasses.dataclass(frozen=True)
class ReusePlan:
    """The previous version a run starts from and what it carries over of it.

    `built_from`: the run id of the version published when this run's graph was built (None: the
    first version). `full_rebuild`: why nothing is carried over (None: records of unchanged inputs are).
    `ledger_files` are absolute paths (the images, and the inputs that failed); `shards` the previous manifest's shard entries, (split, {path
    relative to `output_dir`, num_examples, num_bytes, sha256}); `labels` the previous version's label
    vocabulary.
    """

    built_from: str | None = None
    full_rebuild: str | None = "the first version"
    ledger_files: tuple[str, ...] = ()
    shards: tuple[tuple[str, dict], ...] = ()
    labels: tuple[str, ...] = ()
    output_dir: str = ""
    # Whether the inputs whose bytes failed in the previous version are carried over as failed: the setting
    # that decides such a failure (--max-pixels) is the one it was written with.
    carry_failures: bool = False

    def shard_paths(self) -> list[tuple[str, str]]:
        """(relative path, full path) of every previous shard."""
        return [
            (entry["path"], manifest_lib.join(self.output_dir, entry["path"])) for _, entry in self.shards
        ]

    def shard_sizes(self) -> list[tuple[str, int]]:
        """(relative path, number of records) of every previous shard."""
        return [(entry["path"], entry["num_examples"]) for _, entry in self.shards]

    @property
    def incremental(self) -> bool:
        return self.full_rebuild is None

    def announcement(self) -> str | None:
        """The one line the launcher prints about it (None for a first version: nothing to say)."""
        if self.built_from is None:
            return None
        if self.incremental:
            return (
                f"incremental: inputs unchanged since run {self.built_from} (same content and label) are "
                "carried over without being read or decoded; new and changed ones are decoded"
            )
        return f"full rebuild, every input decoded again: {self.full_rebuild}"


def _signature_change(manifest: dict, config: dict) -> str | None:
    """Why the ledger's near-duplicate signatures cannot be carried over, or None: they are compared with the
    signatures this run takes, so both must come from one version of the signature."""
    published = manifest.get("near_duplicates") or {}
    if config.get("near_duplicates", NEAR_DUPLICATES_OFF) == NEAR_DUPLICATES_OFF:
        return None
    if published.get("mode", NEAR_DUPLICATES_OFF) == NEAR_DUPLICATES_OFF:
        return None  # no signatures in the ledger: carried images are held in their splits, not grouped
    before = published.get("signature_version")
    if before != SIGNATURE_VERSION:
        return (
            f"the near-duplicate signature is version {SIGNATURE_VERSION}, the published version's is "
            f"{before or 'older'}: every image is signed again"
        )
    return None


def _setting_change(image: dict, config: dict) -> str | None:
    for field, key, flag in PIXEL_SETTINGS:
        before = image.get(field, image.get("height") if field == "crop_size" else None)
        if field == "crop_margin":
            before = image.get(field, 0.0)
        now = config.get(key)
        if before != now:
            return f"{flag} is {now}, the published version's is {before}"
    if config.get("encoding") == features.JPEG and image.get("jpeg_quality") != config.get("jpeg_quality"):
        return f"--jpeg-quality is {config.get('jpeg_quality')}, the published version's is {image.get('jpeg_quality')}"
    return None


# A Dataflow template's graph is built once and launched later, against whatever version is published then.
TEMPLATE = "a Dataflow template is built once and launched later, so it cannot know the version it will find"


def plan_reuse(output_dir: str, config: dict, rebuild: bool, template: bool = False) -> ReusePlan:
    """The ReusePlan of a run of `config` (pipeline.job_config) into `output_dir`."""
    if template:
        return ReusePlan(full_rebuild=TEMPLATE)
    from dataset_contract.verification import read_manifest  # noqa: PLC0415 - TensorFlow, with the graph

    try:
        manifest = read_manifest(output_dir)
    except manifest_lib.ManifestError as exc:
        if "not found" not in str(exc):
            logging.warning("the published version cannot be read, so nothing is reused: %s", exc)
        return ReusePlan()
    built_from = manifest_lib.manifest_run_id(manifest)
    reason = None
    if rebuild:
        reason = "--rebuild"
    elif manifest.get("format_version") != manifest_lib.FORMAT_VERSION:
        reason = f"the published version is format {manifest.get('format_version')}, this one writes {manifest_lib.FORMAT_VERSION}"
    elif "ledger_files" not in manifest:
        reason = "the published version has no ledger (it was written before incremental versions)"
    elif config["encoding"] in features.NORMALIZED_ENCODINGS:
        reason = (
            f"--encoding {config['encoding']} stores pixels normalized with the train split's statistics, "
            "which change with the inputs"
        )
    else:
        reason = _setting_change(manifest["image"], config) or _signature_change(manifest, config)
    if reason is not None:
        return ReusePlan(built_from=built_from, full_rebuild=reason)
    return ReusePlan(
        built_from=built_from,
        full_rebuild=None,
        ledger_files=tuple(
            manifest_lib.join(output_dir, path) for path in manifest_lib.ledger_file_paths(manifest)
        ),
        shards=tuple(
            (split, {key: shard[key] for key in ("path", "num_examples", "num_bytes", "sha256")})
            for split, info in sorted(manifest["splits"].items())
            for shard in info["shards"]
        ),
        labels=tuple(manifest["labels"]),
        output_dir=output_dir,
        carry_failures=manifest["image"].get("max_pixels") == config.get("max_pixels"),
    )
