"""Stage 1: the Beam job that writes a dataset directory from a corpus of images.

Locally (DirectRunner, one worker process per core):

    python -m preprocess --input images/ --output /tmp/dataset \\
        --direct_running_mode=multi_processing --direct_num_workers=2

On Dataflow (same code; the workers run the image built from the repository's
Dockerfile, or install the package from setup.py at boot with
`--setup_file ./setup.py` instead of `--sdk_container_image`):

    python -m preprocess --input gs://BUCKET/raw --output gs://BUCKET/dataset \\
        --runner DataflowRunner --project PROJECT --region REGION \\
        --temp_location gs://BUCKET/tmp \\
        --sdk_container_image REGION-docker.pkg.dev/PROJECT/REPOSITORY/tf-image-pipeline:TAG

Data flow: list inputs -> content key of each file (its size and first 16
KiB) -> split by key, dedup by key, and by full hash where keys are shared
(only keys, hashes and URIs are grouped; content.py) -> read each image whole,
once: hash, decode, orient, RGB, resize ->
then, for uint8 and jpeg (the default is uint8), one pass: each image is
encoded and its record appended to a shard file as it is decoded, while
tf.Transform's analysis takes the train split's decoded batches in the same
step; for bfloat16 and float32, whose records are normalized with the
statistics, the decoded batches are spilled to disk and read back through
tf.Transform's transform after the analysis -> shard files written once, in
place (the small remainders packed into shards) -> finalize (the manifest,
published by one atomic replacement of dataset.json). Every input that is
not written is an error record or a counted duplicate.

Each run writes its files once, under `runs/<run id>/` of the output
directory (its temporary files under `staging/<run id>/`); the run id is
made when the job runs, so every run of a Dataflow template has its own.
Publishing is crash-safe and retry-safe: preprocess/publish.py. Our flags:
`python -m preprocess --help`; all other flags go to Beam's PipelineOptions
untouched.
"""

import json
import logging
import os
import sys
import uuid

import apache_beam as beam
import tensorflow_transform.beam as tft_beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from preprocess import errors, filesystem, local_runner, outcomes, progress
from preprocess.content import DeduplicateByContent
from preprocess.decode_stage import DecodeImagesFn
from preprocess.decoded_cache import SpillAndReload
from preprocess.encode import EncodeDecodedFn, EncodeExamplesFn
from preprocess.finalize import finalize_dataset
from preprocess.inputs import ListInputs, input_kind
from preprocess.options import parse_args
from preprocess.publish import SupersededRunError
from preprocess.runs import STAGING_DIR, MakeRunId, tft_temp_dir
from preprocess.shards import WriteErrorLog, WriteShards
from preprocess.summary import format_summary, read_error_examples
from preprocess.transform import ToRecordBatches, make_preprocessing_fn, tensor_adapter_config
from preprocess.transform_output import WriteTransformOutput, read_label_vocabulary, read_normalization

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
    """The settings that go into the manifest (plain data, picklable to workers).

    `build_id` names this pipeline build's tf.Transform temporary directory
    (runs.tft_temp_dir): the one path chosen when the graph is built.
    """
    return {
        "build_id": build_id,
        "input": args.input,
        "input_kind": input_kind(args.input),
        "output": output_dir_of(args),
        "image_size": args.image_size,
        "crop_size": args.crop_size,
        "crop_margin": args.crop_margin,
        "resize_method": args.resize_method,
        "max_pixels": args.max_pixels,
        "max_file_bytes": args.max_file_bytes,
        "encoding": args.encoding,
        "jpeg_quality": args.jpeg_quality,
        "split_fractions": args.split,
    }


class SummarizeUniqueInputsFn(beam.CombineFn):
    """Unique inputs -> {"labels": the train split's sorted class names, "per_split": {split: inputs}}.

    One combine gives both things known before decoding: the label vocabulary
    (so that uint8 and jpeg records can be labelled as they are decoded) and
    the split sizes (to size the shard files). Its accumulator grows with the
    number of classes, not of images.
    """

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


def encode_in_one_pass(decoded, vocabulary, args):
    """uint8 and jpeg: records encoded as the images are decoded (preprocess/encode.py)."""
    return decoded | "Encode" >> beam.ParDo(
        EncodeDecodedFn(args.encoding, args.image_size, args.jpeg_quality),
        beam.pvalue.AsSingleton(vocabulary),
    ).with_outputs("errors", main="examples")


