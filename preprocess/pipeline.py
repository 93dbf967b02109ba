"""Stage 1: the Beam job that writes a dataset directory from a corpus of images.

Locally (DirectRunner, one worker process per core):

    python -m preprocess --input images/ --output /tmp/dataset \\
        --direct_running_mode=multi_processing --direct_num_workers=2

On Dataflow (same code; the package is installed on the workers from setup.py):

    python -m preprocess --input gs://BUCKET/raw --output gs://BUCKET/dataset \\
        --runner DataflowRunner --project PROJECT --region REGION \\
        --temp_location gs://BUCKET/tmp --setup_file ./setup.py

Data flow: list inputs -> hash file bytes -> dedup by hash (only hashes and
URIs are grouped) -> split by hash -> read, decode, orient, RGB, resize ->
Arrow record batches -> tf.Transform (analyze on train as the batches are
decoded; transform all splits, read back from a spill on disk so that memory
does not grow with the corpus) -> encode -> shard parts -> shards packed by bytes -> finalize (move into
place, manifest last). Every input that is not written is an error record or
a counted duplicate. Our flags: `python -m preprocess --help`; all other flags
go to Beam's PipelineOptions untouched.
"""

import json
import logging
import sys
import uuid

import apache_beam as beam
import tensorflow_transform.beam as tft_beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import errors, local_runner, progress
from preprocess.content import DeduplicateByContent
from preprocess.decode_stage import DecodeImagesFn
from preprocess.decoded_cache import SpillAndReload
from preprocess.encode import EncodeExamplesFn
from preprocess.finalize import delete_tree, finalize_dataset
from preprocess.inputs import ListInputs, input_kind
from preprocess.options import parse_args
from preprocess.shards import WriteShards
from preprocess.summary import format_summary, read_error_examples
from preprocess.transform import ToRecordBatches, make_preprocessing_fn, tensor_adapter_config

# Per-record framing and metadata features around the image payload (sha256,
# uri, class name, proto overhead): used only to size shard parts.
_RECORD_OVERHEAD_BYTES = 400
# A 224x224 JPEG at quality 90 is about a sixth of its raw pixels; an estimate
# for sizing parts only (shards are packed by the bytes actually written).
_JPEG_COMPRESSION_ESTIMATE = 6


def estimated_record_bytes(encoding: str, image_size: int) -> int:
    raw = features.raw_bytes_per_image(encoding, image_size, image_size)
    if raw is None:
        raw = image_size * image_size * features.CHANNELS // _JPEG_COMPRESSION_ESTIMATE
    return raw + _RECORD_OVERHEAD_BYTES


def job_config(args) -> dict:
    """The settings that go into the manifest (plain data, picklable to workers)."""
    return {
        "input": args.input,
        "input_kind": input_kind(args.input),
        "output": args.output.rstrip("/"),
        "image_size": args.image_size,
        "crop_size": args.crop_size,
        "crop_margin": args.crop_margin,
        "resize_method": args.resize_method,
        "encoding": args.encoding,
        "jpeg_quality": args.jpeg_quality,
        "split_fractions": args.split,
    }


