"""`python -m pipelines.dataflow` run again: stage 1 is skipped when the published dataset was built from the
same inputs and stage 1 flags (as pipelines.local does), and `--skip-preprocess` refuses stage 1 flags.

Real: the inputs and the dataset in the GCS emulator, the dataset written by the real stage 1 job (DirectRunner)
from those inputs with the flags pipelines.dataflow hands it, the workflow's check of it. Not reachable from
here, so replaced: Dataflow itself (`run_stage1` records that it was asked to run, and it must not be) and
the staging of the package (`build_package`). The relaunch of a running stage 1 job under another job
name, against a fake Dataflow API: tests/preprocess/test_dataflow_job.py.
"""

import pathlib
import uuid

import pytest
import tensorflow as tf

from pipelines import dataflow, workflow
from tests.stage1 import run_stage1, write_corpus

pytestmark = pytest.mark.slow  # a run of stage 1 on the GCS emulator


@pytest.fixture(scope="module")
def built(gcs_emulator, tmp_path_factory):
    """gs://.../raw (a small corpus) and gs://.../run/dataset built from it as pipelines.dataflow asks.

    Built once for the module (a real stage 1 run): the tests launch against it without changing it, or
    put back what they change."""
    corpus = tmp_path_factory.mktemp("relaunch") / "corpus"
    write_corpus(corpus, images_per_class=4, include_broken=False)
    gcs_dir = gcs_emulator.url(f"dataflow-relaunch-{uuid.uuid4().hex[:8]}")
    raw = f"{gcs_dir}/raw"
    for path in sorted(pathlib.Path(corpus).rglob("*")):
        if path.is_file():
            tf.io.gfile.copy(str(path), f"{raw}/{path.relative_to(corpus).as_posix()}")
    workdir = f"{gcs_dir}/run"
    # The stage 1 flags pipelines.dataflow gives for `--model small_cnn --image-size 32` (crop margin 0).
    run_stage1(
        raw, f"{workdir}/dataset", "--crop-margin", "0.0", image_size=32, encoding="uint8", min_shards=1
    )
    return raw, workdir


class Stage1Calls:
    """run_stage1 and the package staging replaced: Dataflow cannot be reached from here."""

    def __init__(self, monkeypatch):
        self.argvs = []
        self.packages = []
        monkeypatch.setattr(workflow, "run_stage1", self.run_stage1)
        monkeypatch.setattr(dataflow, "build_package", self.packages.append)

    def run_stage1(self, argv):
        self.argvs.append(argv)
        raise workflow.WorkflowError("stage 1 (preprocess) failed, so training will not start: not here")


def launch(raw, workdir, *extra):
    argv = ["--workdir", workdir, "--project", "p", "--region", "us-central1", "--tpu", "my-tpu",
            "--zone", "us-central1-a", "--accelerator-type", "v5litepod-8", "--model", "small_cnn",
            "--image-size", "32", *extra]  # fmt: skip
    return dataflow.main((["--input", raw] if raw else []) + argv)


def test_the_same_command_run_again_skips_stage_1_and_goes_on_to_training(built, monkeypatch, capsys):
    raw, workdir = built
    calls = Stage1Calls(monkeypatch)
    assert launch(raw, workdir) == 0
    out = capsys.readouterr().out
    assert calls.argvs == []  # no Dataflow job
    assert f"Stage 1 skipped: {workdir}/dataset" in out and "built from these inputs" in out
    assert "Dataset ready. Train on the TPU VM" in out and calls.packages


def test_other_stage_1_flags_or_a_changed_input_run_stage_1(built, monkeypatch, capsys):
    raw, workdir = built
    calls = Stage1Calls(monkeypatch)
    assert launch(raw, workdir, "--encoding", "jpeg") == 2
    assert len(calls.argvs) == 1 and calls.argvs[0][calls.argvs[0].index("--encoding") + 1] == "jpeg"
    first = sorted(tf.io.gfile.glob(f"{raw}/*/*"))[0]
    tf.io.gfile.copy(first, f"{first}.copy.png")  # a new input file
    try:
        assert launch(raw, workdir) == 2
    finally:
        tf.io.gfile.remove(f"{first}.copy.png")  # the module's inputs as built, for the tests after this one
    assert len(calls.argvs) == 2
    assert "Stage 1 skipped" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,named",
    [
        (["--encoding", "jpeg", "--crop-margin=0.1"], "--crop-margin, --encoding"),
        (["--input", "gs://b/raw", "--sdk_container_image", "img"], "--sdk_container_image"),
        (["--max_num_workers", "5"], "--max_num_workers"),
    ],
)
def test_stage_1_flags_with_skip_preprocess_are_refused(capsys, extra, named):
    code = launch(None, "gs://b/run", "--skip-preprocess", *extra)
    err = capsys.readouterr().err
    assert code == 2 and f"error: {named} given with --skip-preprocess" in err, err
    assert "Traceback" not in err


def test_skip_preprocess_needs_no_input_and_still_accepts_one(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(dataflow, "run_workflow", lambda **kwargs: ran.append(kwargs))
    for raw in (None, "gs://b/raw"):
        assert (
            launch(raw, "gs://b/run", "--skip-preprocess", "--dry-run", "--dry-run-dir", str(tmp_path)) == 0
        )
    assert ran == []  # a dry run builds descriptions only
