"""Stage 1: the Beam job that writes a dataset directory from a corpus of images (`python -m preprocess`).

`build_pipeline` is the graph, its steps taken from the folders of preprocess/ in the order
docs/development.md lists; launch/launcher.py runs it. Command lines and design: docs/internals.md.
"""

import os

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import decode, filesystem, inputs, launch, publish, reuse, write
from preprocess.config import NEAR_DUPLICATES_DROP, NEAR_DUPLICATES_OFF
from preprocess.launch.beam_signatures import remember_signatures
from preprocess.near_duplicates import NearDuplicateAudit, published_shards
from preprocess.transform import (
    ToRecordBatches,
    analysis_example,
    make_preprocessing_fn,
    tensor_adapter_config,
)
from preprocess.write import NEAR_DUPLICATES

# Building this graph, and running it in this process, asks Beam for the same functions' parameters thousands
# of times (launch/beam_signatures.py).
remember_signatures()

# Per-record framing and metadata features around the image payload (sha256,
# uri, class name, proto overhead): used only to size shard files.
_RECORD_OVERHEAD_BYTES = 400
# A 224x224 JPEG at quality 90 is about a sixth of its raw pixels; an estimate
# for sizing files only (shards are planned by the bytes actually written).
_JPEG_COMPRESSION_ESTIMATE = 6


def estimated_record_bytes(encoding: str, image_size: int) -> int:
    raw = features.raw_bytes_per_image(encoding, image_size, image_size)
    if raw is None:
        raw = image_size * image_size * features.CHANNELS // _JPEG_COMPRESSION_ESTIMATE
    return raw + _RECORD_OVERHEAD_BYTES


def output_dir_of(args) -> str:
    """The output directory as every step names it: no trailing '/', absolute on local disk."""
    output = args.output.rstrip("/")
    return os.path.abspath(output) if filesystem.is_local(output) else output


def job_config(args, build_id: str) -> dict:
    """The settings that go into the manifest (plain data, picklable to workers); `build_id` names this
    build's tf.Transform temporary directory (runs.tft_temp_dir)."""
    return {
        "build_id": build_id,
        "input": args.input,
        "input_kind": inputs.input_kind(args.input),
        "output": output_dir_of(args),
        "image_size": args.stored_size,
        "crop_size": args.image_size,
        "crop_margin": args.crop_margin,
        "resize_method": args.resize_method,
        "max_pixels": args.max_pixels,
        "max_file_bytes": args.max_file_bytes,
        "encoding": args.encoding,
        "jpeg_quality": args.jpeg_quality,
        "split_fractions": args.split,
        "max_failed_fraction": args.max_failed_fraction,
        "retention_days": args.retention_days,
        "near_duplicates": args.near_duplicates,
        "near_duplicate_distance": args.near_duplicate_distance,
        "near_duplicate_max_group": args.near_duplicate_max_group,
        "near_duplicate_max_moved": args.near_duplicate_max_moved,
    }


class SummarizeUniqueInputsFn(beam.CombineFn):
    """Unique inputs -> {"labels": the train split's sorted class names, "per_split": {split: inputs}}, in one
    combine whose accumulator grows with the classes, not the images."""

    def create_accumulator(self):
        return set(), {}

    def add_input(self, accumulator, item):
        labels, per_split = accumulator
        if item.split == manifest_lib.TRAIN:
            labels.add(item.label)
        per_split[item.split] = per_split.get(item.split, 0) + 1
        return accumulator

    def merge_accumulators(self, accumulators):
        labels, per_split = self.create_accumulator()
        for other_labels, other_per_split in accumulators:
            labels |= other_labels
            for split, count in other_per_split.items():
                per_split[split] = per_split.get(split, 0) + count
        return labels, per_split

    def extract_output(self, accumulator):
        labels, per_split = accumulator
        return {"labels": sorted(labels), "per_split": per_split}


