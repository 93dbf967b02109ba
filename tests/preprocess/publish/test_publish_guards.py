"""What stops a run from publishing, or from running on: too many failed inputs, and a newer run.

- `--max-failed-fraction`: a real stage 1 run over a CSV manifest half of whose files do not exist
  publishes nothing and fails with the failure counts by reason above the fraction; at it, it publishes.
- A superseded run stops early: a real stage 1 run into a directory whose published run started later
  stops before decoding anything, with one line naming both runs, and exits 0.
- The launcher reports its own run: a workflow whose stage 1 a newer run superseded after its switch
  says so instead of training on the newer run's dataset.
"""

import csv
import glob
import json
import re
import shutil

import pytest

from dataset_contract import commit_log
from dataset_contract import manifest as manifest_lib
from pipelines import workflow
from preprocess import errors
from preprocess.config import DEFAULT_MAX_FAILED_FRACTION
from preprocess.launch import command
from preprocess.publish import commit as publish
from preprocess.publish import protocol
from preprocess.publish.runs import is_run_id, new_run_id
from tests.stage1 import run_stage1, write_corpus

pytestmark = pytest.mark.slow

STAGE1_ARGS = ["--image-size", "16", "--encoding", "uint8", "--min-shards", "1"]


@pytest.fixture(scope="module")
def half_unreadable(tmp_path_factory):
    """A CSV manifest listing every file of a small corpus, and as many files that do not exist."""
    root = tmp_path_factory.mktemp("half-unreadable")
    corpus = write_corpus(root / "corpus", images_per_class=2, include_broken=False)
    rows = []
    for index, corpus_file in enumerate(corpus.files):
        label = corpus_file.path.split("/")[0]
        rows.append({"uri": corpus.uri(corpus_file), "label": label})
        rows.append({"uri": str(root / "gone" / f"{index}.png"), "label": label})
    path = root / "inputs.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["uri", "label"])
        writer.writeheader()
        writer.writerows(rows)
    return path, len(rows)


def test_a_run_whose_failed_inputs_exceed_the_max_fraction_publishes_nothing_and_says_why(
    half_unreadable, tmp_path, capsys
):
    inputs, num_rows = half_unreadable
    output = tmp_path / "dataset"
    assert DEFAULT_MAX_FAILED_FRACTION < 0.5
    with pytest.raises(SystemExit) as exited:
        command.main(["--input", str(inputs), "--output", str(output), *STAGE1_ARGS])
    # The input's fault, not the code's: a user's mistake, exit 2, the message on stderr.
    assert exited.value.code == 2
    message = capsys.readouterr().err
    # Stopped while decoding, once the failures seen made it certain (preprocess/decode/failure_budget.py).
    assert f"of the {num_rows} inputs found fail (certain)" in message
    assert f"--max-failed-fraction {DEFAULT_MAX_FAILED_FRACTION:g}" in message
    assert f"Failed before decoding: {errors.UNREADABLE} {num_rows // 2}" in message
    assert "raise --max-failed-fraction" in message or "higher --max-failed-fraction" in message
    assert not (output / manifest_lib.MANIFEST_FILE).exists()


def test_a_run_whose_failed_inputs_are_within_the_max_fraction_publishes(half_unreadable, tmp_path):
    inputs, num_rows = half_unreadable
    manifest = run_stage1(inputs, tmp_path / "dataset", "--max-failed-fraction", "0.5", image_size=16)
    assert manifest["inputs"]["num_found"] == num_rows
    assert manifest["inputs"]["failures_by_reason"] == {errors.UNREADABLE: num_rows // 2}


def test_a_run_that_a_newer_run_superseded_stops_before_decoding_says_so_in_one_line_and_exits_0(
    tmp_path, capsys
):
    corpus = write_corpus(tmp_path / "corpus", images_per_class=2, include_broken=False)
    output = tmp_path / "dataset"
    (output / manifest_lib.MANIFESTS_DIR).mkdir(parents=True)
    # A run that started after the one below (its id sorts later) has published.
    newer = new_run_id().replace(new_run_id()[:4], "2999", 1)
    (output / commit_log.commit_name(1)).write_text(json.dumps({"format_version": 2, "run": {"id": newer}}))
    command.main(["--input", corpus.root, "--output", str(output), *STAGE1_ARGS])  # no SystemExit: status 0
    message = capsys.readouterr().out.strip().splitlines()[-1]
    own = re.match(r"preprocess: run (\S+) is superseded: ", message)
    assert own and is_run_id(own.group(1)) and own.group(1) < newer, message
    assert message == f"preprocess: {publish.superseded_message(str(output), own.group(1), newer)}"
    # It stopped before decoding: not one shard written.
    assert glob.glob(str(output / "**" / "*.tfrecord"), recursive=True) == []
    assert publish.read_published_manifest(str(output))["run"]["id"] == newer


def test_the_workflow_does_not_train_on_the_dataset_of_a_newer_run_that_published_after_its_stage1(
    tmp_path, monkeypatch
):
    """Stage 1 publishes run A; before the workflow reads dataset.json, a newer run B publishes. The
    workflow says so, naming both runs, and does not train on B's dataset as if it were A's."""
    corpus = write_corpus(tmp_path / "corpus", images_per_class=2, include_broken=False)
    output = tmp_path / "dataset"
    newer = {}
    real_pause_point = protocol.pause_point

    def newer_run_publishes_once_a_has_switched(point, run_id):
        if point == "switched" and not newer:
            own = publish.read_published_manifest(str(output))
            newer_id = new_run_id().replace(new_run_id()[:4], "2999", 1)
            newer["id"], newer["own"] = newer_id, run_id
            shutil.copytree(output / own["run"]["dir"], output / manifest_lib.run_dir(newer_id))
            publish.publish_run(str(output), newer_id, json.loads(json.dumps(own).replace(run_id, newer_id)))
        real_pause_point(point, run_id)

    monkeypatch.setattr(protocol, "pause_point", newer_run_publishes_once_a_has_switched)
    argv = ["--input", corpus.root, "--output", str(output), *STAGE1_ARGS]
    with pytest.raises(workflow.WorkflowError) as raised:
        workflow.run_workflow(
            dataset_dir=str(output),
            preprocess_argv=argv,
            launch_training=lambda manifest: pytest.fail(f"trained on run {manifest['run']['id']}"),
        )
    message = str(raised.value)
    assert (
        f"run {newer['own']} published into {output}, but run {newer['id']}, which started later" in message
    )
    # A's files stay for the readers that opened its manifest (the retention period).
    assert (output / manifest_lib.run_dir(newer["own"])).is_dir()
