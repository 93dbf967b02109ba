"""Keep a spot TPU training: recreate it after each preemption, from your own machine, until training ends.

    python -m pipelines.tpu.restart --spec gs://BUCKET/run/jobs/train_tpu_vm.json [--poll-seconds 60]

(the spec `python -m pipelines.dataflow ... --tpu NAME --spot` wrote and
printed, or its --dry-run's local copy). A TPU Spot VM cannot be restarted
after a preemption: it must be deleted and created again, and the new VM has
a fresh disk (https://cloud.google.com/tpu/docs/spot). Nothing on the VM
survives to do that, so this loop runs off the VM, with your gcloud
credentials. Why not a queued resource instead: a preempted queued resource
is SUSPENDED, "no longer eligible for further allocation"
(https://cloud.google.com/tpu/docs/queued-resources), so it would need the
same delete-and-recreate loop, and plain `tpu-vm create` keeps one path for
spot and on-demand TPUs.

Each poll:
  - MODEL_DIR/metrics.json exists (python -m train writes it last): training
    finished; the loop ends (exit 0);
  - the TPU is PREEMPTED or TERMINATED: delete it, then run the spec's
    commands again (create, install, launch): training resumes from the last
    checkpoint in the model dir;
  - the TPU does not exist (deleted, or a recreation found no capacity): run
    the spec's commands;
  - anything else (READY, CREATING, REPAIRING, ...): wait.
A command that fails (no spot capacity in the zone) is tried again at the
next poll. Ctrl-C ends the loop and leaves the TPU as it is.
"""

import argparse
import json
import logging
import shlex
import subprocess
import sys
import time

from dataset_contract import manifest as manifest_lib

RECREATE_STATES = ("PREEMPTED", "TERMINATED")
NOT_FOUND = "NOT_FOUND"
METRICS_FILE = "metrics.json"  # train/trainer.py METRICS_FILE, without importing TensorFlow

log = logging.getLogger("pipelines.tpu.restart")


def read_spec(location: str) -> dict:
    if location.startswith("gs://"):
        text = _gcloud(["storage", "cat", location], check=True).stdout
    else:
        with open(location) as handle:
            text = handle.read()
    return json.loads(text)


def _gcloud(args: list[str], check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["gcloud", *args], capture_output=True, text=True, check=check)


def tpu_state(tpu: dict) -> str | None:
    """The TPU's state (READY, PREEMPTED, ...), NOT_FOUND, or None when gcloud could not tell."""
    result = _gcloud(
        ["compute", "tpus", "tpu-vm", "describe", tpu["name"], "--zone", tpu["zone"], "--project",
         tpu["project"], "--format=value(state)"]
    )  # fmt: skip
    if result.returncode == 0:
        return result.stdout.strip()
    if "NOT_FOUND" in result.stderr or "not found" in result.stderr.lower():
        return NOT_FOUND
    log.warning("gcloud could not describe TPU %s: %s", tpu["name"], result.stderr.strip())
    return None


def training_finished(model_dir: str) -> bool:
    return _gcloud(["storage", "ls", manifest_lib.join(model_dir, METRICS_FILE)]).returncode == 0


def delete_command(tpu: dict) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", "delete", tpu["name"], "--zone", tpu["zone"], "--project",
            tpu["project"], "--quiet"]  # fmt: skip


def recreate(spec: dict, delete_first: bool) -> bool:
    """Delete (if asked) and run the spec's commands in order; False at the first that fails."""
    commands = ([delete_command(spec["tpu"])] if delete_first else []) + [
        shlex.split(command) for command in spec["commands"]
    ]
    for argv in commands:
        log.info("running: %s", shlex.join(argv[:7]) + (" ..." if len(argv) > 7 else ""))
        result = subprocess.run(argv)
        if result.returncode != 0:
            log.warning("%s exited %d: trying again at the next poll", " ".join(argv[:6]), result.returncode)
            return False
    return True


def watch(spec: dict, poll_seconds: float, max_polls: int | None = None) -> int:
    """The loop (module docstring). Returns 0 when training finished; 1 when max_polls ran out."""
    tpu = spec["tpu"]
    polls = 0
    while max_polls is None or polls < max_polls:
        polls += 1
        if training_finished(spec["model_dir"]):
            log.info("training finished (%s exists): not watching %s any longer", METRICS_FILE, tpu["name"])
            return 0
        state = tpu_state(tpu)
        if state in RECREATE_STATES:
            log.warning("TPU %s is %s: deleting it and creating it again", tpu["name"], state)
            recreate(spec, delete_first=True)
        elif state == NOT_FOUND:
            log.warning("TPU %s does not exist: creating it", tpu["name"])
            recreate(spec, delete_first=False)
        else:
            log.info("TPU %s: %s", tpu["name"], state or "state unknown")
        time.sleep(poll_seconds)
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.tpu.restart",
        description="Recreate a preempted spot TPU from the training spec and relaunch training, until "
        "MODEL_DIR/metrics.json exists.",
    )
    parser.add_argument("--spec", required=True, help="train_tpu_vm.json, local or gs://.")
    parser.add_argument(
        "--poll-seconds", type=float, default=60.0, help="Seconds between checks (default %(default)s)."
    )
    parser.add_argument("--max-polls", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tpu_restart %(levelname)s %(message)s")
    try:
        spec = read_spec(args.spec)
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"error: cannot read the training spec {args.spec}: {exc}", file=sys.stderr)
        return 2
    if spec.get("kind") != "cloud-tpu-vm" or not spec.get("commands"):
        print(
            f"error: {args.spec} is not a training spec written by python -m pipelines.dataflow",
            file=sys.stderr,
        )
        return 2
    try:
        return watch(spec, args.poll_seconds, args.max_polls)
    except KeyboardInterrupt:
        log.warning("stopped; TPU %s left as it is", spec["tpu"]["name"])
        return 130


if __name__ == "__main__":
    sys.exit(main())
