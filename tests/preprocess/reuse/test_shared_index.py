"""The quick check's index is built once per job (reuse/shared_index.py): the launcher builds it, each worker
process copies it instead of building it from the ledger, two at once; a worker that cannot read the
launcher's (it has ended, or the fd is another file now) builds it as before; nothing is left in /tmp
however the launcher or a worker ends."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from preprocess.config import parse_split_fractions
from preprocess.inputs.content import DeduplicateByContent
from preprocess.inputs.rules import InputRecord
from preprocess.reuse import ledger, shared_index

OLD_NS = 1_600_000_000 * 10**9


def _inputs_and_ledger(tmp_path, count=3):
    """`count` old files and a ledger recording each one's size and mtime under a key no bytes hash to."""
    records, entries = [], []
    for index in range(count):
        path = tmp_path / f"{index}.png"
        path.write_bytes(b"x" * (10 + index))
        os.utime(path, ns=(OLD_NS, OLD_NS))
        records.append(InputRecord(uri=str(path), label="cat", size=10 + index, mtime_ns=OLD_NS))
        entries.append({"uri": str(path), "key": f"{index:064x}", "size": 10 + index, "mtime_ns": OLD_NS})
    path = tmp_path / "ledger-0.jsonl"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return records, str(path)


def _counter(result, name):
    counters = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return sum(counter.committed for counter in counters)


def test_the_workers_copy_the_index_the_launcher_built_once(tmp_path):
    records, ledger_file = _inputs_and_ledger(tmp_path)
    pipeline = beam.Pipeline(runner=FnApiRunner())
    shared = shared_index.share(pipeline, [ledger_file])
    out = (
        pipeline
        | beam.Create(records)
        | DeduplicateByContent(parse_split_fractions("1,0,0"), known_keys=shared)
    )
    assert_that(
        out["unique"] | beam.Map(lambda image: image.key), equal_to([f"{index:064x}" for index in range(3)])
    )
    result = pipeline.run()
    result.wait_until_finish()
    shared_index.release(pipeline)
    assert _counter(result, "quick_check_index_built") == 0  # each worker process built it before
    assert _counter(result, "quick_check_index_copied") == 1


_WORKER = """
import json, sys, tempfile
tempfile.tempdir = sys.argv[1]
from preprocess.reuse import ledger, shared_index
spec = json.loads(sys.argv[2])
spec["ledger_files"] = tuple(spec["ledger_files"])
index = ledger.known_keys(shared_index.SharedIndex(**spec))
print(json.dumps([index.built, index.get(sys.argv[3])]), flush=True)
sys.stdin.read()  # held open until told to end
"""


def test_two_workers_at_once_copy_it_and_a_killed_launcher_or_worker_leaves_nothing(tmp_path, monkeypatch):
    records, ledger_file = _inputs_and_ledger(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    held = shared_index.HeldIndex([ledger_file])
    # Held open, its name already unlinked: a launcher killed now leaves nothing in /tmp.
    assert os.path.getsize(f"/proc/{os.getpid()}/fd/{held.shared.fd}") > 0 and os.listdir(scratch) == []
    try:
        spec = json.dumps(dataclasses.asdict(held.shared))
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(scratch), spec, records[1].uri],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        answers = [json.loads(worker.stdout.readline()) for worker in workers]
        assert answers == [[False, [11, OLD_NS, f"{1:064x}"]]] * 2  # copied, not built; the recorded key
        assert os.listdir(scratch) == []  # each copy unlinked once open
        workers[0].send_signal(signal.SIGKILL)
        workers[1].communicate("")
        workers[0].wait()
        assert os.listdir(scratch) == []
    finally:
        held.close()
    # The launcher gone (its fd closed): a worker that starts now builds the index from the ledger.
    ledger._known.clear()
    index = ledger.known_keys(held.shared)
    assert index.built and index.get(records[2].uri) == (12, OLD_NS, f"{2:064x}")
    index.remove()
    ledger._known.clear()


def test_a_worker_on_another_machine_copies_the_index_uploaded_for_the_job(gcs_dir, tmp_path):
    records, ledger_file = _inputs_and_ledger(tmp_path)
    held = shared_index.HeldIndex([ledger_file], upload_dir=f"{gcs_dir}/temp")
    elsewhere = dataclasses.replace(held.shared, machine="another-worker/boot")  # a Dataflow worker
    ledger._known.clear()
    index = ledger.known_keys(elsewhere)
    assert index.copied_from == f"{gcs_dir}/temp/quick-check-{held.token}.sqlite"
    assert index.get(records[0].uri) == (10, OLD_NS, f"{0:064x}")
    held.close()  # the job has ended: its upload is removed
    assert not FileSystems.exists(index.copied_from)
    index.remove()
    ledger._known.clear()


def test_a_copy_left_by_a_worker_killed_while_writing_it_is_removed_by_the_next(tmp_path, monkeypatch):
    _, ledger_file = _inputs_and_ledger(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ended = subprocess.Popen([sys.executable, "-c", ""])
    ended.wait()
    (scratch / f"quick-check-{ended.pid}-abc").mkdir()  # its process was killed before it unlinked it
    (scratch / f"quick-check-{ended.pid}-abc" / "known.sqlite").write_bytes(b"partial")
    (scratch / f"quick-check-{os.getpid()}-def").mkdir()  # a running process's: kept
    (scratch / "quick-check-other").mkdir()  # not named by a process: kept
    held = shared_index.HeldIndex([ledger_file])
    held.close()
    assert sorted(os.listdir(scratch)) == [f"quick-check-{os.getpid()}-def", "quick-check-other"]
