"""What is checked about --input and --output before a job starts, so that a mistake costs seconds, not a run."""

import collections
import concurrent.futures
import dataclasses
import logging
import os
import posixpath

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.inputs import rules as inputs

# Beam (seconds to import) is imported only for gs:// paths: a local mistake is said at once.

log = logging.getLogger(__name__)

# Names looked at in one class folder before it is taken to hold images without proof: a folder of
# millions of sidecar files must not stall the launcher.
SURVEY_LIMIT = 10_000
# Rows of a manifest parsed before the job starts, and files of those rows whose existence is checked.
MANIFEST_SAMPLE_ROWS = 1000
MANIFEST_SAMPLE_FILES = 10
# Class folders surveyed at once on GCS (each a listing request or a few).
_GCS_SURVEY_THREADS = 16
_EXAMPLES = 3
_IMAGE_TYPES = " ".join(inputs.IMAGE_EXTENSIONS)


class InputError(ValueError):
    """--input or --output cannot make a dataset; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class InputSurvey:
    """What the checks saw: the classes with images, empty class folders, files at the root."""

    kind: str
    classes: tuple[str, ...]
    empty_classes: tuple[str, ...] = ()
    root_files: tuple[str, ...] = ()
    # A pre-split tree's splits (its split folders name them), in manifest order; () for other inputs.
    splits: tuple[str, ...] = ()


def _is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def _examples(names) -> str:
    names = list(names)
    shown = ", ".join(names[:_EXAMPLES])
    return shown + (", ..." if len(names) > _EXAMPLES else "")


# ------------------------------------------------------------------------------------------ the output


def check_output_outside_input(input_spec: str, output: str, output_flag: str = "--output") -> None:
    """InputError if `output` is the input tree or inside it: the next run would read it as a class.

    `output_flag`: the flag that chose `output`, for the message (--workdir for the workflows).
    """
    if inputs.input_kind(input_spec) != inputs.DIRECTORY:
        return
    if _is_gcs(input_spec) != _is_gcs(output):
        return
    if _is_gcs(input_spec):
        root, target = input_spec.rstrip("/") + "/", output.rstrip("/") + "/"
    else:
        root = os.path.join(os.path.realpath(input_spec), "")
        target = os.path.join(os.path.realpath(output), "")
    if target.startswith(root):
        raise InputError(
            f"{output_flag} {output} is inside --input {input_spec}: the next run would read the dataset as a "
            f"class of images. Choose a {output_flag} outside the input folder."
        )


# --------------------------------------------------------------------------------------------- a tree


def _local_folder_has_image(folder: str) -> bool | None:
    """True if an image is anywhere below `folder`, False if none is, None if SURVEY_LIMIT names showed none."""
    for seen, (_, name) in enumerate(inputs.walk_files(folder), 1):
        if inputs.is_image_name(name) and inputs.is_input_name(name):
            return True
        if seen >= SURVEY_LIMIT:
            return None
    return False


def _gcs_folder_has_image(folder: str) -> bool | None:
    bucket, prefix = folder[len("gs://") :].split("/", 1)
    prefix = prefix.rstrip("/") + "/"
    from preprocess import filesystem  # noqa: PLC0415 - Beam

    listing = filesystem.gcs_io(folder).client.list_blobs(
        bucket, prefix=prefix, page_size=1000, fields="items(name),nextPageToken"
    )
    for seen, blob in enumerate(listing):
        relative = blob.name[len(prefix) :]
        if inputs.is_image_name(relative) and all(map(inputs.is_input_name, relative.split("/"))):
            return True
        if seen + 1 >= SURVEY_LIMIT:
            return None
    return False


def _tree(root: str, gcs: bool):
    """(class folders as (name, path), files at the root) of a tree; InputError if there is none."""
    if not gcs and not os.path.exists(root):
        raise InputError(
            f"--input {root}: no such folder. Give a folder of class folders (ROOT/<class>/<image>) or a "
            "CSV/JSONL manifest (.csv, .jsonl)."
        )
    if not gcs and not os.path.isdir(root):
        raise InputError(
            f"--input {root} is a file but not a manifest: a manifest's name ends in .csv, .jsonl or .json; "
            "otherwise give a folder of class folders."
        )
    folders, root_files = inputs.list_level(root)
    if gcs and not folders and not root_files:
        raise InputError(f"--input {root}: no such folder, or nothing is in it")
    return folders, root_files


def _tree_folders(root: str, gcs: bool):
    """(folders, root files) of a tree, and {split: folder} for a pre-split tree (else {}); a pre-split tree's
    class folders are named `split/class`, its split folders' own files counted with the root's."""
    folders, root_files = _tree(root, gcs)
    try:
        splits = inputs.tree_splits(name for name, _ in folders)
    except inputs.MixedTreeError as exc:
        raise InputError(f"--input {root}: {exc}") from None
    if splits is None:
        return folders, root_files, {}
    class_folders, split_folders = [], {}
    for name, path in folders:
        inner, files = _tree(path, gcs)
        class_folders += [(f"{name}/{inner_name}", inner_path) for inner_name, inner_path in inner]
        root_files += [f"{name}/{file}" for file in files]
        split_folders.setdefault(splits[name], []).append(name)
    return class_folders, sorted(root_files), split_folders


def survey_directory(root: str, labels=None) -> InputSurvey:
    """Checks a class-per-folder tree (or a pre-split one): at least two classes hold images (any depth
    below their folder)."""
    root = root.rstrip("/") if _is_gcs(root) else root
    gcs = _is_gcs(root)
    folders, root_files, split_folders = _tree_folders(root, gcs)
    root_images = [name for name in root_files if inputs.is_image_name(name)]
    if not folders:
        if split_folders:
            raise InputError(
                f"--input {root}: its split folders ({', '.join(sorted(sum(split_folders.values(), [])))}) "
                "hold no class folders: a pre-split tree is ROOT/<split>/<class>/<image>, as TFDS' "
                "ImageFolder reads it."
            )
        if root_images:
            raise InputError(
                f"--input {root} holds {len(root_images)} images ({_examples(root_images)}) but no class "
                "folders: put each class's images in a folder of its own, ROOT/<class>/<image>, as Keras' "
                "image_dataset_from_directory reads them (or list them in a CSV manifest of uri,label)."
            )
        raise InputError(
            f"--input {root} holds no class folders and no images: expected ROOT/<class>/<image>, the "
            f"images ending in {_IMAGE_TYPES} (any case)."
        )
    if gcs:
        with concurrent.futures.ThreadPoolExecutor(_GCS_SURVEY_THREADS) as pool:
            found = list(pool.map(_gcs_folder_has_image, [path for _, path in folders]))
    else:
        found = [_local_folder_has_image(path) for _, path in folders]
    classes = sorted(  # a pre-split tree's "split/class" -> "class"
        {name.rsplit("/", 1)[-1] for (name, _), has in zip(folders, found, strict=True) if has is not False}
    )
    empty = [name for (name, _), has in zip(folders, found, strict=True) if has is False]
    if labels:
        classes = [name for name in classes if name in set(labels)]
    if not classes:
        raise InputError(
            f"--input {root}: none of its {len(folders)} class folders ({_examples(name for name, _ in folders)}) "
            f"holds an image (a file ending in {_IMAGE_TYPES}, any case)"
            + (f" of the classes --labels names ({', '.join(labels)})" if labels else "")
            + "."
        )
    if len(classes) < 2:
        folders_hold = "folder holds" if len(empty) == 1 else "folders hold"
        others = f" ({len(empty)} other {folders_hold} no image: {_examples(empty)})" if empty else ""
        raise InputError(
            f"--input {root}: only one class, {classes[0]!r}, has images{others}. A classifier needs at least "
            "two classes: put each class's images in a folder of its own, ROOT/<class>/<image>."
        )
    if empty:
        log.warning(
            "%d class folder%s of %s hold%s no image and %s left out: %s",
            len(empty),
            "s" if len(empty) != 1 else "",
            root,
            "" if len(empty) != 1 else "s",
            "are" if len(empty) != 1 else "is",
            ", ".join(empty),
        )
    if root_files:
        log.warning(
            "%d file%s directly in %s%s (%s) %s in no class folder: skipped (counted in the manifest)",
            len(root_files),
            "s" if len(root_files) != 1 else "",
            root,
            " or its split folders" if split_folders else "",
            _examples(root_files),
            "are" if len(root_files) != 1 else "is",
        )
    splits = tuple(split for split in manifest_lib.SPLITS if split in split_folders)
    if split_folders:
        named = ", ".join(f"{'+'.join(split_folders[split])}/ -> {split}" for split in splits)
        log.info("%s is a pre-split tree: %s; --split is not used", root, named)
        if manifest_lib.VALIDATION not in split_folders:
            log.warning(
                "%s has no validation folder (val/, valid/ or validation/): training needs a validation "
                "split; move some of each class's images into %s/validation/<class>/",
                root,
                root.rstrip("/"),
            )
    return InputSurvey(inputs.DIRECTORY, tuple(classes), tuple(empty), tuple(root_files), splits)


# ----------------------------------------------------------------------------------------- a manifest


def _open_binary(path: str):
    if _is_gcs(path):
        from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

        return FileSystems.open(path, compression_type="uncompressed")
    return open(path, "rb")  # noqa: SIM115 - returned to a with


def manifest_sample(path: str) -> tuple[list[str], bool]:
    """(the first MANIFEST_SAMPLE_ROWS lines of a manifest, True if that is all of it)."""
    lines = []
    with _open_binary(path) as handle:
        for raw in handle:
            if len(lines) >= MANIFEST_SAMPLE_ROWS:
                return lines, False
            lines.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    return lines, True


def _file_exists(uri: str) -> bool:
    if _is_gcs(uri):
        from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

        return FileSystems.exists(uri)
    return os.path.isfile(uri)


def survey_manifest(path: str, labels=None) -> InputSurvey:
    """Checks a CSV/JSONL manifest by its first rows: some are usable, name files that exist, two classes."""
    kind = inputs.input_kind(path)
    if not _file_exists(path):
        raise InputError(
            f"--input {path}: no such manifest file. Give a CSV/JSONL manifest of uri,label[,split], or a "
            "folder of class folders."
        )
    lines, complete = manifest_sample(path)
    items = list(inputs.parse_manifest_rows(lines, kind, path))
    if labels:
        items = list(inputs.filter_labels(items, labels))
    records = [item for item in items if isinstance(item, inputs.InputRecord)]
    failures = [item for item in items if isinstance(item, errors.ErrorRecord)]
    rows = "its rows" if complete else f"its first {len(lines)} rows"
    if not items:
        raise InputError(f"--input {path}: the manifest lists no image (it is empty, or only a header).")
    if not records:
        by_reason = collections.Counter(failure.reason for failure in failures)
        counts = ", ".join(f"{reason} {count}" for reason, count in sorted(by_reason.items()))
        columns = (
            "a header naming the columns (uri/path/filename/file/image, label/class/category, split)"
            if kind == inputs.CSV
            else "JSON objects with uri (or path/filename/file/image) and label (or class/category)"
        )
        raise InputError(
            f"--input {path}: none of {rows} can be used ({counts}); the first: {failures[0].detail}. "
            f"Expected {columns}, or rows of uri,label[,split]."
        )
    if complete and len({record.label for record in records}) < 2:
        raise InputError(
            f"--input {path}: every usable row has the label {records[0].label!r}. A classifier needs at "
            "least two classes."
        )
    sample = records[:MANIFEST_SAMPLE_FILES]
    if not any(_file_exists(record.uri) for record in sample):
        raise InputError(
            f"--input {path}: none of the first {len(sample)} files it names exists ({_examples(r.uri for r in sample)}). "
            f"Relative paths are taken relative to the manifest's folder, {posixpath.dirname(path) or '.'}."
        )
    return InputSurvey(kind, tuple(sorted({record.label for record in records})))


# --------------------------------------------------------------------------------------------- entry


_CHECKED: dict = {}


def check_inputs(
    input_spec: str, output: str, labels=None, template: bool = False, output_flag: str = "--output"
) -> InputSurvey | None:
    """Checks --input and --output before a job starts (once per process for the same arguments); InputError
    says what is wrong. A template's input may not exist yet: only the output's place is checked (None)."""
    if "://" not in output:
        output = os.path.abspath(output)
    key = (input_spec, output.rstrip("/"), tuple(labels or ()), template)
    if key in _CHECKED:
        return _CHECKED[key]
    check_output_outside_input(input_spec, output, output_flag)
    survey = None
    if not template:
        if inputs.input_kind(input_spec) == inputs.DIRECTORY:
            survey = survey_directory(input_spec, labels)
        else:
            survey = survey_manifest(input_spec, labels)
    _CHECKED[key] = survey
    return survey
