"""kill -9 of real re-runs (`python -m preprocess`) into a directory that holds a dataset.

Each re-run is stopped at a known point (while decoding: as soon as its first shard file appears; while
publishing and collecting garbage: the PREPROCESS_PAUSE_AT hook of preprocess/publish/commit.py makes it wait
there) and killed with
SIGKILL, process group and all. After every kill the directory verifies (`python -m preprocess.verify`)
and holds the old dataset or the new one, as the kill point says. A normal run afterwards succeeds and
leaves nothing but its own dataset.
"""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataset_contract import manifest as manifest_lib
from preprocess import verify as verify_cli
from preprocess.publish import commit as publish
from preprocess.publish import protocol
from tests.publishing import assert_complete_dataset, shard_digests
from tests.stage1 import run_stage1

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
# No retention period: the test holds that the next run removes every run before it (the retention
# period is held by test_publish.py); the sample corpus's broken files are a quarter of it at this size.
RERUN_ARGS = ["--retention-days", "0", "--max-failed-fraction", "1"]
STAGE1_ARGS = ["--image-size", "16", "--encoding", "uint8", "--min-shards", "1", *RERUN_ARGS]
START_TIMEOUT_S = 300


def start_stage1(corpus_root, output, log_path, pause_at=None) -> subprocess.Popen:
    env = dict(os.environ)
    if pause_at:
        env[protocol.PAUSE_ENV] = pause_at
    command = [sys.executable, "-m", "preprocess", "--input", str(corpus_root), "--output", str(output)]
    with open(log_path, "w") as log:
        return subprocess.Popen(
            command + STAGE1_ARGS,
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until(condition, process, log_path, what: str):
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if process.poll() is not None:
            pytest.fail(
                f"stage 1 ended (status {process.returncode}) before {what}:\n{Path(log_path).read_text()}"
            )
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"stage 1 did not reach {what} in {START_TIMEOUT_S}s:\n{Path(log_path).read_text()}")
        time.sleep(0.2)


def kill(process):
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def kill_at_pause_point(corpus_root, output, tmp_path, point: str):
    flag = tmp_path / f"{point}.flag"
    log_path = tmp_path / f"{point}.log"
    process = start_stage1(corpus_root, output, log_path, pause_at=f"{point}:{flag}")
    wait_until(flag.exists, process, log_path, f"the pause point {point!r}")
    kill(process)


def assert_verifies(output, capsys) -> dict:
    assert verify_cli.main([str(output)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    return assert_complete_dataset(str(output))


def files_below(directory) -> set[str]:
    return {
        os.path.relpath(os.path.join(root, name), directory)
        for root, _, names in os.walk(directory)
        for name in names
    }


def test_kill_9_at_any_point_of_a_rerun_leaves_a_dataset_and_the_next_run_cleans_up(
    tmp_path, capsys, shared_stage1_datasets
):
    output = tmp_path / "dataset"
    # The old dataset, written once per session (test_publish.py's staged directory starts from it too).
    corpus_root, old = shared_stage1_datasets.copy(
        output, images_per_class=4, image_size=16, encoding="float32", min_shards=2
    )

    # 1. While decoding: the new run (uint8, one pass) writes its shard files as it decodes, in its own
    # runs/<run id>/, which no manifest names yet.
    log_path = tmp_path / "decoding.log"
    process = start_stage1(corpus_root, output, log_path)
    wait_until(
        lambda: [
            path
            for path in glob.glob(str(output / "runs" / "*" / "*.tfrecord"))
            if not path.startswith(str(output / old["run"]["dir"]) + "/")
        ],
        process,
        log_path,
        "its first shard file",
    )
    kill(process)
    assert assert_verifies(output, capsys) == old

    # 2. Publishing, its files complete, just before the switch.
    kill_at_pause_point(corpus_root, output, tmp_path, "before-switch")
    assert assert_verifies(output, capsys) == old
    killed_before_switch = {
        name.split(".")[0] for name in os.listdir(output / "runs") if ".publishing." in name
    }
    assert len(killed_before_switch) == 1

    # 3. Publishing, after the commit, in its garbage collection: the old run's files removed, not yet its
    # traces.
    kill_at_pause_point(corpus_root, output, tmp_path, "run-files-removed")
    switched = assert_verifies(output, capsys)
    assert switched["run"]["id"] > max(killed_before_switch) > old["run"]["id"]
    assert switched["image"]["encoding"] == "uint8"
    assert not (output / old["run"]["dir"]).exists()

    # Leftovers now: the runs killed in 1 and 2, tombstones, staging. The run killed before its switch
    # left a publishing marker, which protects its files until it expires; age it instead of waiting.
    expired = time.time() - publish.PUBLISH_MARKER_TTL_SECONDS - 60
    for marker in glob.glob(str(output / "runs" / "*.publishing.*")):
        os.utime(marker, (expired, expired))
    assert len(os.listdir(output / "runs")) > 2

    final = run_stage1(corpus_root, output, *RERUN_ARGS, image_size=16, encoding="uint8", min_shards=1)
    assert assert_verifies(output, capsys) == final
    assert final["run"]["id"] > switched["run"]["id"]
    # Nothing changed since the switched run: the re-run references its shards as they are (issue 32), so
    # its run stays (its staging, left by its killed publish step, goes), and every other leftover goes.
    assert shard_digests(final) == shard_digests(switched)
    expected = {"dataset.json"} | {
        path
        for path in files_below(output)
        if path.startswith(
            (final["run"]["dir"] + "/", switched["run"]["dir"] + "/", manifest_lib.MANIFESTS_DIR + "/")
        )
    }
    assert files_below(output) == expected
    assert sorted(os.listdir(output)) == ["dataset.json", "manifests", "runs"]
    assert sorted(os.listdir(output / "runs")) == sorted([switched["run"]["id"], final["run"]["id"]])
