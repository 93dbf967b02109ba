"""The CSV manifests the incremental tests list their versions' inputs in: one reader's rows, one writer."""

import csv
import os


def corpus_rows(corpus) -> list[list[str]]:
    """[uri, label, ""] of every PNG of a class-per-folder corpus, sorted: a manifest that names no split."""
    return sorted(
        [os.path.join(folder, name), os.path.basename(folder), ""]
        for folder, _, names in os.walk(corpus)
        for name in names
        if name.endswith(".png")
    )


def write_manifest(path, rows):
    """A CSV manifest (uri, label, split) of `rows`."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["uri", "label", "split"])
        writer.writerows(rows)
