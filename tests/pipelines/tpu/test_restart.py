"""The off-VM loop that recreates a preempted spot TPU: real processes, a fake `gcloud` on PATH."""

import json
import os
import subprocess
import sys

from pipelines import dataflow
from pipelines.workflow import WorkflowPaths

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Records each call; `describe` answers the next line of STATES (READY once they run out; NOT_FOUND as
# gcloud reports a missing TPU); `create` fails once when CREATE_FAILS exists (no spot capacity); the
# launch over ssh "finishes" training, so that the next poll finds metrics.json.
FAKE_GCLOUD = """#!/bin/sh
echo "$1 $2 $3 $4 $5" >> {d}/calls
case "$*" in
  "storage ls"*) test -e {d}/finished; exit $?;;
  *"tpu-vm describe"*)
    state=$(head -n 1 {d}/states); sed -i 1d {d}/states
    if [ "$state" = NOT_FOUND ]; then
      echo "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource was not found" >&2; exit 1
    fi
    echo "${{state:-READY}}";;
  *"tpu-vm create"*) printf '%s\\0' "$@" > {d}/create_argv
    if [ -e {d}/create_fails ]; then rm {d}/create_fails; echo "no capacity" >&2; exit 1; fi;;
  *"tpu-vm ssh"*) touch {d}/finished;;
esac
exit 0
"""


def spot_spec(tmp_path):
    args = dataflow.build_parser().parse_args(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central1",
         "--tpu", "my-tpu", "--zone", "us-central1-a", "--accelerator-type", "v5litepod-8", "--spot"]
    )  # fmt: skip
    path = tmp_path / "train_tpu_vm.json"
    path.write_text(json.dumps(dataflow.training_job_spec(args, WorkflowPaths(args.workdir))))
    return path


def run_loop(tmp_path, states, create_fails=False):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD.format(d=tmp_path))
    (bin_dir / "gcloud").chmod(0o755)
    (tmp_path / "states").write_text("".join(f"{state}\n" for state in states))
    if create_fails:
        (tmp_path / "create_fails").touch()
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.tpu.restart", "--spec", str(spot_spec(tmp_path)), "--poll-seconds", "0",
         "--max-polls", "10"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": REPO},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    calls = [line.split()[:4] for line in (tmp_path / "calls").read_text().splitlines()]
    return result, calls, (tmp_path / "calls").read_text()


def test_a_preempted_spot_tpu_is_deleted_created_again_and_relaunched_then_the_loop_ends_when_training_ends(
    tmp_path,
):
    result, calls, text = run_loop(tmp_path, ["READY", "PREEMPTED"])
    assert result.returncode == 0, result.stderr
    assert calls == [
        ["storage", "ls", "gs://b/run/model/metrics.json"],
        ["compute", "tpus", "tpu-vm", "describe"],  # READY: nothing to do
        ["storage", "ls", "gs://b/run/model/metrics.json"],
        ["compute", "tpus", "tpu-vm", "describe"],  # PREEMPTED
        ["compute", "tpus", "tpu-vm", "delete"],
        ["alpha", "compute", "tpus", "tpu-vm"],  # create, with Autocheckpoint (v5e, single host)
        ["compute", "tpus", "tpu-vm", "ssh"],  # install and launch: training resumes from the model dir
        ["storage", "ls", "gs://b/run/model/metrics.json"],  # metrics.json: finished
    ], text
    create = (tmp_path / "create_argv").read_text().split("\0")
    assert "--spot" in create and "--autocheckpoint-enabled" in create and create[5] == "my-tpu"
    assert "PREEMPTED: deleting it and creating it again" in result.stderr


def test_a_missing_tpu_is_created_and_a_failed_create_is_tried_again_at_the_next_poll(tmp_path):
    result, calls, text = run_loop(tmp_path, ["NOT_FOUND", "NOT_FOUND"], create_fails=True)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in text.splitlines()]
    verbs = [words[words.index("tpu-vm") + 1] if "tpu-vm" in words else words[1] for words in lines]
    assert verbs == ["ls", "describe", "create", "ls", "describe", "create", "ssh", "ls"], text
    assert "delete" not in text and "trying again at the next poll" in result.stderr


def test_a_file_that_is_no_training_spec_is_refused_with_exit_2(tmp_path):
    (tmp_path / "other.json").write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.tpu.restart", "--spec", str(tmp_path / "other.json")],
        env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (
        result.returncode == 2 and "not a training spec" in result.stderr and "Traceback" not in result.stderr
    )
