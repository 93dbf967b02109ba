"""Where the images are: list a class-per-folder tree or read a CSV/JSONL manifest."""

import dataclasses
import functools
import hashlib
import os
import random
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from preprocess import errors, filesystem
from preprocess.inputs.listing_plan import plan_boundaries
from preprocess.inputs.reading import md5_hex
from preprocess.inputs.rules import (  # noqa: F401 - some re-exported: the listing's rules, for its callers
    CSV,
    DIRECTORY,
    JSONL,
    InputRecord,
    ManifestLayout,
    MixedTreeError,
    SkippedFile,
    _list_gcs_level,
    detect_manifest_layout,
    extension_of,
    filter_labels,
    input_kind,
    is_image_name,
    is_input_name,
    list_level,
    parse_manifest_line,
    parse_manifest_rows,
    tree_splits,
    walk_files,
)

_GCS_PREFIX = "gs://"

# ----------------------------------------------------------------------------- a class-per-folder tree


def tree_roots(root: str) -> list[tuple[str | None, str]]:
    """(split, folder) of the folders whose sub-folders are the classes: [(None, root)] for a class tree,
    one per split folder for a pre-split tree (input_rules.tree_splits; MixedTreeError for a mix)."""
    folders = list_level(root)[0]
    splits = tree_splits(name for name, _ in folders)
    if splits is None:
        return [(None, root.rstrip("/"))]
    return [(splits[name], folder) for name, folder in folders]


class ClassFolder(NamedTuple):
    """A class's folder; `split` when it is in a pre-split tree's split folder (then every image has it)."""

    label: str
    folder: str
    split: str | None = None


def list_class_folders(root: str):
    """A ClassFolder for every class folder of the tree at `root` (below it, or below each split folder of a
    pre-split tree), in no particular order."""
    for split, top in tree_roots(root):
        for name, folder in list_level(top)[0]:
            yield ClassFolder(name, folder, split)


def list_root_files(root: str):
    """A SkippedFile (at_root) for every file directly in `root`, or in a split folder of a pre-split tree:
    it has no class folder, so no class."""
    tops = [root.rstrip("/")]
    try:
        roots = tree_roots(root)
    except MixedTreeError:
        roots = []  # said by list_class_folders
    tops += [folder for split, folder in roots if split is not None]
    for top in tops:
        for name in list_level(top)[1]:
            yield SkippedFile(
                f"{top}/{name}" if top.startswith(_GCS_PREFIX) else os.path.join(top, name),
                extension_of(name),
                at_root=True,
            )


@dataclasses.dataclass(frozen=True)
class ListingRange:
    """The files of one class folder whose names (below the folder) sort in [start, end); None: unbounded.
    A folder's ranges, end to end, hold every file once, whatever the boundaries."""

    label: str
    folder: str
    start: str | None = None
    end: str | None = None
    split: str | None = None  # the split folder's, in a pre-split tree

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
# Requests the GCS planning may send (each a page of up to 1,000 names): a few hundred for a 5M-file
# folder (benchmarks/RESULTS.md), once per large folder.
_MAX_PLANNING_REQUESTS = 2048
# Names sampled from a large local folder to place its range boundaries.
_LOCAL_SAMPLE_NAMES = 1024


def plan_listing_ranges(class_folder: tuple[str, str], split_above: int = SPLIT_LISTING_ABOVE, ranges=None):
    """The ListingRanges of one class folder: one for a folder of up to `split_above` files, else several of
    similar numbers of names (on GCS from counting pages by prefix: listing_plan.py)."""
    label, folder, split = ClassFolder(*class_folder)
    if folder.startswith(_GCS_PREFIX):
        listing, _, _ = _list_gcs_level(folder, page_size=min(split_above + 1, 1000))
        if sum(1 for _ in zip(range(split_above + 1), listing, strict=False)) <= split_above:
            yield ListingRange(label, folder, split=split)
            return
        boundaries = plan_boundaries(
            functools.partial(_gcs_page, folder),
            ranges or GCS_LISTING_RANGES,
            page=min(split_above, 1000),
            max_requests=_MAX_PLANNING_REQUESTS,
        )
    else:
        boundaries = _sampled_boundaries(folder, split_above, ranges or LOCAL_LISTING_RANGES)
    starts = [None, *sorted(set(boundaries) - {""})]
    for start, end in zip(starts, [*starts[1:], None], strict=True):
        yield ListingRange(label, folder, start, end, split)


def _gcs_page(folder: str, start: str, end: str | None, limit: int) -> tuple[list[str], bool]:
    """(up to `limit` names below `folder` in [start, end), whether more follow): one request."""
    listing, prefix, _ = _list_gcs_level(folder, start=start or None, end=end, page_size=limit)
    page = next(listing.pages, None)
    names = [blob.name[len(prefix) :] for blob in page] if page is not None else []
    return names[:limit], listing.next_page_token is not None


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


