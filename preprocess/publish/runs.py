"""Run ids, and where one run of the job keeps its files in the output directory."""

import dataclasses
import datetime
import json
import re
import secrets

import apache_beam as beam

from dataset_contract import manifest as manifest_lib
from preprocess import filesystem

STAGING_DIR = "staging"
PUBLISHING_MARKER = "publishing"
DELETING_MARKER = "deleting"  # removal markers of earlier versions: garbage collection removes them
TFT_TEMP_PREFIX = "tft-"

_RUN_ID = re.compile(r"\d{8}T\d{12}Z-[0-9a-f]{8}")


def new_run_id(now: datetime.datetime | None = None) -> str:
    """`20260321T101502123456Z-1a2b3c4d`: the UTC start time to the microsecond (ids sort by start), then 32
    random bits."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(4)}"


def is_run_id(text: str) -> bool:
    return _RUN_ID.fullmatch(text) is not None


def run_started_at(run_id: str) -> str:
    """The run's start time as ISO 8601 (`2026-03-21T10:15:02.123456Z`)."""
    stamp = datetime.datetime.strptime(run_id.split("Z-")[0], "%Y%m%dT%H%M%S%f")
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Every path of one run in `output_dir` (local or gs://)."""

    output_dir: str
    run_id: str

    @property
    def relative_dir(self) -> str:
        """`runs/<run id>`, relative to the output directory (as the manifest names it)."""
        return manifest_lib.run_dir(self.run_id)

    @property
    def run_dir(self) -> str:
        return manifest_lib.join(self.output_dir, self.relative_dir)

    def relative(self, name: str) -> str:
        """`runs/<run id>/<name>`: how the manifest names one of the run's final files."""
        return manifest_lib.join(self.relative_dir, name)

    def final(self, name: str) -> str:
        """The full path of one of the run's final files."""
        return manifest_lib.join(self.run_dir, name)

    @property
    def staging_dir(self) -> str:
        return manifest_lib.join(self.output_dir, STAGING_DIR, self.run_id)

    def staging(self, *names: str) -> str:
        return manifest_lib.join(self.staging_dir, *names)

    @property
    def tmp_dir(self) -> str:
        """Where files are written before their atomic rename into place (local disk only)."""
        return self.staging("tmp")

    @property
    def build_file(self) -> str:
        return self.staging("build.json")

    def marker(self, kind: str, attempt: str) -> str:
        return manifest_lib.join(self.output_dir, manifest_lib.RUNS_DIR, f"{self.run_id}.{kind}.{attempt}")


def tft_temp_dir(output_dir: str, build_id: str) -> str:
    """tf.Transform's temporary directory for one pipeline build (fixed when the graph is built; runs of one
    template share it, each file having a name of its own)."""
    return manifest_lib.join(output_dir, STAGING_DIR, f"{TFT_TEMP_PREFIX}{build_id}")


def record_build(run_id: str, output_dir: str, build_id: str, shared: bool) -> str:
    """Write which tf.Transform directory run `run_id` uses (idempotent), for whoever removes the run's files
    later (`shared`: the runs of one template share it); returns the run id."""
    paths = RunPaths(output_dir, run_id)
    record = json.dumps({"build_id": build_id, "shared": shared}).encode("utf-8")
    filesystem.write_bytes(paths.build_file, record, tmp_dir=paths.tmp_dir)
    return run_id


class MakeRunId(beam.PTransform):
    """PBegin -> a PCollection of one element: this run's id (`run_id` if the launcher made one), made at
    execution time and committed by a reshuffle; consumers take it as a singleton side input."""

    def __init__(self, output_dir: str, build_id: str, shared_build: bool, run_id: str | None = None):
        super().__init__()
        self._output_dir = output_dir
        self._build_id = build_id
        self._shared_build = shared_build
        self._run_id = run_id

    def expand(self, pbegin):
        fixed = self._run_id
        return (
            pbegin
            | "Start" >> beam.Create([None])
            | "NewRunId" >> beam.Map(lambda _: fixed or new_run_id()).with_output_types(str)
            | "Commit" >> beam.Reshuffle()
            | "RecordBuild"
            >> beam.Map(
                record_build, output_dir=self._output_dir, build_id=self._build_id, shared=self._shared_build
            )
        )