def estimated_split_bytes(summary: dict, record_bytes: int) -> dict:
    """{split: estimated bytes of its records}: sizes the shards before they are written."""
    return {split: summary["per_split"].get(split, 0) * record_bytes for split in manifest_lib.SPLITS}


def audit_near_duplicates(decoded_examples, args, output_dir: str, run_id, published=None, carried=None):
    """keep/drop: the decoded examples in their final splits, and what the manifest says of the groups:
    (examples, summary, dropped, finalize's side inputs, the groups' (NEAR_DUPLICATES, JSON line) for
    WriteJsonLogs); `published`/`carried`: an incremental run's."""
    carried_inputs = carried_in_audit(carried) if carried is not None else {}
    near = decoded_examples | "NearDuplicates" >> NearDuplicateAudit(
        output_dir,
        run_id,
        args.near_duplicate_distance,
        drop=args.near_duplicates == NEAR_DUPLICATES_DROP,
        max_group_size=args.near_duplicate_max_group,
        max_moved_share=args.near_duplicate_max_moved,
        published_shards=published_shards(output_dir) if published is None else published,
        **carried_inputs,
    )
    # One JSON line per group, written with the error log's lines (build_pipeline's WriteLogs).
    group_lines = near["groups"] | "GroupsToJson" >> beam.Map(
        lambda group: (NEAR_DUPLICATES, group.to_json().encode("utf-8"))
    )
    manifest_inputs = {"near_duplicate_stats": beam.pvalue.AsSingleton(near["stats"])}
    return near["examples"], near["summary"], near["dropped"], manifest_inputs, group_lines


class CarriedForAuditFn(beam.DoFn):
    """(sha256, CarriedImage) -> its SignedImage (main), to be grouped; or, when it cannot be grouped (no
    signature in the ledger), its ((split, label), 1) on "counts", to be counted only."""

    def process(self, element):
        _, carried = element
        signed = carried.signed()
        if signed is None:
            yield beam.pvalue.TaggedOutput("counts", ((carried.image.split, carried.image.label), 1))
        else:
            yield signed


def carried_in_audit(carried) -> dict:
    """How the near-duplicate audit takes the images carried over: grouped with the decoded ones, held in
    their published split, so a new copy of a published image follows it; in drop mode a carried member is
    the one its group keeps, never dropped (grouping.py; docs/preprocessing.md, "Re-runs")."""
    sorted_ = carried | "CarriedForAudit" >> beam.ParDo(CarriedForAuditFn()).with_outputs(
        "counts", main="signed"
    )
    return {"carried_images": sorted_.signed, "carried_counts": sorted_.counts}


def analysis_input(examples, carried_examples, referenced_analysis, incremental: bool):
    """The train split's examples as the analysis reads them: moments and metadata, no pixels
    (transform.analysis_example).

    The analysis consumes the decoded examples in the stage that decodes (or, with the audit, routes)
    them. A Flatten of inputs made in several stages would end that stage: the local runner would
    hold every decoded example, pixels and all, until the analysis's own stage ran, and memory would
    grow with the corpus (benchmarks/RESULTS.md, issue 30's cost). So the carried-over examples of an
    incremental run are flattened in only then, and only after the pixels are dropped. Those of the
    referenced shards come as the analysis reads them (reuse.ReferencedFn)."""
    sources = {"Decoded": examples}
    if incremental:
        sources["Carried"] = carried_examples
    train = [
        collection
        | f"Train{name}" >> beam.Filter(lambda example: example["split"] == manifest_lib.TRAIN)
        | f"ForAnalysis{name}" >> beam.Map(analysis_example)
        for name, collection in sources.items()
    ]
    if incremental:
        train.append(referenced_analysis)
    if len(train) == 1:
        return train[0]
    return train | "TrainDecodedAndCarried" >> beam.Flatten()


