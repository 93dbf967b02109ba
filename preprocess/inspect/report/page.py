"""The report's HTML: one self-contained page; every string from the dataset goes through `figures.escape`."""

import datetime
import posixpath
from importlib import resources

from preprocess.inspect import diff
from preprocess.inspect.report import figures, near_duplicate_groups, thumbnails
from preprocess.inspect.report.figures import escape
from preprocess.inspect.summary import format_bytes, split_fractions

SECTION_TITLES = {
    "splits": "Examples per split",
    "classes": "Examples per class",
    "failures": "Failures by reason",
    "sizes": "Source image sizes",
    "sheet": "Contact sheet",
    "groups": "Near-duplicate groups",
    "changes": "Changes between versions",
}


def _section(key: str, body: str) -> str:
    return f'<section id="{key}"><h2>{escape(SECTION_TITLES[key])}</h2>{body}</section>'


def _missing(key: str, text: str) -> str:
    """A section that has nothing to show, saying why (`text` is HTML)."""
    return _section(key, f'<p class="missing">{text}</p>')


def _img(data_uri: str, uri: str) -> str:
    return f'<img src="{data_uri}" alt="{escape(uri)}" title="{escape(uri)}">'


def _header(data) -> str:
    manifest = data.manifest
    image = manifest["image"]
    run = (manifest.get("run") or {}).get("id")
    lines = [f"<p>{escape(data.data_dir)}</p>"]
    facts = [f"written {manifest['created_at']}"] if manifest.get("created_at") else []
    facts += [f"run {run}"] if run else []
    facts += [f"source {manifest['source']['input']}"] if (manifest.get("source") or {}).get("input") else []
    if facts:
        lines.append(f"<p>{escape(' · '.join(facts))}</p>")
    lines.append(
        f"<p>{escape(image['height'])}×{escape(image['width'])}×{escape(image['channels'])} "
        f"{escape(image['encoding'])}, resize {escape(image['resize_method'])}, "
        f"{len(manifest['labels'])} classes</p>"
    )
    return f"<header><h1>Dataset report</h1>{''.join(lines)}</header>"


def _overview(data) -> str:
    inputs = data.manifest["inputs"]
    items = [
        ("found", inputs.get("num_found", 0)),
        ("written", inputs.get("num_written", 0)),
        ("failed", inputs.get("num_failed", 0)),
        ("exact duplicates", inputs.get("num_duplicates", 0)),
    ]
    summary = data.groups.summary
    if data.groups.recorded and summary.get("mode") not in (None, "off"):
        items.append(("near-duplicate groups", summary.get("groups", data.groups.total_groups)))
        items.append(("groups with several labels", summary.get("groups_with_several_labels", 0)))
    facts = "".join(f"<li><b>{int(value):,}</b>{escape(name)}</li>" for name, value in items)
    return f'<section id="overview"><ul class="facts">{facts}</ul></section>'


def _failures(data) -> str:
    counts = data.manifest["inputs"].get("failures_by_reason") or {}
    if not counts:
        return _missing("failures", "No input failed.")
    rows = sorted(counts.items(), key=lambda item: (-int(item[1]), item[0]))
    parts = [
        figures.bar_table([(reason, int(count)) for reason, count in rows], "failures", ("reason", "inputs"))
    ]
    for reason, count in rows:
        examples = data.failures.examples.get(reason, [])
        if not examples:
            continue
        more = f" (first {len(examples)} of {int(count):,})" if int(count) > len(examples) else ""
        items = "".join(
            f'<li><span class="uri">{escape(example.uri)}</span>'
            + (f'<span class="detail">{escape(example.detail)}</span>' if example.detail else "")
            + "</li>"
            for example in examples
        )
        parts.append(f'<h3>{escape(reason)}{escape(more)}</h3><ul class="examples">{items}</ul>')
    parts += [f'<p class="note">{escape(note)}</p>' for note in data.failures.notes]
    return _section("failures", "".join(parts))


def _sizes(data) -> str:
    sizes = data.manifest.get("source_image_sizes")
    if not isinstance(sizes, dict):
        return _missing("sizes", "Not recorded by this dataset's stage 1 run.")
    return _section("sizes", figures.source_size_histogram(sizes))


def _sheet(data) -> str:
    """The contact sheet: a row per sampled class, in label order."""
    if not data.sample.examples:
        return _missing("sheet", f"Split {escape(data.split)} has no examples to show.")
    counts = data.manifest["splits"].get(data.split, {}).get("num_examples_per_class", {})
    rows = []
    for label, examples in sorted(data.sample.examples.items()):
        name = data.manifest["labels"][label]
        images = (
            "".join(
                _img(thumbnails.pixels_thumbnail(example.pixels).data_uri, example.uri)
                for example in examples
            )
            or '<span class="missing">none in this split</span>'
        )
        rows.append(
            f'<div class="sheet-row"><div class="sheet-label"><span class="label-id">{label}</span> '
            f"{escape(name)}<small>{int(counts.get(name, 0)):,} in {escape(data.split)}</small></div>"
            f'<div class="thumbs">{images}</div></div>'
        )
    intro = (
        f'<p class="note">Split {escape(data.split)}, as training sees it (decoded from the shards, '
        f"de-normalized). Read {data.sample.num_records:,} records ({escape(format_bytes(data.sample.num_bytes))})."
        "</p>"
    )
    notes = "".join(f'<p class="note">{escape(note)}</p>' for note in data.sample.warnings)
    return _section("sheet", intro + "".join(rows) + notes)


