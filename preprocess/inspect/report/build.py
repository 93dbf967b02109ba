"""Gather what the report shows and write the page (local path or gs://)."""

import dataclasses
import posixpath

import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.inspect.report import near_duplicate_groups, page, thumbnails


@dataclasses.dataclass(frozen=True)
class SheetCell:
    uri: str
    thumbnail: thumbnails.Thumbnail


@dataclasses.dataclass(frozen=True)
class SheetRow:
    label: int
    class_name: str
    num_in_split: int
    cells: list[SheetCell]


@dataclasses.dataclass
class ReportData:
    """Everything the page shows; `page.render` turns it into HTML."""

    data_dir: str
    manifest: dict
    split: str
    sheet_rows: list[SheetRow]
    sheet_notes: list[str]
    records_read: int
    record_bytes_read: int
    failures: errors.ErrorLogSample
    groups: near_duplicate_groups.GroupSelection
    group_thumbnails: list[list[thumbnails.Thumbnail]]  # parallel to groups.groups and their members
    source_budget: thumbnails.ReadBudget
    # Parallel to the manifest's near_duplicates.near_misses and their two members.
    near_miss_thumbnails: list[list[thumbnails.Thumbnail]] = dataclasses.field(default_factory=list)


def sheet_rows(manifest: dict, split: str, sample) -> list[SheetRow]:
    """The contact sheet's rows from an `inspect.Sample`: one per sampled class, in label order."""
    counts = manifest["splits"].get(split, {}).get("num_examples_per_class", {})
    rows = []
    for label, examples in sorted(sample.examples.items()):
        name = manifest["labels"][label]
        cells = [SheetCell(example.uri, thumbnails.pixels_thumbnail(example.pixels)) for example in examples]
        rows.append(SheetRow(label, name, int(counts.get(name, 0)), cells))
    return rows


def gather(
    data_dir: str, manifest: dict, split: str, sample, max_groups: int, max_read_bytes: int
) -> ReportData:
    """Read what the page needs (see the module docstring for the bounds)."""
    groups = near_duplicate_groups.select_groups(data_dir, manifest, max_groups)
    budget = thumbnails.ReadBudget(remaining=max_read_bytes)
    group_thumbnails = [
        [thumbnails.source_thumbnail(member.uri, budget) for member in group.members]
        for group in groups.groups
    ]
    near_miss_thumbnails = [
        [thumbnails.source_thumbnail(uri, budget) for uri in pair.get("uris", [])[:2]]
        for pair in (groups.summary.get("near_misses") or [])
    ]
    return ReportData(
        data_dir=data_dir,
        manifest=manifest,
        split=split,
        sheet_rows=sheet_rows(manifest, split, sample) if sample is not None else [],
        sheet_notes=list(sample.warnings) if sample is not None else [],
        records_read=sample.num_records if sample is not None else 0,
        record_bytes_read=sample.num_bytes if sample is not None else 0,
        failures=errors.read_error_log(
            [manifest_lib.join(data_dir, relative) for relative in manifest_lib.error_file_paths(manifest)],
            per_reason=5,
            wanted=manifest["inputs"].get("failures_by_reason") or {},
            max_bytes=16 << 20,
        ),
        groups=groups,
        group_thumbnails=group_thumbnails,
        source_budget=budget,
        near_miss_thumbnails=near_miss_thumbnails,
    )


def write_text(path: str, text: str):
    """Write a UTF-8 file to a local path or gs://, making its directory."""
    parent = posixpath.dirname(path)
    if parent and not tf.io.gfile.exists(parent):
        tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(path, "wb") as handle:
        handle.write(text.encode("utf-8"))


def write_report(
    data_dir: str, manifest: dict, out: str, split: str, sample, max_groups: int, max_read_bytes: int
) -> ReportData:
    """Gather, render and write the page to `out`; returns what it shows."""
    data = gather(data_dir, manifest, split, sample, max_groups, max_read_bytes)
    write_text(out, page.render(data))
    return data
