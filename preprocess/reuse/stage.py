"""The reuse steps of an incremental run: match the inputs to the previous version's ledger, then carry over
the records of the unchanged ones, by reference to the previous shards where a whole shard is unchanged, else
copied from them. The flow, and why by reference: docs/internals.md, `preprocess/reuse/`.
"""

import dataclasses

import apache_beam as beam
from apache_beam.metrics import Metrics

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import errors
from preprocess.decode import outcomes
from preprocess.reuse.ledger import (
    ReadLedger,
    decoder_version,
    entry_bytes,
    entry_of,
    facts_of,
    input_facts,
    is_failure,
    moments_bytes,
    new_entry,
)
from preprocess.transform import analysis_example
from preprocess.write.encode import label_not_in_train

DECODE, CARRY, MOVED, PUBLISHED, FAILED = "decode", "carry", "moved", "published", "failed"


@dataclasses.dataclass(frozen=True)
class CarriedImage:
    """An unchanged input (a content.UniqueInput, in its final split) and its previous version's ledger entry."""

    image: object
    entry: dict

    @property
    def shard(self) -> str | None:
        """The previous shard (relative path) that holds its record as this version writes it, or None: the
        ledger says where (a ledger before shard references does not), and the record's split and URI are
        those it has now (its label index is checked per shard, IntactShards)."""
        if self.image.uri != self.entry["uri"] or self.image.split != self.entry["split"]:
            return None
        return self.entry.get("shard")

    @property
    def source_size(self):
        """(width, height) of its source image, as the ledger kept it (None in ledgers from before)."""
        size = self.entry.get("source_size")
        return None if size is None else tuple(size)

    def example(self) -> dict:
        """What the rest of the job needs of it: the statistics' moments, the ledger's fields; no pixels."""
        example = {
            "image_raw": b"",
            "moments": moments_bytes(self.entry),
            "key": self.image.key,
            "sha256": self.entry["sha256"],
            "uri": self.image.uri,
            "label": self.image.label,
            "split": self.image.split,
            # Its file's size and mtime now (this run keyed it), its source size as the ledger had it.
            "input": input_facts(self.image, self.entry.get("source_size")),
        }
        if self.entry.get("signature") is not None:
            example["signature"] = self.entry["signature"]
        return example

    def ledger_entry(self) -> dict:
        """Its entry in the new ledger: as ledger.entry_of(self.example() and its shard) gives it, built from the
        previous entry without the example's round trips (moments through numpy, facts through JSON)."""
        image, before = self.image, self.entry
        return new_entry(
            image.key,
            before["sha256"],
            image.uri,
            image.label,
            image.split,
            before["moments"],
            signature=before.get("signature"),
            shard=self.shard,
            facts=facts_of(image, self.source_size),
        )

    def signed(self):
        """As near-duplicate grouping takes it (a SignedImage): held in its split, with no part to route;
        None when the previous version kept no signature (its audit was off)."""
        from preprocess.near_duplicates.grouping import SignedImage  # noqa: PLC0415

        if self.entry.get("signature") is None:
            return None
        return SignedImage(
            key=self.entry["sha256"],
            signature=int(self.entry["signature"]),
            uri=self.image.uri,
            label=self.image.label,
            split=self.image.split,
            split_given=self.image.split_given,
            num_bytes=self.image.size or 0,
            published_split=self.image.split,
            carried=True,
        )


# ReferencedFn's outputs beside the ledger lines (main).
ANALYSIS, SIZES, OUTCOMES = "analysis", "sizes", "outcomes"


class ReferencedFn(beam.DoFn):
    """(sha256, CarriedImage) of an image whose record stays in a previous shard the new version references ->
    what the rest of the job takes of it, in one step rather than a step each (the per-image cost of a re-run
    is in such steps: benchmarks/RESULTS.md, issue 32): its ledger line (main); ANALYSIS: its example as the
    statistics' analysis reads it (train only: moments, no pixels); SIZES: its source image's (width, height);
    OUTCOMES: written in its split and class, and reused."""

    def process(self, element):
        _, carried = element
        image = carried.image
        yield entry_bytes(carried.ledger_entry())
        if image.split == manifest_lib.TRAIN:
            analysed = {"moments": moments_bytes(carried.entry), "sha256": carried.entry["sha256"]}
            yield beam.pvalue.TaggedOutput(
                ANALYSIS, analysis_example({**analysed, "uri": image.uri, "label": image.label})
            )
        if carried.source_size is not None:
            yield beam.pvalue.TaggedOutput(SIZES, carried.source_size)
        yield beam.pvalue.TaggedOutput(OUTCOMES, outcomes.written(image.split, image.label))
        yield beam.pvalue.TaggedOutput(OUTCOMES, outcomes.REUSED)


