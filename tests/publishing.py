"""Test support for publishing: stop a real run before its switch, crash file operations, check a directory.

- `run_stopped_before_switch`: the real stage 1 job (in process) into a directory
  that already holds a dataset, stopped at the instant it would replace
  `dataset.json`: the new run's files are complete in runs/<run id>/ (and its
  staging is there), the old dataset is still the published one.
- `FaultInjector`: every file-changing call counted (Beam's FileSystems, GCS
  batch deletes and uploads, and the dataset store's creates, writes and
  deletes on local disk: preprocess/publish/store.py); from call K on, each
  raises `InjectedCrash`, as if the worker had died just before call K.
- `start_paused_publish`: the real `publish_run` of one run in a subprocess, paused at
  one of its pause points (protocol.PAUSE_ENV) until the test lets it go on.
- `assert_complete_dataset`: `preprocess.verify`'s checks, through its library
  functions (every shard's size, sha256 and records; the other files the
  manifest names); returns the manifest.
"""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.gcp import gcsio
from google.cloud import storage

from dataset_contract import manifest as manifest_lib
from dataset_contract import verification
from preprocess.publish import commit as publish
from preprocess.publish import protocol
from preprocess.publish import store as dataset_store
from tests.stage1 import run_stage1


class StopBeforeSwitch(Exception):
    """Raised in place of replacing dataset.json."""


@dataclasses.dataclass
class StoppedRun:
    run_id: str
    manifest: dict


def run_stopped_before_switch(input_spec, output_dir, **stage1_args) -> StoppedRun:
    """Run stage 1 (in process) into `output_dir`, stopping it where it would switch the manifest."""
    captured = {}

    def stop(output, run_id, manifest, retention_days, store=None):
        captured.update(run_id=run_id, manifest=manifest)
        raise StopBeforeSwitch(f"stopped before publishing run {run_id}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(publish, "commit_manifest", stop)
        try:
            run_stage1(input_spec, output_dir, **stage1_args)
        except Exception as exc:  # the runner may wrap the DoFn's exception
            if "stopped before publishing" not in str(exc):
                raise
        else:
            raise AssertionError("the run published although its switch was stopped")
    return StoppedRun(captured["run_id"], captured["manifest"])


REPO = Path(__file__).resolve().parent.parent
PAUSE_TIMEOUT_S = 120
# The real publish step of one run: python -c SCRIPT OUTPUT MANIFEST_FILE RETENTION_DAYS.
_PUBLISH_SCRIPT = """
import json, sys
from preprocess.publish.commit import publish_run
manifest = json.load(open(sys.argv[2]))
publish_run(sys.argv[1], manifest["run"]["id"], manifest, retention_days=float(sys.argv[3]))
"""


@dataclasses.dataclass
class PausedPublish:
    """A publish step in a subprocess, waiting at a pause point until `resume`."""

    process: subprocess.Popen
    flag: Path
    log: Path

    def resume(self) -> int:
        """Let it go on; its exit status once it ends."""
        self.flag.unlink()
        return self.process.wait(timeout=PAUSE_TIMEOUT_S)

    def output(self) -> str:
        return self.log.read_text()


def start_paused_publish(output_dir, manifest, point, scratch: Path, env=None, retention_days=0.0):
    """Start `publish_run(output_dir, <its run>, manifest)` in a subprocess and wait until it reaches `point`."""
    name = f"{manifest['run']['id']}-{point}-{time.monotonic_ns()}"
    manifest_file, flag, log = (scratch / f"{name}.{ext}" for ext in ("json", "flag", "log"))
    manifest_file.write_text(json.dumps(manifest))
    env = {
        **(os.environ if env is None else env),
        protocol.PAUSE_ENV: f"{point}:{flag}",
        "PYTHONPATH": str(REPO),
    }
    command = [
        sys.executable,
        "-c",
        _PUBLISH_SCRIPT,
        str(output_dir),
        str(manifest_file),
        str(retention_days),
    ]
    with open(log, "w") as handle:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not flag.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"the publish step did not reach {point!r}:\n{log.read_text()}")
        time.sleep(0.05)
    return PausedPublish(process, flag, log)