def _file_item(uri: str, name: str, label: str, size, md5: str | None = None, split: str | None = None):
    """The InputRecord of an image file of a class, or the SkippedFile of any other file."""
    if is_image_name(name):
        return InputRecord(uri=uri, label=label, split=split, size=size, md5=md5)
    return SkippedFile(uri, extension_of(name))


def _blob_item(bucket: str, blob, name: str, label: str, split: str | None):
    """_file_item of a listed GCS object (its size and MD5 from the listing)."""
    return _file_item(
        f"{_GCS_PREFIX}{bucket}/{blob.name}", name, label, blob.size, md5_hex(blob.md5_hash), split
    )


def _local_items(paths, label: str, split: str | None):
    """_file_item of each (path, name) of local files, stat'ed (through a link to a file: the file's)."""
    for path, name in paths:
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            continue  # a dangling link, as Beam's local match skipped it; or a file gone since
        yield _file_item(path, name, label, size, split=split)


def _list_gcs_subtree(folder_prefix: str, bucket: str, label: str, split: str | None = None):
    """Every file below gs://bucket/folder_prefix, at any depth (one listing without a delimiter)."""
    # Beam's own GCS client, built from the job's options (credentials, the emulator in tests), per thread.
    listing = filesystem.gcs_io(f"{_GCS_PREFIX}{bucket}").client.list_blobs(
        bucket, prefix=folder_prefix, fields="items(name,size,md5Hash),nextPageToken"
    )
    for blob in listing:
        relative = blob.name[len(folder_prefix) :]
        # A name ending in "/" is a folder's placeholder object; a hidden folder's files are passed over.
        if relative and not relative.endswith("/") and all(map(is_input_name, relative.split("/"))):
            yield _blob_item(bucket, blob, relative, label, split)


def _list_local_subtree(folder: str, label: str, split: str | None = None):
    """Every file below a local sub-folder of a class folder, at any depth, hidden folders left out."""
    files = ((path, name) for path, name in walk_files(folder) if is_input_name(name))
    yield from _local_items(files, label, split)


def list_range(listing_range: ListingRange):
    """The files of a class folder within one name range, streamed: InputRecord (with its size) for each
    image, SkippedFile for any other file; a sub-folder in the range is listed whole, its images in the class."""
    label, folder, split = listing_range.label, listing_range.folder, listing_range.split
    _RANGES_LISTED.inc()
    if folder.startswith(_GCS_PREFIX):
        listing, prefix, bucket = _list_gcs_level(folder, listing_range.start, listing_range.end)
        for blob in listing:
            name = blob.name[len(prefix) :]
            # "" is the folder's own placeholder object. `holds`: GCS bounds the listing already; the
            # check keeps a server that ignores the offsets (the tests' emulator) from listing a file twice.
            if is_input_name(name) and listing_range.holds(name):
                yield _blob_item(bucket, blob, name, label, split)
        for subfolder in sorted(listing.prefixes):  # complete once the items are consumed
            name = subfolder[len(prefix) :].rstrip("/")
            if is_input_name(name) and listing_range.holds(name):
                yield from _list_gcs_subtree(subfolder, bucket, label, split)
        return
    with os.scandir(folder) as entries:
        for entry in entries:
            if not is_input_name(entry.name) or not listing_range.holds(entry.name):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield from _list_local_subtree(entry.path, label, split)
            elif not entry.is_dir():  # a link to a folder is not followed, as os.walk does not
                yield from _local_items([(os.path.join(folder, entry.name), entry.name)], label, split)


def list_class_files(class_folder):
    """InputRecord for every image in one class folder (a ClassFolder or (label, folder)), at any depth
    (as one range), streamed as it is listed."""
    label, folder, split = ClassFolder(*class_folder)
    for item in list_range(ListingRange(label, folder, split=split)):
        if isinstance(item, InputRecord):
            yield item


def list_directory_tree(root: str):
    """Every image of the tree at `root` (list_class_files of each class folder), in one process, streamed."""
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


def read_first_line(path: str) -> str | None:
    """The first line of a manifest file (local or gs://), or None if there is none or it cannot be read."""
    try:
        with FileSystems.open(path, compression_type="uncompressed") as handle:
            return handle.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    except Exception:  # noqa: BLE001 - a missing manifest is reported by the checks and the job
        return None


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
    """Records -> the same records, spread over the workers and with the classes mixed (groups by a hash of
    the URI, each sorted by it), so that a local run's shards do not each hold one class."""

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
    """Input spec -> PCollection of InputRecord (mixed, spread), ErrorRecord ('errors') and SkippedFile
    ('skipped'), listed on the workers. `layout`: a CSV manifest's columns (None: read from its first line)."""

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
