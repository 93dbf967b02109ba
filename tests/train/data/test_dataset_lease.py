"""Leases without windows (train/data/dataset_lease.py): each window between a reader and a remover,
held open with a barrier, on real runs of stage 1 on local disk and on the GCS emulator.

The dataset directory holds runs A and B (tests/train/data/test_dataset_pin.py's TwoRuns); the reader is
`resolve_and_lease`, the phase of `python -m train` (and of `train.evaluate`) that chooses the run; the
remover follows dataset_contract/leases.py (its marker, then the leases), held after its marker
(`HeldRemover`). The invariant each test holds: when both are done, the run the reader holds is whole,
or the reader said it is gone.
"""

import datetime
import logging
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
import tensorflow as tf

from dataset_contract import commit_log, leases
from dataset_contract import manifest as manifest_lib
from tests.train.data.test_dataset_pin import TwoRuns
from train.data import dataset_lease, dataset_pin
from train.errors import DatasetError

pytestmark = pytest.mark.slow  # two runs of stage 1 (session-cached) per directory
_WAIT_S = 60


@pytest.fixture
def two_runs(stage1_dataset, tmp_path):
    return TwoRuns(tmp_path / "dataset", Path(stage1_dataset("uint8")), Path(stage1_dataset("jpeg")))


class LeaseGate:
    """Holds the reader between its choice of a run and its first lease, until `go`."""

    def __init__(self, monkeypatch):
        self.reached = threading.Event()
        self.released = threading.Event()
        original = dataset_lease.DatasetLease.start
        gate = self

        def start(lease, *args, **kwargs):
            if not gate.reached.is_set():
                gate.reached.set()
                assert gate.released.wait(_WAIT_S), "the test never let the reader go on"
            return original(lease, *args, **kwargs)

        monkeypatch.setattr(dataset_lease.DatasetLease, "start", start)

    def wait_until_reached(self):
        assert self.reached.wait(_WAIT_S), "the reader never reached its lease"

    def go(self):
        self.released.set()


