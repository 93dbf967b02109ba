"""Where the images are: list a class-per-folder tree or read a CSV/JSONL manifest.

Both forms produce `InputRecord`s (uri, label, split or None). A manifest row
that cannot be used becomes an error record right here, so every input is
accounted for from the first step.

Nothing here holds the whole listing, in one element or one worker, because a
corpus can hold 100M files:

- a tree is listed in two steps: the class folders (one listing of the root,
  with a delimiter on GCS), spread over the workers, then each folder's files,
  streamed as they are listed (`os.scandir` locally; on GCS the storage
  client's paged listing, 1,000 names a request). Beam's `FileSystems.match`
  returns one list of every match, and GcsIO's `list_files` keeps a set of
  every name it has seen, so neither is used for the files.
- a manifest is read with Beam's `ReadFromText`, which splits the file into
  byte ranges read in parallel. A row is parsed alone, so a bad row names the
  manifest and quotes the row (a line number is not known to a worker that
  reads from the middle of the file); CSV quoting works within a row, a quoted
  field cannot span lines.

The records then go through `MixClasses`, which spreads them over the workers
and mixes the classes (see there).
"""

import csv
import dataclasses
import hashlib
import json
import os
import posixpath
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from preprocess import errors

DIRECTORY = "directory"
CSV = "csv"
JSONL = "jsonl"

# Files that are never images and never inputs: OS and VCS debris in a tree.
_IGNORED_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
_GCS_PREFIX = "gs://"
# A manifest row quoted in an error's detail is cut to this many characters.
_QUOTED_ROW_CHARS = 200


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


# ----------------------------------------------------------------------------- a class-per-folder tree


def _is_input_name(name: str) -> bool:
    return bool(name) and name not in _IGNORED_NAMES and not name.startswith(".")


def _gcs_client(uri: str):
    # Beam's own GCS client, built from the job's options as Beam's GCS filesystem builds it for every
    # file it opens (credentials, impersonation, the emulator in tests).
    return FileSystems.get_filesystem(uri)._gcsIO().client


def _split_gcs(uri: str) -> tuple[str, str]:
    bucket, _, name = uri[len(_GCS_PREFIX) :].partition("/")
    return bucket, name


def _list_gcs_level(folder: str):
    """(lazy listing, folder prefix, bucket) of the level directly below gs://bucket/folder/.

    One listing with delimiter "/": objects directly below come as its items,
    deeper ones only as the prefix of their subfolder (`.prefixes`, complete
    once every item has been consumed). Pages of 1,000 are fetched as the
    items are consumed, with the client's retries for each request.
    """
    bucket, prefix = _split_gcs(folder.rstrip("/") + "/")
    listing = _gcs_client(folder).list_blobs(
        bucket, prefix=prefix, delimiter="/", fields="items(name),prefixes,nextPageToken"
    )
    return listing, prefix, bucket


def list_class_folders(root: str):
    """(class name, folder uri) for every folder directly below `root`, in no particular order.

    As many elements as classes: small next to the files, whatever the corpus.
    """
    root = root.rstrip("/")
    if root.startswith(_GCS_PREFIX):
        listing, prefix, bucket = _list_gcs_level(root)
        for _ in listing:  # files directly below the root: not inputs, but the listing must pass them
            pass
        for folder in sorted(listing.prefixes):
            name = folder[len(prefix) :].rstrip("/")
            yield name, f"{_GCS_PREFIX}{bucket}/{folder.rstrip('/')}"
        return
    with os.scandir(root) as entries:
        for entry in entries:
            # Not through a symlink, as Beam's local match (os.walk) never followed one either.
            if entry.is_dir(follow_symlinks=False):
                yield entry.name, os.path.join(root, entry.name)


