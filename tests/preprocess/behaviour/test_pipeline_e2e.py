"""The real stage 1 job on the DirectRunner, end to end, read back with plain tf.data."""

import collections
import csv
import hashlib
import json
import os
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
import tensorflow_transform as tft
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.transforms import environments

from dataset_contract import commit_log, verification
from dataset_contract import manifest as manifest_lib
from pipelines import sample_corpus
from preprocess import errors
from preprocess.decode.image import load_image
from preprocess.inputs.content import assign_split
from preprocess.inputs.reading import content_key
from preprocess.launch import local_runner
from preprocess.options import parse_args
from preprocess.pipeline import build_pipeline
from tests.stage1 import read_errors, read_manifest, read_split, run_stage1, write_corpus

pytestmark = pytest.mark.slow

SIZE = 32
MAX_PIXELS = 100_000_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), images_per_class=10)


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory):
    output = tmp_path_factory.mktemp("dataset")
    manifest = run_stage1(corpus.root, output, image_size=SIZE, encoding="float32", min_shards=2)
    return str(output), manifest


def _source_pixels(path):
    with open(path, "rb") as handle:
        return load_image(handle.read(), size=SIZE, method="crop", max_pixels=MAX_PIXELS).astype(np.float64)


def test_accounting_holds_and_matches_the_corpus(corpus, dataset):
    _, manifest = dataset
    inputs = manifest["inputs"]
    assert inputs["num_found"] == corpus.num_found
    assert inputs["num_duplicates"] == corpus.num_duplicates
    assert inputs["num_failed"] == corpus.num_failed
    assert inputs["num_written"] == corpus.num_usable
    assert inputs["num_found"] == inputs["num_written"] + inputs["num_failed"] + inputs["num_duplicates"]


def test_every_bad_file_is_in_the_error_files_once_with_its_reason(corpus, dataset):
    output, manifest = dataset
    read = read_errors(output)
    logged = {os.path.relpath(error["uri"], corpus.root): error for error in read}
    assert len(read) == len(logged) == sum(entry["num_errors"] for entry in manifest["error_files"])
    assert len(read) == manifest["inputs"]["num_failed"]
    assert {path: error["reason"] for path, error in logged.items()} == corpus.expected_errors
    assert all(error["detail"] for error in logged.values())
    assert manifest["inputs"]["failures_by_reason"] == dict(
        collections.Counter(corpus.expected_errors.values())
    )


def test_shards_hold_what_the_manifest_says(dataset):
    output, manifest = dataset
    for split, info in manifest["splits"].items():
        rows = read_split(output, split, manifest)
        assert len(rows) == info["num_examples"]
        counts = collections.Counter(row["class_name"] for row in rows)
        assert {name: counts.get(name, 0) for name in manifest["labels"]} == info["num_examples_per_class"]
        assert all(manifest["labels"][row["label"]] == row["class_name"] for row in rows)
        for shard in info["shards"]:
            with open(os.path.join(output, shard["path"]), "rb") as handle:
                data = handle.read()
            assert len(data) == shard["num_bytes"]
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        assert sum(shard["num_examples"] for shard in info["shards"]) == info["num_examples"]


def test_classes_are_mixed_within_a_shard(dataset):
    output, manifest = dataset
    first_shard = {**manifest, "splits": {"train": {"shards": manifest["splits"]["train"]["shards"][:1]}}}
    classes = [row["class_name"] for row in read_split(output, "train", first_shard)]
    runs = 1 + sum(1 for before, after in zip(classes, classes[1:], strict=False) if before != after)
    # Listed folder by folder, a shard would hold a few long runs of one class.
    assert runs > 2 * len(manifest["labels"]), classes


def test_labels_are_the_class_names_sorted(corpus, dataset):
    _, manifest = dataset
    assert manifest["labels"] == sorted(corpus.class_names)