def _member(member, thumbnail) -> str:
    if thumbnail.data_uri:
        picture = _img(thumbnail.data_uri, member.uri)
    else:
        picture = (
            f'<div class="placeholder" title="{escape(thumbnail.problem)}">{escape(thumbnail.problem)}</div>'
        )
    kept = "" if member.kept else ' <span class="badge">dropped</span>'
    return (
        f'<figure class="{"" if member.kept else "dropped"}">{picture}<figcaption><b>{escape(member.label)}</b>'
        f" · {escape(member.split)}{kept}"
        f'<span class="name uri" title="{escape(member.uri)}">{escape(posixpath.basename(member.uri))}</span>'
        f'<span class="uri" title="{escape(member.uri)}">{escape(posixpath.dirname(member.uri))}</span>'
        "</figcaption></figure>"
    )


def _group(group, group_thumbnails) -> str:
    distance = "?" if group.max_distance is None else str(group.max_distance)
    badges = f'<span class="badge">largest distance {escape(distance)}</span>'
    badges += f'<span class="badge">{group.num_members} images</span>'
    if len(group.splits) > 1:
        badges += f'<span class="badge">splits {escape(", ".join(group.splits))}</span>'
    if group.several_labels:
        badges += (
            '<span class="badge bad">likely label error: labels '
            + escape(", ".join(sorted(group.labels)))
            + "</span>"
        )
    members = "".join(
        _member(member, thumb) for member, thumb in zip(group.members, group_thumbnails, strict=True)
    )
    more = group.num_members - len(group.members)
    if more > 0:
        members += f'<p class="note">and {more:,} more members</p>'
    kind = "group label-error" if group.several_labels else "group"
    return (
        f'<div class="{kind}"><div class="group-head">group <span class="uri" title="{escape(group.group)}">'
        f"{escape(group.group[:12])}…</span>"
        f'{badges}</div><div class="members">{members}</div></div>'
    )


def _groups(data) -> str:
    selection = data.groups
    if not selection.recorded:
        return _missing(
            "groups",
            "Not recorded by this dataset's stage 1 run (written before the near-duplicate audit existed).",
        )
    if selection.summary.get("mode") == "off":
        return _missing("groups", "The audit was off for this run (--near-duplicates off).")
    summary = selection.summary
    facts = [
        f"mode {summary.get('mode', '?')}",
        f"distance ≤ {summary.get('max_distance', '?')}",
        f"{summary.get('groups', selection.total_groups)} groups",
        f"{summary.get('images_in_groups', '?')} images in groups",
        f"the largest {summary.get('largest_group', '?')}",
        f"{summary.get('split_changes', 0)} moved between splits",
        f"{summary.get('groups_with_several_labels', 0)} with more than one label",
        f"{summary.get('groups_across_splits', 0)} across splits",
    ]
    if summary.get("oversized_groups"):
        facts.append(f"{summary['oversized_groups']} over the size limit (no one moved)")
    if summary.get("mode") == "drop":
        facts.append(f"{summary.get('dropped', 0)} dropped")
    if summary.get("hot_buckets"):
        facts.append(
            f"{summary['hot_buckets']} hot buckets ({summary.get('hot_bucket_entries', 0)} entries) not compared"
        )
    parts = [f"<p>{escape(', '.join(str(fact) for fact in facts))}.</p>"]
    if summary.get("changes_withheld"):
        parts.append(
            '<p class="warning">'
            + escape(
                f"Not applied: the audit would have moved {summary.get('would_move', 0)} of "
                f"{summary.get('images', 0)} images to another split, over --near-duplicate-max-moved "
                f"{summary.get('max_moved', 0):g}. No image was moved or dropped."
            )
            + "</p>"
        )
    fractions = split_fractions(data.manifest, summary)
    if fractions:
        parts.append(f"<p>{escape('Splits written: ' + fractions)}.</p>")
    if not selection.groups:
        parts.append('<p class="missing">No near-duplicate group.</p>')
    else:
        parts.append(
            f'<p class="note">Showing {len(selection.groups)} of {selection.total_groups:,} groups'
            + (
                f" ({selection.left_out:,} left out; raise --max-groups to see more)"
                if selection.left_out
                else ""
            )
            + ", those with more than one label first. Thumbnails are the source files, read "
            f"{data.source_budget.num_read:,} files ({escape(format_bytes(data.source_budget.bytes_read))}).</p>"
        )
        parts.append(
            '<div class="group-grid">'
            + "".join(
                _group(group, thumbs)
                for group, thumbs in zip(selection.groups, data.group_thumbnails, strict=True)
            )
            + "</div>"
        )
    parts += [f'<p class="note">{escape(note)}</p>' for note in selection.notes]
    parts += [_distance_histogram(summary), _near_misses(data), _low_information(summary)]
    return _section("groups", "".join(parts))


