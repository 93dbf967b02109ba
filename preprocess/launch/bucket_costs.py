"""The output bucket's cost rules, stated when stage 1 is launched, with a warning where one multiplies the
bill for this dataset."""

import dataclasses
import logging

log = logging.getLogger(__name__)

# USD per GB-month at rest, and per GB read (retrieval), by storage class: Cloud Storage's list prices for
# a regional bucket in us-central1 (Iowa), from https://cloud.google.com/storage/pricing as published in
# 2026. Other locations, dual- and multi-regions price differently (multi-region Standard is ~30% more);
# the figures here only say which setting multiplies the bill, and by about how much.
PRICES = {
    "STANDARD": (0.020, 0.0),
    "NEARLINE": (0.010, 0.01),
    "COLDLINE": (0.004, 0.02),
    "ARCHIVE": (0.0012, 0.05),
}
PRICES_SOURCE = (
    "list prices of a us-central1 bucket, cloud.google.com/storage/pricing (2026); other locations differ"
)
MINIMUM_DAYS = {"NEARLINE": 30, "COLDLINE": 90, "ARCHIVE": 365}
PUBLISHES_PER_MONTH = 52 / 12  # the estimates assume one publish a week
_DAYS_PER_MONTH = 30.4
_EPOCHS = 30  # the training the retrieval estimate adds up (pipelines.dataflow's default --epochs)
_PER_GB = 100.0  # the size the figures are given for when the directory has no dataset yet


@dataclasses.dataclass(frozen=True)
class BucketSettings:
    """What of a bucket's metadata decides what superseded runs and training reads cost."""

    name: str
    location: str | None
    storage_class: str
    soft_delete_seconds: int
    versioning: bool
    noncurrent_deleted: bool  # a lifecycle rule deletes noncurrent versions
    autoclass: bool
    autoclass_terminal_class: str | None
    retention_seconds: int | None
    retention_locked: bool
    default_event_based_hold: bool

    @classmethod
    def from_bucket(cls, bucket) -> "BucketSettings":
        """From a google-cloud-storage Bucket whose metadata was loaded (`reload`)."""
        soft_delete = bucket.soft_delete_policy
        return cls(
            name=bucket.name,
            location=bucket.location,
            storage_class=(bucket.storage_class or "STANDARD").upper(),
            soft_delete_seconds=int(soft_delete.retention_duration_seconds or 0) if soft_delete else 0,
            versioning=bool(bucket.versioning_enabled),
            noncurrent_deleted=any(map(_deletes_noncurrent_versions, bucket.lifecycle_rules)),
            autoclass=bool(bucket.autoclass_enabled),
            autoclass_terminal_class=bucket.autoclass_terminal_storage_class,
            retention_seconds=int(bucket.retention_period) if bucket.retention_period else None,
            retention_locked=bool(bucket.retention_policy_locked),
            default_event_based_hold=bool(bucket.default_event_based_hold),
        )


def _deletes_noncurrent_versions(rule) -> bool:
    condition = rule.get("condition") or {}
    return (rule.get("action") or {}).get("type") == "Delete" and (
        condition.get("isLive") is False
        or "daysSinceNoncurrentTime" in condition
        or "numNewerVersions" in condition
        or "noncurrentTimeBefore" in condition
    )


def read_settings(output_dir: str) -> tuple[BucketSettings | None, str | None]:
    """(settings, None), or (None, why they cannot be read) for the bucket of gs:// `output_dir`."""
    from apache_beam.io.gcp.gcsio import parse_gcs_path  # noqa: PLC0415 - GCS only

    from preprocess import filesystem  # noqa: PLC0415 - Beam's GCS client
    from preprocess.errors import first_line  # noqa: PLC0415

    bucket_name, _ = parse_gcs_path(output_dir.rstrip("/") + "/")
    try:
        bucket = filesystem.gcs_io(output_dir).client.bucket(bucket_name)
        bucket.reload()
        return BucketSettings.from_bucket(bucket), None
    except Exception as exc:  # noqa: BLE001 - unreadable settings are a line, never an error
        if getattr(exc, "code", None) == 403:
            return None, "403: this account lacks storage.buckets.get on it"
        return None, first_line(exc, 200)


def dataset_gigabytes(manifest: dict | None) -> float | None:
    """The size of a published dataset's shards in GB (10^9 bytes), or None without one."""
    if not manifest or not manifest.get("splits"):
        return None
    total = sum(shard.get("num_bytes", 0) for info in manifest["splits"].values() for shard in info["shards"])
    return total / 1e9