def _near_duplicate_groups(output, manifest) -> list[dict]:
    groups = []
    for entry in manifest["near_duplicate_files"]:
        with open(os.path.join(output, entry["path"])) as handle:
            groups += [json.loads(line) for line in handle if line.strip()]
    return groups


def test_splits_follow_the_content_key_and_never_share_an_image(dataset):
    output, manifest = dataset
    # A near-duplicate group's members all take the split of its smallest key's member (--near-duplicates).
    split_of_uri = {}
    for group in _near_duplicate_groups(output, manifest):
        first_uri = group["uris"][group["sha256"].index(group["group"])]
        group_split = assign_split(content_key(first_uri)[0], manifest["split_fractions"])
        split_of_uri.update(dict.fromkeys(group["uris"], group_split))
    seen = {}
    for split in manifest_lib.SPLITS:
        for row in read_split(output, split, manifest):
            assert row["sha256"] not in seen
            seen[row["sha256"]] = split
            expected = split_of_uri.get(row["uri"]) or assign_split(
                content_key(row["uri"])[0], manifest["split_fractions"]
            )
            assert expected == split
            with open(row["uri"], "rb") as source:
                assert hashlib.sha256(source.read()).hexdigest() == row["sha256"]
    assert set(seen.values()) == set(manifest_lib.SPLITS)


