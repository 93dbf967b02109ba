"""The supervisor's status object: written to local disk or through `gcloud storage cp`, a last report retried."""

import json
import os

from train.tools import run_status

# A `gcloud storage cp FILE gs://B/O` that fails while FAILURES holds lines (one per call), then stores the
# object under GCS/B/O; `storage cat` reads it back (or fails: no such object).
FAKE_GCLOUD = """#!/bin/sh
echo "$*" >> {d}/calls
case "$*" in
  "storage cp"*)
    if [ -s {d}/failures ]; then sed -i 1d {d}/failures; echo "ERROR: 503 Service Unavailable" >&2; exit 1; fi
    mkdir -p "$(dirname "{d}/gcs/${{4#gs://}}")" && cp "$3" "{d}/gcs/${{4#gs://}}";;
  "storage cat"*) cat "{d}/gcs/${{3#gs://}}";;
esac
"""


def fake_gcloud(tmp_path, monkeypatch, failures=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD.format(d=tmp_path))
    (bin_dir / "gcloud").chmod(0o755)
    (tmp_path / "failures").write_text("fail\n" * failures)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_local_status_object_is_written_whole_and_read_back(tmp_path):
    uri = run_status.status_uri(str(tmp_path))
    report = run_status.StatusReport(uri, saved_step=lambda: 300)
    report.report(run_status.RUNNING, "run 2", run=2)
    written = run_status.parse_status(run_status.read_status_text(uri))
    assert (written["state"], written["detail"], written["run"], written["saved_step"]) == (
        "running",
        "run 2",
        2,
        300,
    )
    assert written["heartbeat"] == 1 and list(tmp_path.iterdir()) == [tmp_path / "supervisor.json"]


def test_a_last_report_is_tried_again_when_gcloud_fails_and_a_beat_is_not(tmp_path, monkeypatch):
    fake_gcloud(tmp_path, monkeypatch, failures=2)
    monkeypatch.setattr(run_status, "RETRY_SECONDS", 0.0)
    uri = "gs://b/run/model/supervisor.json"
    report = run_status.StatusReport(uri)
    report.report(run_status.RUNNING, "run 1")  # one try: it fails, and the heartbeat will write again
    assert run_status.read_status_text(uri) is None
    report.report(
        run_status.STOPPED, "no progress (exit status 1)", attempts=3, reason="no progress", status=1
    )
    written = json.loads(run_status.read_status_text(uri))
    assert (written["state"], written["reason"], written["status"]) == ("stopped", "no progress", 1)
    assert (tmp_path / "calls").read_text().count("storage cp") == 3  # 1 failed, then 1 failed + 1 written
