"""A slice's setup waits for every worker's TPU server: real sockets on 127.0.0.1, a fake `gcloud` on PATH."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fake_gcloud(tmp_path, ports):
    """A `gcloud` whose `tpu-vm describe --format=json` lists workers at 127.0.0.1:PORT, recording its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    endpoints = [{"ipAddress": "127.0.0.1", "port": port} for port in ports]
    (bin_dir / "gcloud").write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path / "gcloud.calls"}\n'
        f"echo '{json.dumps({'state': 'READY', 'networkEndpoints': endpoints})}'\n"
    )
    (bin_dir / "gcloud").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": REPO}


def serve_later(port: int, delay: float, stop: threading.Event):
    """A TPU server that starts listening `delay` seconds from now (a tpu-runtime service restarting)."""

    def run():
        time.sleep(delay)
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    server.accept()[0].close()
                except OSError:
                    pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait(env, *options, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "train.tools.tpu_servers", "--tpu", "my-v4-32", "--zone", "us-central2-b",
         "--project", "p", "--poll-seconds", "0.1", *options],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_setup_waits_until_a_server_that_opens_late_answers(tmp_path):
    ready, late = free_port(), free_port()
    env = fake_gcloud(tmp_path, [ready, late])
    stop = threading.Event()
    serve_later(ready, 0.0, stop)
    serve_later(late, 1.5, stop)
    try:
        started = time.monotonic()
        result = wait(env, "--timeout", "30")
        waited = time.monotonic() - started
    finally:
        stop.set()
    assert result.returncode == 0, result.stderr
    assert waited >= 1.5  # it did not start before the late server answered
    assert "all 2 TPU servers answer" in result.stdout
    calls = (tmp_path / "gcloud.calls").read_text()
    assert "compute tpus tpu-vm describe my-v4-32 --zone us-central2-b --project p --format=json" in calls


def test_a_server_that_never_answers_ends_the_wait_with_a_message_naming_the_worker_and_exit_2(tmp_path):
    ready, silent = free_port(), free_port()
    env = fake_gcloud(tmp_path, [ready, silent])
    stop = threading.Event()
    serve_later(ready, 0.0, stop)
    try:
        result = wait(env, "--timeout", "1")
    finally:
        stop.set()
    assert result.returncode == 2
    assert f"worker 1 (127.0.0.1:{silent}) does not answer" in result.stderr
    assert "systemctl status tpu-runtime" in result.stderr and "Traceback" not in result.stderr
