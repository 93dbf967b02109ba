"""Real multi-worker training: two `python -m train` processes on this machine, a cluster over TF_CONFIG.

MultiWorkerMirroredStrategy runs one replica per process here, the
processes all-reduce their gradients over gRPC on localhost, and each
process reads its own share of the train split. The dataset has one shard
per split, fewer than the two input pipelines, so the shares are split
record by record (with the warning that says how to re-shard).
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

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
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith(f"ckpt-{total}")
    # One model dir: the non-chief's checkpoint copies went to a scratch directory that is gone.
    assert not [name for name in os.listdir(model_dir / "checkpoints") if name.startswith(".scratch")]
    assert os.path.isdir(model_dir / "export" / "variables")
    manifest = json.loads(open(os.path.join(data_dir, "dataset.json")).read())
    assert metrics["validation"]["num_examples"] == manifest["splits"]["validation"]["num_examples"]
