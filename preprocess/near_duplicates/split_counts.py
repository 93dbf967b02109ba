"""The label vocabulary and the per-split sizes after near-duplicate grouping, from small counts.

Counts per (split, class) and the members' -1/+1 changes: no join of images to groups (docs/internals.md).
"""

import apache_beam as beam

from dataset_contract import manifest as manifest_lib


def image_count(image) -> tuple:
    """A SignedImage -> ((its split before grouping, its label), 1)."""
    return (image.split, image.label), 1


def member_deltas(member) -> list[tuple]:
    """A GroupMember -> the changes to the counts: out of its old split, into its new one unless dropped."""
    if (member.kept and member.split == member.image.split) or member.image.carried:
        return []  # unchanged, or carried over (published: it keeps its split, and is kept in keep mode)
    label = member.image.label
    deltas = [((member.image.split, label), -1)]
    if member.kept:
        deltas.append(((member.split, label), 1))
    return deltas


class SplitLabelCountsFn(beam.CombineFn):
    """((split, label), count) pairs -> {"labels": the train split's sorted class names, "per_split": {split:
    images}}: the same summary pipeline.SummarizeUniqueInputsFn gives without the audit."""

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, element):
        key, count = element
        accumulator[key] = accumulator.get(key, 0) + count
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = {}
        for accumulator in accumulators:
            for key, count in accumulator.items():
                merged[key] = merged.get(key, 0) + count
        return merged

    def extract_output(self, accumulator):
        per_split = {}
        for (split, _), count in accumulator.items():
            per_split[split] = per_split.get(split, 0) + count
        labels = sorted(
            label
            for (split, label), count in accumulator.items()
            if split == manifest_lib.TRAIN and count > 0
        )
        return {"labels": labels, "per_split": per_split}
