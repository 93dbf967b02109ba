"""What a TPU VM is created with so that training survives what Cloud TPU does to it, and what it cannot.

Three events end a training process on a Cloud TPU VM:

- Maintenance of the host. Without Autocheckpoint it starts at once, with no
  SIGTERM first (AUTOCHECKPOINT_DOC: "the procedure is initiated immediately,
  without leaving time for users to perform progress-preserving actions").
  With `--autocheckpoint-enabled` at creation, Cloud TPU sends SIGTERM to the
  process using the TPU device and waits until it exits, or 5 minutes, before
  maintenance: `python -m train` saves a checkpoint on SIGTERM and exits 143.
  The docs allow it on TPU v2 to v4 and v5e, created through the Cloud TPU API,
  and call it a Public Preview; it is created with `gcloud alpha`. By default
  (`--autocheckpoint auto`) it is on where that holds on a single-host VM, the
  one case where our process is the one using the TPU device: on a multi-host
  slice that process is each worker's TPU server, and worker 0's client gets
  no signal.
- A reboot (after maintenance, or by hand). The disk stays: the VM is created
  with a startup script (metadata `startup-script`, run as root at every boot)
  that runs ~/tf-image-pipeline/start.sh as its owner; the launch writes that
  script (pipelines/tpu/launch.py). It resumes training from the last
  checkpoint unless the supervisor ended it for good (success, a setup error,
  giving up: its `stopped` file).
- A spot preemption (`--spot`). A TPU Spot VM cannot be restarted: it must be
  deleted and created again (SPOT_DOC), with a fresh disk. Nothing on the VM
  survives to do that, and a queued resource does not do it either: a
  preempted one is SUSPENDED, "no longer eligible for further allocation"
  (QUEUED_RESOURCES_DOC). So an off-VM loop does: `python -m
  pipelines.tpu.restart --spec SPEC`, run on the user's machine with the
  user's gcloud credentials, watches the TPU's state and, once it is
  PREEMPTED, deletes it and runs the spec's create and launch commands again;
  training resumes from the model dir's last checkpoint. The same loop
  relaunches training on a READY TPU where nothing supervises it (a launch
  whose ssh failed, a supervisor heartbeat that stopped) and ends, printing
  the delete command, when training finished or stopped for good.

The create needs `gcloud alpha` for Autocheckpoint (the only track with
--autocheckpoint-enabled); `autocheckpoint_gcloud_problem` asks this
machine's gcloud for it before anything is created.

What each machine kind can lose, then (the guarantee the docs state): at most
the interval checkpoint, --checkpoint-every of training (python -m train's
default 10m), on every kind: a spot preemption (its notice reaches the VM, but
nothing guarantees the save finishes), maintenance without Autocheckpoint,
any event on a multi-host slice (only worker 0's process sees signals), a
SIGKILL or a crash. Nothing on a single-host VM with Autocheckpoint for
maintenance, where the SIGTERM save completes within Cloud TPU's 5 minutes.
"""

import argparse
import dataclasses
import subprocess

from pipelines.tpu import runtime as tpu_runtime

AUTOCHECKPOINT_DOC = "https://cloud.google.com/tpu/docs/autocheckpoint"
SPOT_DOC = "https://cloud.google.com/tpu/docs/spot"
QUEUED_RESOURCES_DOC = "https://cloud.google.com/tpu/docs/queued-resources"
# AUTOCHECKPOINT_DOC: "Only TPUs (v2-v4, and v5e) created through the Cloud TPU API can use this feature".
AUTOCHECKPOINT_GENERATIONS = ("v2", "v3", "v4", "v5e")
AUTO, ON, OFF = "auto", "on", "off"
INTERVAL = "up to --checkpoint-every of training (python -m train's default 10m), the interval checkpoint"

# Runs as root at every boot of every worker. Only the worker a launch wrote start.sh on (worker 0, or the
# single host) has one; on a fresh (recreated) disk there is none, and the launch commands start training.
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
    """How the TPU VM is created and how training comes back after each event (module docstring)."""

    spot: bool
    autocheckpoint: bool
    autocheckpoint_why: str
    multi_host: bool = False  # then only worker 0's process can save, and Autocheckpoint's SIGTERM misses it

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
                if self.autocheckpoint and not self.multi_host
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


def choose_lifecycle(tpu: tpu_runtime.TpuType, spot: bool = False, autocheckpoint: str = AUTO) -> Lifecycle:
    """The creation choices for `tpu`; ValueError when Autocheckpoint is asked for where Cloud TPU has none."""
    generation = tpu.generation.name
    supported = generation in AUTOCHECKPOINT_GENERATIONS
    if autocheckpoint == ON and not supported:
        raise ValueError(
            f"--autocheckpoint on: Cloud TPU offers Autocheckpoint on {', '.join(AUTOCHECKPOINT_GENERATIONS)} "
            f"only ({AUTOCHECKPOINT_DOC}), not on {generation}. Use --autocheckpoint off (what maintenance can "
            "lose is then bounded by --checkpoint-every)"
        )
    if autocheckpoint == OFF:
        return Lifecycle(spot, False, "--autocheckpoint off", tpu.multi_host)
    if not supported:
        why = f"Cloud TPU offers no Autocheckpoint on {generation} ({AUTOCHECKPOINT_DOC})"
        return Lifecycle(spot, False, why, tpu.multi_host)
    if tpu.multi_host and autocheckpoint == AUTO:
        return Lifecycle(
            spot,
            False,
            "a multi-host slice: Autocheckpoint's SIGTERM goes to the process using the TPU device, each "
            "worker's TPU server, not to worker 0's client (--autocheckpoint on to enable it anyway)",
            True,
        )
    where = (
        "slice: the SIGTERM reaches the TPU servers, not worker 0's client"
        if tpu.multi_host
        else "single host"
    )
    return Lifecycle(spot, True, f"{generation} {where} ({AUTOCHECKPOINT_DOC})", tpu.multi_host)


GCLOUD_COMPONENTS_DOC = "https://cloud.google.com/sdk/docs/components"


def autocheckpoint_gcloud_problem(run=subprocess.run) -> str | None:
    """None when this machine's gcloud creates TPUs with --autocheckpoint-enabled; else what to do, in words.

    Only `gcloud alpha compute tpus tpu-vm create` has the flag (gcloud 528: not the GA or beta command).
    Run without a terminal, a gcloud without its alpha component fails ("This prompt could not be answered
    because you are not in an interactive session"), which would block the unattended restart loop at its
    first create: so the launch and the loop ask first, before creating anything.
    """
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