def _money(amount: float) -> str:
    return f"${amount:,.2f}" if amount < 100 else f"${amount:,.0f}"


def _days(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:g} days" if days >= 1 else f"{seconds / 3600:g} hours"


def describe(settings: BucketSettings) -> str:
    """One line: the bucket's settings that decide the bill."""
    retention = "no retention policy"
    if settings.retention_seconds:
        retention = f"retention policy {_days(settings.retention_seconds)}{' (locked)' if settings.retention_locked else ''}"
    parts = [
        f"soft delete {_days(settings.soft_delete_seconds)}"
        if settings.soft_delete_seconds
        else "soft delete off",
        "versioning on"
        + (" (noncurrent versions deleted by a lifecycle rule)" if settings.noncurrent_deleted else "")
        if settings.versioning
        else "versioning off",
        f"default class {settings.storage_class}",
        f"Autoclass on (down to {settings.autoclass_terminal_class or 'NEARLINE'})"
        if settings.autoclass
        else "Autoclass off",
        retention,
    ]
    if settings.default_event_based_hold:
        parts.append("default event-based hold")
    where = f" ({settings.location.lower()})" if settings.location else ""
    return f"output bucket {settings.name}{where}: " + ", ".join(parts)


def warnings(settings: BucketSettings, gigabytes: float | None) -> list[str]:
    """A line per setting that multiplies the cost, each with its estimated figure for this dataset."""
    size = gigabytes if gigabytes is not None else _PER_GB
    of = f"this dataset ({size:,.1f} GB)" if gigabytes is not None else f"each {_PER_GB:g} GB of dataset"
    storage_class = "STANDARD" if settings.autoclass else settings.storage_class
    at_rest, retrieval = PRICES.get(storage_class, PRICES["STANDARD"])
    run_month = size * at_rest  # one superseded run kept a month

    def monthly(seconds: float) -> str:  # every run kept `seconds` longer, at a publish a week
        return _money(run_month * (seconds / 86400) / _DAYS_PER_MONTH * PUBLISHES_PER_MONTH)

    lines = []
    if settings.soft_delete_seconds:
        lines.append(
            f"soft delete keeps every removed run billed {_days(settings.soft_delete_seconds)} more: ~{monthly(settings.soft_delete_seconds)} "
            f"a month for {of} at a publish a week (turn it off for this bucket: gcloud storage buckets update "
            f"gs://{settings.name} --clear-soft-delete)"
        )
    if settings.versioning and not settings.noncurrent_deleted:
        lines.append(
            f"versioning keeps every removed run as noncurrent versions, billed for ever: ~{_money(run_month)} a month "
            f"more for {of} with each publish, ~{_money(run_month * 52)} a month after a year of weekly publishes "
            "(add the lifecycle rule of docs/cloud.md, 'Buckets and their costs', or turn versioning off)"
        )
    if settings.storage_class in MINIMUM_DAYS and not settings.autoclass:
        lines.append(
            f"default class {settings.storage_class}: training reads the dataset every epoch at ${retrieval}/GB "
            f"retrieval, ~{_money(size * retrieval)} an epoch for {of}, ~{_money(size * retrieval * _EPOCHS)} for "
            f"{_EPOCHS} epochs, and each run is billed at least {MINIMUM_DAYS[settings.storage_class]} days (use a "
            "STANDARD bucket, or Autoclass, for datasets that are trained on)"
        )
    if settings.retention_seconds:
        lines.append(
            f"the retention policy keeps every superseded run {_days(settings.retention_seconds)} before garbage "
            f"collection may remove it: ~{monthly(settings.retention_seconds)} a month for {of} at a publish a week"
        )
    if settings.default_event_based_hold:
        lines.append(
            "the default event-based hold keeps every object until its hold is released: superseded runs pile up, "
            f"~{_money(run_month)} a month more for {of} with each publish"
        )
    return lines


def launch_lines(output_dir: str, manifest: dict | None) -> list[str]:
    """What the stage 1 launch says about the output bucket: its settings, then a warning per setting
    that multiplies the cost (and where the prices come from); one line if they cannot be read."""
    settings, problem = read_settings(output_dir)
    if settings is None:
        return [
            f"output bucket of {output_dir}: its settings cannot be read ({problem}); soft delete, versioning, "
            "storage class and retention not checked (docs/cloud.md, 'Buckets and their costs')"
        ]
    found = warnings(settings, dataset_gigabytes(manifest))
    lines = [describe(settings)]
    lines += [f"  warning: {line}" for line in found]
    if found:
        lines.append(f"  (estimates from {PRICES_SOURCE})")
    return lines
