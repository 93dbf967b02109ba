"""The near-duplicate groups a report shows (several-label ones first), read within a byte budget from the
files the manifest's `near_duplicate_files` lists (docs/dataset_format.md)."""

import dataclasses
import json

import tensorflow as tf

from dataset_contract import manifest as manifest_lib

# A group of thousands of near-blank images shows this many members and says how many more it has.
MAX_MEMBERS_SHOWN = 12


@dataclasses.dataclass(frozen=True)
class Member:
    uri: str
    label: str
    split: str
    kept: bool


@dataclasses.dataclass(frozen=True)
class Group:
    group: str
    max_distance: int | None
    members: tuple[Member, ...]  # at most MAX_MEMBERS_SHOWN
    num_members: int
    labels: tuple[str, ...]  # every distinct label of the group, in member order

    @property
    def several_labels(self) -> bool:
        return len(self.labels) > 1

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(member.split for member in self.members))


@dataclasses.dataclass
class GroupSelection:
    """What the manifest says about near-duplicates, and the groups picked to show."""

    recorded: bool  # False: the dataset was written before stage 1 audited near-duplicates
    summary: dict = dataclasses.field(default_factory=dict)  # the manifest's `near_duplicates`
    groups: list[Group] = dataclasses.field(default_factory=list)
    total_groups: int = 0
    bytes_read: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def left_out(self) -> int:
        return max(0, self.total_groups - len(self.groups))


def parse_group(line: str) -> Group:
    """One line of a near-duplicate file -> a Group; ValueError if it is not one."""
    try:
        record = json.loads(line)
        uris, labels, splits = record["uris"], record["labels"], record["splits"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a near-duplicate group ({exc})") from None
    if not (isinstance(uris, list) and len(uris) == len(labels) == len(splits)):
        raise ValueError("uris, labels and splits are not parallel lists")
    kept = record.get("kept")
    if not (isinstance(kept, list) and len(kept) == len(uris)):
        kept = [True] * len(uris)
    members = tuple(
        Member(str(uri), str(label), str(split), bool(keep))
        for uri, label, split, keep in zip(uris, labels, splits, kept, strict=True)
    )
    distance = record.get("max_distance")
    return Group(
        group=str(record.get("group", "")),
        max_distance=distance if isinstance(distance, int) else None,
        members=members[:MAX_MEMBERS_SHOWN],
        num_members=len(members),
        labels=tuple(dict.fromkeys(str(label) for label in labels)),
    )


def select_groups(
    data_dir: str, manifest: dict, max_groups: int, max_bytes: int = 64 << 20
) -> GroupSelection:
    """At most `max_groups` groups, several-label ones first, in file order within each kind."""
    if "near_duplicates" not in manifest:
        return GroupSelection(recorded=False)
    files = manifest.get("near_duplicate_files") or []
    selection = GroupSelection(
        recorded=True,
        summary=dict(manifest["near_duplicates"] or {}),
        total_groups=sum(int(entry.get("num_groups", 0)) for entry in files)
        or int((manifest["near_duplicates"] or {}).get("groups", 0)),
    )
    several, others = [], []
    for entry in files:
        relative = entry.get("path")
        problem = manifest_lib.relative_path_problem(relative)
        if problem:
            selection.notes.append(f"near_duplicate_files entry {relative!r} skipped: {problem}")
            continue
        path = manifest_lib.join(data_dir, relative)
        if not tf.io.gfile.exists(path):
            selection.notes.append(f"near-duplicate file {path} is missing")
            continue
        with tf.io.gfile.GFile(path, "r") as handle:
            for number, line in enumerate(handle, 1):
                selection.bytes_read += len(line)
                if not line.strip():
                    continue
                try:
                    group = parse_group(line)
                except ValueError as exc:
                    selection.notes.append(f"{path} line {number}: {exc}")
                    continue
                kind = several if group.several_labels else others
                if len(kind) < max_groups:
                    kind.append(group)
                if len(several) >= max_groups:
                    break  # nothing later would be shown before these
                if selection.bytes_read >= max_bytes:
                    selection.notes.append(
                        f"read the first {max_bytes >> 20} MB of the near-duplicate files; "
                        "later groups are not considered"
                    )
                    break
        if len(several) >= max_groups or selection.bytes_read >= max_bytes:
            break

    # Likely label errors first; then the largest groups, then the borderline (largest distance) ones.
    def order(group):
        return (-group.num_members, -(group.max_distance or 0))

    selection.groups = (sorted(several, key=order) + sorted(others, key=order))[:max_groups]
    return selection
