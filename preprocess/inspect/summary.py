"""The readable report of a dataset: what was written and what failed."""

import statistics
import sys

from dataset_contract import manifest as manifest_lib
from dataset_contract import verification
from preprocess import errors

# Above this many classes the table shows the smallest ones (where problems
# are) and a one-line distribution of the rest.
_MAX_CLASS_ROWS = 20


def format_bytes(num_bytes: float) -> str:
    """1536 -> '1.5 KB' (powers of 1024)."""
    if num_bytes < 1024:
        return f"{num_bytes:.0f} B"
    for unit in ("KB", "MB", "GB"):
        num_bytes /= 1024
        if num_bytes < 1024:
            return f"{num_bytes:.1f} {unit}"
    return f"{num_bytes / 1024:.1f} TB"


def read_manifest_or_explain(data_dir: str) -> dict | None:
    """The checked manifest of `data_dir`, or None after saying on stderr why it is not a dataset."""
    try:
        return verification.read_manifest(data_dir)
    except manifest_lib.ManifestError as exc:
        print(f"not a dataset: {exc}", file=sys.stderr)
        return None


def read_error_examples(data_dir: str, manifest: dict, per_reason: int = 3) -> dict[str, list[str]]:
    """Up to `per_reason` URIs for each failure reason the manifest counts (errors.read_error_log)."""
    wanted = manifest["inputs"].get("failures_by_reason") or {}
    if not wanted:
        return {}
    paths = [manifest_lib.join(data_dir, relative) for relative in manifest_lib.error_file_paths(manifest)]
    return errors.read_error_log(paths, per_reason, wanted=wanted).uris()


def failure_lines(counts: dict[str, int], examples: dict[str, list[str]], indent: str) -> list[str]:
    """A line per failure reason of `counts`, in its order: the count and the first URIs of `examples`."""
    lines = []
    for reason, count in counts.items():
        shown = examples.get(reason, [])
        more = ", ..." if shown and count > len(shown) else ""
        lines.append(f"{indent}{reason} {count}" + (f": {', '.join(shown)}{more}" if shown else ""))
    return lines


