"""The quick check's index is built once per job (reuse/shared_index.py): the launcher builds it, each worker
process opens its machine's copy instead of building it from the ledger (a real Beam run with two worker
processes; a worker elsewhere copies the upload, on the GCS emulator); the worker processes of one Dataflow VM
download it once, and one killed as it downloads leaves nothing the others open; a worker that cannot read
the launcher's (it has ended) builds it as before; nothing is left in /tmp, and a file left by a killed
process is removed."""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from preprocess.config import parse_split_fractions
from preprocess.inputs.content import DeduplicateByContent
from preprocess.inputs.rules import InputRecord
from preprocess.launch import local_runner
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


def _indexes(directory):
    return [name for name in os.listdir(directory) if name.startswith("quick-check-")]


def _counter(result, name):
    counters = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return sum(counter.committed for counter in counters)


def test_two_worker_processes_copy_the_index_the_launcher_built_once(tmp_path, monkeypatch):
    records, ledger_file = _inputs_and_ledger(tmp_path, count=20)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the worker processes' temporary directory, and this one's
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    options = PipelineOptions(["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"])
    pipeline = beam.Pipeline(runner=local_runner.fn_api_runner(options), options=options)
    shared = shared_index.share(pipeline, [ledger_file])
    # Held open, its name already unlinked: a launcher killed now leaves nothing in /tmp.
    assert os.path.getsize(f"/proc/{os.getpid()}/fd/{shared.fd}") > 0 and _indexes(scratch) == []
    out = (
        pipeline
        | beam.Create(records)
        | beam.Reshuffle()
        | DeduplicateByContent(parse_split_fractions("1,0,0"), known_keys=shared)
    )
    assert_that(
        out["unique"] | beam.Map(lambda image: image.key), equal_to([f"{index:064x}" for index in range(20)])
    )
    result = pipeline.run()
    result.wait_until_finish()
    shared_index.release(pipeline)
    assert _counter(result, "quick_check_index_built") == 0  # each worker process built it before
    assert _counter(result, "quick_check_index_copied") >= 1  # once per worker process, not per bundle
    assert _counter(result, "keys_trusted_by_stat") == 20
    assert _indexes(scratch) == []  # each copy unlinked once open
    # The launcher's file freed: a worker that starts now builds the index from the ledger, as before.
    ledger._known.clear()
    index = ledger.known_keys(shared)
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


# A worker process on a Dataflow VM: it opens its machine's copy of the index (`json` of the SharedIndex in
# argv[1]), then prints where it came from; with argv[2] == "die", it stops as the copy is complete, before it
# is renamed into place, and waits to be killed.
WORKER = """
import json, os, sys, time
from preprocess.reuse import ledger, shared_index
fields = json.loads(sys.argv[1])
shared = shared_index.SharedIndex(**{**fields, "ledger_files": tuple(fields["ledger_files"])})
if sys.argv[2] == "die":
    def rename(*_):
        print("copied", flush=True)
        time.sleep(600)
    os.rename = rename
index = ledger.known_keys(shared)
print(json.dumps({"copied_from": index.copied_from, "entry": index.get(sys.argv[3])}), flush=True)
"""


def _worker(shared, uri, scratch, env, mode="open", **more_env):
    fields = json.dumps(dataclasses.asdict(shared))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, fields, mode, uri],
        env={**env, "TMPDIR": str(scratch), "PYTHONPATH": os.getcwd(), **more_env},
        stdout=subprocess.PIPE,
        text=True,
    )


def _reads(faults, held):
    """The reads of the index's upload (a download is more than one: Beam's reader reads on past the end)."""
    return sum(1 for read in faults.forwarded_reads if read.name == held.uploaded.split("/", 3)[3])


def _reads_of_a_download(faults, shared, held, tmp_path):
    before = _reads(faults, held)
    assert shared.copy_to(str(tmp_path / "one-download.sqlite")) == held.uploaded
    return _reads(faults, held) - before