def test_pixels_round_trip_and_normalization_uses_train_statistics(dataset):
    output, manifest = dataset
    mean = np.array(manifest["normalization"]["mean"])
    std = np.array(manifest["normalization"]["std"])
    train = read_split(output, "train", manifest)
    train_pixels = np.stack([_source_pixels(row["uri"]) for row in train])
    np.testing.assert_allclose(mean, train_pixels.mean(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(std, train_pixels.std(axis=(0, 1, 2)), rtol=1e-4)
    # Every split is normalized with the train statistics, including held-out images.
    for split in ("train", "validation"):
        for row in read_split(output, split, manifest)[:5]:
            restored = row["image"] * std + mean
            np.testing.assert_allclose(restored, _source_pixels(row["uri"]), atol=1e-3)


def test_transform_output_loads_with_tft(dataset):
    output, manifest = dataset
    transform_output = tft.TFTransformOutput(
        os.path.join(output, manifest_lib.transform_output_dir(manifest))
    )
    assert "image" in transform_output.transformed_feature_spec()
    assert transform_output.vocabulary_by_name("labels") == [label.encode() for label in manifest["labels"]]


def shard_paths(manifest) -> list[str]:
    return [shard["path"] for info in manifest["splits"].values() for shard in info["shards"]]


def _files_below(directory) -> set[str]:
    return {
        os.path.relpath(os.path.join(root, name), directory)
        for root, _, names in os.walk(directory)
        for name in names
    }


def test_nothing_but_the_dataset_is_left_in_the_directory(dataset):
    output, manifest = dataset
    run_dir = manifest["run"]["dir"]
    assert run_dir == f"runs/{manifest['run']['id']}"
    listed = {shard["path"] for info in manifest["splits"].values() for shard in info["shards"]}
    assert all(path.startswith(run_dir + "/") for path in listed)
    errors = manifest_lib.error_file_paths(manifest)
    assert errors and all(
        path.startswith(f"{run_dir}/errors-") and path.endswith(".jsonl") for path in errors
    )
    # Only the log (its one commit) and its copy at the top; the run's directory holds exactly what the
    # manifest names.
    assert set(os.listdir(output)) == {"dataset.json", "manifests", "runs"}
    assert os.listdir(os.path.join(output, "manifests")) == [commit_log.commit_name(1).split("/")[1]]
    assert os.listdir(os.path.join(output, "runs")) == [manifest["run"]["id"]]
    transform = {
        path
        for path in _files_below(output)
        if path.startswith((f"{run_dir}/transform_fn/", f"{run_dir}/transformed_metadata/"))
    }
    assert f"{run_dir}/transform_fn/saved_model.pb" in transform
    assert f"{run_dir}/transformed_metadata/schema.pbtxt" in transform
    near_duplicates = manifest_lib.near_duplicate_file_paths(manifest)
    assert all(path.startswith(f"{run_dir}/near-duplicates-") for path in near_duplicates)
    # The version's ledger (issue 32: what a re-run reuses), in the run's directory too.
    ledger = manifest_lib.ledger_file_paths(manifest)
    assert ledger and all(path.startswith(f"{run_dir}/ledger-") for path in ledger)
    assert (
        _files_below(output)
        == {
            "dataset.json",
            commit_log.commit_name(1),
            *errors,
            *near_duplicates,
            *ledger,
        }
        | listed
        | transform
    )


# bfloat16: normalized values within bfloat16's 8-bit mantissa; uint8: exact;
# jpeg (quality 90, 32x32 noisy images): a few levels on average.
@pytest.mark.parametrize(
    "encoding,mean_error,max_error", [("bfloat16", None, None), ("uint8", 0, 0), ("jpeg", 6, 80)]
)
def test_each_encoding_round_trips_within_its_precision(
    corpus, dataset, tmp_path, encoding, mean_error, max_error
):
    output = tmp_path / encoding
    manifest = run_stage1(corpus.root, output, image_size=SIZE, encoding=encoding, min_shards=1)
    # One pass (uint8, jpeg) or two (bfloat16, and the float32 `dataset`): the same images, labels
    # and statistics.
    _, reference = dataset
    assert manifest["labels"] == reference["labels"]
    assert manifest["inputs"] == reference["inputs"]
    for split in manifest_lib.SPLITS:
        assert (
            manifest["splits"][split]["num_examples_per_class"]
            == reference["splits"][split]["num_examples_per_class"]
        )
    np.testing.assert_allclose(
        manifest["normalization"]["mean"], reference["normalization"]["mean"], rtol=1e-6
    )
    np.testing.assert_allclose(manifest["normalization"]["std"], reference["normalization"]["std"], rtol=1e-6)
    mean = np.array(manifest["normalization"]["mean"])
    std = np.array(manifest["normalization"]["std"])
    rows = read_split(str(output), "validation", manifest)
    assert rows
    for row in rows:
        source = _source_pixels(row["uri"])
        if encoding == "bfloat16":
            normalized = (source - mean) / std
            np.testing.assert_allclose(row["image"], normalized, rtol=2**-8, atol=1e-6)
        else:
            assert np.abs(row["image"] - source).mean() <= mean_error
            assert np.abs(row["image"] - source).max() <= max_error


def test_csv_manifest_input_with_splits_and_unknown_labels(corpus, tmp_path):
    manifest_path = tmp_path / "labels.csv"
    sample_corpus.write_manifest_csv(corpus, str(manifest_path), with_split=True)
    with open(manifest_path, "a", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([corpus.uri(corpus.files[0]).replace("_0000", "_9999"), "circle", ""])  # no such file
        writer.writerow([corpus.uri(corpus.files[1]), "", ""])  # no label
    with open(manifest_path) as handle:
        rows = list(csv.DictReader(handle))
    named_splits = {row["uri"]: row["split"] for row in rows if row["split"]}
    labels = ",".join(sorted(set(corpus.class_names) - {"star"}))
    output = tmp_path / "dataset"
    manifest = run_stage1(manifest_path, output, "--labels", labels, image_size=16, min_shards=1)
    reasons = collections.Counter(error["reason"] for error in read_errors(output))
    assert reasons[errors.UNREADABLE] == 1
    assert reasons[errors.MISSING_LABEL] == 1
    assert reasons[errors.UNKNOWN_LABEL] == sum(1 for row in rows if row["label"] == "star")
    assert "star" not in manifest["labels"]
    inputs = manifest["inputs"]
    assert (
        inputs["num_found"]
        == len(rows)
        == inputs["num_written"] + inputs["num_failed"] + inputs["num_duplicates"]
    )
    for split in manifest_lib.SPLITS:
        for row in read_split(str(output), split, manifest):
            if row["uri"] in named_splits:
                assert named_splits[row["uri"]] == split
    assert json.loads(json.dumps(manifest))["source"]["kind"] == "csv"


# Runs a pipeline graph serialized by the test, in a fresh process: as Dataflow runs a template.
RUN_SERIALIZED_PIPELINE = """
import sys
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability import common_urns
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.transforms import environments
from apache_beam.portability.api import beam_runner_api_pb2
from preprocess.launch import local_runner
with open(sys.argv[1], "rb") as handle:
    proto = beam_runner_api_pb2.Pipeline.FromString(handle.read())
options = PipelineOptions([])
local_runner.fn_api_runner(options).run_via_runner_api(proto, options).wait_until_finish()
"""


def test_a_pipeline_built_once_and_run_twice_gets_its_run_id_and_files_at_each_run(corpus, tmp_path):
    """As two launches of one Dataflow template: the graph is built (and serialized) once, the run id is
    made by each run; the second run publishes its own files and removes the first's (no retention)."""
    output = tmp_path / "dataset"
    args, beam_args = parse_args(
        ["--input", corpus.root, "--output", str(output), "--image-size", "16", "--min-shards", "1"]
        # The corpus holds every kind of broken file, more than the default failure limit allows.
        + ["--retention-days", "0", "--max-failed-fraction", "1"]
    )
    options = PipelineOptions(beam_args)
    pipeline = beam.Pipeline(runner=local_runner.runner_for(options), options=options)
    build_pipeline(pipeline, args, build_id="one-build")
    graph = tmp_path / "pipeline.pb"
    graph.write_bytes(
        pipeline.to_runner_api(
            default_environment=environments.EmbeddedPythonEnvironment.default()
        ).SerializeToString()
    )
    runs = []
    for _ in range(2):
        subprocess.run([sys.executable, "-c", RUN_SERIALIZED_PIPELINE, str(graph)], check=True, timeout=900)
        runs.append(read_manifest(output))
    first, second = runs
    assert second["run"]["id"] > first["run"]["id"]
    assert not set(shard_paths(first)) & set(shard_paths(second))
    assert os.listdir(output / "runs") == [second["run"]["id"]]
    assert verification.verify_shards(str(output), second, check_sha256=True) == []


def _graph(encoding: str, tmp_path, *flags):
    args, beam_args = parse_args(
        ["--input", str(tmp_path), "--output", str(tmp_path / "out"), "--encoding", encoding, *flags]
    )
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    build_pipeline(pipeline, args, build_id="graph-only")
    return pipeline.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())


@pytest.fixture(scope="module")
def graph_of(tmp_path_factory):
    """graph_of(encoding, *flags) -> a copy of the graph stage 1 builds for those flags (not run).

    Built once per arguments for the module: building one (tf.Transform traces its functions) takes seconds,
    and several tests look at the same graph."""
    root = tmp_path_factory.mktemp("graphs")
    built = {}

    def graph(encoding: str, *flags):
        if (encoding, flags) not in built:
            built[encoding, flags] = _graph(encoding, root, *flags)
        copy = beam_runner_api_pb2.Pipeline()
        copy.CopyFrom(built[encoding, flags])
        return copy

    return graph


def _step_names(graph) -> set[str]:
    return {transform.unique_name for transform in graph.components.transforms.values()}


DECODE = "Decode/ParDo(DecodeImagesFn)"
NEAR_DUPLICATE_SPILL = "NearDuplicates/Spill/ParDo(SpillDecodedFn)"
NEAR_DUPLICATE_ROUTE = "NearDuplicates/Route"
WRITE_SHARD_FILES = "WriteShards/WriteFiles/ParDo(WriteShardFilesFn)"


@pytest.mark.parametrize(
    "encoding,mode,stages_together",
    [
        ("uint8", "off", [{DECODE, "Encode/ParDo(EncodeDecodedFn)", WRITE_SHARD_FILES}]),
        ("jpeg", "off", [{DECODE, "Encode/ParDo(EncodeDecodedFn)", WRITE_SHARD_FILES}]),
        ("bfloat16", "off", [{DECODE, "Spill[train]/WriteParts", "Spill[test]/WriteParts"}]),
        # With the near-duplicate audit: decoded pixels go to the audit's spill where they are decoded, and
        # from there, where each part is read back, to the shards (or the second pass's spill). In a first
        # run (nothing carried over) the grouping takes the signed images in that stage too.
        (
            "uint8",
            "keep",
            [
                {DECODE, NEAR_DUPLICATE_SPILL, "NearDuplicates/Group/BySignature"},
                {NEAR_DUPLICATE_ROUTE, "Encode/ParDo(EncodeDecodedFn)", WRITE_SHARD_FILES},
            ],
        ),
        (
            "bfloat16",
            "drop",
            [
                {DECODE, NEAR_DUPLICATE_SPILL},
                {NEAR_DUPLICATE_ROUTE, "Spill[train]/WriteParts", "Spill[test]/WriteParts"},
            ],
        ),
    ],
)
def test_no_decoded_image_crosses_a_stage_boundary(encoding, mode, stages_together, graph_of):
    """Decoded pixels go to disk (shards, or the spill) in the stage that decodes them, as the local runner
    fuses the graph: whatever crosses a stage boundary, it holds in memory."""
    _, stages = fn_runner.FnApiRunner().create_stages(graph_of(encoding, "--near-duplicates", mode))
    for together in stages_together:
        first = sorted(together)[0]
        (stage,) = [stage for stage in stages if first in {t.unique_name for t in stage.transforms}]
        assert together <= {transform.unique_name for transform in stage.transforms}


@pytest.mark.parametrize("encoding", ["uint8", "jpeg"])
def test_pixel_encodings_are_written_in_one_pass_without_a_spill_or_a_transform(encoding, graph_of):
    steps = _step_names(graph_of(encoding, "--near-duplicates", "off"))
    assert "Encode" in steps and "AnalyzeTrain" in steps and "WriteShards" in steps
    assert not {
        step for step in steps if step.startswith(("Spill[", "Transform[", "Encode[", "NearDuplicates"))
    }


def _shuffles_outside_the_audit(graph) -> set[str]:
    return {
        transform.unique_name
        for transform in graph.components.transforms.values()
        if transform.spec.urn == common_urns.primitives.GROUP_BY_KEY.urn
        and not transform.unique_name.startswith("NearDuplicates/")
    }


def test_near_duplicates_off_builds_no_audit_and_keep_is_the_default_with_no_shuffle_outside_it(graph_of):
    """The audit adds no shuffle outside its own steps: its groups' files are written by the error log's
    writer, not by one of their own (three shuffles and their stages per job: benchmarks/RESULTS.md, issue
    30's cost). (Without the audit the summary is a combine of its own, SummarizeUnique: with it, the
    grouping's counts give it.)"""
    off = graph_of("uint8", "--near-duplicates", "off")
    default = graph_of("uint8")  # no --near-duplicates flag
    assert not {step for step in _step_names(off) if "NearDuplicate" in step}
    default_steps = _step_names(default)
    assert {
        "NearDuplicates",
        "NearDuplicates/Spill",
        "NearDuplicates/Group",
        "GroupsToJson",
    } <= default_steps
    assert _shuffles_outside_the_audit(default) - _shuffles_outside_the_audit(off) == set()


def test_normalized_encodings_take_a_second_pass_through_the_spill_and_the_transform(graph_of):
    steps = _step_names(graph_of("bfloat16"))
    for split in manifest_lib.SPLITS:
        assert {f"Spill[{split}]", f"Transform[{split}]", f"Encode[{split}]"} <= steps
    assert "WriteShards" in steps  # one writer for every split


def test_uint8_is_the_default_encoding(tmp_path):
    args, _ = parse_args(["--input", str(tmp_path), "--output", str(tmp_path / "out")])
    assert args.encoding == "uint8"