def encode_after_transform(decoded, run_transform_fn, args, output_dir, run_id):
    """bfloat16 and float32: the decoded batches are spilled, then transformed with the statistics."""
    adapter_config = tensor_adapter_config()
    by_split = decoded | "PartitionBySplit" >> beam.Partition(
        lambda example, _: manifest_lib.SPLITS.index(example["split"]), len(manifest_lib.SPLITS)
    )
    examples, errors_out = [], []
    for index, split in enumerate(manifest_lib.SPLITS):
        # Decoded once; the transform reads them back from disk (see decoded_cache.py).
        reloaded = (
            by_split[index]
            | f"ToRecordBatches[{split}]" >> ToRecordBatches(args.transform_batch_size)
            | f"Spill[{split}]" >> SpillAndReload(split, output_dir, run_id)
        )
        transformed, _ = ((reloaded, adapter_config), run_transform_fn) | f"Transform[{split}]" >> (
            tft_beam.TransformDataset(output_record_batches=True)
        )
        encoded = transformed | f"Encode[{split}]" >> beam.ParDo(
            EncodeExamplesFn(split, args.encoding, args.image_size, args.jpeg_quality)
        ).with_outputs("errors", main="examples")
        examples.append(encoded.examples)
        errors_out.append(encoded.errors)
    return (
        examples | "AllEncoded" >> beam.Flatten(),
        errors_out | "AllEncodeErrors" >> beam.Flatten(),
    )


def build_pipeline(pipeline: beam.Pipeline, args, build_id: str):
    """Adds the whole job to `pipeline`; returns the PCollection holding the manifest."""
    config = job_config(args, build_id)
    output_dir = config["output"]
    one_pass = args.encoding not in features.NORMALIZED_ENCODINGS
    # The runs of a template share this build's tf.Transform directory (runs.tft_temp_dir).
    template = bool(pipeline.options.view_as(GoogleCloudOptions).template_location)
    # Every path a run writes to below runs/ and staging/ is named by this id, a side input.
    run_id = pipeline | "RunId" >> MakeRunId(output_dir, build_id, shared_build=template)
    # Listed in parallel, spread over the workers and with the classes mixed (inputs.py).
    listed = pipeline | "ListInputs" >> ListInputs(args.input, args.labels)
    deduplicated = listed.records | "Deduplicate" >> DeduplicateByContent(args.split, args.max_file_bytes)
    unique = deduplicated["unique"]
    summary = unique | "SummarizeUnique" >> beam.CombineGlobally(SummarizeUniqueInputsFn())
    vocabulary = summary | "Vocabulary" >> beam.Map(lambda summary: summary["labels"])
    # Decoding, encoding and writing must run in one fused stage, so that no decoded image ever
    # crosses a stage boundary (the local runner would hold every one in memory). The encoder's side
    # inputs (the vocabulary, the split sizes) are computed from `unique`, so a stage that made
    # `unique` could not also wait for them: the runner would split decode from encode. The reshuffle
    # (of small metadata) ends the deduplication's stage here; it also spreads the decoding evenly.
    decoded = (
        unique
        | "SpreadDecoding" >> beam.Reshuffle()
        | "Decode"
        >> beam.ParDo(
            DecodeImagesFn(args.image_size, args.resize_method, args.max_pixels, args.max_file_bytes)
        ).with_outputs("errors", main="examples")
    )
    error_collections = [listed.errors, deduplicated["errors"], decoded.errors]

    with tft_beam.Context(temp_dir=tft_temp_dir(output_dir, build_id)):
        # The analysis consumes the train split's batches as they are decoded, in the same stage.
        transform_fn = (
            decoded.examples
            | "TrainExamples" >> beam.Filter(lambda example: example["split"] == manifest_lib.TRAIN)
            | "TrainBatches" >> ToRecordBatches(args.transform_batch_size),
            tensor_adapter_config(),
        ) | "AnalyzeTrain" >> tft_beam.AnalyzeDataset(make_preprocessing_fn(args.image_size, args.encoding))
        transform_written = transform_fn | "WriteTransformOutput" >> WriteTransformOutput(output_dir, run_id)
        if one_pass:
            encoded = encode_in_one_pass(decoded.examples, vocabulary, args)
            encoded_examples, encode_errors = encoded.examples, encoded.errors
            labels = vocabulary
        else:
            # The transform loads the graph from the run's copy (written once, where it stays).
            encoded_examples, encode_errors = encode_after_transform(
                decoded.examples, (transform_written, transform_fn[1]), args, output_dir, run_id
            )
            labels = transform_written | "ReadVocabulary" >> beam.Map(read_label_vocabulary)
    error_collections.append(encode_errors)
    stats = transform_written | "ReadNormalization" >> beam.Map(
        read_normalization, image_size=args.image_size
    )

    shards = (
        encoded_examples
        | "Records" >> beam.MapTuple(lambda split, record, _: (split, record))
        | "WriteShards"
        >> WriteShards(
            output_dir,
            args.shard_size_mb * 1_000_000,
            args.min_shards,
            summary
            | "EstimatedSplitBytes"
            >> beam.Map(estimated_split_bytes, estimated_record_bytes(args.encoding, args.image_size)),
            run_id,
        )
    )

    all_errors = error_collections | "AllErrors" >> beam.Flatten()
    errors_log = (
        all_errors
        | "ErrorsToJson" >> beam.Map(lambda error: errors.ErrorRecord.to_json(error).encode("utf-8"))
        | "WriteErrors" >> WriteErrorLog(output_dir, run_id)
    )
    # Every input's fate, counted in one combine (each global count would add its own stages).
    outcome_counts = (
        (
            listed.records | "Listed" >> beam.Map(lambda _: outcomes.FOUND),
            listed.errors | "ListingError" >> beam.Map(lambda _: outcomes.FOUND),
            deduplicated["duplicates"] | "Duplicate" >> beam.Map(lambda _: outcomes.DUPLICATE),
            all_errors | "Failed" >> beam.Map(outcomes.failed),
            encoded_examples
            | "Written" >> beam.MapTuple(lambda split, _, class_name: outcomes.written(split, class_name)),
        )
        | "Outcomes" >> beam.Flatten()
        | "CountOutcomes" >> beam.combiners.Count.PerElement()
    )

    return (
        pipeline
        | "Finalize" >> beam.Create([None])
        | "WriteManifest"
        >> beam.Map(
            finalize_dataset,
            config=config,
            run_id=beam.pvalue.AsSingleton(run_id),
            labels=beam.pvalue.AsSingleton(labels),
            stats=beam.pvalue.AsSingleton(stats),
            shards=beam.pvalue.AsList(shards),
            errors_log=beam.pvalue.AsSingleton(errors_log),
            outcome_counts=beam.pvalue.AsList(outcome_counts),
        )
    )


