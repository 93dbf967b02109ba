"""Where the images are: list a class-per-folder tree or read a CSV/JSONL manifest.

Both forms produce `InputRecord`s (uri, label, split or None). A manifest row
that cannot be used becomes an error record right here, so every input is
accounted for from the first step. All file access goes through Beam's
`FileSystems`, so local paths and `gs://` URIs behave the same.
"""

import csv
import dataclasses
import hashlib
import io
import json
import posixpath

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from preprocess import errors

DIRECTORY = "directory"
CSV = "csv"
JSONL = "jsonl"

# Files that are never images and never inputs: OS and VCS debris in a tree.
_IGNORED_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})


@dataclasses.dataclass(frozen=True)
class InputRecord:
    uri: str
    label: str
    split: str | None = None  # None: assigned from the content hash


def input_kind(spec: str) -> str:
    """`csv`/`jsonl` for a manifest file (by extension), else `directory`."""
    lowered = spec.lower()
    if lowered.endswith(".csv"):
        return CSV
    if lowered.endswith((".jsonl", ".json")):
        return JSONL
    return DIRECTORY


def list_directory_tree(root: str) -> list[InputRecord]:
    """Every file at `root/<class>/<file>`, the class taken from the folder name.

    Listing happens once, on the driver or the first worker: a match over
    `root/*/*` is one API call per 1000 objects on GCS, fast even for millions.
    """
    root = root.rstrip("/")
    pattern = posixpath.join(root, "*", "*")
    records = []
    for metadata in FileSystems.match([pattern])[0].metadata_list:
        relative = metadata.path[len(root) + 1 :]
        parts = relative.split("/")
        if len(parts) != 2 or parts[1] in _IGNORED_NAMES or parts[1].startswith("."):
            continue
        records.append(InputRecord(uri=metadata.path, label=parts[0]))
    return records


def _mixing_key(item) -> bytes:
    return hashlib.sha256(item.uri.encode("utf-8")).digest()


def _resolve_uri(uri: str, manifest_dir: str) -> str:
    """Manifest URIs may be relative to the manifest's own directory."""
    if "://" in uri or uri.startswith("/"):
        return uri
    return manifest_lib.join(manifest_dir, uri)


def parse_manifest_rows(text: str, kind: str, manifest_path: str):
    """Yield InputRecord or ErrorRecord for each row of a CSV/JSONL manifest."""
    manifest_dir = posixpath.dirname(manifest_path)
    if kind == CSV:
        rows = csv.reader(io.StringIO(text))
        for line_number, row in enumerate(rows, start=1):
            if not row or all(not cell.strip() for cell in row):
                continue
            if line_number == 1 and [cell.strip().lower() for cell in row[:2]] == ["uri", "label"]:
                continue  # header
            yield _record_from_fields(row, manifest_path, line_number, manifest_dir)
    else:
        for line_number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                fields = [obj["uri"], obj.get("label", ""), obj.get("split") or ""]
            except (ValueError, KeyError, TypeError) as exc:
                yield errors.ErrorRecord(
                    f"{manifest_path}:{line_number}",
                    errors.BAD_MANIFEST_ROW,
                    f"not a JSON object with 'uri': {exc}",
                )
                continue
            yield _record_from_fields(fields, manifest_path, line_number, manifest_dir)


def _record_from_fields(fields, manifest_path, line_number, manifest_dir):
    fields = [str(field).strip() for field in fields]
    if len(fields) < 2 or len(fields) > 3 or not fields[0]:
        return errors.ErrorRecord(
            f"{manifest_path}:{line_number}",
            errors.BAD_MANIFEST_ROW,
            f"expected 'uri,label[,split]', got {len(fields)} fields",
        )
    uri = _resolve_uri(fields[0], manifest_dir)
    label = fields[1]
    split = fields[2] if len(fields) == 3 and fields[2] else None
    if not label:
        return errors.ErrorRecord(
            uri, errors.MISSING_LABEL, f"row {line_number} of {manifest_path} has no label"
        )
    if split is not None and split not in manifest_lib.SPLITS:
        return errors.ErrorRecord(
            uri,
            errors.UNKNOWN_SPLIT,
            f"row {line_number} of {manifest_path} names split {split!r}; expected one of {manifest_lib.SPLITS}",
        )
    return InputRecord(uri=uri, label=label, split=split)


def read_manifest(path: str, kind: str) -> list:
    """All rows of a manifest file as InputRecord / ErrorRecord."""
    with FileSystems.open(path) as handle:
        text = handle.read().decode("utf-8-sig")
    return list(parse_manifest_rows(text, kind, path))


def filter_labels(items, allowed_labels):
    """Turn records whose label is not in `allowed_labels` into UNKNOWN_LABEL errors."""
    allowed = set(allowed_labels)
    for item in items:
        if isinstance(item, InputRecord) and item.label not in allowed:
            yield errors.ErrorRecord(
                item.uri,
                errors.UNKNOWN_LABEL,
                f"label {item.label!r} is not one of --labels {sorted(allowed)}",
            )
        else:
            yield item


class ListInputs(beam.PTransform):
    """Input spec -> PCollection of InputRecord and ErrorRecord (tagged 'errors').

    The listing itself runs inside the pipeline (a Create of the spec, then a
    FlatMap), so a Dataflow job lists the bucket on a worker, not in the
    launcher, and a template stays valid as the bucket changes.
    """

    def __init__(self, spec: str, labels: list[str] | None = None):
        super().__init__()
        self._spec = spec
        self._labels = labels

    def expand(self, pbegin):
        spec, labels = self._spec, self._labels

        def list_spec(spec_value):
            kind = input_kind(spec_value)
            items = list_directory_tree(spec_value) if kind == DIRECTORY else read_manifest(spec_value, kind)
            # Listings come grouped by class (folders, or manifests written
            # class by class), and a local runner keeps that order all the way
            # into the shards; a stable pseudo-random order mixes classes
            # within each shard, so a reader's shuffle buffer need not undo it.
            items = sorted(items, key=_mixing_key)
            if labels:
                items = filter_labels(items, labels)
            for item in items:
                if isinstance(item, errors.ErrorRecord):
                    yield beam.pvalue.TaggedOutput("errors", item)
                else:
                    yield item

        return (
            pbegin
            | "Spec" >> beam.Create([spec])
            | "List" >> beam.FlatMap(list_spec).with_outputs("errors", main="records")
        )