def list_class_files(class_folder: tuple[str, str]):
    """InputRecord for every file directly in one class folder, streamed as it is listed.

    Memory stays flat however many files the folder holds: one page of names on GCS, one
    directory-entry buffer locally.
    """
    label, folder = class_folder
    if folder.startswith(_GCS_PREFIX):
        listing, prefix, bucket = _list_gcs_level(folder)
        for blob in listing:
            name = blob.name[len(prefix) :]
            if _is_input_name(name):  # "" is the folder's own placeholder object
                yield InputRecord(uri=f"{_GCS_PREFIX}{bucket}/{blob.name}", label=label)
        return
    with os.scandir(folder) as entries:
        for entry in entries:
            if not _is_input_name(entry.name) or entry.is_dir():
                continue
            if entry.is_symlink() and not os.path.exists(entry.path):
                continue  # a dangling link, as Beam's local match skipped it
            yield InputRecord(uri=os.path.join(folder, entry.name), label=label)


def list_directory_tree(root: str):
    """Every file at `root/<class>/<file>`, the class taken from the folder name (one process, streamed)."""
    for class_folder in list_class_folders(root):
        yield from list_class_files(class_folder)


# ----------------------------------------------------------------------------------- a CSV/JSONL manifest


def require_manifest(path: str) -> str:
    """`path`, if a file is there; else a FileNotFoundError that says what --input must be."""
    if not FileSystems.exists(path):
        raise FileNotFoundError(
            f"--input {path}: no such manifest file (give a CSV/JSONL manifest, or a folder of class folders)"
        )
    return path


def _resolve_uri(uri: str, manifest_dir: str) -> str:
    """Manifest URIs may be relative to the manifest's own directory."""
    if "://" in uri or uri.startswith("/"):
        return uri
    return manifest_lib.join(manifest_dir, uri)


def _quoted(line: str) -> str:
    return repr(line if len(line) <= _QUOTED_ROW_CHARS else line[:_QUOTED_ROW_CHARS] + "...")


def parse_manifest_line(line: str, kind: str, manifest_path: str):
    """The InputRecord or ErrorRecord of one line of a CSV/JSONL manifest; nothing for a blank or header line."""
    line = line.removeprefix("\ufeff")  # a byte order mark, on the first line
    if not line.strip():
        return
    if kind == CSV:
        row = next(csv.reader([line]), [])
        if all(not cell.strip() for cell in row):
            return
        if [cell.strip().lower() for cell in row[:2]] == ["uri", "label"]:
            return  # the header
        fields = row
    else:
        try:
            obj = json.loads(line)
            fields = [obj["uri"], obj.get("label", ""), obj.get("split") or ""]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            yield errors.ErrorRecord(
                manifest_path,
                errors.BAD_MANIFEST_ROW,
                f"not a JSON object with 'uri' ({exc}): {_quoted(line)}",
            )
            return
    yield _record_from_fields(fields, line, manifest_path)


def parse_manifest_rows(text: str, kind: str, manifest_path: str):
    """InputRecord or ErrorRecord for each line of a manifest held in memory (small manifests, tools)."""
    for line in text.splitlines():
        yield from parse_manifest_line(line, kind, manifest_path)


def _record_from_fields(fields, line: str, manifest_path: str):
    fields = [str(field).strip() for field in fields]
    if len(fields) < 2 or len(fields) > 3 or not fields[0]:
        return errors.ErrorRecord(
            manifest_path,
            errors.BAD_MANIFEST_ROW,
            f"expected 'uri,label[,split]', got {len(fields)} fields: {_quoted(line)}",
        )
    uri = _resolve_uri(fields[0], posixpath.dirname(manifest_path))
    label = fields[1]
    split = fields[2] if len(fields) == 3 and fields[2] else None
    if not label:
        return errors.ErrorRecord(uri, errors.MISSING_LABEL, f"its row in {manifest_path} has no label")
    if split is not None and split not in manifest_lib.SPLITS:
        return errors.ErrorRecord(
            uri,
            errors.UNKNOWN_SPLIT,
            f"its row in {manifest_path} names split {split!r}; expected one of {manifest_lib.SPLITS}",
        )
    return InputRecord(uri=uri, label=label, split=split)


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


