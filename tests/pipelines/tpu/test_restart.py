"""The off-VM loop that recreates a preempted spot TPU: real processes, a fake `gcloud` on PATH."""

import json
import os
import subprocess
import sys

from pipelines import dataflow
from pipelines.workflow import WorkflowPaths

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Records each call; `describe` answers the next line of STATES (READY once they run out; NOT_FOUND as
# gcloud reports a missing TPU); `create` fails once when CREATE_FAILS exists (no spot capacity); ssh (its
# --worker= recorded in SSH_WORKERS) fails once when SSH_FAILS exists (a new VM's first minute), else runs
# ON_SSH when it exists, else "finishes" training, so that the next poll finds metrics.json. `storage`
# commands work on GCS/BUCKET/OBJECT; `storage cat` of the status object answers a growing heartbeat when
# BEATING exists (a live supervisor). The alpha probe (`... create --help`) is not recorded; without alpha
# (NO_ALPHA) it fails as gcloud does unattended.
FAKE_GCLOUD = """#!/bin/sh
case "$*" in
  *--help*)
    if [ -e {d}/no_alpha ]; then
      echo "ERROR: (gcloud) This prompt could not be answered because you are not in an interactive session." >&2
      exit 1
    fi
    echo "  [--autocheckpoint-enabled]"; exit 0;;
esac
echo "$1 $2 $3 $4 $5" >> {d}/calls
case "$*" in
  "storage ls"*) test -e "{d}/gcs/${{3#gs://}}"; exit $?;;
  "storage cat"*supervisor.json)
    if [ -e {d}/beating ]; then echo x >> {d}/beats; echo "{{\"state\": \"running\", \"heartbeat\": $(wc -l < {d}/beats)}}"; exit 0; fi
    cat "{d}/gcs/${{3#gs://}}" 2>/dev/null; exit $?;;
  "storage cat"*) cat "{d}/gcs/${{3#gs://}}"; exit $?;;
  "storage cp"*) mkdir -p "$(dirname "{d}/gcs/${{4#gs://}}")" && cp "$3" "{d}/gcs/${{4#gs://}}"; exit $?;;
  *"tpu-vm describe"*)
    state=$(head -n 1 {d}/states); sed -i 1d {d}/states
    if [ "$state" = NOT_FOUND ]; then
      echo "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource was not found" >&2; exit 1
    fi
    echo "${{state:-READY}}";;
  *"tpu-vm create"*) printf '%s\\0' "$@" > {d}/create_argv
    if [ -e {d}/create_fails ]; then rm {d}/create_fails; echo "no capacity" >&2; exit 1; fi;;
  *"tpu-vm ssh"*)
    for word in "$@"; do case "$word" in --worker=*) echo "$word" >> {d}/ssh_workers;; esac; done
    if [ -e {d}/ssh_fails ]; then rm {d}/ssh_fails; echo "ssh: connect to host: Connection refused" >&2; exit 255; fi
    if [ -e {d}/on_ssh ]; then sh {d}/on_ssh; exit $?; fi
    mkdir -p {d}/gcs/b/run/model && touch {d}/gcs/b/run/model/metrics.json;;
esac
exit 0
"""


def spot_spec(tmp_path, accelerator_type="v5litepod-8"):
    args = dataflow.build_parser().parse_args(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central1",
         "--tpu", "my-tpu", "--zone", "us-central1-a", "--accelerator-type", accelerator_type, "--spot"]
    )  # fmt: skip
    path = tmp_path / "train_tpu_vm.json"
    path.write_text(json.dumps(dataflow.training_job_spec(args, WorkflowPaths(args.workdir))))
    return path


def fake_gcloud_env(tmp_path, states=(), *flags):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(FAKE_GCLOUD.format(d=tmp_path))
    (bin_dir / "gcloud").chmod(0o755)
    (tmp_path / "states").write_text("".join(f"{state}\n" for state in states))
    for flag in flags:  # create_fails, ssh_fails, beating, no_alpha
        (tmp_path / flag).touch()
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": REPO}


def run_loop(
    tmp_path, states, create_fails=False, *options, flags=(), max_polls=10, accelerator_type="v5litepod-8"
):
    env = fake_gcloud_env(tmp_path, states, *flags, *(["create_fails"] if create_fails else []))
    spec = spot_spec(tmp_path, accelerator_type)
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.tpu.restart", "--spec", str(spec), "--poll-seconds", "0",
         "--max-polls", str(max_polls), *options],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    text = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    calls = [line.split()[:4] for line in text.splitlines()]
    return result, calls, text


def verbs(text):
    """Each call's verb: the tpu-vm command (describe, create, ssh, ...) or the storage one (ls, cat)."""
    lines = [line.split() for line in text.splitlines()]
    return [words[words.index("tpu-vm") + 1] if "tpu-vm" in words else words[1] for words in lines]


STATUS = ["storage", "cat", "gs://b/run/model/supervisor.json"]  # the supervisor's status object, each poll


