"""`python -m pipelines.local` end to end, and its refusal to train on a bad stage 1."""

import json
import os
import re
import shutil

import pytest
import tensorflow as tf

from pipelines import local
from tests.stage1 import read_manifest, remove_published_manifest, run_stage1, write_corpus

pytestmark = pytest.mark.slow


def _run_local(*argv):
    return local.main(list(argv))


def test_local_workflow_writes_a_dataset_a_model_and_an_export_that_agree(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", images_per_class=8, near_duplicates=True)
    workdir = tmp_path / "work"
    code = _run_local(
        "--input",
        corpus.root,
        "--workdir",
        str(workdir),
        "--image-size",
        "32",
        "--epochs",
        "1",
        "--global-batch-size",
        "8",
        "--workers",
        "2",
        "--max-failed-fraction",  # the sample corpus's six broken files are a tenth of it at this size
        "1",
    )
    assert code == 0
    manifest = read_manifest(workdir / "dataset")
    assert manifest["inputs"]["num_written"] == corpus.num_usable
    with open(workdir / "model" / "metrics.json") as handle:
        metrics = json.load(handle)
    assert metrics["data_dir"] == str(workdir / "dataset")
    assert metrics["validation"]["num_examples"] == manifest["splits"]["validation"]["num_examples"]
    serve = tf.saved_model.load(metrics["export_dir"]).signatures["serving_default"]
    source = corpus.uri(corpus.files_of_kind("good")[0])
    with open(source, "rb") as handle:
        outputs = serve(tf.constant([handle.read()]))
    assert outputs["probabilities"].shape == (1, len(manifest["labels"]))
    assert outputs["label"][0].numpy().decode() in manifest["labels"]
    printed = capsys.readouterr().out
    assert "validation accuracy" in printed
    assert "prediction by the exported model" in printed
    # The error log's path is whole, not relative to the dataset directory.
    assert re.search(rf"failures: (\d+ files, )?{re.escape(str(workdir / 'dataset'))}/runs/", printed), (
        printed
    )
    for reason in manifest["inputs"]["failures_by_reason"]:
        assert reason in printed
    # The altered copies the corpus plants are found, and the summary says where to look at them.
    groups = manifest["near_duplicates"]["groups"]
    assert groups >= 1, manifest["near_duplicates"]
    assert f"near-duplicates (keep, distance <= 8): {groups} group" in printed
    assert f"see them: python -m preprocess.inspect {workdir / 'dataset'} --report report.html" in printed


def test_workflow_does_not_train_when_stage1_fails(tmp_path, capsys):
    # Two classes of files named as images, none of them one: the checks before stage 1 pass, stage 1 fails.
    broken = tmp_path / "broken" / "cat"
    broken.mkdir(parents=True)
    (broken / "a.jpg").write_bytes(b"not an image")
    (broken / "b.png").write_bytes(b"")
    (broken.parent / "dog").mkdir()
    (broken.parent / "dog" / "c.jpg").write_bytes(b"not an image either")
    workdir = tmp_path / "work"
    code = _run_local(
        "--input", str(broken.parent), "--workdir", str(workdir), "--image-size", "16", "--workers", "1"
    )
    assert code == 2
    assert "stage 1 (preprocess) failed" in capsys.readouterr().err
    assert not (workdir / "model").exists()


@pytest.mark.parametrize("held", ["dataset_pin.json", "checkpoints"])
def test_workflow_refuses_before_stage1_a_model_dir_left_by_an_earlier_workflow(tmp_path, capsys, held):
    # A model dir resumes on the dataset run it started on (train/data/dataset_pin.py); a new stage 1 run would
    # publish another, which that model would never train on.
    workdir = tmp_path / "work"
    (workdir / "model").mkdir(parents=True)
    if held == "checkpoints":
        (workdir / "model" / held).mkdir()
    else:
        (workdir / "model" / held).write_text("{}")
    code = _run_local("--workdir", str(workdir), "--image-size", "16", "--sample-images-per-class", "2")
    assert code == 2
    error = capsys.readouterr().err
    assert "already holds a model" in error and held in error and "--skip-preprocess" in error
    assert not (workdir / "dataset").exists()  # refused before stage 1 spent anything


@pytest.fixture(scope="module")
def finished_dataset(tmp_path_factory):
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"), images_per_class=6, include_broken=False)
    dataset = tmp_path_factory.mktemp("dataset")
    run_stage1(corpus.root, dataset, image_size=16, min_shards=1)
    return dataset


@pytest.mark.parametrize("damage", ["no_manifest", "missing_shard", "resized_shard"])
def test_workflow_refuses_an_incomplete_dataset(finished_dataset, tmp_path, capsys, damage):
    workdir = tmp_path / "work"
    shutil.copytree(finished_dataset, workdir / "dataset")
    manifest = read_manifest(workdir / "dataset")
    shard = workdir / "dataset" / manifest["splits"]["validation"]["shards"][0]["path"]
    if damage == "no_manifest":
        remove_published_manifest(workdir / "dataset")
    elif damage == "missing_shard":
        os.remove(shard)
    else:
        with open(shard, "ab") as handle:
            handle.write(b"\0")
    code = _run_local(
        "--workdir", str(workdir), "--skip-preprocess", "--epochs", "1", "--global-batch-size", "4"
    )
    assert code == 2
    error = capsys.readouterr().err
    assert "stage 1 output is not a usable dataset" in error
    assert (shard.name if damage != "no_manifest" else "dataset.json") in error
    assert not (workdir / "model").exists()
