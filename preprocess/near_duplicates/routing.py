"""Decoded images spilled once, then each routed to the split its near-duplicate group gives it: the
decode step writes Arrow part files and passes on a small SignedImage; after grouping, each part is read
back once with its overrides. Design notes: docs/internals.md ("routing.py")."""

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from preprocess.decode.spill import DEFAULT_PART_BYTES, ArrowPartFile, new_part_path
from preprocess.near_duplicates.grouping import SignedImage

PART_PREFIX = "near"
# The spill's output of part paths, and CoGroupByKey's tags: each part's path, and the overrides of its rows.
PARTS = "parts"
OVERRIDES = "overrides"
# Rows per Arrow record batch in a part: what a writer or a reader holds at once.
ROWS_PER_BATCH = 32

# The spilled columns: the raw example as DecodeImagesFn made it, without the signature's extras.
_BINARY_COLUMNS = ("image_raw", "moments")
# The signature (an int of up to SIGNATURE_BITS) as decimal text: the version's ledger keeps it, so that a
# re-run can group new images with the published ones it carries over (preprocess/reuse/).
_STRING_COLUMNS = ("label", "sha256", "uri", "split", "key", "signature", "input")
PART_SCHEMA = pa.schema(
    [(name, pa.large_binary()) for name in _BINARY_COLUMNS]
    + [(name, pa.string()) for name in _STRING_COLUMNS]
)


def signed_image(example: dict, locator: tuple) -> SignedImage:
    """What grouping needs of a decoded example (DecodeImagesFn with signatures), with its locator."""
    return SignedImage(
        key=example["sha256"],
        signature=example["signature"],
        uri=example["uri"],
        label=example["label"],
        split=example["split"],
        split_given=example.get("split_given", False),
        source_pixels=example["source_width"] * example["source_height"],
        num_bytes=example.get("num_bytes", 0),
        locator=locator,
    )


class SpillDecodedFn(beam.DoFn):
    """Decoded example -> SignedImage (main output), the example written to a part file; the paths of the
    committed parts on the 'parts' output."""

    def __init__(self, output_dir: str, part_bytes: int = DEFAULT_PART_BYTES):
        self._output_dir = output_dir
        self._part_bytes = part_bytes
        self._spilled = Metrics.counter("preprocess", "near_duplicates_spilled")

    def start_bundle(self):
        self._abort()
        self._part = None
        self._rows = []

    def _abort(self):
        # A bundle that failed on this instance left its part open: discarded, never committed.
        part = getattr(self, "_part", None)
        if part is not None:
            part.abort()
        self._part = None

    def teardown(self):
        self._abort()

    def _flush(self):
        if self._rows:
            columns = [
                pa.array([row[name] for row in self._rows], type=pa.large_binary())
                for name in _BINARY_COLUMNS
            ]
            columns += [
                pa.array([str(row[name]) for row in self._rows], type=pa.string()) for name in _STRING_COLUMNS
            ]
            self._part.write(pa.RecordBatch.from_arrays(columns, schema=PART_SCHEMA))
            self._rows = []

    def _close(self) -> str | None:
        if self._part is None:
            return None
        self._flush()
        path, self._part = self._part.close(), None
        return path

    def process(self, example: dict, run_id: str):
        try:
            yield from self._process(example, run_id)
        except BaseException:
            self._abort()
            raise

    def _process(self, example: dict, run_id: str):
        if self._part is None:
            self._part = ArrowPartFile(new_part_path(self._output_dir, run_id, PART_PREFIX), PART_SCHEMA)
        row = self._part.num_rows + len(self._rows)
        self._rows.append(example)
        self._spilled.inc()
        yield signed_image(example, (self._part.path, row))
        if len(self._rows) >= ROWS_PER_BATCH:
            self._flush()
            if self._part.num_bytes >= self._part_bytes:
                yield beam.pvalue.TaggedOutput(PARTS, self._close())

    def finish_bundle(self):
        path = self._close()
        if path is not None:
            yield beam.pvalue.TaggedOutput(PARTS, GlobalWindows.windowed_value(path))


def read_part(path: str):
    """Yield (row index, example dict) for every row of a part file, a record batch at a time."""
    row = 0
    with FileSystems.open(path) as handle:
        for batch in pa.ipc.open_stream(pa.PythonFile(handle, mode="r")):
            columns = {name: batch.column(name).to_pylist() for name in PART_SCHEMA.names}
            for index in range(batch.num_rows):
                yield row, {name: values[index] for name, values in columns.items()}
                row += 1


def override_of(member):
    """GroupMember -> [(part path, (row, final split or None if dropped))]; none when nothing changes."""
    if (member.kept and member.split == member.image.split) or member.image.carried:
        return []  # unchanged, or carried over from the previous version (no part: it keeps its split)
    path, row = member.image.locator
    return [(path, (row, member.split if member.kept else None))]


class RoutePartFn(beam.DoFn):
    """(part path, {PARTS: [...], OVERRIDES: [(row, split or None), ...]}) -> the part's examples, each with
    its final split; the rows of dropped members are left out (they are counted from the groups)."""

    def __init__(self):
        self._moved = Metrics.counter("preprocess", "near_duplicates_moved")

    def process(self, element):
        path, grouped = element
        if not list(grouped[PARTS]):
            # Overrides for a part no committed attempt wrote: a locator that escaped a failed attempt.
            raise ValueError(f"near-duplicate overrides name {path}, which is not a committed part")
        overrides = dict(grouped[OVERRIDES])
        for row, example in read_part(path):
            if row in overrides:
                split = overrides[row]
                if split is None:
                    continue
                self._moved.inc()
                example["split"] = split
            yield example