def test_the_worker_processes_of_a_dataflow_vm_download_the_index_once(gcs_dir, gcs_read_faults, tmp_path):
    records, ledger_file = _inputs_and_ledger(tmp_path)
    held = shared_index.HeldIndex([ledger_file], upload_dir=f"{gcs_dir}/temp")
    elsewhere = dataclasses.replace(held.shared, machine="another-worker/boot")
    # Two SDK containers of one VM, as on Dataflow: each its own /tmp, the VM's semi-persistent directory shared.
    shared_dir, containers = (
        tmp_path / "semi-persistent",
        [tmp_path / "container-1", tmp_path / "container-2"],
    )
    for directory in (shared_dir, *containers):
        directory.mkdir()
    workers = [
        _worker(
            elsewhere, records[1].uri, tmp, gcs_read_faults.env, SEMI_PERSISTENT_DIRECTORY=str(shared_dir)
        )
        for tmp in containers
    ]
    said = [json.loads(worker.communicate(timeout=120)[0]) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    assert all(process["entry"] == [11, OLD_NS, f"{1:064x}"] for process in said)
    by_workers = _reads(gcs_read_faults, held)
    assert by_workers == _reads_of_a_download(gcs_read_faults, elsewhere, held, tmp_path)  # one per VM
    assert sorted(process["copied_from"] for process in said) == sorted([ledger.MACHINE, held.uploaded])
    # One file on the VM, named by the job, and its lock; no partial copy.
    assert sorted(os.listdir(shared_dir)) == [
        f"quick-check-job-{held.token}.{end}" for end in ("lock", "sqlite")
    ]
    held.close()


def test_a_worker_killed_while_it_downloads_the_index_leaves_no_copy_that_another_opens(
    gcs_dir, gcs_read_faults, tmp_path, monkeypatch
):
    records, ledger_file = _inputs_and_ledger(tmp_path)
    held = shared_index.HeldIndex([ledger_file], upload_dir=f"{gcs_dir}/temp")
    elsewhere = dataclasses.replace(held.shared, machine="another-worker/boot")
    scratch = tmp_path / "vm-tmp"
    scratch.mkdir()
    dying = _worker(elsewhere, records[1].uri, scratch, gcs_read_faults.env, mode="die")
    assert dying.stdout.readline() == "copied\n"  # downloaded, under the lock, not yet renamed into place
    dying.kill()  # kill -9: the lock is freed with the process, its partial file stays
    dying.wait()
    # Its partial copy, never under the name the other processes open.
    assert sorted(_indexes(scratch)) == [f"quick-check-job-{held.token}.{end}" for end in ("lock", "partial")]
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ledger._known.clear()
    index = ledger.known_keys(elsewhere)  # the next worker process of that VM downloads it again
    assert index.copied_from == held.uploaded and index.get(records[2].uri) == (12, OLD_NS, f"{2:064x}")
    by_workers = _reads(gcs_read_faults, held)
    assert by_workers == 2 * _reads_of_a_download(gcs_read_faults, elsewhere, held, tmp_path)
    # The partial copy written anew and renamed: the copy, its lock.
    assert sorted(_indexes(scratch)) == [f"quick-check-job-{held.token}.{end}" for end in ("lock", "sqlite")]
    index.remove()
    ledger._known.clear()
    held.close()
    assert _indexes(scratch) == []


def test_a_machine_copy_no_process_holds_is_removed_by_the_next_job_on_that_machine(tmp_path, monkeypatch):
    records, ledger_file = _inputs_and_ledger(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for job in ("ended", "running"):  # copies of two earlier jobs, as their worker processes left them
        (scratch / f"quick-check-job-{job}.sqlite").write_bytes(b"index")
        (scratch / f"quick-check-job-{job}.lock").write_bytes(b"")
    (scratch / "quick-check-job-killed.lock").write_bytes(b"")  # a job whose only copier was killed
    (scratch / "quick-check-job-killed.partial").write_bytes(b"ind")
    held = ledger.hold(str(scratch / "quick-check-job-running.sqlite"))  # a process still reads it
    job = shared_index.HeldIndex([ledger_file])
    path, source = job.shared.machine_copy()
    assert source == f"/proc/{os.getpid()}/fd/{job.shared.fd}"
    assert sorted(os.listdir(scratch)) == sorted(
        [f"quick-check-job-{name}.{end}" for name in ("running", job.token) for end in ("lock", "sqlite")]
    )
    held.close()
    job.close()  # the job ends: its launcher removes its machine's copy
    assert sorted(os.listdir(scratch)) == ["quick-check-job-running.lock", "quick-check-job-running.sqlite"]
