"""The output bucket's cost rules stated at launch (preprocess/bucket_costs.py), against the GCS emulator
serving the bucket's settings (tests/gcs_emulator.py: the forwarder's `bucket_fields`, its retention
policy, and a 403 on the bucket's metadata)."""

import json

import pytest

from preprocess.launch import bucket_costs
from preprocess.publish.commit import read_published_manifest
from tests.preprocess.launch.test_dataflow_job import FakeDataflow, _airflow_launch
from tests.stage1 import write_corpus

WEEK = 7 * 86400
MONTH = 30 * 86400


def publish_manifest_of(gcs_emulator, directory: str, gigabytes: float) -> None:
    """A dataset.json whose shards add up to `gigabytes` (all the cost summary reads of a manifest)."""
    shard = {
        "path": "runs/r/train-0.tfrecord",
        "num_examples": 1,
        "num_bytes": int(gigabytes * 1e9),
        "sha256": "",
    }
    manifest = {"format_version": 2, "splits": {"train": {"shards": [shard], "num_examples": 1}}}
    from google.cloud import storage  # noqa: PLC0415

    name = directory.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/dataset.json"
    storage.Client().bucket(gcs_emulator.bucket).blob(name).upload_from_string(json.dumps(manifest))


def test_each_setting_that_multiplies_the_cost_is_stated_and_warned_with_a_monthly_figure_for_this_dataset(
    gcs_emulator, gcs_read_faults, gcs_dir
):
    gcs_read_faults.bucket_fields = {
        "softDeletePolicy": {"retentionDurationSeconds": str(WEEK)},
        "versioning": {"enabled": True},
        "storageClass": "NEARLINE",
        "autoclass": {"enabled": False},
    }
    gcs_read_faults.retention_seconds = MONTH
    publish_manifest_of(gcs_emulator, gcs_dir, 120.0)

    lines = bucket_costs.launch_lines(gcs_dir, read_published_manifest(gcs_dir))
    text = "\n".join(lines)
    assert lines[0] == (
        f"output bucket {gcs_emulator.bucket} (us): soft delete 7 days, versioning on, default class NEARLINE, "
        "Autoclass off, retention policy 30 days"
    )
    # 120 GB of Nearline at $0.010/GB-month is $1.20 a month per run kept; a publish a week is 52/12 a month.
    assert (
        "soft delete keeps every removed run billed 7 days more: ~$1.20 a month for this dataset (120.0 GB)"
        in text
    )
    assert "--clear-soft-delete" in text
    assert (
        "~$1.20 a month more for this dataset (120.0 GB) with each publish, ~$62.40 a month after a year"
        in text
    )
    assert "$0.01/GB retrieval, ~$1.20 an epoch for this dataset (120.0 GB), ~$36.00 for 30 epochs" in text
    assert "billed at least 30 days" in text
    assert (
        "keeps every superseded run 30 days before garbage collection may remove it: ~$5.13 a month" in text
    )
    assert sum(line.startswith("  warning: ") for line in lines) == 4
    assert lines[-1] == f"  (estimates from {bucket_costs.PRICES_SOURCE})"
    assert "cloud.google.com/storage/pricing" in bucket_costs.PRICES_SOURCE


def test_a_standard_bucket_whose_lifecycle_bounds_its_versions_gets_no_warning(gcs_read_faults, gcs_dir):
    gcs_read_faults.bucket_fields = {
        "softDeletePolicy": {"retentionDurationSeconds": "0"},
        "versioning": {"enabled": True},
        "storageClass": "STANDARD",
        "autoclass": {"enabled": True, "terminalStorageClass": "ARCHIVE"},
        "lifecycle": {
            "rule": [
                {"action": {"type": "Delete"}, "condition": {"isLive": False, "daysSinceNoncurrentTime": 7}}
            ]
        },
    }
    lines = bucket_costs.launch_lines(gcs_dir, None)
    assert len(lines) == 1, lines
    assert "soft delete off, versioning on (noncurrent versions deleted by a lifecycle rule)" in lines[0]
    assert "Autoclass on (down to ARCHIVE), no retention policy" in lines[0]


def test_before_a_first_publish_the_figures_are_per_100_gb(gcs_read_faults, gcs_dir):
    gcs_read_faults.bucket_fields = {"softDeletePolicy": {"retentionDurationSeconds": str(WEEK)}}
    (warning,) = [line for line in bucket_costs.launch_lines(gcs_dir, None) if "warning" in line]
    # 100 GB of Standard at $0.020: $2.00 a month per run, x 7/30.4 x 52/12.
    assert "~$2.00 a month for each 100 GB of dataset at a publish a week" in warning


def test_unreadable_settings_are_one_line_never_an_error(gcs_read_faults, gcs_dir):
    gcs_read_faults.bucket_metadata_status = 403
    (line,) = bucket_costs.launch_lines(gcs_dir, None)
    assert line.startswith(
        f"output bucket of {gcs_dir}: its settings cannot be read (403: this account lacks"
    )
    assert "storage.buckets.get" in line and "not checked" in line


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root, images_per_class=2, include_broken=False)
    return str(root)


@pytest.mark.parametrize("readable", [True, False])
def test_the_stage_1_launch_states_the_bucket_settings_before_submitting(
    monkeypatch, corpus, gcs_read_faults, gcs_dir, capsys, readable
):
    if readable:
        gcs_read_faults.bucket_fields = {"softDeletePolicy": {"retentionDurationSeconds": str(WEEK)}}
    else:
        gcs_read_faults.bucket_metadata_status = 403
    service = FakeDataflow()
    with pytest.raises(SystemExit) as exited:  # submitted; the launcher then stops, the job runs on
        _airflow_launch(monkeypatch, service, corpus, f"{gcs_dir}/dataset", "preprocess-costs-1")
    assert exited.value.code == 130 and len(service.jobs) == 1
    out = capsys.readouterr().out
    if readable:
        assert "preprocess: output bucket test-bucket (us): soft delete 7 days" in out
        assert "preprocess:   warning: soft delete keeps every removed run billed 7 days more" in out
    else:
        bucket_lines = [line for line in out.splitlines() if "output bucket" in line]
        assert len(bucket_lines) == 1 and "cannot be read (403" in bucket_lines[0], out
