"""What a TPU VM is created with so that training survives what Cloud TPU does to it, and what it cannot.

Why and how: docs/internals.md.
"""

import argparse
import dataclasses
import subprocess

from pipelines.tpu import runtime as tpu_runtime

AUTOCHECKPOINT_DOC = "https://cloud.google.com/tpu/docs/autocheckpoint"
SPOT_DOC = "https://cloud.google.com/tpu/docs/spot"
# AUTOCHECKPOINT_DOC: "Only TPUs (v2-v4, and v5e) created through the Cloud TPU API can use this feature".
AUTOCHECKPOINT_GENERATIONS = ("v2", "v3", "v4", "v5e")
AUTO, ON, OFF = "auto", "on", "off"
INTERVAL = "up to --checkpoint-every of training (python -m train's default 10m), the interval checkpoint"

# Runs as root at every boot of every worker. Only the workers a launch wrote start.sh on (the single host,
# worker 0 of a TensorFlow slice, every worker of a JAX one) have one; on a fresh (recreated) disk there is
# none, and the launch commands start training.
# No commas: gcloud's --metadata splits KEY=VALUE pairs on them.
BOOT_SCRIPT = """#!/bin/bash
# tf-image-pipeline (pipelines/tpu/lifecycle.py): after a reboot resume the training this VM ran.
for start in /home/*/tf-image-pipeline/start.sh; do
  test -f "$start" || continue
  su - "$(stat -c %U "$start")" -c "bash $start >> ~/tf-image-pipeline/boot.log 2>&1"
done
"""


@dataclasses.dataclass(frozen=True)
class Lifecycle:
    """How the TPU VM is created and how training comes back after each event (docs/internals.md)."""

    spot: bool
    autocheckpoint: bool
    autocheckpoint_why: str
    # TensorFlow on a slice: only worker 0's process saves; Autocheckpoint's SIGTERM misses it.
    single_client: bool = False

    def describe(self, restart_command: str) -> dict:
        return {
            "spot": self.spot,
            "autocheckpoint": self.autocheckpoint,
            "autocheckpoint_why": self.autocheckpoint_why,
            "after_reboot": "the VM's startup script (metadata startup-script) runs ~/tf-image-pipeline/start.sh "
            "at every boot: training resumes from the last checkpoint unless it ended for good",
            "watch": f"run on your machine: {restart_command} (relaunches training where nothing supervises it"
            + (", recreates the TPU after a preemption" if self.spot else "")
            + "; ends when training finishes or stops for good, printing the command that deletes the TPU)",
            "after_spot_preemption": (
                f"run on your machine: {restart_command} (deletes the preempted TPU, creates it again and "
                "relaunches; training resumes from the last checkpoint)"
                if self.spot
                else "not spot: no preemption"
            ),
            # The interval checkpoint (--checkpoint-every, python -m train's default 10m) bounds every other case.
            "at_most_lost": {
                "maintenance": "nothing: Autocheckpoint waits for the SIGTERM checkpoint"
                if self.autocheckpoint and not self.single_client
                else INTERVAL,
                "spot_preemption": INTERVAL if self.spot else "not spot",
                "crash_or_sigkill": INTERVAL,
            },
        }


def summary_lines(described: dict) -> list[str]:
    """What --dry-run and the launch print about the lifecycle (Lifecycle.describe's dict)."""
    lost = described["at_most_lost"]
    return [
        f"TPU VM: {'spot' if described['spot'] else 'on-demand'}; Autocheckpoint "
        f"{'on' if described['autocheckpoint'] else 'off'} ({described['autocheckpoint_why']})",
        f"After a reboot: {described['after_reboot']}",
        f"After a spot preemption: {described['after_spot_preemption']}",
        f"Keep it training: {described['watch']}",
        f"At most lost: on maintenance {lost['maintenance']}; on a spot preemption {lost['spot_preemption']}; "
        f"on a crash or SIGKILL {lost['crash_or_sigkill']}",
    ]


def add_lifecycle_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spot",
        action="store_true",
        help=f"Create a TPU Spot VM (cheaper; preempted at any time and then deleted and recreated by `python "
        f"-m pipelines.tpu.restart`, {SPOT_DOC}).",
    )
    parser.add_argument(
        "--autocheckpoint",
        choices=(AUTO, ON, OFF),
        default=AUTO,
        help="Create the TPU with --autocheckpoint-enabled (Public Preview, gcloud alpha): maintenance then "
        "waits for the SIGTERM checkpoint. 'auto' (default): on for single-host v2-v4 and v5e VMs, the ones "
        f"the docs allow where our process holds the TPU ({AUTOCHECKPOINT_DOC}).",
    )