class InjectedCrash(BaseException):
    """A crash injected into a file operation (BaseException: nothing may swallow it, as nothing can a kill)."""


_MUTATIONS = ("create", "rename", "copy", "delete", "mkdirs")


class FaultInjector:
    """Counts file-changing calls; with `crash_at=K`, call K and every later one raise InjectedCrash."""

    def __init__(self, monkeypatch, crash_at: int | None = None):
        self.calls: list[str] = []
        self._crash_at = crash_at
        for name in _MUTATIONS:
            monkeypatch.setattr(FileSystems, name, self._wrap(name, getattr(FileSystems, name)))
        monkeypatch.setattr(
            gcsio.GcsIO, "delete_batch", self._wrap_method("delete_batch", gcsio.GcsIO.delete_batch)
        )
        # The commit, markers and the hint on GCS: uploads (preprocess/publish/store.py).
        monkeypatch.setattr(
            storage.Blob,
            "upload_from_string",
            self._wrap_method("upload_from_string", storage.Blob.upload_from_string),
        )
        # The same on local disk, one call per file.
        for name in ("create_if_absent", "write", "_delete_one"):
            real = getattr(dataset_store.LocalStore, name)
            monkeypatch.setattr(dataset_store.LocalStore, name, self._wrap_method(name, real))

    def _count(self, name, args):
        if self._crash_at is not None and len(self.calls) >= self._crash_at:
            raise InjectedCrash(f"crash before file call {len(self.calls)} ({name} {args[:1]})")
        self.calls.append(f"{name} {args[:1]}")

    def _wrap(self, name, real):
        def wrapper(*args, **kwargs):
            self._count(name, args)
            return real(*args, **kwargs)

        return staticmethod(wrapper)

    def _wrap_method(self, name, real):
        def wrapper(instance, *args, **kwargs):
            self._count(name, args)
            return real(instance, *args, **kwargs)

        return wrapper


@contextlib.contextmanager
def injected_faults(monkeypatch, crash_at: int | None = None):
    """A FaultInjector for the duration of the block only."""
    with monkeypatch.context() as patch:
        yield FaultInjector(patch, crash_at)


def assert_complete_dataset(data_dir: str) -> dict:
    """What `python -m preprocess.verify` checks, through its library functions; returns the manifest.

    The published manifest is found by the one reader (dataset_contract/commit_log.py); on gs:// through
    the publish store, as stage 1 reads it (a directory in an older layout may hold a dataset.json that was
    replaced within seconds, and TensorFlow's GCS filesystem caches a file's size for a few seconds). Every other file is written once
    and never changes, so its checks go through TensorFlow as in production.
    """
    if data_dir.startswith("gs://"):
        published = protocol.read_published(data_dir)
        manifest = json.loads(published.data)
        manifest_lib.check_manifest(manifest)
    else:
        manifest = verification.read_manifest(data_dir)
    problems = verification.verify_named_files(data_dir, manifest)
    problems += verification.verify_shards(data_dir, manifest, check_sha256=True, check_records=True)
    assert not problems, "\n".join(str(problem) for problem in problems)
    return manifest


def published_dataset(data_dir: str) -> dict:
    """`assert_complete_dataset`'s manifest without `retained_runs`, which the switch adds to the run's
    manifest (the runs it superseded): what the run asked to publish."""
    manifest = assert_complete_dataset(data_dir)
    manifest.pop(publish.RETAINED_RUNS, None)
    return manifest


def shard_digests(manifest: dict) -> dict[str, str]:
    """Shard path -> sha256, as the manifest lists them."""
    return {
        shard["path"]: shard["sha256"] for info in manifest["splits"].values() for shard in info["shards"]
    }


def write_marker(path: str, run_id: str):
    """A publishing marker of run `run_id` at `path` (a full path, local or gs://), as a publish attempt
    writes it: its content does not matter, only that it exists."""
    with FileSystems.create(path) as handle:
        handle.write(json.dumps({"run_id": run_id}).encode("utf-8"))
