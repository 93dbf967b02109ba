"""Where the images are: list a class-per-folder tree or read a CSV/JSONL manifest.

Both forms produce `InputRecord`s (uri, label, split or None). A manifest row
that cannot be used becomes an error record right here, so every input is
accounted for from the first step.

Nothing here holds the whole listing, in one element or one worker, because a
corpus can hold 100M files:

- a tree is listed in three steps: the class folders (one listing of the
  root, with a delimiter on GCS), spread over the workers; each folder's
  name ranges (`plan_listing_ranges`: one range for a folder of up to a few
  thousand files, else split), spread over the workers; then each range's
  files, streamed as they are listed (`os.scandir` locally; on GCS the
  storage client's paged listing, 1,000 names a request, from the range's
  `start_offset` to its `end_offset`). Paging is serial, so a folder of 5M
  files listed as one range is one thread paging for 15-25 minutes; its
  ranges are listed by every worker at once. Beam's `FileSystems.match`
  returns one list of every match, and GcsIO's `list_files` keeps a set of
  every name it has seen, so neither is used for the files. The listing
  gives each file's size (a GCS listing has it; locally a stat), which the
  records carry: the size limit and the reads need no other request.
- a manifest is read with Beam's `ReadFromText`, which splits the file into
  byte ranges read in parallel. A row is parsed alone, so a bad row names the
  manifest and quotes the row (a line number is not known to a worker that
  reads from the middle of the file); CSV quoting works within a row, a quoted
  field cannot span lines.

What is an input follows Keras' `image_dataset_from_directory`: in a tree,
only files with an image extension (IMAGE_EXTENSIONS, any case) are inputs,
and images in sub-folders of a class folder belong to that class. Other files
(a `meta.json`, `notes.txt` or README beside the images) and the files
directly in the root (which have no class) are skipped: not failures, but
`SkippedFile`s, counted by extension in the manifest. Hidden files and OS
debris (`.DS_Store`, `Thumbs.db`) are passed over without a count.

A manifest's columns are found from its header, when it has one
(`ManifestLayout`): the common names (uri/path/filename/file/image,
label/class/category, split), in any order, a pandas index column ignored;
split names such as `val`, `valid` or `eval` mean validation.

The records then go through `MixClasses`, which spreads them over the workers
and mixes the classes (see there).
"""

import collections
import csv
import dataclasses
import functools
import hashlib
import json
import os
import posixpath
import random
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dataset_contract import manifest as manifest_lib
from preprocess import errors, filesystem

DIRECTORY = "directory"
CSV = "csv"
JSONL = "jsonl"

# Files that are never images and never inputs: OS and VCS debris in a tree, passed over without a count.
_IGNORED_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
# The files of a tree that are inputs, by extension (any case): Keras' image_dataset_from_directory takes
# .bmp .gif .jpeg .jpg .png; WebP is added as the decoder reads it (preprocess/image_decode.py).
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
_GCS_PREFIX = "gs://"
# A manifest row quoted in an error's detail is cut to this many characters.
_QUOTED_ROW_CHARS = 200


@dataclasses.dataclass(frozen=True)
class InputRecord:
    uri: str
    label: str
    split: str | None = None  # None: assigned from the content hash
    size: int | None = None  # bytes, where the listing gave it (None: a manifest's row)


@dataclasses.dataclass(frozen=True)
class SkippedFile:
    """A file of a tree that is not an input: not an image by its extension, or directly in the root."""

    uri: str
    extension: str  # lower case with its dot, "" for none
    at_root: bool = False


def extension_of(name: str) -> str:
    """'.jpg' for 'a/B.JPG'; '' for a name without one."""
    base = posixpath.basename(name.replace(os.sep, "/"))
    _, extension = posixpath.splitext(base)
    return extension.lower()


def is_image_name(name: str) -> bool:
    """True if a file of this name is an input of a tree (by its extension, any case), as Keras decides."""
    return extension_of(name) in IMAGE_EXTENSIONS


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
    # Beam's own GCS client, built from the job's options (credentials, impersonation, the emulator in
    # tests), one per thread and reused: a large folder's planning sends hundreds of small listings.
    return filesystem.gcs_io(uri).client


def _split_gcs(uri: str) -> tuple[str, str]:
    bucket, _, name = uri[len(_GCS_PREFIX) :].partition("/")
    return bucket, name


_LEVEL_FIELDS = "items(name,size),prefixes,nextPageToken"