class SortByPublishedFn(beam.DoFn):
    """(content key, {"inputs": [UniqueInput], "published": [entry]}) -> DECODE (main): UniqueInputs to decode;
    CARRY: (sha256, CarriedImage); MOVED: {uri, from, to}; PUBLISHED: (sha256, split) of every published image
    that is decoded again (near-duplicate grouping holds it in its split); FAILED: the ErrorRecord of an input
    whose bytes failed in the previous version, carried over (with `carry_failures`: the settings that decide
    such a failure are the previous version's, and so is `decoder`: this run's decoder_version, taken as the
    graph is built) instead of decoded again."""

    def __init__(self, carry_failures: bool = True, decoder: str | None = None):
        self._carry_failures = carry_failures
        self._decoder = decoder_version() if decoder is None else decoder
        self._carried = Metrics.counter("preprocess", "carried_over")
        self._failures = Metrics.counter("preprocess", "failures_carried_over")

    def process(self, element):
        _, grouped = element
        inputs, published = list(grouped["inputs"]), list(grouped["published"])
        if not inputs:
            return  # removed since the previous version
        if len(published) != 1 or len(inputs) != 1:
            # New content (or two contents under one key, a crafted MD5 collision): decoded.
            yield from inputs
            return
        image, entry = inputs[0], published[0]
        if is_failure(entry):
            if not self._carry_failures or entry["failed"].get("decoder") != self._decoder:
                yield image
                return
            self._failures.inc()
            failed = entry["failed"]
            yield beam.pvalue.TaggedOutput(
                FAILED, errors.ErrorRecord(image.uri, failed["reason"], failed["detail"], input=image)
            )
            return
        split = image.split if image.split_given else entry["split"]
        if split != entry["split"]:
            # A split the input names wins, even over the published one; the summary says so.
            yield beam.pvalue.TaggedOutput(MOVED, {"uri": image.uri, "from": entry["split"], "to": split})
        if split != image.split:
            image = dataclasses.replace(image, split=split)
        if image.label != entry["label"]:
            # Relabelled: written again with its new label, in the split it was published in.
            yield beam.pvalue.TaggedOutput(PUBLISHED, (entry["sha256"], split))
            yield image
            return
        self._carried.inc()
        yield beam.pvalue.TaggedOutput(CARRY, (entry["sha256"], CarriedImage(image, entry)))


class SortByPublished(beam.PTransform):
    """UniqueInputs -> {DECODE, CARRY, MOVED, PUBLISHED} (SortByPublishedFn) against the ledger files given."""

    def __init__(self, ledger_files, carry_failures: bool = True):
        super().__init__()
        self._ledger_files = list(ledger_files)
        self._carry_failures = carry_failures

    def expand(self, unique):
        ledger = unique.pipeline | "ReadLedger" >> ReadLedger(self._ledger_files)
        keyed = unique | "ByKey" >> beam.Map(lambda image: (image.key, image))
        sorted_ = (
            {"inputs": keyed, "published": ledger}
            | "Match" >> beam.CoGroupByKey()
            | "Sort"
            >> beam.ParDo(SortByPublishedFn(self._carry_failures)).with_outputs(
                CARRY, MOVED, PUBLISHED, FAILED, main=DECODE
            )
        )
        return {name: sorted_[name] for name in (DECODE, CARRY, MOVED, PUBLISHED, FAILED)}


def shard_records(path: str):
    """A shard -> (sha256, serialized record) of each of its records."""
    import tensorflow as tf  # noqa: PLC0415 - on the workers, only in an incremental run

    from dataset_contract.verification import read_records  # noqa: PLC0415

    for record in read_records(path):
        example = tf.train.Example.FromString(record)
        yield example.features.feature[features.SHA256].bytes_list.value[0].decode("ascii"), record


def rewritten(record: bytes, label: int, uri: str) -> bytes:
    """The record with its label index and URI set (the pixels untouched: no decode, no encode)."""
    import tensorflow as tf  # noqa: PLC0415

    example = tf.train.Example.FromString(record)
    feature = example.features.feature
    if (
        feature[features.LABEL].int64_list.value[0] == label
        and feature[features.URI].bytes_list.value[0] == uri.encode()
    ):
        return record
    feature[features.LABEL].int64_list.value[0] = label
    feature[features.URI].bytes_list.value[0] = uri.encode()
    return example.SerializeToString()


class FindRecordFn(beam.DoFn):
    """(sha256, {"carried": [CarriedImage], "records": [record]}) -> (CarriedImage, record) (main); "missing":
    the UniqueInputs whose record the previous version's shards lack (decoded instead)."""

    def process(self, element):
        _, grouped = element
        carried = list(grouped["carried"])
        if not carried:
            return  # a record of the previous version that this one does not carry (removed, relabelled)
        record = next(iter(grouped["records"]), None)
        for image in carried:
            if record is None:
                yield beam.pvalue.TaggedOutput("missing", image.image)
            else:
                yield image, record