def reuse_published(unique, plan: reuse.ReusePlan) -> dict:
    """The unique inputs sorted against the published version (preprocess/reuse/):

    - "decode": every input to read and decode (new, relabelled, and carried ones whose record is missing)
    - "decode_first": the same without the missing ones (they are counted among "carried")
    - "carried": (sha256, CarriedImage) of the unchanged inputs; of those, "found": (CarriedImage, record)
      of the ones copied, "referenced": (sha256, CarriedImage) of the ones whose previous shard the new
      version references as it is, "referenced_shards": a singleton set of those shards (relative paths)
    - "moved": {uri, from, to} of published images a named split moved
    - "published": (sha256, split) of the published images decoded again
    - "carried_sizes": (width, height) of the source image of each one carried over by copy (the ledger's)
    - "failed": the ErrorRecords of the inputs whose bytes failed in the published version, carried over

    Without a version to reuse (a first run, a full rebuild), everything is decoded and the rest is empty.
    """
    pipeline = unique.pipeline
    if not plan.incremental:
        empty = {
            name: pipeline | f"No{name.capitalize()}" >> beam.Create([])
            for name in ("carried", "found", "moved", "published", "referenced", "failed")
        }
        nothing = pipeline | "NoReferencedShards" >> beam.Create([frozenset()])
        return {
            "decode": unique,
            "decode_first": unique,
            "referenced_shards": nothing,
            "carried_sizes": pipeline | "NoCarriedSizes" >> beam.Create([]),
            **empty,
        }
    sorted_ = unique | "Reuse" >> reuse.SortByPublished(plan.ledger_files, plan.carry_failures)
    carried = sorted_[reuse.CARRY]
    # The label vocabulary of the inputs, known before any decoding: a shard is referenced only if it is the
    # previous one (a record's label index is its class's place in it).
    labels_now = (
        (sorted_[reuse.DECODE], carried | "CarriedImages" >> beam.MapTuple(lambda _, image: image.image))
        | "InputsInSplits" >> beam.Flatten()
        | "InputLabels" >> beam.CombineGlobally(SummarizeUniqueInputsFn())
    )
    intact = carried | "IntactShards" >> reuse.IntactShards(plan.shard_sizes(), labels_now, plan.labels)
    by_reference = carried | "ByReference" >> beam.Partition(
        lambda element, _, intact: int(element[1].shard not in intact), 2, beam.pvalue.AsSingleton(intact)
    )
    found = by_reference[1] | "FindCarried" >> reuse.FindCarriedRecords(plan.shard_paths(), intact)
    decode = (sorted_[reuse.DECODE], found["missing"]) | "ToDecode" >> beam.Flatten()
    # The source sizes of the images carried over by copy (not those sent back to decoding: they count as
    # decoded; those of the referenced shards: reuse.ReferencedFn).
    carried_sizes = found["found"] | "CarriedSourceSizes" >> beam.FlatMapTuple(
        lambda carried, _: [carried.source_size] if carried.source_size else []
    )
    return {
        "decode": decode,
        "decode_first": sorted_[reuse.DECODE],
        "carried": carried,
        "found": found["found"],
        "referenced": by_reference[0],
        "referenced_shards": intact,
        "moved": sorted_[reuse.MOVED],
        "published": sorted_[reuse.PUBLISHED],
        "failed": sorted_[reuse.FAILED],
        "carried_sizes": carried_sizes,
    }


def _index_upload_dir(pipeline: beam.Pipeline) -> str | None:
    """Where a Dataflow job's workers fetch the quick check's index (its --temp_location); None for a job on
    this machine, whose workers copy the launcher's."""
    if not launch.runs_remotely(pipeline.options):
        return None
    options = pipeline.options.view_as(GoogleCloudOptions)
    return options.temp_location or options.staging_location