def build_pipeline(pipeline: beam.Pipeline, args, staging_dir: str):
    """Adds the whole job to `pipeline`; returns the PCollection holding the manifest."""
    config = job_config(args)
    listed = pipeline | "ListInputs" >> ListInputs(args.input, args.labels)
    # The listing is one element's FlatMap: without a reshuffle a distributed
    # runner would hash and decode the whole corpus on one worker.
    records = listed.records | "SpreadInputs" >> beam.Reshuffle()
    deduplicated = records | "Deduplicate" >> DeduplicateByContent(args.split)
    decoded = deduplicated["unique"] | "Decode" >> beam.ParDo(
        DecodeImagesFn(args.image_size, args.resize_method, args.max_pixels)
    ).with_outputs("errors", main="examples")
    by_split = decoded.examples | "PartitionBySplit" >> beam.Partition(
        lambda example, _: manifest_lib.SPLITS.index(example["split"]), len(manifest_lib.SPLITS)
    )

    adapter_config = tensor_adapter_config()
    preprocessing_fn = make_preprocessing_fn(args.image_size, args.encoding)
    record_bytes = estimated_record_bytes(args.encoding, args.image_size)
    shard_size_bytes = args.shard_size_mb * 1_000_000
    error_collections = [listed.errors, deduplicated["errors"], decoded.errors]
    shard_collections, class_count_collections, stats_collections = [], [], []

    with tft_beam.Context(temp_dir=manifest_lib.join(staging_dir, "tft")):
        batches = {
            split: by_split[index] | f"ToRecordBatches[{split}]" >> ToRecordBatches(args.transform_batch_size)
            for index, split in enumerate(manifest_lib.SPLITS)
        }
        transform_fn = (
            batches[manifest_lib.TRAIN],
            adapter_config,
        ) | "AnalyzeTrain" >> tft_beam.AnalyzeDataset(preprocessing_fn)
        transform_written = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(staging_dir)
        decoded_dir = manifest_lib.join(staging_dir, "decoded")
        for index, split in enumerate(manifest_lib.SPLITS):
            # Decoded once; the analysis consumes the batches as they are made,
            # the transform reads them back from disk (see decoded_cache.py).
            reloaded = batches[split] | f"Spill[{split}]" >> SpillAndReload(split, decoded_dir)
            transformed, _ = ((reloaded, adapter_config), transform_fn) | f"Transform[{split}]" >> (
                tft_beam.TransformDataset(output_record_batches=True)
            )
            encoded = transformed | f"Encode[{split}]" >> beam.ParDo(
                EncodeExamplesFn(split, args.encoding, args.image_size, args.jpeg_quality)
            ).with_outputs("errors", "stats", main="examples")
            error_collections.append(encoded.errors)
            stats_collections.append(encoded.stats)
            class_count_collections.append(
                encoded.examples
                | f"ClassOf[{split}]" >> beam.Map(lambda example, split=split: (split, example[1]))
                | f"CountClasses[{split}]" >> beam.combiners.Count.PerElement()
            )
            estimated_bytes = (
                by_split[index]
                | f"Count[{split}]" >> beam.combiners.Count.Globally()
                | f"EstimateBytes[{split}]" >> beam.Map(lambda count: count * record_bytes)
            )
            shard_collections.append(
                encoded.examples
                | f"Records[{split}]" >> beam.Map(lambda example: example[0])
                | f"WriteShards[{split}]"
                >> WriteShards(split, staging_dir, shard_size_bytes, args.min_shards, estimated_bytes)
            )

    all_errors = error_collections | "AllErrors" >> beam.Flatten()
    errors_written = (
        all_errors
        | "ErrorsToJson" >> beam.Map(errors.ErrorRecord.to_json)
        | "WriteErrors"
        >> beam.io.WriteToText(
            manifest_lib.join(staging_dir, manifest_lib.ERRORS_FILE), shard_name_template="", num_shards=1
        )
    )
    failures = (
        all_errors
        | "Reasons" >> beam.Map(lambda error: error.reason)
        | "CountReasons" >> beam.combiners.Count.PerElement()
    )
    num_listed = listed.records | "CountListed" >> beam.combiners.Count.Globally()
    num_listing_errors = listed.errors | "CountListingErrors" >> beam.combiners.Count.Globally()
    num_found = (
        (num_listed, num_listing_errors)
        | "FoundParts" >> beam.Flatten()
        | "Found" >> beam.CombineGlobally(sum)
    )
    num_duplicates = deduplicated["duplicates"] | "CountDuplicates" >> beam.combiners.Count.Globally()
    stats = stats_collections | "AllStats" >> beam.Flatten() | "DistinctStats" >> beam.Distinct()

    return (
        pipeline
        | "Finalize" >> beam.Create([None])
        | "WriteManifest"
        >> beam.Map(
            finalize_dataset,
            config=config,
            staging_dir=staging_dir,
            shards=beam.pvalue.AsList(shard_collections | "AllShards" >> beam.Flatten()),
            class_counts=beam.pvalue.AsList(class_count_collections | "AllClassCounts" >> beam.Flatten()),
            stats=beam.pvalue.AsList(stats),
            num_found=beam.pvalue.AsSingleton(num_found),
            failures=beam.pvalue.AsList(failures),
            num_duplicates=beam.pvalue.AsSingleton(num_duplicates),
            errors_files=beam.pvalue.AsList(errors_written),
            transform_written=beam.pvalue.AsList(transform_written),
        )
    )


def read_manifest(output_dir: str) -> dict:
    with FileSystems.open(manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def run(argv=None) -> dict | None:
    """Runs the job and waits for it; returns the manifest (None if the runner did not run it)."""
    args, beam_args = parse_args(argv)
    output_dir = args.output.rstrip("/")
    staging_dir = manifest_lib.join(output_dir, f".staging-{uuid.uuid4().hex[:12]}")
    options = PipelineOptions(beam_args)
    pipeline = beam.Pipeline(runner=local_runner.runner_for(options), options=options)
    build_pipeline(pipeline, args, staging_dir)
    # Dataflow has its own monitoring UI; a local run prints a progress line every few seconds.
    with progress.ProgressReporter(enabled=progress.runs_locally(options)):
        result = pipeline.run()
        state = result.wait_until_finish()
    # tf.Transform may still write temporary files after the finalize step
    # has cleaned up staging; whatever is left goes now.
    delete_tree(staging_dir)
    if not FileSystems.exists(manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)):
        logging.info(
            "pipeline finished in state %s without writing a manifest (a template or dry run?)", state
        )
        return None
    return read_manifest(output_dir)


def main(argv=None):
    logging.getLogger().setLevel(logging.INFO)
    manifest = run(sys.argv[1:] if argv is None else argv)
    if manifest is not None:
        args, _ = parse_args(sys.argv[1:] if argv is None else argv)
        output_dir = args.output.rstrip("/")
        print(format_summary(manifest, output_dir, read_error_examples(output_dir, manifest)))