class RelabelRecordFn(beam.DoFn):
    """(CarriedImage, record) -> (split, record, class name, ledger entry) (main), its example dict on
    "examples"; "errors": a carried validation/test image whose class has no train image any more."""

    def __init__(self):
        self._indices = None

    def _index(self, vocabulary):
        if self._indices is None or self._indices[0] is not vocabulary:
            self._indices = (vocabulary, {name: index for index, name in enumerate(vocabulary)})
        return self._indices[1]

    def process(self, element, vocabulary):
        carried, record = element
        image = carried.image
        label = self._index(vocabulary).get(image.label)
        if label is None:
            yield beam.pvalue.TaggedOutput("errors", label_not_in_train(image.uri, image.label, image.split))
            return
        example = carried.example()
        yield beam.pvalue.TaggedOutput("examples", example)
        yield image.split, rewritten(record, label, image.uri), image.label, entry_of(example)


class FindCarriedRecords(beam.PTransform):
    """(sha256, CarriedImage) -> {"found": (CarriedImage, record), "missing": UniqueInputs}: the previous
    version's records of the carried images, read from its shards (`shards`: (relative path, full path)),
    but for those in `referenced` (a singleton set of relative paths; IntactShards).

    Needs no label vocabulary (RelabelRecordFn does), so the images it finds missing can still be decoded
    before the vocabulary is known."""

    def __init__(self, shards, referenced=None):
        super().__init__()
        self._shards = list(shards)
        self._referenced = referenced

    def expand(self, carried):
        shards = carried.pipeline | "Shards" >> beam.Create(self._shards)
        if self._referenced is not None:
            # A shard the new version references is never opened: this is where a re-run's time went.
            shards = shards | "NotReferenced" >> beam.Filter(
                lambda shard, referenced: shard[0] not in referenced,
                beam.pvalue.AsSingleton(self._referenced),
            )
        records = (
            shards
            | "Paths" >> beam.MapTuple(lambda _, path: path)
            | "SpreadShards" >> beam.Reshuffle()
            | "Records" >> beam.FlatMap(shard_records)
        )
        out = (
            {"carried": carried, "records": records}
            | "BySha256" >> beam.CoGroupByKey()
            | "Find" >> beam.ParDo(FindRecordFn()).with_outputs("missing", main="found")
        )
        return {"found": out.found, "missing": out.missing}


def intact_shards(counts, shard_sizes: dict, labels_now: dict, labels_before) -> frozenset:
    """The previous shards (relative paths) the new version references: every record of each carried as it
    was. `counts`: (shard, carried images whose record it holds as it is); `shard_sizes`: {shard: records};
    `labels_now`: the summary of the unique inputs (SummarizeUniqueInputsFn), whose label vocabulary must be
    the previous one, else every index may have moved and every record is copied."""
    if list(labels_now["labels"]) != list(labels_before):
        return frozenset()
    return frozenset(shard for shard, count in counts if shard_sizes.get(shard) == count)


class IntactShards(beam.PTransform):
    """(sha256, CarriedImage) -> a singleton frozenset of the previous shards the new version references.

    `shards`: (relative path, number of records) of every previous shard; `labels_now`: a singleton of the
    unique inputs' summary; `labels_before`: the previous version's label vocabulary. Needs no decoded
    image, so the records of the other shards are still found before anything is decoded."""

    def __init__(self, shards, labels_now, labels_before):
        super().__init__()
        self._sizes = dict(shards)
        self._labels_now = labels_now
        self._labels_before = list(labels_before)

    def expand(self, carried):
        return (
            carried
            | "ShardAsItWas" >> beam.FlatMap(lambda element: [element[1].shard] if element[1].shard else [])
            | "PerShard" >> beam.combiners.Count.PerElement()
            | "AllShards" >> beam.combiners.ToList()
            | "Intact"
            >> beam.Map(
                intact_shards,
                shard_sizes=self._sizes,
                labels_now=beam.pvalue.AsSingleton(self._labels_now),
                labels_before=self._labels_before,
            )
        )


def referenced_shard_entries(referenced, shards, labels, labels_before):
    """The manifest's entries of the previous shards the new version references (as the previous manifest
    lists them, path into the earlier run's directory), each with its `split`.

    `labels`: the label vocabulary the version is written with. Shards are picked before it is known (near-
    duplicate grouping may still take every train image of a class away): if it is not the previous one,
    the referenced records' label indexes would be wrong, and the run stops rather than publish them."""
    if referenced and list(labels) != list(labels_before):
        raise errors.RebuildNeededError(
            f"the label vocabulary changed after {len(referenced)} shards of the previous version were "
            f"referenced as they are (now {list(labels)}, before {list(labels_before)}); nothing was published. "
            "Run again with --rebuild (the published dataset is unchanged)"
        )
    return [{"split": split, **entry} for split, entry in shards if entry["path"] in referenced]