def _class_table(manifest: dict) -> list[str]:
    splits = [split for split in manifest["splits"] if manifest["splits"][split]["num_examples"] > 0]
    labels = manifest["labels"]
    counts = {split: manifest["splits"][split]["num_examples_per_class"] for split in splits}
    first = splits[0] if splits else None
    shown = labels
    if len(labels) > _MAX_CLASS_ROWS and first is not None:
        shown = sorted(labels, key=lambda name: (counts[first].get(name, 0), name))[: _MAX_CLASS_ROWS // 2]
    name_width = max([len("class"), len("total"), *(len(name) for name in shown)])
    widths = [max(len(split), 7) for split in splits]

    def row(name, values) -> str:
        return name.ljust(name_width) + "".join(f"  {v:>{w}}" for v, w in zip(values, widths, strict=True))

    rows = [row("class", splits)]
    rows += [row(name, [counts[split].get(name, 0) for split in splits]) for name in shown]
    if len(shown) < len(labels):
        per_class = [counts[first].get(name, 0) for name in labels]
        rows.append(
            f"... {len(labels) - len(shown)} more classes ({first} per class: min {min(per_class)}, "
            f"median {statistics.median(per_class):g}, max {max(per_class)})"
        )
    rows.append(row("total", [manifest["splits"][split]["num_examples"] for split in splits]))
    return rows


def format_skipped(inputs: dict) -> str | None:
    """'skipped, not inputs: .json 2, .txt 1 (not images); 1 file at the root (no class folder)', or None."""
    by_extension = inputs.get("skipped_by_extension") or {}
    at_root = inputs.get("skipped_at_root") or 0
    parts = []
    if by_extension:
        counts = ", ".join(
            f"{extension or '(no extension)'} {count}"
            for extension, count in sorted(by_extension.items(), key=lambda item: (-item[1], item[0]))
        )
        parts.append(f"{counts} (not images by their extension)")
    if at_root:
        parts.append(f"{at_root} file{'s' if at_root != 1 else ''} at the root (not in a class folder)")
    return f"skipped, not inputs: {'; '.join(parts)}" if parts else None


def plural(count: int, word: str) -> str:
    """'1 group', '2 groups'."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def format_near_duplicates(manifest: dict, output_dir: str = "") -> list[str]:
    """The summary's lines on near-duplicates (preprocess/near_duplicates/): none for a manifest without
    them (written before the audit existed)."""
    near = manifest.get("near_duplicates")
    if not near:
        return []
    mode = near.get("mode")
    if mode == "off":
        return ["  near-duplicates: not looked for (--near-duplicates off)"]
    groups = near.get("groups", 0)
    head = f"  near-duplicates ({mode}, distance <= {near.get('max_distance')}): "
    if not groups:
        return [head + "none found"]
    head += (
        f"{plural(groups, 'group')}, {near.get('images_in_groups', 0)} images in them, the largest "
        f"{near.get('largest_group', 0)}"
    )
    if near.get("changes_withheld"):
        return [
            head,
            f"    NOT APPLIED: the audit would have moved {near.get('would_move', 0)} of "
            f"{near.get('images', 0)} images to another split, over --near-duplicate-max-moved "
            f"{near.get('max_moved', 0):g}: so many are more likely similar images than copies. No image was "
            "moved or dropped: every image is in the split it had before the audit. Look at the groups, then lower "
            "--near-duplicate-distance, or raise --near-duplicate-max-moved if they are copies.",
            *_split_fraction_lines(manifest, near),
            *_group_file_lines(manifest, output_dir),
        ]
    across = near.get("groups_across_splits", 0)
    oversized = near.get("oversized_groups", 0)
    where = (
        "each group is in one split"
        if not across and not oversized
        else f"{plural(across + oversized, 'group')} across splits"
    )
    lines = [f"{head}; {near.get('split_changes', 0)} moved between splits; {where}"]
    several = near.get("groups_with_several_labels", 0)
    if several:
        lines.append(
            f"    {plural(several, 'group')} with more than one label: likely label errors, look at them"
        )
    if across:
        lines.append(
            f"    {plural(across, 'group')} across splits: members named by the input (a manifest's split "
            "column, a pre-split tree's folders) or published (the previous version) in different splits; "
            "no one was moved"
        )
    if oversized:
        lines.append(
            f"    {plural(oversized, 'group')} larger than --near-duplicate-max-group "
            f"({near.get('images_in_oversized_groups', 0)} images): more likely similar images than copies; "
            "listed, no one was moved"
        )
    if mode == "drop":
        lines.append(
            f"    dropped: {near.get('dropped', 0)} (all but one image of each group: the majority label's, "
            "then a named split's, then the largest)"
        )
        whole = near.get("groups_kept_whole", 0)
        published = near.get("groups_kept_whole_published", 0)
        if whole and not published:
            lines.append(f"    kept whole: {plural(whole, 'group')} whose labels have no majority")
        elif whole:
            # An incremental run's: a carried (published) image is never dropped, so its group stays whole.
            lines.append(
                f"    kept whole: {plural(whole, 'group')}: {whole - published} whose labels have no majority, "
                f"{published} because they hold an image carried over from the published version (never "
                "dropped) whose label its new copies outvote"
            )
    hot = near.get("hot_buckets", 0)
    if hot:
        lines.append(
            f"    hot buckets: {hot} ({near.get('hot_bucket_entries', 0)} entries share a popular signature "
            "band, e.g. near-blank images; not compared there, still compared through their other bands)"
        )
    too_large = near.get("components_too_large", 0)
    if too_large:
        lines.append(
            f"    left alone: {near.get('images_in_components_too_large', 0)} images in "
            f"{plural(too_large, 'cluster')} of similar images too large to cut into groups"
        )
    return lines + _split_fraction_lines(manifest, near) + _group_file_lines(manifest, output_dir)


def split_fractions(manifest: dict, near: dict) -> str:
    """'train 80.1% (asked 80%), ...': the realised split fractions beside the requested ones ('' for a
    manifest without them); the summary's and the report's."""
    requested = manifest.get("split_fractions") or {}
    return ", ".join(
        f"{split} {100 * share:.1f}%"
        + (f" (asked {100 * requested[split]:g}%)" if split in requested else "")
        for split, share in (near.get("realised_split_fractions") or {}).items()
    )


def _split_fraction_lines(manifest: dict, near: dict) -> list[str]:
    fractions = split_fractions(manifest, near)
    return [f"    splits written: {fractions}"] if fractions else []


def _group_file_lines(manifest: dict, output_dir: str) -> list[str]:
    files = [manifest_lib.join(output_dir, path) for path in manifest_lib.near_duplicate_file_paths(manifest)]
    if not files:
        return []
    where = files[0] if len(files) == 1 else f"{len(files)} files, listed in near_duplicate_files"
    # The groups are judged by eye: the page shows each one's members side by side.
    return [
        f"    groups, one JSON line each: {where}",
        f"    see them: python -m preprocess.inspect {output_dir or 'DIR'} --report report.html",
    ]


def _crop_note(image: dict) -> str:
    crop = manifest_lib.crop_size(image)
    if crop == image["height"]:
        return ""
    return f"; training crops {crop}x{crop} (margin {image.get('crop_margin', 0):g}), center crop to serve"


def format_reuse(manifest: dict) -> list[str]:
    """What the run decoded and what it carried over from the version it was built from (issue 32), and the
    published images a named split moved; nothing for a manifest written before incremental versions."""
    inputs, run = manifest["inputs"], manifest.get("run") or {}
    if "num_decoded" not in inputs:
        return []
    built_from = run.get("built_from")
    if not built_from:
        how = "the first version of this directory"
    elif run.get("full_rebuild"):
        how = f"full rebuild after run {built_from}: {run['full_rebuild']}"
    else:
        how = f"carried over from run {built_from}, neither read nor decoded"
    lines = [f"  {inputs['num_decoded']} decoded + {inputs.get('num_reused', 0)} reused ({how})"]
    moved, named_moves = inputs.get("num_moved_by_named_split", 0), inputs.get("moved_by_named_split", [])
    if moved:
        named = ", ".join(f"{move['uri']} ({move['from']} -> {move['to']})" for move in named_moves)
        more = f" and {moved - len(named_moves)} more" if moved > len(named_moves) else ""
        lines.append(f"  {moved} published images moved to the split their input names: {named}{more}")
    return lines


def format_summary(
    manifest: dict, output_dir: str, error_examples: dict[str, list[str]] | None = None
) -> str:
    """The report of a dataset directory; `error_examples` from `read_error_examples`."""
    inputs = manifest["inputs"]
    image = manifest["image"]
    normalization = manifest["normalization"]
    source = manifest.get("source", {})
    origin = [f"from {source['input']}"] if source.get("input") else []
    origin += [f"written {manifest['created_at']}"] if manifest.get("created_at") else []
    origin += [f"run {manifest['run']['id']}"] if (manifest.get("run") or {}).get("id") else []
    lines = [
        f"Dataset {output_dir}" + (f" ({', '.join(origin)})" if origin else ""),
        f"  images: {inputs['num_found']} found = {inputs['num_written']} written"
        f" + {inputs['num_failed']} failed + {inputs['num_duplicates']} duplicates"
        + (
            f" + {inputs['num_near_duplicates']} near-duplicates dropped"
            if inputs.get("num_near_duplicates")
            else ""
        ),
    ]
    lines += format_reuse(manifest)
    skipped = format_skipped(inputs)
    lines += [f"  {skipped}"] if skipped else []
    lines += [
        f"  image: {image['height']}x{image['width']}x{image['channels']} {image['encoding']}"
        + (f" (quality {image['jpeg_quality']})" if image.get("jpeg_quality") else "")
        + f", resize {image['resize_method']}"
        + _crop_note(image),
        f"  normalization ({normalization.get('computed_on', manifest_lib.TRAIN)}):"
        f" mean {[round(v, 2) for v in normalization['mean']]}"
        f" std {[round(v, 2) for v in normalization['std']]}",
        f"  classes: {len(manifest['labels'])}",
    ]
    lines += [f"    {row}" for row in _class_table(manifest)]
    lines.append("  shards:")
    sizes = {
        split: [shard["num_bytes"] for shard in info["shards"]] for split, info in manifest["splits"].items()
    }
    lines += [
        f"    {split}: {len(of)} shards, {format_bytes(sum(of))} ({format_bytes(min(of))} - {format_bytes(max(of))} each)"
        if of
        else f"    {split}: none"
        for split, of in sizes.items()
    ]
    every = [size for of in sizes.values() for size in of]
    lines.append(f"  total size: {format_bytes(sum(every))} in {len(every)} shards")
    if inputs.get("failures_by_reason"):
        lines.append(
            f"  failures by reason (details: {manifest_lib.describe_error_files(manifest, output_dir)}):"
        )
        lines += failure_lines(inputs["failures_by_reason"], error_examples or {}, "    ")
    lines += format_near_duplicates(manifest, output_dir)
    # The runs this one superseded whose files stay for their readers (preprocess/publish/commit.py).
    for entry in manifest.get("retained_runs", []):
        lines.append(
            f"  kept for its readers: run {entry['id']} ({entry['dir']}), superseded {entry['superseded_at']}"
        )
    lines.append(f"  manifest: {manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)}")
    return "\n".join(lines)