def _distance_histogram(summary: dict) -> str:
    """The grey distances of the pairs the buckets compared, the threshold marked."""
    counts = summary.get("distance_histogram")
    if not counts:
        return ""
    threshold = summary.get("max_distance", -1)
    rows = [(f"{distance} bits", count) for distance, count in enumerate(counts)]
    table = figures.bar_table(
        rows,
        head=("grey distance", "pairs"),
        kind_of=lambda label: "within" if int(label.split()[0]) <= threshold else "beyond",
    )
    # The last row within the distance is underlined: the threshold.
    table = table.replace(
        f'<tr><th scope="row">{threshold} bits</th>',
        f'<tr class="threshold"><th scope="row">{threshold} bits</th>',
        1,
    )
    return (
        "<h3>Distances of the pairs compared</h3>"
        f'<p class="note">Grey-hash distance of every pair of images that shared a signature bucket (a pair '
        f"sharing several counts in each). Red: within the distance ({threshold} bits, the line), where the "
        "colour and thumbnail checks decide; grey: beyond it.</p>" + table
    )


def _near_misses(data) -> str:
    """The pairs that passed every check but were just over the distance, with thumbnails."""
    pairs = (data.groups.summary or {}).get("near_misses") or []
    if not pairs:
        return ""
    rows = []
    for pair, thumbs in zip(pairs, data.near_miss_thumbnails, strict=False):
        members = "".join(
            _member(near_duplicate_groups.Member(uri, label, split, True), thumb)
            for uri, label, split, thumb in zip(
                pair["uris"], pair["labels"], pair["splits"], thumbs, strict=True
            )
        )
        rows.append(
            f'<div class="group"><div class="group-head">distance {escape(pair["distance"])}</div>'
            f'<div class="members">{members}</div></div>'
        )
    return (
        "<h3>Near misses</h3>"
        f'<p class="note">The {len(pairs)} closest pairs that pass the colour and thumbnail checks but are up to '
        "3 bits over the distance: not grouped. If they are copies, raise --near-duplicate-distance.</p>"
        f'<div class="group-grid">{"".join(rows)}</div>'
    )


def _low_information(summary: dict) -> str:
    counts = summary.get("low_information_by_split")
    if not counts:
        return ""
    return (
        "<h3>Near-blank and tiny images</h3>"
        '<p class="note">Images with little to compare (near-uniform, or a side under 24 px): grouped only '
        "when their pixels are near-equal, by split.</p>" + figures.split_bars(counts, ("split", "images"))
    )


def _changes(data) -> str:
    """What changed between two versions (`inspect --diff`'s counts and files); "" for a directory with one."""
    changes = data.changes
    if changes is None:
        return _missing("changes", escape(data.changes_note)) if data.changes_note else ""
    intro = (
        f'<p class="note">From {escape(changes.old.describe())} to {escape(changes.new.describe())}: '
        f"{changes.old_images:,} → {changes.new_images:,} images, {changes.in_both:,} in both. An image is the "
        "same image when its source file's sha256 is.</p>"
    )
    counts = "".join(
        f"<li><b>{getattr(changes, attribute).count:,}</b>{escape(title)}</li>"
        for title, attribute, _ in diff.CATEGORIES
    )
    parts = [intro, f'<ul class="facts">{counts}</ul>']
    for title, attribute, what in diff.CATEGORIES:
        category = getattr(changes, attribute)
        if not category.count:
            continue
        items = "".join(
            f'<li><span class="uri">{escape(change.uri)}</span> {escape(what(change))}</li>'
            for change in category.first
        )
        more = category.count - len(category.first)
        parts.append(
            f'<h3 id="changes-{attribute}">{escape(title.capitalize())} ({category.count:,})</h3>'
            f'<ul class="examples">{items}</ul>'
            + (f'<p class="note">… and {more:,} more (--limit).</p>' if more else "")
        )
    return _section("changes", "".join(parts))


def render(data) -> str:
    """The page for a `build.ReportData`."""
    shown = [
        key for key in SECTION_TITLES if key != "changes" or data.changes is not None or data.changes_note
    ]
    nav = "".join(f'<a href="#{key}">{escape(SECTION_TITLES[key])}</a>' for key in shown)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    # A file of this package: setup.py's package_data puts it in the wheel and the sdist.
    css = resources.files(__package__).joinpath("report.css").read_text(encoding="utf-8")
    examples_per_split = {split: info["num_examples"] for split, info in data.manifest["splits"].items()}
    body = "".join(
        [
            _overview(data),
            _section("splits", figures.split_bars(examples_per_split, ("split", "examples"))),
            _section("classes", figures.examples_per_class(data.manifest)),
            _failures(data),
            _sizes(data),
            _sheet(data),
            _groups(data),
            _changes(data),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Dataset report: {escape(data.data_dir)}</title><style>{css}</style></head><body>"
        f"{_header(data)}<nav>{nav}</nav><main>{body}</main>"
        f"<footer>Written {escape(now)} by python -m preprocess.inspect --report.</footer></body></html>\n"
    )