def test_a_preempted_spot_tpu_is_deleted_created_again_and_relaunched_then_the_loop_ends_when_training_ends(
    tmp_path,
):
    result, calls, text = run_loop(tmp_path, ["READY", "PREEMPTED"])
    assert result.returncode == 0, result.stderr
    assert calls == [
        ["storage", "ls", "gs://b/run/model/metrics.json"],
        STATUS,
        ["compute", "tpus", "tpu-vm", "describe"],  # READY: nothing to do
        ["storage", "ls", "gs://b/run/model/metrics.json"],
        STATUS,
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
    assert verbs(text) == [
        "ls",
        "cat",
        "describe",
        "create",
        "ls",
        "cat",
        "describe",
        "create",
        "ssh",
        "ls",
    ], text
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


DELETE = "gcloud compute tpus tpu-vm delete my-tpu --zone us-central1-a --project p --quiet"


def test_a_failed_ssh_after_a_create_is_run_again_on_the_ready_tpu_until_the_launch_succeeds(tmp_path):
    # Before, the READY TPU that followed meant "wait": its fresh disk had no start.sh, and nothing started.
    result, _, text = run_loop(tmp_path, ["NOT_FOUND", "READY"], flags=["ssh_fails"])
    assert result.returncode == 0, result.stderr
    assert verbs(text) == ["ls", "cat", "describe", "create", "ssh", "ls", "cat", "describe", "ssh", "ls"], (
        text
    )
    assert "READY and its last launch did not complete: launching again" in result.stderr
    # Finished: the TPU is still billed, and the loop says how to delete it.
    assert f"still exists and is billed until it is deleted: {DELETE}" in result.stderr


def test_a_ready_tpu_whose_supervisor_heartbeat_stops_changing_gets_the_launch_again(tmp_path):
    # No status object changes on the READY TPU (a launch that died, a fresh disk): after --heartbeat-timeout
    # the loop runs the install and launch again, never the create or a delete.
    result, _, text = run_loop(
        tmp_path, [], False, "--poll-seconds", "0.1", "--heartbeat-timeout", "0.5", max_polls=30
    )
    assert result.returncode == 0, result.stderr
    assert verbs(text).count("ssh") == 1 and "create" not in text and "delete" not in text, text
    assert "has not changed for" in result.stderr and "nothing supervises training there" in result.stderr


def test_a_supervisor_whose_heartbeat_grows_is_left_alone(tmp_path):
    # The first poll cannot see a change (the object may be an old run's): its three gcloud calls must fit in
    # --heartbeat-timeout however loaded the machine (0.5 s did not, once in 15 runs at load 13). The polls'
    # own sleeps (11 x 0.25 s) outlast the timeout, so a loop that missed the growing heartbeat would relaunch
    # before --max-polls ran out, on an idle machine too.
    result, _, text = run_loop(
        tmp_path,
        [],
        False,
        "--poll-seconds",
        "0.25",
        "--heartbeat-timeout",
        "2",
        flags=["beating"],
        max_polls=12,
    )
    assert result.returncode == 124, result.stderr  # --max-polls ran out: no decision to take
    assert "ssh" not in verbs(text) and "create" not in text, text


def test_a_supervisor_that_stopped_for_good_ends_the_loop_with_exit_1_and_the_delete_command(tmp_path):
    # The ssh launch runs the real supervisor (here, not detached) on a command that fails its setup; it writes
    # its status object through `gcloud storage cp`, which the loop reads at the next poll.
    (tmp_path / "on_ssh").write_text(
        f"{sys.executable} -m train.tools.supervisor --restart-delay 0 --status-uri gs://b/run/model/supervisor.json "
        f"-- {sys.executable} -c 'import sys; sys.exit(2)'\nexit 0\n"
    )
    result, _, text = run_loop(tmp_path, ["NOT_FOUND"])
    assert result.returncode == 1, result.stderr
    assert verbs(text)[:5] == ["ls", "cat", "describe", "create", "ssh"] and verbs(text)[-2:] == [
        "ls",
        "cat",
    ], text
    assert verbs(text).count("create") == 1 and verbs(text).count("ssh") == 1
    status = json.loads((tmp_path / "gcs" / "b" / "run" / "model" / "supervisor.json").read_text())
    assert (status["state"], status["detail"]) == ("stopped", "setup error (exit status 2)")
    assert "error: training on TPU my-tpu stopped for good: setup error (exit status 2)" in result.stderr
    assert DELETE in result.stderr and "Traceback" not in result.stderr


def test_without_gcloud_alpha_an_autocheckpoint_spec_is_refused_before_anything_is_created(tmp_path):
    result, _, text = run_loop(tmp_path, ["NOT_FOUND"], flags=["no_alpha"])
    assert result.returncode == 2 and text == "", result.stderr  # no call but the probe: nothing created
    assert "gcloud components install alpha" in result.stderr and "--autocheckpoint off" in result.stderr
    assert "Traceback" not in result.stderr


def test_on_a_slice_a_quiet_heartbeat_relaunches_worker_0_only_and_a_failed_launch_runs_the_whole_setup(
    tmp_path,
):
    # A v4-32: the setup (install, TPU servers restarted on every worker) is not rerun under a training whose
    # status merely went quiet; only worker 0's supervised launch (start.sh starts no second supervisor).
    # That one fails here (ssh_fails), so the next poll runs the setup on every worker and the launch.
    result, _, text = run_loop(
        tmp_path, [], False, "--poll-seconds", "0.1", "--heartbeat-timeout", "0.5", flags=["ssh_fails"],
        max_polls=30, accelerator_type="v4-32",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    workers = (tmp_path / "ssh_workers").read_text().split()
    assert workers == ["--worker=0", "--worker=all", "--worker=0"], workers
    assert "create" not in verbs(text) and "delete" not in verbs(text)


def test_the_old_command_name_pipelines_tpu_restart_still_runs_the_restart_loop():
    # docs/cloud.md showed `python -m pipelines.tpu_restart` before the move to pipelines/tpu/.
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.tpu_restart", "--help"],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "--spec" in result.stdout
