"""A spill of decoded images to disk, so no runner has to hold a split in memory."""

import uuid

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from preprocess.filesystem import UncommittedFile
from preprocess.publish.runs import RunPaths

DEFAULT_PART_BYTES = 64 << 20


def new_part_path(output_dir: str, run_id: str, prefix: str) -> str:
    """A fresh part file's path in the run's staging: `staging/<run id>/decoded/<prefix>-<uuid>.arrow`.

    A uuid per file, so that every bundle attempt writes files of its own.
    """
    return RunPaths(output_dir, run_id).staging("decoded", f"{prefix}-{uuid.uuid4().hex}.arrow")


class ArrowPartFile:
    """One Arrow IPC stream file being written, kept only by `close()`: a failed attempt's part, dropped
    or aborted, never appears on GCS."""

    def __init__(self, path: str, schema: pa.Schema):
        self.path = path
        self._handle = UncommittedFile(path)
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._handle, mode="w"), schema)
        self.num_bytes = 0
        self.num_rows = 0

    def write(self, batch: pa.RecordBatch):
        self._writer.write_batch(batch)
        self.num_bytes += batch.nbytes
        self.num_rows += batch.num_rows

    def close(self) -> str:
        self._writer.close()
        self._handle.commit()
        return self.path

    def abort(self):
        self._handle.abort()


class WriteBatchPartsFn(beam.DoFn):
    """Arrow record batches of one split -> paths of Arrow IPC files holding them."""

    def __init__(self, split: str, output_dir: str, part_bytes: int = DEFAULT_PART_BYTES):
        self._split = split
        self._output_dir = output_dir
        self._part_bytes = part_bytes

    def start_bundle(self):
        self._part = None

    def _close(self) -> str | None:
        if self._part is None:
            return None
        path, self._part = self._part.close(), None
        return path

    def process(self, batch: pa.RecordBatch, run_id: str):
        if self._part is None:
            self._part = ArrowPartFile(new_part_path(self._output_dir, run_id, self._split), batch.schema)
        self._part.write(batch)
        if self._part.num_bytes >= self._part_bytes:
            yield self._close()

    def finish_bundle(self):
        path = self._close()
        if path is not None:
            yield GlobalWindows.windowed_value(path)


def read_batch_part(path: str):
    """Yield the record batches of one part file."""
    with FileSystems.open(path) as handle:
        reader = pa.ipc.open_stream(pa.PythonFile(handle, mode="r"))
        yield from reader


class SpillAndReload(beam.PTransform):
    """Record batches -> the same record batches, via part files on disk, read back in parallel once all are
    written. `run_id` is the singleton of preprocess.publish.runs.MakeRunId."""

    def __init__(self, split: str, output_dir: str, run_id, part_bytes: int = DEFAULT_PART_BYTES):
        super().__init__()
        self._split = split
        self._output_dir = output_dir
        self._run_id = run_id
        self._part_bytes = part_bytes

    def expand(self, batches):
        write = WriteBatchPartsFn(self._split, self._output_dir, self._part_bytes)
        return (
            batches
            | "WriteParts" >> beam.ParDo(write, beam.pvalue.AsSingleton(self._run_id))
            | "AllParts" >> beam.combiners.ToList()
            | "EachPart" >> beam.FlatMap(sorted)
            | "SpreadParts" >> beam.Reshuffle()
            | "ReadParts" >> beam.FlatMap(read_batch_part)
        )