def choose_lifecycle(
    tpu: tpu_runtime.TpuType,
    spot: bool = False,
    autocheckpoint: str = AUTO,
    single_client: bool | None = None,
) -> Lifecycle:
    """The creation choices for `tpu`; ValueError when Autocheckpoint is asked for where Cloud TPU has none.
    `single_client`: one process, on worker 0, drives the slice (TensorFlow's TPUStrategy)."""
    single_client = tpu.multi_host if single_client is None else single_client
    generation = tpu.generation.name
    supported = generation in AUTOCHECKPOINT_GENERATIONS
    if autocheckpoint == ON and not supported:
        raise ValueError(
            f"--autocheckpoint on: Cloud TPU offers Autocheckpoint on {', '.join(AUTOCHECKPOINT_GENERATIONS)} "
            f"only ({AUTOCHECKPOINT_DOC}), not on {generation}. Use --autocheckpoint off (what maintenance can "
            "lose is then bounded by --checkpoint-every)"
        )
    if autocheckpoint == OFF:
        return Lifecycle(spot, False, "--autocheckpoint off", single_client)
    if not supported:
        why = f"Cloud TPU offers no Autocheckpoint on {generation} ({AUTOCHECKPOINT_DOC})"
        return Lifecycle(spot, False, why, single_client)
    if single_client and autocheckpoint == AUTO:
        return Lifecycle(
            spot,
            False,
            "a multi-host slice: Autocheckpoint's SIGTERM goes to the process using the TPU device, each "
            "worker's TPU server, not to worker 0's client (--autocheckpoint on to enable it anyway)",
            True,
        )
    if single_client:
        where = "slice: the SIGTERM reaches the TPU servers, not worker 0's client"
    elif tpu.multi_host:
        where = "slice on JAX: every worker's trainer holds its chips and gets the SIGTERM"
    else:
        where = "single host"
    return Lifecycle(spot, True, f"{generation} {where} ({AUTOCHECKPOINT_DOC})", single_client)


GCLOUD_COMPONENTS_DOC = "https://cloud.google.com/sdk/docs/components"


def autocheckpoint_gcloud_problem(run=subprocess.run) -> str | None:
    """None when this machine's gcloud creates TPUs with --autocheckpoint-enabled (the alpha command); else
    what to do, in words, asked before anything is created."""
    argv = ["gcloud", "alpha", "compute", "tpus", "tpu-vm", "create", "--help"]
    try:
        result = run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return "gcloud is not installed here: https://cloud.google.com/sdk/docs/install"
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv)}` did not answer within 120 s"
    if result.returncode == 0 and "--autocheckpoint-enabled" in result.stdout:
        return None
    said = (result.stderr.strip() or result.stdout.strip()).splitlines()
    if result.returncode == 0:
        cause = "this gcloud's alpha create has no --autocheckpoint-enabled: update gcloud (`gcloud components update`)"
    else:
        cause = (
            "gcloud's alpha commands are not installed here: install them with `gcloud components install alpha` "
            "(a gcloud installed with apt or yum has them in its google-cloud-cli package; "
            f"{GCLOUD_COMPONENTS_DOC})"
        )
    return (
        f"Autocheckpoint is created with `gcloud alpha compute tpus tpu-vm create --autocheckpoint-enabled` "
        f"(the only gcloud track with the flag), and {cause}. Or create without it: python -m pipelines.dataflow "
        f"... --autocheckpoint off (with --skip-preprocess, it writes a new spec; what maintenance can lose is then "
        f"bounded by --checkpoint-every). gcloud said: {said[-1] if said else '-'}"
    )


def create_command(
    name: str, location: list[str], choice: tpu_runtime.RuntimeChoice, lifecycle: Lifecycle
) -> list[str]:
    """`gcloud [alpha] compute tpus tpu-vm create` with the spot, Autocheckpoint and boot-script choices."""
    # Autocheckpoint is a Public Preview flag: the docs create with `gcloud alpha`.
    gcloud = ["gcloud", "alpha"] if lifecycle.autocheckpoint else ["gcloud"]
    argv = [
        *gcloud, "compute", "tpus", "tpu-vm", "create", name, *location,
        "--accelerator-type", choice.tpu.name, "--version", choice.runtime_version,
        "--metadata", f"startup-script={BOOT_SCRIPT}",
    ]  # fmt: skip
    if lifecycle.spot:
        argv.append("--spot")
    if lifecycle.autocheckpoint:
        argv.append("--autocheckpoint-enabled")
    return argv