class InThread:
    """`function(*args)` in a thread; `join()` gives its result or raises its exception."""

    def __init__(self, function, *args, **kwargs):
        self.result = self.error = None

        def body():
            try:
                self.result = function(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def join(self):
        self.thread.join(_WAIT_S)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.result


class HeldRemover(InThread):
    """A remover that has written its removal marker and is held there until `go`; then it lists the
    run's leases and removes the run's files unless a live lease holds it, and its marker last.

    `kind` "commit log": the marker is `leases/<run id>/removing.<expiry>.<attempt>.json`
    (dataset_contract/leases.py), as stage 1's garbage collection (preprocess.gc) writes it; "older": it is
    `runs/<run id>.deleting.<attempt>`, as stage 1 before the commit log wrote it (a job launched with
    that code may still be running).
    """

    def __init__(self, data_dir: str, run_id: str, kind: str):
        self.released = threading.Event()
        now = datetime.datetime.now(datetime.timezone.utc)
        if kind == "commit log":
            expires = now + datetime.timedelta(seconds=leases.REMOVAL_MARKER_SECONDS)
            name = leases.removal_marker_name(run_id, uuid.uuid4().hex, expires)
        else:
            name = f"{manifest_lib.RUNS_DIR}/{run_id}.deleting.{uuid.uuid4().hex}"
        marker = manifest_lib.join(data_dir, name)
        if not marker.startswith("gs://"):
            tf.io.gfile.makedirs(os.path.dirname(marker))
        with tf.io.gfile.GFile(marker, "w") as handle:
            handle.write("{}")

        def remove():
            assert self.released.wait(_WAIT_S)
            directory = manifest_lib.join(data_dir, leases.run_leases_dir(run_id))
            names = tf.io.gfile.listdir(directory) if tf.io.gfile.exists(directory) else []
            held = leases.live_holders(names, datetime.datetime.now(datetime.timezone.utc))
            if not held:
                tf.io.gfile.rmtree(manifest_lib.join(data_dir, manifest_lib.RUNS_DIR, run_id))
            tf.io.gfile.remove(marker)
            if not held:
                remove_run_files(data_dir, run_id)  # what is left: expired leases
            return not held

        super().__init__(remove)

    def go(self):
        self.released.set()


def remove_run_files(data_dir: str, run_id: str) -> None:
    """What a remover leaves of a run: nothing (its files, then its leases)."""
    for directory in (
        manifest_lib.join(data_dir, manifest_lib.RUNS_DIR, run_id),
        manifest_lib.join(data_dir, leases.run_leases_dir(run_id)),
    ):
        if tf.io.gfile.exists(directory):
            tf.io.gfile.rmtree(directory)


REMOVER_KINDS = ["commit log", "older"]


def live_holders(data_dir: str, run_id: str) -> set[str]:
    directory = os.path.join(data_dir, leases.run_leases_dir(run_id))
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return leases.live_holders(names, datetime.datetime.now(datetime.timezone.utc))


def is_whole(data_dir: str, manifest_bytes: bytes) -> bool:
    manifest = dataset_pin.checks.parse_manifest(manifest_bytes, where="test")
    return not dataset_pin.missing_shards(data_dir, manifest)


def test_a_first_start_whose_run_was_removed_between_its_read_and_its_lease_takes_the_newest_run(
    two_runs, tmp_path, monkeypatch
):
    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    gate = LeaseGate(monkeypatch)
    reader = InThread(dataset_lease.resolve_and_lease, root, model_dir)
    gate.wait_until_reached()  # it read dataset.json: run A
    two_runs.publish_b()
    remove_run_files(root, two_runs.run_a)  # no lease yet: A goes
    gate.go()
    pinned, lease = reader.join()
    lease.stop()

    assert pinned.run_id == two_runs.run_b
    assert lease.run_id == two_runs.run_b and live_holders(root, two_runs.run_b) == {lease.holder}
    assert not live_holders(root, two_runs.run_a)


@pytest.mark.parametrize("remover_kind", REMOVER_KINDS)
def test_a_first_start_that_finds_a_remover_at_work_on_its_run_after_its_lease_backs_off_to_the_newest(
    two_runs, tmp_path, monkeypatch, remover_kind
):
    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    gate = LeaseGate(monkeypatch)
    reader = InThread(dataset_lease.resolve_and_lease, root, model_dir)
    gate.wait_until_reached()  # it read dataset.json: run A
    two_runs.publish_b()
    remover = HeldRemover(root, two_runs.run_a, remover_kind)
    gate.go()  # the lease on A comes after the remover's marker: the reader must see it
    pinned, lease = reader.join()
    remover.go()
    remover.join()
    lease.stop()

    assert pinned.run_id == two_runs.run_b and lease.run_id == two_runs.run_b
    assert is_whole(root, pinned.manifest_bytes)
    assert live_holders(root, two_runs.run_b) == {lease.holder}


def test_a_marker_left_on_the_published_run_by_a_remover_that_died_does_not_stop_a_first_start(
    two_runs, tmp_path
):
    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    remover = HeldRemover(root, two_runs.run_a, "commit log")  # marked, then held (as if it had died)
    pinned, lease = dataset_lease.resolve_and_lease(root, model_dir)
    lease.stop()
    assert pinned.run_id == two_runs.run_a  # still the published run: no remover removes it
    assert live_holders(root, two_runs.run_a) == {lease.holder}
    remover.go()
    assert remover.join() is False  # and one that goes on finds the lease and leaves the run
    assert is_whole(root, two_runs.manifest_a)


def _pin_run_a_with_a_lapsed_lease(two_runs, model_dir: str):
    """A model dir that trained on A, stopped two days ago: its pin, and its last lease, long expired."""
    root = str(two_runs.root)
    tf.io.gfile.makedirs(model_dir)
    dataset_pin.record_pin(model_dir, dataset_pin.resolve_dataset(root, model_dir))
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
    lease = dataset_lease.DatasetLease(root, two_runs.run_a, model_dir)
    lease.refresh(now=past)
    return lease


@pytest.mark.parametrize("remover_kind", REMOVER_KINDS)
def test_a_resume_whose_lease_lapsed_waits_for_the_remover_at_work_and_holds_a_whole_run_or_says_it_is_gone(
    two_runs, tmp_path, monkeypatch, remover_kind
):
    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    old_lease = _pin_run_a_with_a_lapsed_lease(two_runs, model_dir)
    two_runs.publish_b()
    remover = HeldRemover(root, two_runs.run_a, remover_kind)
    # A's files are all there, and a remover is at work on them: the resume must not take them as they are.
    reader = InThread(dataset_lease.resolve_and_lease, root, model_dir, removal_wait_seconds=_WAIT_S)
    deadline = time.monotonic() + _WAIT_S
    while old_lease.holder not in live_holders(root, two_runs.run_a):
        assert time.monotonic() < deadline, "the resume never wrote its lease"
        time.sleep(0.02)
    time.sleep(0.5)  # it is waiting on the remover's marker now
    assert reader.thread.is_alive(), "the resume read the run while a remover was at work on it"
    remover.go()
    remover.join()
    try:
        pinned, lease = reader.join()
    except DatasetError as exc:
        message = str(exc)
        assert not is_whole(root, two_runs.manifest_a), "the run is whole, yet the resume refused it"
        assert "expired at" in message and f"run {two_runs.run_a}" in message
        assert "start a new --model-dir" in message and "run the same command again" in message
        assert len(message.splitlines()) <= 5
    else:
        lease.stop()
        assert pinned.run_id == two_runs.run_a
        assert is_whole(root, two_runs.manifest_a), "the resume holds a run that was removed"
        assert old_lease.holder in live_holders(root, two_runs.run_a)


def test_a_resume_whose_run_is_gone_exits_2_in_a_few_lines_saying_its_lease_lapsed(
    two_runs, tmp_path, capsys
):
    from train.__main__ import main  # noqa: PLC0415

    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    _pin_run_a_with_a_lapsed_lease(two_runs, model_dir)
    two_runs.publish_b()
    remove_run_files(root, two_runs.run_a)
    for _ in range(2):  # run again, it says the same
        assert main(["--data", root, "--model-dir", model_dir, "--epochs", "1"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert f"lease {model_dir} held on dataset run {two_runs.run_a} has lapsed" in err, err
        assert f"run {two_runs.run_b}" in err and "start a new --model-dir" in err, err
        assert len(err.strip().splitlines()) <= 5, err


def test_a_resume_whose_lease_lapsed_but_whose_run_is_whole_is_leased_again(two_runs, tmp_path, caplog):
    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    old = _pin_run_a_with_a_lapsed_lease(two_runs, model_dir)
    two_runs.publish_b()
    with caplog.at_level(logging.INFO, logger=dataset_lease.__name__):
        pinned, lease = dataset_lease.resolve_and_lease(root, model_dir)
    lease.stop()
    assert pinned.run_id == two_runs.run_a
    assert live_holders(root, two_runs.run_a) == {old.holder}
    assert "expired at" in caplog.text and "re-checked: the run is whole" in caplog.text


def test_on_the_gcs_emulator_a_first_start_backs_off_from_a_remover_at_work(
    two_runs, gcs_dir, tmp_path, monkeypatch
):
    """The same window on gs://: the lease and the marker listing through TensorFlow's GCS filesystem."""
    root = f"{gcs_dir}/dataset"
    for path in Path(two_runs.root).rglob("*"):
        if path.is_file():
            tf.io.gfile.copy(str(path), f"{root}/{path.relative_to(two_runs.root).as_posix()}")
    model_dir = f"{gcs_dir}/model"
    gate = LeaseGate(monkeypatch)
    reader = InThread(dataset_lease.resolve_and_lease, root, model_dir)
    gate.wait_until_reached()
    with tf.io.gfile.GFile(f"{root}/{commit_log.commit_name(2)}", "wb") as handle:
        handle.write(two_runs.manifest_b)  # B publishes: commit 2, on top of A's commit 1
    remover = HeldRemover(root, two_runs.run_a, "commit log")
    gate.go()
    pinned, lease = reader.join()
    remover.go()
    remover.join()
    lease.stop()

    assert pinned.run_id == two_runs.run_b
    assert not dataset_pin.missing_shards(root, pinned.manifest)
    assert tf.io.gfile.glob(f"{root}/{leases.run_leases_dir(two_runs.run_b)}/{lease.holder}.*.json")
    assert not tf.io.gfile.glob(f"{root}/{leases.run_leases_dir(two_runs.run_a)}/*")


def test_training_leases_its_run_and_train_evaluate_holds_a_lease_while_it_reads(
    two_runs, tmp_path, monkeypatch
):
    from train.config import TrainConfig  # noqa: PLC0415
    from train.data import dataset  # noqa: PLC0415
    from train.evaluate.split import evaluate_split  # noqa: PLC0415
    from train.trainer import train_and_evaluate  # noqa: PLC0415

    root, model_dir = str(two_runs.root), str(tmp_path / "model")
    config = TrainConfig(data_dir=root, model_dir=model_dir, epochs=1, steps_per_epoch=2, global_batch_size=8)
    train_and_evaluate(config)
    holder = leases.holder_id(model_dir)
    assert live_holders(root, two_runs.run_a) == {holder}  # left to expire by itself
    # A day later: B is published, and the training's lease on A has expired (removed here).
    two_runs.publish_b()
    for name in os.listdir(os.path.join(root, leases.run_leases_dir(two_runs.run_a))):
        os.remove(os.path.join(root, leases.run_leases_dir(two_runs.run_a), name))

    reading = threading.Event()
    go = threading.Event()
    make_eval_dataset = dataset.make_eval_dataset

    def held_eval_dataset(*args, **kwargs):
        reading.set()
        assert go.wait(_WAIT_S)
        yield from make_eval_dataset(*args, **kwargs)

    monkeypatch.setattr(dataset, "make_eval_dataset", held_eval_dataset)
    evaluation = InThread(evaluate_split, model_dir, manifest_lib.VALIDATION)
    assert reading.wait(_WAIT_S)
    # While it reads: a live lease on A, which stage 1's cleanup honours.
    assert live_holders(root, two_runs.run_a) == {holder}
    go.set()
    result = evaluation.join()
    assert result["dataset"]["run_id"] == two_runs.run_a
    assert live_holders(root, two_runs.run_a) == {holder}  # it stays until it expires, as training's


@pytest.mark.parametrize(
    "tf_config,chief",
    [
        (None, True),
        ('{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}', True),
        ('{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}}', False),
        ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}', True),
        ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}', False),
    ],
)
def test_only_the_chief_takes_the_lease(monkeypatch, tf_config, chief):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    assert dataset_lease.is_chief_process() is chief
