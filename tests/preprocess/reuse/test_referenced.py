"""An image carried over in a referenced shard goes through one step (reuse.ReferencedFn), which gives what the
steps it replaced gave from its example: its ledger line, its analysis example (train only), its source
size and its outcomes."""

import apache_beam as beam
import pytest

from preprocess.decode import outcomes
from preprocess.inputs.content import UniqueInput
from preprocess.reuse import stage as reuse
from preprocess.reuse.ledger import entry_bytes, entry_of
from preprocess.transform import analysis_example

ENTRY = {
    "key": "ab" * 16,
    "sha256": "cd" * 32,
    "uri": "/corpus/cat/1.jpg",
    "label": "cat",
    "split": "train",
    "moments": [0.1, 0.2, 0.30000000000000004, 1e-17, 5.0, 6.25],
    "signature": 12345678901234567,
    "shard": "runs/r1/train-00000-of-00001.tfrecord",
    "size": 100,
    "mtime_ns": 1_600_000_000 * 10**9,
    "source_size": [640, 480],
}


def _outputs(carried):
    tags = (reuse.ANALYSIS, reuse.SIZES, reuse.OUTCOMES)
    out = {tag: [] for tag in ("ledger", *tags)}
    for value in reuse.ReferencedFn().process(("sha", carried)):
        if isinstance(value, beam.pvalue.TaggedOutput):
            out[value.tag].append(value.value)
        else:
            out["ledger"].append(value)
    return out


@pytest.mark.parametrize(
    "entry, image",
    [
        (ENTRY, {}),
        # Evaluation split, no signature (the audit was off), a file keyed too soon after a change (no mtime),
        # a ledger from before source sizes.
        (
            {k: v for k, v in ENTRY.items() if k not in ("signature", "source_size")}
            | {"split": "validation"},
            {"split": "validation", "mtime_ns": None},
        ),
        # The file touched since (same content): its new size and mtime go into the line.
        (ENTRY, {"mtime_ns": 1_700_000_000 * 10**9}),
    ],
)
def test_a_referenced_image_gives_what_its_example_gave(entry, image):
    fields = dict(uri=entry["uri"], label="cat", split="train", size=100, split_given=False, key=entry["key"])
    carried = reuse.CarriedImage(UniqueInput(**{**fields, "mtime_ns": entry.get("mtime_ns"), **image}), entry)
    assert carried.shard == entry["shard"]
    example = carried.example()
    out = _outputs(carried)
    assert out["ledger"] == [entry_bytes(entry_of({**example, "shard": carried.shard}))]
    train = example["split"] == "train"
    assert out[reuse.ANALYSIS] == ([analysis_example(example)] if train else [])
    assert out[reuse.SIZES] == ([tuple(entry["source_size"])] if "source_size" in entry else [])
    assert out[reuse.OUTCOMES] == [outcomes.written(example["split"], "cat"), outcomes.REUSED]