def build_pipeline(pipeline: beam.Pipeline, args, build_id: str, run_id: str | None = None):
    """Adds the whole job to `pipeline`; returns the PCollection holding the manifest.

    `run_id`: the run's id, made by the launcher; None (a template) makes it when the job runs.
    """
    # Imported here, not with the module: a worker that unpickles this module's functions for the
    # listing and deduplication stages must not load TensorFlow (benchmarks/RESULTS.md, issue 20).
    import tensorflow_transform.beam as tft_beam

    config = job_config(args, build_id)
    output_dir = config["output"]
    # What this run reuses of the published version (preprocess/reuse/): said in one line.
    # The runs of a template share this build's tf.Transform directory (runs.tft_temp_dir).
    template = bool(pipeline.options.view_as(GoogleCloudOptions).template_location)
    plan = reuse.plan_reuse(output_dir, config, getattr(args, "rebuild", False), template=template)
    announcement = plan.announcement()
    if announcement:
        print(f"preprocess: {announcement}", flush=True)
    config["built_from"], config["full_rebuild"] = plan.built_from, plan.full_rebuild
    one_pass = args.encoding not in features.NORMALIZED_ENCODINGS
    # Every path a run writes to below runs/ and staging/ is named by this id, a side input.
    run_id = pipeline | "RunId" >> publish.MakeRunId(
        output_dir, build_id, shared_build=template, run_id=run_id
    )
    # Listed in parallel, spread over the workers and with the classes mixed (inputs.py).
    listed = pipeline | "ListInputs" >> inputs.ListInputs(args.input, args.labels)
    # A re-run trusts the content key the published version recorded for a local file of unchanged size and
    # mtime (the quick check, inputs/content.py); --checksum (or a full rebuild) reads every one. A gs://
    # input's listing gives the MD5 already: no check, and no shuffle of the listing for it.
    local_input = not str(args.input).startswith("gs://")
    known_keys = plan.ledger_files if local_input and not getattr(args, "checksum", False) else ()
    if known_keys:
        # Its index is built here, once per job, and copied by each worker process (reuse/shared_index.py).
        known_keys = reuse.share(pipeline, known_keys, upload_dir=_index_upload_dir(pipeline))
    deduplicated = listed.records | "Deduplicate" >> inputs.DeduplicateByContent(
        args.split, args.max_file_bytes, known_keys=known_keys
    )
    unique = deduplicated["unique"]
    reused = reuse_published(unique, plan)
    # The carried images whose previous shard is referenced as it is: no record read, none written; their
    # ledger line, their share of the statistics and of the counts, in one step (reuse.ReferencedFn).
    referenced = reused["referenced"] | "Referenced" >> beam.ParDo(reuse.ReferencedFn()).with_outputs(
        reuse.ANALYSIS, reuse.SIZES, reuse.OUTCOMES, main="ledger"
    )
    audit = args.near_duplicates != NEAR_DUPLICATES_OFF
    # Without the audit, decoding, encoding and writing must run in one fused stage, so that no decoded
    # image ever crosses a stage boundary (the local runner would hold every one in memory). The
    # encoder's side inputs (the vocabulary, the split sizes) are computed from `unique`, so a stage
    # that made `unique` could not also wait for them: the runner would split decode from encode. The
    # reshuffle (of small metadata) ends the deduplication's stage here; it also spreads the decoding
    # evenly. With the audit, the decoding stage ends in a spill to disk instead (near_duplicates/).
    decoded = decode.decode_images(
        reused["decode"],
        listed,
        # The inputs to decode (in an incremental run, not those carried over): what the decoding samples.
        reused["decode_first"],
        [listed.errors, deduplicated["errors"], reused["failed"]],
        run_id,
        output_dir,
        args,
        signatures=audit,
    )
    error_collections = [listed.errors, deduplicated["errors"], decoded.errors, reused["failed"]]
    source_image_sizes = decode.source_image_sizes(
        decoded.examples, reused["carried_sizes"], referenced[reuse.SIZES]
    )
    if audit:
        # Every image in its final split: no group of near-duplicates straddles train and evaluation.
        examples, summary, dropped, near_duplicate_inputs, group_lines = audit_near_duplicates(
            decoded.examples,
            args,
            output_dir,
            run_id,
            published=reused["published"] if plan.incremental else None,
            # A first run carries nothing over: no empty input to flatten with the signed images, which
            # would end the stage that signs them (one more stage, and every SignedImage coded across it).
            carried=reused["carried"] if plan.incremental else None,
        )
    else:
        examples, dropped, near_duplicate_inputs, group_lines = decoded.examples, None, {}, None
        carried_inputs = reused["carried"] | "CarriedInputs" >> beam.MapTuple(
            lambda _, carried: carried.image
        )
        summary = (
            (reused["decode_first"], carried_inputs)
            | "UniqueInFinalSplits" >> beam.Flatten()
            | "SummarizeUnique" >> beam.CombineGlobally(SummarizeUniqueInputsFn())
        )
    vocabulary = summary | "Vocabulary" >> beam.Map(lambda summary: summary["labels"])
    # The carried records, labelled with this version's vocabulary (an index that moved is rewritten).
    carried = reused["found"] | "CarriedRecords" >> beam.ParDo(
        reuse.RelabelRecordFn(), beam.pvalue.AsSingleton(vocabulary)
    ).with_outputs("examples", "errors", main="records")
    error_collections.append(carried.errors)

    with tft_beam.Context(temp_dir=publish.tft_temp_dir(output_dir, build_id)):
        transform_fn = (
            analysis_input(examples, carried.examples, referenced[reuse.ANALYSIS], plan.incremental)
            | "TrainBatches" >> ToRecordBatches(args.transform_batch_size),
            tensor_adapter_config(),
        ) | "AnalyzeTrain" >> tft_beam.AnalyzeDataset(make_preprocessing_fn(args.stored_size, args.encoding))
        transform_written = transform_fn | "WriteTransformOutput" >> write.WriteTransformOutput(
            output_dir, run_id
        )
        if one_pass:
            encoded = write.encode_in_one_pass(examples, vocabulary, args)
            encoded_examples, encode_errors = encoded.examples, encoded.errors
            labels = vocabulary
        else:
            # The transform loads the graph from the run's copy (written once, where it stays).
            encoded_examples, encode_errors = write.encode_after_transform(
                examples, (transform_written, transform_fn[1]), args, output_dir, run_id
            )
            labels = transform_written | "ReadVocabulary" >> beam.Map(write.read_label_vocabulary)
    error_collections.append(encode_errors)
    stats = transform_written | "ReadNormalization" >> beam.Map(
        write.read_normalization, image_size=args.stored_size
    )

    # Decoded and carried over by copy: every record the version writes, (split, record, class name[, ledger
    # entry]) each, written by the shard writer as two inputs (never flattened: see WriteShards).
    written = (
        encoded_examples | "Records" >> beam.Map(lambda element: (element[0], element[1], *element[3:])),
        carried.records
        | "CarriedSplitRecords" >> beam.Map(lambda element: (element[0], element[1], element[3])),
    ) | "WriteShards" >> write.WriteShards(
        output_dir,
        args.shard_size_mb * 1_000_000,
        args.min_shards,
        summary
        | "EstimatedSplitBytes"
        >> beam.Map(estimated_split_bytes, estimated_record_bytes(args.encoding, args.stored_size)),
        run_id,
    )
    # The previous version's shards that this one references as they are (preprocess/reuse/stage.py).
    referenced_shards = reused["referenced_shards"] | "ReferencedShards" >> beam.FlatMap(
        reuse.referenced_shard_entries,
        shards=plan.shards,
        labels=beam.pvalue.AsSingleton(labels),
        labels_before=plan.labels,
    )
    shards = (written["shards"], referenced_shards) | "AllShards" >> beam.Flatten()

    all_errors = error_collections | "AllErrors" >> beam.Flatten()
    errors_log, near_duplicate_files = write.write_logs(all_errors, group_lines, output_dir, run_id)
    if near_duplicate_files is not None:
        near_duplicate_inputs["near_duplicate_files"] = beam.pvalue.AsSingleton(near_duplicate_files)
    # The version's ledger (preprocess/reuse/ledger.py): what the next version reuses without decoding. uint8
    # and jpeg: each written record's entry says which shard holds it (the shard writer's), a referenced
    # one's keeps its shard. bfloat16 and float32 versions are never carried over (previous.py): no shard.
    if one_pass:
        ledger_lines = (
            written["ledger"] | "LedgerLines" >> beam.Map(reuse.entry_bytes),
            referenced.ledger,
        ) | "LedgerEntries" >> beam.Flatten()
    else:
        ledger_lines = (
            examples
            # Not an example whose class has no train image: it fails to be labelled (label_not_in_train).
            | "LedgerLabelled"
            >> beam.Filter(
                lambda example, labels: example["label"] in labels, beam.pvalue.AsSingleton(vocabulary)
            )
            | "LedgerLines" >> beam.Map(reuse.entry_line)
        )
    # The inputs whose bytes failed (decoded now, or carried over), for the next version to carry over.
    failed_entries = all_errors | "FailedEntries" >> beam.FlatMap(reuse.failure_entry)
    ledger_lines = (
        ledger_lines,
        failed_entries | "FailedLines" >> beam.Map(reuse.entry_bytes),
    ) | "LedgerAndFailed" >> beam.Flatten()
    ledger = ledger_lines | "WriteLedger" >> write.WriteErrorLog(
        output_dir, run_id, prefix=reuse.LEDGER, count_key="num_images"
    )
    # Every input's fate, counted in one combine (each global count would add its own stages).
    fates = [
        listed.records | "Listed" >> beam.Map(lambda _: decode.outcomes.FOUND),
        listed.errors | "ListingError" >> beam.Map(lambda _: decode.outcomes.FOUND),
        listed.skipped | "Skipped" >> beam.Map(decode.outcomes.skipped),
        deduplicated["duplicates"] | "Duplicate" >> beam.Map(lambda _: decode.outcomes.DUPLICATE),
        all_errors | "Failed" >> beam.Map(decode.outcomes.failed),
        encoded_examples
        | "Written" >> beam.Map(lambda element: decode.outcomes.written(element[0], element[2])),
        carried.records
        | "WrittenCarried" >> beam.Map(lambda element: decode.outcomes.written(element[0], element[2])),
        referenced[reuse.OUTCOMES],
        reused["decode"] | "Decoded" >> beam.Map(lambda _: decode.outcomes.DECODED),
        carried.records | "Reused" >> beam.Map(lambda _: decode.outcomes.REUSED),
        reused["failed"] | "ReusedFailed" >> beam.Map(lambda _: decode.outcomes.REUSED),
    ]
    if dropped is not None:
        fates.append(dropped | "NearDuplicate" >> beam.Map(lambda _: decode.outcomes.NEAR_DUPLICATE))
    outcome_counts = (
        fates | "Outcomes" >> beam.Flatten() | "CountOutcomes" >> beam.combiners.Count.PerElement()
    )

    return (
        pipeline
        | "Finalize" >> beam.Create([None])
        | "WriteManifest"
        >> beam.Map(
            publish.finalize_dataset,
            config=config,
            run_id=beam.pvalue.AsSingleton(run_id),
            labels=beam.pvalue.AsSingleton(labels),
            stats=beam.pvalue.AsSingleton(stats),
            shards=beam.pvalue.AsList(shards),
            errors_log=beam.pvalue.AsSingleton(errors_log),
            outcome_counts=beam.pvalue.AsList(outcome_counts),
            source_image_sizes=beam.pvalue.AsSingleton(source_image_sizes),
            ledger_files=beam.pvalue.AsSingleton(ledger),
            moved=beam.pvalue.AsList(reused["moved"]),
            **near_duplicate_inputs,
        )
    )