# ------------------------------------------------------------------------------------------- the transforms

# Records per group when mixing: a group is sorted in memory, so it stays this small on average
# whatever the corpus (its size is about Poisson-distributed around it).
MIX_GROUP_SIZE = 16


def _mixing_key(uri: str) -> int:
    return int.from_bytes(hashlib.sha256(uri.encode("utf-8")).digest()[:8], "big")


def _mix_group(record: InputRecord, num_records: int):
    return _mixing_key(record.uri) % max(1, num_records // MIX_GROUP_SIZE), record


def _in_mixed_order(group):
    _, records = group
    return sorted(records, key=lambda record: _mixing_key(record.uri))


class MixClasses(beam.PTransform):
    """Records -> the same records, spread over the workers and with the classes mixed.

    Listings come grouped by class (folders, or manifests written class by
    class). On Dataflow the group-by below spreads them over the workers and
    its output order is arbitrary anyway; but a local runner keeps the order
    of its input all the way into the shards (its group-by emits keys in the
    order they first arrive), and shards each holding one class would have to
    be undone by a reader's shuffle buffer. So each record goes into one of
    about N / MIX_GROUP_SIZE groups by a hash of its URI, and each group comes
    out sorted by that hash: every group holds a pseudo-random handful of the
    whole listing, whatever order it arrived in, and no group grows with N.
    """

    def expand(self, records):
        num_records = records | "CountRecords" >> beam.combiners.Count.Globally()
        return (
            records
            | "ToGroup" >> beam.Map(_mix_group, num_records=beam.pvalue.AsSingleton(num_records))
            | "GroupByMixingKey" >> beam.GroupByKey()
            | "InMixedOrder" >> beam.FlatMap(_in_mixed_order)
        )


class ListedInputs(NamedTuple):
    records: beam.PCollection  # InputRecord
    errors: beam.PCollection  # ErrorRecord


def _route(item):
    if isinstance(item, errors.ErrorRecord):
        yield beam.pvalue.TaggedOutput("errors", item)
    else:
        yield item


class ListInputs(beam.PTransform):
    """Input spec -> PCollection of InputRecord (mixed, spread) and ErrorRecord (tagged 'errors').

    The listing runs inside the pipeline, so a Dataflow job lists the bucket on
    its workers, not in the launcher, and a template stays valid as the bucket
    changes.
    """

    def __init__(self, spec: str, labels: list[str] | None = None):
        super().__init__()
        self._spec = spec
        self._labels = labels

    def expand(self, pbegin):
        spec, kind = self._spec, input_kind(self._spec)
        if kind == DIRECTORY:
            items = (
                pbegin
                | "Root" >> beam.Create([spec])
                | "ListClassFolders" >> beam.FlatMap(list_class_folders)
                # One element per class: without this, one worker would list every class.
                | "SpreadClassFolders" >> beam.Reshuffle()
                | "ListClassFiles" >> beam.FlatMap(list_class_files)
            )
        else:
            # Checked when the job runs, not in the launcher (a template may be made before its
            # manifest exists); ReadFromText alone would read a missing manifest as an empty one.
            _ = (
                pbegin
                | "ManifestSpec" >> beam.Create([spec])
                | "RequireManifest" >> beam.Map(require_manifest)
            )
            items = (
                pbegin
                | "ReadManifest" >> beam.io.ReadFromText(spec, validate=False)
                | "ParseRows" >> beam.FlatMap(parse_manifest_line, kind, spec)
            )
        if self._labels:
            items = items | "FilterLabels" >> beam.FlatMap(
                lambda item, labels: filter_labels([item], labels), self._labels
            )
        routed = items | "Route" >> beam.FlatMap(_route).with_outputs("errors", main="records")
        return ListedInputs(records=routed.records | "MixClasses" >> MixClasses(), errors=routed.errors)
