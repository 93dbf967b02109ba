"""Real multi-worker training: two `python -m train` processes on this machine, a cluster over TF_CONFIG.

MultiWorkerMirroredStrategy runs one replica per process here, the
processes all-reduce their gradients over gRPC on localhost, and each
process reads its own share of the train split. The dataset has one shard
per split, fewer than the two input pipelines, so the shares are split
record by record (with the warning that says how to re-shard).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.train.checkpoint_files import latest_step
from tests.train.loop.test_preemption import RunningTraining
from train.loop.checkpoints import PREEMPTED_EXIT_CODE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS_PER_EPOCH = 3
EPOCHS = 2


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.slow
def test_two_worker_processes_train_one_model_into_one_model_dir(stage1_dataset, tmp_path):
    data_dir = stage1_dataset("uint8", min_shards=1)
    model_dir = tmp_path / "model"
    workers = [f"localhost:{port}" for port in free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {
            **os.environ,
            "PYTHONPATH": REPO,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_CONFIG": json.dumps(tf_config),
        }
        command = [
            sys.executable, "-m", "train",
            "--data", data_dir,
            "--model-dir", str(model_dir),
            "--strategy", "multiworker",
            "--epochs", str(EPOCHS),
            "--steps-per-epoch", str(STEPS_PER_EPOCH),
            "--global-batch-size", "8",
            "--log-every", "1",
            "--checkpoint-every", "1s",  # by each worker's clock: the workers must agree when to save
        ]  # fmt: skip
        processes.append(
            subprocess.Popen(
                command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=600))
        finally:
            if process.poll() is None:
                process.kill()
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr[-4000:]

    total = EPOCHS * STEPS_PER_EPOCH
    chief_out, worker_out = outputs[0][0], outputs[1][0]
    assert f"step {total}/{total}" in chief_out
    assert f"[worker-1] step {total}/{total}" in worker_out  # the second process trained every step too
    # One input pipeline per worker, one shard: record-level shares, and the warning, once (from worker 0).
    assert "--min-shards 2" in outputs[0][1] and "--min-shards" not in outputs[1][1]

    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert (metrics["strategy"], metrics["num_replicas"], metrics["global_step"]) == ("multiworker", 2, total)
    assert metrics["per_replica_batch_size"] == 4
    assert latest_step(model_dir) == total
    # One model dir: the chief's files alone (the non-chief's copies went to a local scratch file that is gone).
    names = os.listdir(model_dir / "checkpoints")
    assert {"checkpoint.json", f"ckpt-{total}.weights.h5"} <= set(names), names
    assert all(name == "checkpoint.json" or name.endswith(".weights.h5") for name in names), names
    assert os.path.isdir(model_dir / "export" / "variables")
    manifest = json.loads(open(os.path.join(data_dir, "dataset.json")).read())
    assert metrics["validation"]["num_examples"] == manifest["splits"]["validation"]["num_examples"]


class DirectoryWatch:
    """Every name that appears under some directories while a run goes on (polled, every few ms)."""

    def __init__(self, *roots):
        self._roots = roots
        self.seen = {root: set() for root in roots}  # root -> paths relative to it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.is_set():
            for root in self._roots:
                for directory, subdirectories, files in os.walk(root):
                    for name in subdirectories + files:
                        self.seen[root].add(os.path.relpath(os.path.join(directory, name), root))
            time.sleep(0.002)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)


def start_workers(command, workers, cwd, local_tmp) -> list[RunningTraining]:
    runs = []
    for index in range(len(workers)):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {
            **os.environ,
            "PYTHONPATH": REPO,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_CONFIG": json.dumps(tf_config),
            "TMPDIR": str(local_tmp[index]),  # each worker's local disk
        }
        runs.append(RunningTraining(command, cwd, env))
    return runs


@pytest.mark.slow
def test_two_workers_agree_every_k_steps_stop_together_on_one_worker_s_sigterm_and_keep_scratch_local(
    stage1_dataset, tmp_path
):
    steps_per_epoch, epochs, every = 12, 2, 4
    total = steps_per_epoch * epochs
    model_dir = tmp_path / "model"
    local_tmp = [tmp_path / f"local-disk-{index}" for index in range(2)]
    for directory in local_tmp:
        directory.mkdir()

    def command(check_every):
        return [
            sys.executable, "-m", "train",
            "--data", stage1_dataset("uint8", min_shards=1),
            "--model-dir", str(model_dir),
            "--strategy", "multiworker",
            "--epochs", str(epochs),
            "--steps-per-epoch", str(steps_per_epoch),
            "--global-batch-size", "8",
            "--log-every", "1",
            "--checkpoint-every", "3",  # saves (a collective: the non-chief writes a copy too) every 3 steps
            "--preemption-check-every", str(check_every),
            "--no-export",
        ]  # fmt: skip

    workers = [f"localhost:{port}" for port in free_ports(2)]
    watch = DirectoryWatch(model_dir, local_tmp[1])
    try:
        chief, other = start_workers(command(every), workers, tmp_path, local_tmp)
        signalled_at = other.wait_for_step(5, timeout=600)
        other.process.send_signal(signal.SIGTERM)  # the non-chief only
        (chief_code, chief_err), (other_code, other_err) = chief.finish(), other.finish()
    finally:
        watch.stop()

    assert other_code == PREEMPTED_EXIT_CODE, other_err[-3000:]
    assert chief_code == PREEMPTED_EXIT_CODE, chief_err[-3000:]
    stopped = latest_step(model_dir)
    # Both stopped at the first agreement after the signal: a multiple of K, at the same step.
    assert stopped % every == 0 and signalled_at <= stopped < signalled_at + 2 * every
    assert chief.steps[-1] <= stopped and other.steps[-1] <= stopped
    assert f"stopped by SIGTERM at step {stopped}" in other_err
    assert f"at step {stopped}" in chief_err and "another worker" in chief_err
    # The non-chief's copies were written on its local disk, never in the model dir, and are gone.
    assert not [name for name in watch.seen[model_dir] if "scratch" in name]
    assert any(name.startswith("checkpoint-scratch-worker-1-") for name in watch.seen[local_tmp[1]])
    assert not [name for name in os.listdir(local_tmp[1]) if name.startswith("checkpoint-scratch")]

    # Resumed to the end, checking every 5 steps: the collectives are counted.
    resume_every = 5
    workers = [f"localhost:{port}" for port in free_ports(2)]
    runs = start_workers(command(resume_every), workers, tmp_path, local_tmp)
    results = [run.finish() for run in runs]
    for code, stderr in results:
        assert code == 0, stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == stopped and metrics["global_step"] == total
    periodic = [step for step in range(stopped + 1, total + 1) if step % resume_every == 0]
    epoch_ends = [step for step in range(stopped + 1, total + 1) if step % steps_per_epoch == 0]
    assert metrics["preemption_check"] == {
        "every": f"{resume_every} steps",
        "agreements": len(periodic) + len(epoch_ends),
        "last_steps_between": resume_every,
    }