def _list_gcs_level(folder: str, start: str | None = None, end: str | None = None, page_size=None):
    """(lazy listing, folder prefix, bucket) of the level directly below gs://bucket/folder/.

    One listing with delimiter "/": objects directly below come as its items,
    deeper ones only as the prefix of their subfolder (`.prefixes`, complete
    once every item has been consumed). Pages of 1,000 are fetched as the
    items are consumed, with the client's retries for each request. `start`
    and `end` (names below the folder) bound it to [start, end): GCS's
    `startOffset`/`endOffset`.
    """
    bucket, prefix = _split_gcs(folder.rstrip("/") + "/")
    listing = _gcs_client(folder).list_blobs(
        bucket,
        prefix=prefix,
        delimiter="/",
        start_offset=prefix + start if start else None,
        end_offset=prefix + end if end else None,
        page_size=page_size,
        fields=_LEVEL_FIELDS,
    )
    return listing, prefix, bucket


def list_class_folders(root: str):
    """(class name, folder uri) for every folder directly below `root`, in no particular order.

    As many elements as classes: small next to the files, whatever the corpus.
    """
    root = root.rstrip("/")
    if root.startswith(_GCS_PREFIX):
        listing, prefix, bucket = _list_gcs_level(root)
        for _ in listing:  # files directly below the root: list_root_files's, but the listing must pass them
            pass
        for folder in sorted(listing.prefixes):
            name = folder[len(prefix) :].rstrip("/")
            if _is_input_name(name):
                yield name, f"{_GCS_PREFIX}{bucket}/{folder.rstrip('/')}"
        return
    with os.scandir(root) as entries:
        for entry in entries:
            # Not through a symlink, as Beam's local match (os.walk) never followed one either.
            if entry.is_dir(follow_symlinks=False) and _is_input_name(entry.name):
                yield entry.name, os.path.join(root, entry.name)


def list_root_files(root: str):
    """A SkippedFile (at_root) for every file directly in `root`: it has no class folder, so no class."""
    root = root.rstrip("/")
    if root.startswith(_GCS_PREFIX):
        listing, prefix, bucket = _list_gcs_level(root)
        for blob in listing:
            name = blob.name[len(prefix) :]
            if _is_input_name(name):
                yield SkippedFile(f"{_GCS_PREFIX}{bucket}/{blob.name}", extension_of(name), at_root=True)
        return
    with os.scandir(root) as entries:
        for entry in entries:
            if _is_input_name(entry.name) and not entry.is_dir():
                yield SkippedFile(os.path.join(root, entry.name), extension_of(entry.name), at_root=True)


@dataclasses.dataclass(frozen=True)
class ListingRange:
    """The files of one class folder whose names (below the folder) sort in [start, end); None: unbounded.

    A folder's ranges run from None to None, each starting where the one
    before ends, so together they hold every file once, whatever the
    boundaries are (plan_listing_ranges).
    """

    label: str
    folder: str
    start: str | None = None
    end: str | None = None

    def holds(self, name: str) -> bool:
        return (self.start is None or name >= self.start) and (self.end is None or name < self.end)


# How many ranges were listed (a Beam counter, in the job's metrics).
_RANGES_LISTED = Metrics.counter("preprocess", "listing_ranges")
# A folder with more files than this is listed in several ranges; below it, the planning would cost
# more requests than the split saves (a page holds 1,000 names).
SPLIT_LISTING_ABOVE = 5000
# How many ranges a large folder is split into: on GCS, enough for every worker of a large job to
# page at once; on local disk each range scans the whole directory, so a few.
GCS_LISTING_RANGES = 64
LOCAL_LISTING_RANGES = 8
# Requests the GCS planning may send (each a listing of one name): a few seconds, once per large folder.
_MAX_PLANNING_PROBES = 256
# Names sampled from a large local folder to place its range boundaries.
_LOCAL_SAMPLE_NAMES = 1024


