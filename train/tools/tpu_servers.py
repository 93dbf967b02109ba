"""Wait until the TPU server of every worker of a multi-host slice answers, before training starts.

    python3 -m train.tools.tpu_servers --tpu NAME --zone ZONE --project PROJECT [--timeout 900]

Why worker 0's start script waits: docs/internals.md.
"""

import argparse
import json
import socket
import subprocess
import sys
import time

TPU_SERVER_PORT = 8470  # the gRPC port TPU servers listen on (Cloud TPU's networkEndpoints report it)
CONNECT_SECONDS = 3.0
GCLOUD_SECONDS = 120
HEALTHY = "HEALTHY"


def describe_tpu(name: str, zone: str, project: str) -> dict:
    """Cloud TPU's description of TPU `name` (`gcloud ... describe --format=json`); RuntimeError if it cannot."""
    try:
        result = subprocess.run(
            ["gcloud", "compute", "tpus", "tpu-vm", "describe", name, "--zone", zone, "--project", project,
             "--format=json"],
            capture_output=True, text=True, timeout=GCLOUD_SECONDS, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"gcloud did not describe TPU {name} within {GCLOUD_SECONDS} s") from exc
    if result.returncode != 0:
        raise RuntimeError(f"gcloud cannot describe TPU {name} in {zone}: {result.stderr.strip()}")
    try:
        return json.loads(result.stdout)
    except ValueError as exc:
        raise RuntimeError(f"gcloud's description of TPU {name} is not JSON: {exc}") from exc


def worker_endpoints(name: str, zone: str, project: str) -> list[tuple[str, int]]:
    """(address, port) of each worker of TPU `name`, in worker order, from `gcloud ... describe`."""
    endpoints = describe_tpu(name, zone, project).get("networkEndpoints") or []
    if not endpoints:
        raise RuntimeError(f"Cloud TPU reports no network endpoints for TPU {name}: is it READY?")
    return [(endpoint["ipAddress"], int(endpoint.get("port") or TPU_SERVER_PORT)) for endpoint in endpoints]


def health_of(node: dict) -> str:
    """`state/health` of a described TPU, e.g. READY/HEALTHY or READY/UNHEALTHY_MAINTENANCE."""
    return f"{node.get('state', 'STATE_UNSPECIFIED')}/{node.get('health', 'HEALTH_UNSPECIFIED')}"


def is_healthy(node: dict) -> bool:
    """READY, and not reported unhealthy: HEALTHY, or no health reported (Cloud TPU's Node.health)."""
    return node.get("state") == "READY" and node.get("health", HEALTHY) in (HEALTHY, "HEALTH_UNSPECIFIED")


def answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=CONNECT_SECONDS):
            return True
    except OSError:
        return False


def wait_for_servers(
    endpoints, timeout: float, poll_seconds: float = 2.0, clock=time.monotonic, stop=None
) -> list[int]:
    """Wait until each endpoint accepts a connection; return the worker indexes still silent at `timeout`.

    `stop` (a threading.Event) ends the wait early when set.
    """
    silent = list(range(len(endpoints)))
    deadline = clock() + timeout
    while True:
        silent = [worker for worker in silent if not answers(*endpoints[worker])]
        if not silent or clock() >= deadline:
            return silent
        if stop is not None:
            if stop.wait(poll_seconds):
                return silent
        else:
            time.sleep(poll_seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m train.tools.tpu_servers",
        description="Wait until every worker's TPU server of slice NAME answers (exit 0), or exit 2 after "
        "--timeout naming the workers that do not.",
    )
    parser.add_argument("--tpu", required=True, help="The slice's name.")
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="Seconds to wait at most (default %(default)s)."
    )
    parser.add_argument("--poll-seconds", type=float, default=2.0, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        endpoints = worker_endpoints(args.tpu, args.zone, args.project)
    except (RuntimeError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    listed = ", ".join(f"{address}:{port}" for address, port in endpoints)
    print(f"waiting for the TPU servers of {len(endpoints)} workers of {args.tpu} ({listed})", flush=True)
    started = time.monotonic()
    silent = wait_for_servers(endpoints, args.timeout, args.poll_seconds)
    if silent:
        where = ", ".join(
            f"worker {worker} ({endpoints[worker][0]}:{endpoints[worker][1]})" for worker in silent
        )
        print(
            f"error: after {args.timeout:g} s the TPU server of {where} does not answer, so training was not "
            f"started. On that worker (gcloud compute tpus tpu-vm ssh {args.tpu} --zone {args.zone} "
            f"--worker=N) see `sudo systemctl status tpu-runtime` and `sudo journalctl -u tpu-runtime`",
            file=sys.stderr,
        )
        return 2
    print(f"all {len(endpoints)} TPU servers answer (after {time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
