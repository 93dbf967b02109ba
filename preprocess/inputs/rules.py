"""Which files are inputs and how a manifest's rows read: the rules of stage 1's listing, and the listing of
one folder level (Beam imported only for gs://)."""

import csv
import dataclasses
import json
import os
import posixpath

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import errors

DIRECTORY = "directory"
CSV = "csv"
JSONL = "jsonl"

# Files that are never images and never inputs: OS and VCS debris in a tree, passed over without a count.
_IGNORED_NAMES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})
# The files of a tree that are inputs, by extension (any case): Keras' list and WebP
# (preprocess/decode/image.py reads it); declared in dataset_contract, which stage 2 reads too.
IMAGE_EXTENSIONS = features.SOURCE_IMAGE_EXTENSIONS
# A manifest row quoted in an error's detail is cut to this many characters.
_QUOTED_ROW_CHARS = 200


@dataclasses.dataclass(frozen=True)
class InputRecord:
    uri: str
    label: str
    split: str | None = None  # None: assigned from the content hash
    size: int | None = None  # bytes, where the listing gave it (None: a manifest's row)
    md5: str | None = None  # hex MD5 of the bytes, where GCS's listing gave it (reading.content_key)
    # A local file's modification time (ns), taken when it is keyed (content.with_mtime): with `size`, the
    # quick check a re-run trusts the previous version's content key on (content.trusted_key).
    mtime_ns: int | None = dataclasses.field(default=None, compare=False)
    # Whether the manifest named `split` (content.KeyContentFn fills in the others): near-duplicate
    # grouping never moves such an image to another split (preprocess/near_duplicates/).
    split_given: bool = dataclasses.field(default=False, compare=False)
    # The content key (content.KeyContentFn fills it in): what a re-run compares with the previous
    # version's ledger to carry the record over (preprocess/reuse/).
    key: str | None = dataclasses.field(default=None, compare=False)


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


def is_input_name(name: str) -> bool:
    """False for hidden files and folders and OS debris, which are passed over without a count."""
    return bool(name) and name not in _IGNORED_NAMES and not name.startswith(".")


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


def split_name(text: str) -> str | None:
    """The split a manifest's split cell names ('val' -> 'validation'), or None if it names none."""
    return _SPLIT_NAMES.get(text.strip().lower())


# The top folders of a pre-split tree (any case). Fewer than a manifest's split names: a class folder
# called `dev` or `eval` is more likely a class than a split.
SPLIT_FOLDER_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing")


class MixedTreeError(ValueError):
    """Some top folders of a tree name splits (train, val, test) and others do not: neither layout."""


def tree_splits(folder_names) -> dict[str, str] | None:
    """{top folder name: split} for a pre-split tree, None for a class-per-folder tree; MixedTreeError when
    only some top folders name a split."""
    names = sorted(folder_names)
    splits = {name: split_name(name) for name in names if name.lower() in SPLIT_FOLDER_NAMES}
    if not splits:
        return None
    if len(splits) == len(names):
        return splits
    others = [name for name in names if name not in splits]
    shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    raise MixedTreeError(
        f"its top folders mix split folders ({', '.join(sorted(splits))}) and other folders ({shown}). "
        "Either every top folder is a split holding class folders (ROOT/train/<class>/<image>, "
        "ROOT/validation/<class>/..., ROOT/test/<class>/...), or every top folder is a class "
        "(ROOT/<class>/<image>, split by stage 1's --split): move the class folders into a split folder, "
        "or rename a class folder that only looks like a split."
    )


@dataclasses.dataclass(frozen=True)
class ManifestLayout:
    """Where a CSV manifest's uri, label and split are: column indexes, and its header row, if it has one
    (found once, when the job is built, so that every worker parses rows alike)."""

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
    """The layout of a manifest whose first line is `first_line` (None: unknown yet): a header's named
    columns (any order, any case), else uri,label[,split], after an integer index column if there is one."""
    if kind != CSV or not first_line:
        return ManifestLayout()
    cells = [cell.strip().lower() for cell in next(csv.reader([first_line.removeprefix("\ufeff")]), [])]
    uri = next((cells.index(name) for name in URI_COLUMNS if name in cells), None)
    label = next((cells.index(name) for name in LABEL_COLUMNS if name in cells), None)
    if uri is not None and label is not None:
        split = next((cells.index(name) for name in SPLIT_COLUMNS if name in cells), None)
        if (uri, label, split, len(cells)) in ((0, 1, 2, 3), (0, 1, None, 2)):
            return ManifestLayout(header=tuple(cells))  # the columns where they are without a header
        return ManifestLayout(uri, label, split, header=tuple(cells), num_columns=len(cells))
    if len(cells) in (3, 4) and _is_integer(cells[0]) and not _is_integer(cells[1]):
        # pandas' to_csv(header=False): 0,a.jpg,cat[,train]
        return ManifestLayout(1, 2, 3 if len(cells) == 4 else None, num_columns=len(cells))
    if len(cells) == 1 and _names_columns_split_by_other_delimiter(cells[0]):
        # A header separated by ';' or a tab (a spreadsheet's export in some locales): still the header, so
        # it is passed over and not counted with the rows, which cannot be read (bad_manifest_row).
        return ManifestLayout(header=tuple(cells))
    return ManifestLayout()


