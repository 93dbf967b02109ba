"""Keep a TPU training until it ends: relaunch it, recreate a preempted spot TPU, from your own machine.

    python -m pipelines.tpu.restart --spec gs://BUCKET/run/jobs/train_tpu_vm.json [--poll-seconds 60]

What the loop does at each state of the TPU, and why it runs off the VM: docs/internals.md.
"""

import argparse
import json
import logging
import shlex
import subprocess
import sys
import time

from dataset_contract import manifest as manifest_lib
from pipelines.tpu import lifecycle as tpu_lifecycle
from train.tools import run_status

RECREATE_STATES = ("PREEMPTED", "TERMINATED")
NOT_FOUND = "NOT_FOUND"
READY = "READY"
METRICS_FILE = "metrics.json"  # train/trainer.py METRICS_FILE, without importing TensorFlow
TRAINING_FINISHED, STOPPED_FOR_GOOD, POLLS_RAN_OUT = 0, 1, 124

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


def launch_commands(spec: dict) -> list[str]:
    """The spec's commands after the create: install (and a slice's servers), then the supervised launch."""
    return [command for command in spec["commands"] if "tpu-vm create " not in " ".join(shlex.split(command))]


def run_commands(argvs: list[list[str]]) -> bool:
    """Run each command in order; False at the first that fails."""
    for argv in argvs:
        log.info("running: %s", shlex.join(argv[:7]) + (" ..." if len(argv) > 7 else ""))
        result = subprocess.run(argv)
        if result.returncode != 0:
            log.warning("%s exited %d: trying again at the next poll", " ".join(argv[:6]), result.returncode)
            return False
    return True


def recreate(spec: dict, delete_first: bool) -> bool:
    """Delete (if asked) and run the spec's commands in order; False at the first that fails."""
    commands = ([delete_command(spec["tpu"])] if delete_first else []) + [
        shlex.split(command) for command in spec["commands"]
    ]
    return run_commands(commands)


def relaunch(spec: dict, setup: bool) -> bool:
    """On a TPU that exists: the launch commands again, all of them with `setup`, else only the supervised
    launch (never a slice's TPU servers under a training that merely went quiet)."""
    commands = launch_commands(spec)
    return run_commands([shlex.split(command) for command in (commands if setup else commands[-1:])])


class Heartbeat:
    """Whether the supervisor's status object changes: the loop's own clock, never the VM's (they may differ)."""

    def __init__(self, timeout: float, clock=time.monotonic):
        self.timeout = timeout
        self.clock = clock
        self.text: str | None = None
        self.seen = False
        self.changed_at = clock()

    def observe(self, text: str | None) -> None:
        """The object's text at this poll. The first one is no sign of life: it may be an old run's."""
        if self.seen and text != self.text:
            self.changed_at = self.clock()
        self.text, self.seen = text, True

    def restart_clock(self) -> None:
        """A launch just ran, or the TPU was not READY: the supervisor gets --heartbeat-timeout from now."""
        self.changed_at = self.clock()

    def silent_for(self) -> float:
        return self.clock() - self.changed_at

    def stale(self) -> bool:
        return self.silent_for() > self.timeout


def _tell_delete(tpu: dict) -> str:
    return (
        f"TPU {tpu['name']} still exists and is billed until it is deleted: {shlex.join(delete_command(tpu))}"
    )


def watch(
    spec: dict, poll_seconds: float, max_polls: int | None = None, heartbeat_timeout: float = 900.0
) -> int:
    """The loop (docs/internals.md). 0: training finished; 1: it stopped for good; 124: max_polls ran out."""
    tpu = spec["tpu"]
    status_uri = run_status.status_uri(spec["model_dir"])
    heartbeat = Heartbeat(heartbeat_timeout)
    launch_pending = False  # the TPU exists, but the launch on it did not complete
    polls = 0
    while max_polls is None or polls < max_polls:
        polls += 1
        if training_finished(spec["model_dir"]):
            log.info("training finished (%s exists): not watching %s any longer", METRICS_FILE, tpu["name"])
            print(_tell_delete(tpu), file=sys.stderr)
            return TRAINING_FINISHED
        text = run_status.read_status_text(status_uri)
        heartbeat.observe(text)
        status = run_status.parse_status(text) or {}
        if status.get("state") == run_status.STOPPED:
            if status.get("status") == 0:
                log.info("training finished (%s): not watching %s any longer", status_uri, tpu["name"])
                print(_tell_delete(tpu), file=sys.stderr)
                return TRAINING_FINISHED
            print(
                f"error: training on TPU {tpu['name']} stopped for good: {status.get('detail')} ({status_uri}; "
                f"the log: ~/tf-image-pipeline/train.log on the VM, worker 0 of a slice). Nothing restarts it; "
                f"fix the cause and launch again (the spec's last command), or stop paying for the TPU. "
                + _tell_delete(tpu),
                file=sys.stderr,
            )
            return STOPPED_FOR_GOOD
        state = tpu_state(tpu)
        if state in RECREATE_STATES:
            log.warning("TPU %s is %s: deleting it and creating it again", tpu["name"], state)
            launch_pending = not recreate(spec, delete_first=True)
            heartbeat.restart_clock()
        elif state == NOT_FOUND:
            log.warning("TPU %s does not exist: creating it", tpu["name"])
            launch_pending = not recreate(spec, delete_first=False)
            heartbeat.restart_clock()
        elif state == READY and (launch_pending or heartbeat.stale()):
            if launch_pending:
                log.warning(
                    "TPU %s is READY and its last launch did not complete: launching again", tpu["name"]
                )
            else:
                log.warning(
                    "TPU %s is READY but %s has not changed for %.0f s: nothing supervises training there; "
                    "launching it again",
                    tpu["name"],
                    status_uri,
                    heartbeat.silent_for(),
                )
            launch_pending = not relaunch(spec, setup=launch_pending)
            heartbeat.restart_clock()
        else:
            log.info(
                "TPU %s: %s; supervisor: %s",
                tpu["name"],
                state or "state unknown",
                status.get("detail", "no status yet"),
            )
            if state != READY:
                heartbeat.restart_clock()  # no heartbeat while the VM is away; counted once it is READY
        time.sleep(poll_seconds)
    return POLLS_RAN_OUT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.tpu.restart",
        description="Keep the TPU training of a spec until it ends: relaunch it where nothing supervises it, "
        "recreate a preempted spot TPU; end when MODEL_DIR/metrics.json exists (exit 0) or the supervisor "
        "stopped for good (exit 1), printing the command that deletes the TPU.",
    )
    parser.add_argument("--spec", required=True, help="train_tpu_vm.json, local or gs://.")
    parser.add_argument(
        "--poll-seconds", type=float, default=60.0, help="Seconds between checks (default %(default)s)."
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=900.0,
        help="On a READY TPU, relaunch when the supervisor's status object (MODEL_DIR/supervisor.json) has not "
        "changed for this many seconds (default %(default)s; the supervisor writes it every 60 s).",
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
    if any(shlex.split(command)[:2] == ["gcloud", "alpha"] for command in spec["commands"]):
        problem = tpu_lifecycle.autocheckpoint_gcloud_problem()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        return watch(spec, args.poll_seconds, args.max_polls, args.heartbeat_timeout)
    except KeyboardInterrupt:
        log.warning("stopped; TPU %s left as it is", spec["tpu"]["name"])
        return 130


if __name__ == "__main__":
    sys.exit(main())