def plan_listing_ranges(class_folder: tuple[str, str], split_above: int = SPLIT_LISTING_ABOVE, ranges=None):
    """The ListingRanges of one class folder: one for a folder of up to `split_above` files, else several.

    GCS lists names in sorted order, a page at a time, so a range of names
    is listed by its own pager (`startOffset`/`endOffset`). The boundaries
    are found without listing the folder: by the characters that names go
    on with after their common start, one probe (a listing of one name) per
    character, breadth first (names img_000001.jpg ... img_999999.jpg split
    at img_1, img_2, ..., then img_01, img_02, ...), until there are
    `ranges` of them. Locally the directory is read once, names sampled, and
    the boundaries placed at the sample's quantiles. Any boundaries give the
    same files in all (ListingRange); good ones give ranges of similar size.
    """
    label, folder = class_folder
    if folder.startswith(_GCS_PREFIX):
        listing, _, _ = _list_gcs_level(folder, page_size=min(split_above + 1, 1000))
        if sum(1 for _ in zip(range(split_above + 1), listing, strict=False)) <= split_above:
            yield ListingRange(label, folder)
            return
        boundaries = _probe_boundaries(
            functools.partial(_first_gcs_name, folder), ranges or GCS_LISTING_RANGES, _MAX_PLANNING_PROBES
        )
    else:
        boundaries = _sampled_boundaries(folder, split_above, ranges or LOCAL_LISTING_RANGES)
    starts = [None, *sorted(boundaries)]
    for start, end in zip(starts, [*starts[1:], None], strict=True):
        yield ListingRange(label, folder, start, end)


def _first_gcs_name(folder: str, start: str, other_than: str) -> str | None:
    """The first name (below `folder`) at or after `start` other than `other_than`, or None.

    A request of one name (two when the first is `other_than`).
    """
    listing, prefix, _ = _list_gcs_level(folder, start=start, page_size=1)
    for blob in listing:
        name = blob.name[len(prefix) :]
        # GCS starts at `start` already; the check keeps servers that ignore startOffset (the tests' emulator) right.
        if name >= start and name != other_than:
            return name
    return None


def _next_character(character: str) -> str | None:
    """The character after `character` in code point (so UTF-8 byte) order, skipping surrogates."""
    point = ord(character) + 1
    if 0xD800 <= point <= 0xDFFF:
        point = 0xE000
    return chr(point) if point <= 0x10FFFF else None


def _probe_boundaries(first_at_or_after, target: int, max_probes: int) -> set[str]:
    """Range starts that split the names `first_at_or_after(start, other_than)` walks, by their next
    character after a prefix, breadth first.

    A name equal to the prefix itself (the folder's placeholder object, for
    the prefix "") sorts before every name that goes on from it; it is
    passed over here, and listed by the range that holds it like any other.
    """
    boundaries: set[str] = set()
    frontier = collections.deque([""])
    probes = 0
    while frontier and len(boundaries) + 1 < target and probes < max_probes:
        prefix = frontier.popleft()
        children = []
        start = prefix
        while probes < max_probes:
            name = first_at_or_after(start, prefix)
            probes += 1
            if name is None or not name.startswith(prefix):
                break
            children.append(name[len(prefix)])
            following = _next_character(children[-1])
            if following is None:
                break
            start = prefix + following
        # Each child character starts a range, but the first: names before it belong to the range before.
        boundaries.update(prefix + character for character in children[1:])
        frontier.extend(prefix + character for character in children)
    return boundaries


