"""Gather what the report shows (`page.render` makes the page of it)."""

import dataclasses

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.inspect import diff
from preprocess.inspect.report import near_duplicate_groups, thumbnails
from preprocess.inspect.summary import format_bytes


@dataclasses.dataclass
class ReportData:
    """Everything the page shows; `page.render` turns it into HTML."""

    data_dir: str
    manifest: dict
    split: str
    sample: object  # contact_sheet.Sample: the sheet's examples by label, what their records cost, its notes
    failures: errors.ErrorLogSample
    groups: near_duplicate_groups.GroupSelection
    group_thumbnails: list[list[thumbnails.Thumbnail]]  # parallel to groups.groups and their members
    source_budget: thumbnails.ReadBudget
    # Parallel to the manifest's near_duplicates.near_misses and their two members.
    near_miss_thumbnails: list[list[thumbnails.Thumbnail]] = dataclasses.field(default_factory=list)
    # What changed between two versions; None with a `changes_note` saying why they were not compared, or
    # with none when the directory holds one version (then the page has no such section).
    changes: diff.VersionDiff | None = None
    changes_note: str = ""


def gather_changes(data_dir: str, max_read_bytes: int, limit: int) -> tuple[diff.VersionDiff | None, str]:
    """(the diff of the newest version against the one before, or None; why not, "" when the directory holds
    one version). Both versions' ledgers (shards, before ledgers) are read only within `max_read_bytes`."""
    try:
        old, new = diff.choose_versions(data_dir)
        ledger_files, shards, cost = diff.read_cost(data_dir, (old, new))
        if cost > max_read_bytes:
            files = diff.describe_files(ledger_files, shards)
            return (
                None,
                f"Not compared: the two versions' {files} are {format_bytes(cost)}, over --max-read-mb. "
                f"`python -m preprocess.inspect {data_dir} --diff` reads them all.",
            )
        return diff.diff_versions(data_dir, old, new, limit), ""
    except diff.DiffRefused:
        return None, ""
    except diff.VersionUnreadable as exc:
        return None, f"Not compared: {exc}"


def gather(
    data_dir: str,
    manifest: dict,
    split: str,
    sample,
    max_groups: int,
    max_read_bytes: int,
    changes: diff.VersionDiff | None = None,
    diff_limit: int = diff.DEFAULT_LIMIT,
) -> ReportData:
    """Read what the page needs, each part within its bound. `changes`: the diff `--diff` computed, else the
    newest version against the one before, within the read budget."""
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
    changes_note = ""
    if changes is None:
        changes, changes_note = gather_changes(data_dir, max_read_bytes, diff_limit)
    return ReportData(
        data_dir=data_dir,
        manifest=manifest,
        split=split,
        sample=sample,
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
        changes=changes,
        changes_note=changes_note,
    )