def read_manifest(output_dir: str) -> dict:
    with FileSystems.open(manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)) as handle:
        return json.loads(handle.read().decode("utf-8"))


def run(argv=None) -> dict | None:
    """Runs the job and waits for it; returns the manifest (None if the runner did not run it)."""
    args, beam_args = parse_args(argv)
    output_dir = output_dir_of(args)
    build_id = uuid.uuid4().hex[:12]
    options = PipelineOptions(beam_args)
    local_runner.run_small_jobs_in_process(options, args.input, args.in_process_below)
    pipeline = beam.Pipeline(runner=local_runner.runner_for(options), options=options)
    build_pipeline(pipeline, args, build_id)
    # Dataflow has its own monitoring UI; a local run prints a progress line every few seconds.
    with progress.ProgressReporter(enabled=progress.runs_locally(options)):
        result = pipeline.run()
        state = result.wait_until_finish()
    if not options.view_as(GoogleCloudOptions).template_location:
        # This build's tf.Transform directory served this one run, which has
        # ended (tf.Transform may write into it until the very end). A
        # template's is shared by its runs: publish.py removes it once idle.
        filesystem.delete_tree(tft_temp_dir(output_dir, build_id))
        filesystem.remove_empty_directory(manifest_lib.join(output_dir, STAGING_DIR))
    if not FileSystems.exists(manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)):
        logging.info(
            "pipeline finished in state %s without writing a manifest (a template or dry run?)", state
        )
        return None
    return read_manifest(output_dir)


def main(argv=None):
    logging.getLogger().setLevel(logging.INFO)
    try:
        manifest = run(sys.argv[1:] if argv is None else argv)
    except SupersededRunError as exc:
        # Not a failure of this run's data: another run's dataset is there, complete.
        sys.exit(f"preprocess: {exc}")
    if manifest is not None:
        args, _ = parse_args(sys.argv[1:] if argv is None else argv)
        output_dir = args.output.rstrip("/")
        print(format_summary(manifest, output_dir, read_error_examples(output_dir, manifest)))