def _sampled_boundaries(folder: str, split_above: int, target: int) -> set[str]:
    """Range starts at the quantiles of a sample of a local folder's names (none for a small folder)."""
    sample: list[str] = []
    seen = 0
    chooser = random.Random(folder)  # the same ranges on every run over the same folder
    with os.scandir(folder) as entries:
        for entry in entries:
            seen += 1
            if len(sample) < _LOCAL_SAMPLE_NAMES:
                sample.append(entry.name)
            else:  # reservoir sampling: every name equally likely to be kept, in bounded memory
                slot = chooser.randrange(seen)
                if slot < _LOCAL_SAMPLE_NAMES:
                    sample[slot] = entry.name
    if seen <= split_above:
        return set()
    sample.sort()
    return {sample[index * len(sample) // target] for index in range(1, target)}


def _file_item(uri: str, name: str, label: str, size):
    """The InputRecord of an image file of a class, or the SkippedFile of any other file."""
    if is_image_name(name):
        return InputRecord(uri=uri, label=label, size=size)
    return SkippedFile(uri, extension_of(name))


def _list_gcs_subtree(folder_prefix: str, bucket: str, label: str):
    """Every file below gs://bucket/folder_prefix, at any depth (one listing without a delimiter)."""
    listing = _gcs_client(f"{_GCS_PREFIX}{bucket}").list_blobs(
        bucket, prefix=folder_prefix, fields="items(name,size),nextPageToken"
    )
    for blob in listing:
        relative = blob.name[len(folder_prefix) :]
        # A name ending in "/" is a folder's placeholder object; a hidden folder's files are passed over.
        if relative and not relative.endswith("/") and all(map(_is_input_name, relative.split("/"))):
            yield _file_item(f"{_GCS_PREFIX}{bucket}/{blob.name}", relative, label, blob.size)


def _list_local_subtree(folder: str, label: str):
    """Every file below a local sub-folder of a class folder, at any depth, hidden folders left out."""
    for directory, subdirectories, names in os.walk(folder):  # not through symlinked folders
        subdirectories[:] = sorted(name for name in subdirectories if _is_input_name(name))
        for name in names:
            if not _is_input_name(name):
                continue
            path = os.path.join(directory, name)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue  # a dangling link, or a file gone since
            yield _file_item(path, name, label, size)


def list_range(listing_range: ListingRange):
    """The files of a class folder within one name range: InputRecord (with its size) for each image,
    SkippedFile for any other file; a sub-folder in the range is listed whole, its images in the class.

    Streamed as it is listed: memory stays flat however many files the
    range holds (one page of names on GCS, one directory-entry buffer
    locally).
    """
    label, folder = listing_range.label, listing_range.folder
    _RANGES_LISTED.inc()
    if folder.startswith(_GCS_PREFIX):
        listing, prefix, bucket = _list_gcs_level(folder, listing_range.start, listing_range.end)
        for blob in listing:
            name = blob.name[len(prefix) :]
            # "" is the folder's own placeholder object. `holds`: GCS bounds the listing already; the
            # check keeps a server that ignores the offsets (the tests' emulator) from listing a file twice.
            if _is_input_name(name) and listing_range.holds(name):
                yield _file_item(f"{_GCS_PREFIX}{bucket}/{blob.name}", name, label, blob.size)
        for subfolder in sorted(listing.prefixes):  # complete once the items are consumed
            name = subfolder[len(prefix) :].rstrip("/")
            if _is_input_name(name) and listing_range.holds(name):
                yield from _list_gcs_subtree(subfolder, bucket, label)
        return
    with os.scandir(folder) as entries:
        for entry in entries:
            if not _is_input_name(entry.name) or not listing_range.holds(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield from _list_local_subtree(entry.path, label)
                continue
            if entry.is_dir():
                continue  # a link to a folder: not followed, as os.walk does not
            try:
                size = entry.stat().st_size  # through a link to a file: the file's
            except FileNotFoundError:
                continue  # a dangling link, as Beam's local match skipped it; or a file gone since
            yield _file_item(os.path.join(folder, entry.name), entry.name, label, size)


def list_class_files(class_folder: tuple[str, str]):
    """InputRecord for every image in one class folder, at any depth (as one range), streamed as it is listed."""
    label, folder = class_folder
    for item in list_range(ListingRange(label, folder)):
        if isinstance(item, InputRecord):
            yield item


def list_directory_tree(root: str):
    """Every image at `root/<class>/.../<file>`, the class taken from the folder name (one process, streamed)."""
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


# Header names of a manifest's columns (compared in lower case), and the split names a manifest may use.
URI_COLUMNS = ("uri", "path", "filename", "file", "image", "image_path", "filepath", "file_path", "url")
LABEL_COLUMNS = ("label", "class", "category", "class_name", "label_name")
SPLIT_COLUMNS = ("split", "subset", "fold")
_SPLIT_NAMES = {
    "train": manifest_lib.TRAIN,
    "training": manifest_lib.TRAIN,
    "validation": manifest_lib.VALIDATION,
    "val": manifest_lib.VALIDATION,
    "valid": manifest_lib.VALIDATION,
    "eval": manifest_lib.VALIDATION,
    "evaluation": manifest_lib.VALIDATION,
    "dev": manifest_lib.VALIDATION,
    "test": manifest_lib.TEST,
    "testing": manifest_lib.TEST,
}
# pandas' to_csv writes its index as a first column with an empty header ("Unnamed: 0" once read back).
_INDEX_HEADERS = ("", "unnamed: 0", "index")


def split_name(text: str) -> str | None:
    """The split a manifest's split cell names ('val' -> 'validation'), or None if it names none."""
    return _SPLIT_NAMES.get(text.strip().lower())


@dataclasses.dataclass(frozen=True)
class ManifestLayout:
    """Where a CSV manifest's uri, label and split are: column indexes, and its header row, if it has one.

    Found from the manifest's first row (`detect_manifest_layout`) when the
    job is built, so that every worker, whichever part of the file it reads,
    parses rows alike and passes over the header.
    """

    uri: int = 0
    label: int = 1
    split: int | None = 2
    header: tuple[str, ...] | None = None  # the header's cells, lower case; None: no header
    num_columns: int | None = None  # with a header or an index column: the row width expected

    def describe(self) -> str:
        if self.header is None and self.num_columns is None:
            return "uri,label[,split]"
        names = {self.uri: "uri", self.label: "label"}
        if self.split is not None:
            names[self.split] = "split"
        return ",".join(names.get(index, "(ignored)") for index in range(self.num_columns or 0))


def _is_integer(text: str) -> bool:
    return text.strip().isdigit()


def detect_manifest_layout(first_line: str | None, kind: str) -> ManifestLayout:
    """The layout of a manifest whose first line is `first_line` (None: unknown yet, e.g. a template's).

    A header names the columns (URI_COLUMNS, LABEL_COLUMNS, SPLIT_COLUMNS, any
    order, any case; other columns, such as pandas' unnamed index, ignored).
    Without a header the columns are uri,label[,split], after an integer index
    column if the first row starts with one and has a column to spare.
    """
    if kind != CSV or not first_line:
        return ManifestLayout()
    cells = [cell.strip().lower() for cell in next(csv.reader([first_line.removeprefix("\ufeff")]), [])]
    uri = next((cells.index(name) for name in URI_COLUMNS if name in cells), None)
    label = next((cells.index(name) for name in LABEL_COLUMNS if name in cells), None)
    if uri is not None and label is not None:
        split = next((cells.index(name) for name in SPLIT_COLUMNS if name in cells), None)
        if (uri, label) == (0, 1) and split in (2, None) and len(cells) <= 3:
            return ManifestLayout(header=tuple(cells))  # the columns where they are without a header
        return ManifestLayout(uri, label, split, header=tuple(cells), num_columns=len(cells))
    if len(cells) in (3, 4) and _is_integer(cells[0]) and not _is_integer(cells[1]):
        # pandas' to_csv(header=False): 0,a.jpg,cat[,train]
        return ManifestLayout(1, 2, 3 if len(cells) == 4 else None, num_columns=len(cells))
    return ManifestLayout()


def read_first_line(path: str) -> str | None:
    """The first line of a manifest file (local or gs://), or None if there is none or it cannot be read."""
    try:
        with FileSystems.open(path, compression_type="uncompressed") as handle:
            return handle.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    except Exception:  # noqa: BLE001 - a missing manifest is reported by the checks and the job
        return None


def parse_manifest_line(line: str, kind: str, manifest_path: str, layout: ManifestLayout | None = None):
    """The InputRecord or ErrorRecord of one line of a CSV/JSONL manifest; nothing for a blank or header line."""
    layout = layout or ManifestLayout()
    line = line.removeprefix("\ufeff")  # a byte order mark, on the first line
    if not line.strip():
        return
    if kind == CSV:
        row = next(csv.reader([line]), [])
        if all(not cell.strip() for cell in row):
            return
        lowered = tuple(cell.strip().lower() for cell in row)
        if lowered == layout.header or [cell for cell in lowered[:2]] == ["uri", "label"]:
            return  # the header
        yield _record_from_row(row, layout, line, manifest_path)
        return
    try:
        obj = json.loads(line)
        keys = {str(key).strip().lower(): value for key, value in obj.items()}
        uri_key = next(name for name in URI_COLUMNS if keys.get(name) not in (None, ""))
        label = next((keys[name] for name in LABEL_COLUMNS if keys.get(name) is not None), "")
        split = next((keys[name] for name in SPLIT_COLUMNS if keys.get(name)), "")
        fields = [keys[uri_key], label, split]
    except (ValueError, StopIteration, TypeError, AttributeError) as exc:
        detail = str(exc) or "no " + "/".join(URI_COLUMNS[:5])
        yield errors.ErrorRecord(
            manifest_path,
            errors.BAD_MANIFEST_ROW,
            f"not a JSON object with 'uri' ({detail}): {_quoted(line)}",
        )
        return
    yield _record_from_fields(fields, line, manifest_path)


def parse_manifest_rows(text: str, kind: str, manifest_path: str, layout: ManifestLayout | None = None):
    """InputRecord or ErrorRecord for each line of a manifest held in memory (small manifests, tools).

    Without `layout`, the first line gives it (detect_manifest_layout).
    """
    lines = text.splitlines()
    if layout is None:
        layout = detect_manifest_layout(next((line for line in lines if line.strip()), None), kind)
    for line in lines:
        yield from parse_manifest_line(line, kind, manifest_path, layout)


def _record_from_row(row, layout: ManifestLayout, line: str, manifest_path: str):
    """A CSV row, its columns picked by `layout`."""
    expected = layout.num_columns
    if expected is None and (len(row) < 2 or len(row) > 3):
        return errors.ErrorRecord(
            manifest_path,
            errors.BAD_MANIFEST_ROW,
            f"expected 'uri,label[,split]', got {len(row)} fields: {_quoted(line)}",
        )
    if expected is not None and not max(layout.uri, layout.label) < len(row) <= expected:
        return errors.ErrorRecord(
            manifest_path,
            errors.BAD_MANIFEST_ROW,
            f"expected {expected} fields ({layout.describe()}), got {len(row)}: {_quoted(line)}",
        )
    split = row[layout.split] if layout.split is not None and layout.split < len(row) else ""
    return _record_from_fields([row[layout.uri], row[layout.label], split], line, manifest_path)


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
    split_text = fields[2] if len(fields) == 3 else ""
    if not label:
        return errors.ErrorRecord(uri, errors.MISSING_LABEL, f"its row in {manifest_path} has no label")
    split = split_name(split_text) if split_text else None
    if split_text and split is None:
        return errors.ErrorRecord(
            uri,
            errors.UNKNOWN_SPLIT,
            f"its row in {manifest_path} names split {split_text!r}; expected one of {manifest_lib.SPLITS} "
            "(or val, valid, eval, dev for validation)",
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
    skipped: beam.PCollection  # SkippedFile: a tree's files that are not inputs


def _route(item):
    if isinstance(item, errors.ErrorRecord):
        yield beam.pvalue.TaggedOutput("errors", item)
    elif isinstance(item, SkippedFile):
        yield beam.pvalue.TaggedOutput("skipped", item)
    else:
        yield item


class ListInputs(beam.PTransform):
    """Input spec -> PCollection of InputRecord (mixed, spread), ErrorRecord (tagged 'errors') and
    SkippedFile (tagged 'skipped').

    The listing runs inside the pipeline, so a Dataflow job lists the bucket on
    its workers, not in the launcher, and a template stays valid as the bucket
    changes. `layout`: a CSV manifest's columns (detect_manifest_layout), found
    by the launcher; None: read from the manifest's first line now, if it is there.
    """

    def __init__(
        self,
        spec: str,
        labels: list[str] | None = None,
        split_listing_above: int = SPLIT_LISTING_ABOVE,
        layout: ManifestLayout | None = None,
    ):
        super().__init__()
        self._spec = spec
        self._labels = labels
        self._split_listing_above = split_listing_above
        self._layout = layout

    def expand(self, pbegin):
        spec, kind = self._spec, input_kind(self._spec)
        if kind == DIRECTORY:
            root = pbegin | "Root" >> beam.Create([spec])
            items = (
                root
                | "ListClassFolders" >> beam.FlatMap(list_class_folders)
                # One element per class: without this, one worker would list every class.
                | "SpreadClassFolders" >> beam.Reshuffle()
                | "PlanListingRanges" >> beam.FlatMap(plan_listing_ranges, self._split_listing_above)
                # One element per range: a large folder is listed by several workers at once.
                | "SpreadListingRanges" >> beam.Reshuffle()
                | "ListClassFiles" >> beam.FlatMap(list_range)
            )
            root_files = root | "ListRootFiles" >> beam.FlatMap(list_root_files)
            items = (items, root_files) | "AllListed" >> beam.Flatten()
        else:
            # Checked when the job runs, not in the launcher (a template may be made before its
            # manifest exists); ReadFromText alone would read a missing manifest as an empty one.
            _ = (
                pbegin
                | "ManifestSpec" >> beam.Create([spec])
                | "RequireManifest" >> beam.Map(require_manifest)
            )
            layout = self._layout or detect_manifest_layout(read_first_line(spec), kind)
            items = (
                pbegin
                | "ReadManifest" >> beam.io.ReadFromText(spec, validate=False)
                | "ParseRows" >> beam.FlatMap(parse_manifest_line, kind, spec, layout)
            )
        if self._labels:
            items = items | "FilterLabels" >> beam.FlatMap(
                lambda item, labels: filter_labels([item], labels), self._labels
            )
        routed = items | "Route" >> beam.FlatMap(_route).with_outputs("errors", "skipped", main="records")
        return ListedInputs(
            records=routed.records | "MixClasses" >> MixClasses(),
            errors=routed.errors,
            skipped=routed.skipped,
        )
