"""`preprocess.verify` and `dataset_contract.verification`: a whole dataset passes; each kind of damage
fails, naming the shard and the problem."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from dataset_contract import features, verification
from dataset_contract import manifest as manifest_lib
from preprocess import verify as verify_cli
from tests.stage1 import run_stage1, write_corpus, write_published_manifest

pytestmark = pytest.mark.slow

SIZE = 16


@pytest.fixture(scope="module")
def written_dataset(tmp_path_factory):
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"), images_per_class=5)
    output = tmp_path_factory.mktemp("dataset")
    run_stage1(corpus.root, output, image_size=SIZE, encoding="float32", min_shards=2)
    return output


@pytest.fixture
def dataset(written_dataset, tmp_path):
    """A private copy that a test may damage."""
    copy = tmp_path / "dataset"
    shutil.copytree(written_dataset, copy)
    return copy


def load_manifest(data_dir) -> dict:
    return json.loads((data_dir / manifest_lib.MANIFEST_FILE).read_text())


def first_shard(data_dir, split=manifest_lib.TRAIN):
    return data_dir / load_manifest(data_dir)["splits"][split]["shards"][0]["path"]


def first_shard_not_of_train(data_dir):
    """A shard of the validation or test split (which of them has records depends on the split's keys)."""
    splits = load_manifest(data_dir)["splits"]
    split = next(split for split in (manifest_lib.VALIDATION, manifest_lib.TEST) if splits[split]["shards"])
    return first_shard(data_dir, split)


def problems_of(data_dir, **checks) -> set[tuple[str, str]]:
    checks = {"check_sha256": True, "check_records": True, **checks}
    problems = verification.verify_shards(str(data_dir), load_manifest(data_dir), **checks)
    return {(os.path.basename(problem.path), problem.kind) for problem in problems}


def run_cli(data_dir, capsys) -> tuple[int, str]:
    status = verify_cli.main([str(data_dir)])
    return status, capsys.readouterr().out


def record_bytes(serialized: bytes, tmp_path) -> bytes:
    """`serialized` framed as one TFRecord record (length, checksums), as TensorFlow writes it."""
    path = str(tmp_path / "one.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(serialized)
    with open(path, "rb") as handle:
        return handle.read()


def rewrite_shard(data_dir, shard_path, records: list[bytes], tmp_path, num_examples=None):
    """Replace a shard's records and re-list its size and sha256 (and count, if given) in the manifest."""
    path = str(tmp_path / "rewritten.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    shutil.copyfile(path, shard_path)
    data = shard_path.read_bytes()
    manifest = load_manifest(data_dir)
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            if shard["path"] == os.path.relpath(shard_path, data_dir):
                shard.update(num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
                if num_examples is not None:
                    shard["num_examples"] = num_examples
    write_published_manifest(data_dir, manifest)


def test_a_dataset_as_written_passes(dataset, capsys):
    assert problems_of(dataset) == set()
    status, out = run_cli(dataset, capsys)
    assert status == 0
    assert out.strip().splitlines()[-1].startswith("OK: every shard matches dataset.json")


def test_a_truncated_shard_fails_naming_it(dataset, capsys):
    shard = first_shard(dataset)
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 10)
    assert problems_of(dataset) == {
        (shard.name, verification.WRONG_SIZE),
        (shard.name, verification.CORRUPT_RECORDS),
    }
    status, out = run_cli(dataset, capsys)
    assert status == 1
    assert f"{shard}: " in out and "truncated" in out


def test_a_flipped_byte_fails_naming_it(dataset, capsys):
    shard = first_shard_not_of_train(dataset)
    content = bytearray(shard.read_bytes())
    content[len(content) // 2] ^= 0x01
    shard.write_bytes(bytes(content))
    assert problems_of(dataset) == {
        (shard.name, verification.WRONG_SHA256),
        (shard.name, verification.CORRUPT_RECORDS),
    }
    # Without the sha256, the record checksums alone find it.
    assert problems_of(dataset, check_sha256=False) == {(shard.name, verification.CORRUPT_RECORDS)}
    status, out = run_cli(dataset, capsys)
    assert status == 1
    assert f"BAD corrupt_records: {shard}: record " in out
    assert "fails its checksum (corrupted)" in out


def test_a_missing_shard_fails_naming_it(dataset, capsys):
    shard = first_shard(dataset)
    shard.unlink()
    assert problems_of(dataset) == {(shard.name, verification.MISSING)}
    status, out = run_cli(dataset, capsys)
    assert status == 1
    assert f"{shard}: listed in the published dataset but absent" in out


def test_an_extra_record_fails_on_the_record_count(dataset, tmp_path, capsys):
    shard = first_shard(dataset)
    records = list(verification.read_records(str(shard)))
    # Size and sha256 re-listed for the longer shard: only counting the records can tell.
    rewrite_shard(dataset, shard, [*records, records[0]], tmp_path)
    assert (shard.name, verification.WRONG_RECORD_COUNT) in problems_of(dataset)
    assert {kind for name, kind in problems_of(dataset) if name == shard.name} == {
        verification.WRONG_RECORD_COUNT
    }
    status, out = run_cli(dataset, capsys)
    assert status == 1
    assert f"{shard}: {len(records) + 1} records, but the published dataset says {len(records)}" in out
    # The split's examples per class no longer add up either; that is the manifest's line.
    assert "BAD wrong_class_counts" in out


def edited(record: bytes, edit) -> bytes:
    example = tf.train.Example.FromString(record)
    edit(example.features.feature)
    return example.SerializeToString()


def test_records_that_break_the_schema_the_image_or_the_label_fail(dataset, tmp_path, capsys):
    shard = first_shard(dataset)
    manifest = load_manifest(dataset)
    labels = manifest["labels"]
    records = list(verification.read_records(str(shard)))
    assert len(records) >= 5

    def wrong_label(feature):
        label = feature[features.LABEL].int64_list.value[0]
        feature[features.LABEL].int64_list.value[0] = (label + 1) % len(labels)

    def out_of_range_label(feature):
        feature[features.LABEL].int64_list.value[0] = len(labels)

    def nan_pixel(feature):
        values = np.frombuffer(feature[features.IMAGE].bytes_list.value[0], "<f4").copy()
        values[7] = np.nan
        feature[features.IMAGE].bytes_list.value[0] = values.tobytes()

    def short_image(feature):
        feature[features.IMAGE].bytes_list.value[0] = feature[features.IMAGE].bytes_list.value[0][:-4]

    def no_uri(feature):
        del feature[features.URI]

    broken = [wrong_label, out_of_range_label, nan_pixel, short_image, no_uri]
    records[: len(broken)] = [edited(record, edit) for record, edit in zip(records, broken, strict=False)]
    rewrite_shard(dataset, shard, records, tmp_path)

    assert {kind for name, kind in problems_of(dataset) if name == shard.name} == {
        verification.BAD_LABEL,
        verification.BAD_IMAGE,
        verification.BAD_EXAMPLE,
    }
    status, out = run_cli(dataset, capsys)
    assert status == 1
    assert "BAD bad_label" in out and "record 0: label" in out and "but class_name is" in out
    assert f"record 1: label {len(labels)} is outside [0, {len(labels)})" in out
    assert "record 2: image has 1 NaN or infinite values" in out
    assert f"record 3: image is {SIZE * SIZE * 3 * 4 - 4} bytes" in out
    assert "BAD bad_example" in out and "record 4:" in out


def test_a_jpeg_that_does_not_decode_fails(dataset, tmp_path):
    manifest = load_manifest(dataset)
    manifest["image"]["encoding"] = features.JPEG  # hold this float32 payload as a jpeg: it cannot decode
    write_published_manifest(dataset, manifest)
    problems = verification.verify_shards(
        str(dataset), manifest, splits=[manifest_lib.TRAIN], check_records=True
    )
    assert problems and {problem.kind for problem in problems} == {verification.BAD_IMAGE}
    assert "does not decode as jpeg" in problems[0].detail


def test_cli_refuses_a_directory_without_a_manifest(tmp_path, capsys):
    assert verify_cli.main([str(tmp_path)]) == 2
    assert "dataset.json: not found" in capsys.readouterr().err


def test_verify_reads_gs(written_dataset, gcs_dir, capsys):
    manifest = load_manifest(written_dataset)
    names = [manifest_lib.MANIFEST_FILE] + [
        s["path"] for info in manifest["splits"].values() for s in info["shards"]
    ]
    for path in written_dataset.rglob("*"):
        if path.is_file():
            tf.io.gfile.copy(str(path), f"{gcs_dir}/{path.relative_to(written_dataset)}")
    assert verify_cli.main([gcs_dir]) == 0
    tf.io.gfile.remove(f"{gcs_dir}/{names[1]}")
    assert verify_cli.main([gcs_dir]) == 1
    assert f"{gcs_dir}/{names[1]}: listed in the published dataset but absent" in capsys.readouterr().out


def test_a_missing_error_log_or_transform_graph_is_named(dataset, capsys):
    manifest = load_manifest(dataset)
    error_file = manifest["error_files"][0]["path"]
    os.remove(dataset / error_file)
    shutil.rmtree(dataset / manifest["transform"]["transform_fn"])
    status, out = run_cli(dataset, capsys)
    assert status == 1
    assert f"{dataset / error_file}: named in the published dataset but absent" in out
    assert (
        f"{dataset / manifest['transform']['transform_fn']}/saved_model.pb: named in the published dataset"
        in out
    )


def test_a_format_1_dataset_with_every_file_at_the_top_still_verifies(dataset, capsys):
    """The layout before runs/<run id>/: readers take both."""
    manifest = load_manifest(dataset)
    run_dir = dataset / manifest["run"]["dir"]
    for entry in os.listdir(run_dir):
        shutil.move(str(run_dir / entry), str(dataset / entry))
    shutil.rmtree(dataset / "runs")
    flat = json.loads(json.dumps(manifest).replace(manifest["run"]["dir"] + "/", ""))
    flat["format_version"] = 1
    del flat["run"]
    write_published_manifest(dataset, flat, older_layout=True)
    assert flat["splits"]["train"]["shards"][0]["path"].startswith("train-")
    status, out = run_cli(dataset, capsys)
    assert status == 0, out


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../elsewhere/train-00000-of-00001.tfrecord", "runs/./x.tfrecord", "gs://b/x"]
)
def test_a_shard_path_outside_the_dataset_directory_is_refused(dataset, capsys, path):
    manifest = load_manifest(dataset)
    manifest["splits"]["train"]["shards"][0]["path"] = path
    write_published_manifest(dataset, manifest)
    assert verify_cli.main([str(dataset)]) == 2
    assert f"shard path {path!r} must" in capsys.readouterr().err
