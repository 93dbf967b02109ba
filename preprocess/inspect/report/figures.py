"""The report's figures as HTML: horizontal CSS bars, scaled to the largest value of their figure; every
text from the dataset is escaped here."""

import html

from dataset_contract import manifest as manifest_lib

# Above this many classes the per-class figure shows the smallest and the largest ones.
MAX_CLASS_ROWS = 60


def escape(text) -> str:
    return html.escape(str(text), quote=True)


def bar(value: float, maximum: float, kind: str = "") -> str:
    """One bar, its length `value / maximum` of the column (a non-zero value gets at least a sliver)."""
    share = 0.0 if maximum <= 0 else 100.0 * value / maximum
    if value > 0:
        share = max(share, 0.5)
    return f'<span class="bar {escape(kind)}"><span style="width:{share:.2f}%"></span></span>'


def bar_table(
    rows: list[tuple[str, int]], kind: str = "", head: tuple[str, str] = ("", "count"), kind_of=None
) -> str:
    """A table of (label, count) rows, each with a bar (coloured by `kind`, or by `kind_of(label)`)."""
    maximum = max([value for _, value in rows] or [0])
    body = "".join(
        f'<tr><th scope="row">{escape(label)}</th><td class="num">{value:,}</td>'
        f'<td class="barcell">{bar(value, maximum, kind_of(label) if kind_of else kind)}</td></tr>'
        for label, value in rows
    )
    return (
        f'<table class="bars"><thead><tr><th>{escape(head[0])}</th><th class="num">{escape(head[1])}</th>'
        f"<th></th></tr></thead><tbody>{body}</tbody></table>"
    )


def split_names(names) -> list[str]:
    """Split names, the standard ones in their usual order first."""
    order = {split: index for index, split in enumerate(manifest_lib.SPLITS)}
    return sorted(names, key=lambda split: order.get(split, len(order)))


def split_bars(counts: dict, head: tuple[str, str]) -> str:
    """A bar per split of {split: count}, in split_names' order, each in its split's colour."""
    rows = [(split, int(counts[split])) for split in split_names(counts)]
    return bar_table(rows, head=head, kind_of=lambda split: "split-" + split)


def shown_classes(manifest: dict) -> tuple[list[str], str | None]:
    """The classes the per-class figure shows (all, or the smallest and largest), and a note if not all."""
    labels = list(manifest["labels"])
    if len(labels) <= MAX_CLASS_ROWS:
        return labels, None
    per_class = [info["num_examples_per_class"] for info in manifest["splits"].values()]
    by_size = sorted(labels, key=lambda name: (sum(int(counts.get(name, 0)) for counts in per_class), name))
    half = MAX_CLASS_ROWS // 2
    shown = set(by_size[:half] + by_size[-half:])
    return (
        [name for name in labels if name in shown],
        f"{len(labels)} classes: showing the {half} smallest and the {half} largest (all splits together)",
    )


def examples_per_class(manifest: dict) -> str:
    """One row per class, one bar per split (each split's bars scaled to its largest class)."""
    splits = split_names(manifest["splits"])
    names, note = shown_classes(manifest)
    maxima = {
        split: max([int(v) for v in manifest["splits"][split]["num_examples_per_class"].values()] or [0])
        for split in splits
    }
    head = "".join(f'<th class="num">{escape(split)}</th><th></th>' for split in splits)
    rows = []
    for name in names:
        cells = ""
        for split in splits:
            value = int(manifest["splits"][split]["num_examples_per_class"].get(name, 0))
            cells += (
                f'<td class="num">{value:,}</td><td class="barcell">'
                f"{bar(value, maxima[split], 'split-' + split)}</td>"
            )
        rows.append(
            f'<tr><th scope="row"><span class="label-id">{manifest["labels"].index(name)}</span> '
            f"{escape(name)}</th>{cells}</tr>"
        )
    table = (
        f'<table class="bars per-class"><thead><tr><th>class</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return (f'<p class="note">{escape(note)}</p>' if note else "") + table


def _bucket_label(previous: int | None, upto: int | None) -> str:
    if upto is None:
        return f"> {previous:,} px" if previous else "any"
    if previous is None:
        return f"≤ {upto:,} px"
    return f"{previous + 1:,}–{upto:,} px"


def source_size_histogram(sizes: dict) -> str:
    """The manifest's `source_image_sizes`: the longest side's buckets as bars, and the extremes."""
    rows, previous = [], None
    for bucket in sizes.get("longest_side") or []:
        upto = bucket.get("upto")
        rows.append((_bucket_label(previous, upto), int(bucket.get("count", 0))))
        previous = upto
    facts = [f"{int(sizes.get('count', 0)):,} source images"]
    for word in ("smallest", "largest"):
        value = sizes.get(word)
        if isinstance(value, list) and len(value) == 2:
            facts.append(f"{word} {escape(value[0])}×{escape(value[1])} (width×height)")
    return f"<p>{', '.join(facts)}</p>" + bar_table(rows, "sizes", ("longest side", "images"))