def _names_columns_split_by_other_delimiter(cell: str) -> bool:
    for delimiter in (";", "\t", "|"):
        names = [name.strip() for name in cell.split(delimiter)]
        if len(names) > 1 and set(names) & set(URI_COLUMNS) and set(names) & set(LABEL_COLUMNS):
            return True
    return False


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
            # The header. (A bare `return`, the comment on its own line: Beam warns about "yield and return"
            # in a FlatMap's function when a line starts with "return " followed by anything.)
            return
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


def parse_manifest_rows(text, kind: str, manifest_path: str, layout: ManifestLayout | None = None):
    """InputRecord or ErrorRecord for each line of a manifest held in memory (its text, or its lines); without
    `layout`, the first line gives it (detect_manifest_layout)."""
    lines = text.splitlines() if isinstance(text, str) else text
    if layout is None:
        layout = detect_manifest_layout(next((line for line in lines if line.strip()), None), kind)
    for line in lines:
        yield from parse_manifest_line(line, kind, manifest_path, layout)


def _record_from_row(row, layout: ManifestLayout, line: str, manifest_path: str):
    """A CSV row, its columns picked by `layout` (without a header or an index column: uri,label[,split])."""
    expected = layout.num_columns
    if expected is None:
        return _record_from_fields(row, line, manifest_path)
    if not max(layout.uri, layout.label) < len(row) <= expected:
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


def _split_gcs(uri: str) -> tuple[str, str]:
    bucket, _, name = uri[len("gs://") :].partition("/")
    return bucket, name


_LEVEL_FIELDS = "items(name,size,md5Hash),prefixes,nextPageToken"


def _list_gcs_level(folder: str, start: str | None = None, end: str | None = None, page_size=None):
    """(lazy listing, folder prefix, bucket) of the level directly below gs://bucket/folder/ (delimiter "/"),
    bounded to [start, end) by GCS's startOffset/endOffset."""
    bucket, prefix = _split_gcs(folder.rstrip("/") + "/")
    from preprocess import filesystem  # noqa: PLC0415 - Beam, only for gs://

    listing = filesystem.gcs_io(folder).client.list_blobs(
        bucket,
        prefix=prefix,
        delimiter="/",
        start_offset=prefix + start if start else None,
        end_offset=prefix + end if end else None,
        page_size=page_size,
        fields=_LEVEL_FIELDS,
    )
    return listing, prefix, bucket


def walk_files(folder: str):
    """(path, name) of every file below a local folder, at any depth, hidden folders and debris left out (not
    its files: the caller filters, and counts); not through symlinked folders (os.walk)."""
    for directory, subdirectories, names in os.walk(folder):
        subdirectories[:] = sorted(name for name in subdirectories if is_input_name(name))
        for name in sorted(names):
            yield os.path.join(directory, name), name


def list_level(folder: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(sorted (name, path) of the folders, sorted names of the files) directly below `folder`, hidden names
    and OS debris left out; locally not through a symlink, as Beam's local match (os.walk) never was."""
    if folder.startswith("gs://"):
        folder = folder.rstrip("/")
        listing, prefix, _ = _list_gcs_level(folder)
        files = [blob.name[len(prefix) :] for blob in listing]  # consumed first: `prefixes` is then complete
        folders = [(name[len(prefix) :].rstrip("/"), None) for name in listing.prefixes]
        folders = [(name, f"{folder}/{name}") for name, _ in folders]
    else:
        with os.scandir(folder) as scanned:
            entries = list(scanned)
        folders = [(entry.name, entry.path) for entry in entries if entry.is_dir(follow_symlinks=False)]
        files = [entry.name for entry in entries if not entry.is_dir()]
    return sorted(item for item in folders if is_input_name(item[0])), sorted(filter(is_input_name, files))
