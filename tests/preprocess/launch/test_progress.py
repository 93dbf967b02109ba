"""`preprocess.launch.progress`: counts from every worker process reach the driver's progress lines."""

import io
import os
import pickle
import re
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from preprocess.launch import progress

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_COUNT_IN_A_CHILD = """
from preprocess.launch.progress import ProgressCounter
decoded, failed = ProgressCounter("decoded"), ProgressCounter("failed")
for _ in range({n}):
    decoded.inc()
failed.inc(2)
"""


def reporter(interval=0.1) -> progress.ProgressReporter:
    return progress.ProgressReporter(interval=interval, stream=io.StringIO())


def test_counts_from_several_processes_are_summed():
    with reporter() as report:
        children = [
            subprocess.Popen(
                [sys.executable, "-c", _COUNT_IN_A_CHILD.format(n=n)], env={**os.environ, "PYTHONPATH": REPO}
            )
            for n in (30, 45)
        ]
        assert [child.wait(timeout=60) for child in children] == [0, 0]
        assert progress.read_totals(report.directory) == {"decoded": 75, "failed": 4}
    assert re.fullmatch(
        r"\[0:\d\d\] done: hashed 0 \(0\.0/s avg\) \| decoded 75 \([\d.]+/s avg\) .*\| failed 4",
        report.lines[-1],
    )


def test_in_process_the_last_line_is_exact_without_waiting_for_worker_processes():
    # With worker processes the reporter waits for their last flush (FLUSH_INTERVAL_SECONDS at least); a
    # job run in this process has nobody to wait for, and its own counts are flushed on the way out.
    counter = progress.ProgressCounter("decoded")
    with progress.ProgressReporter(interval=60, stream=io.StringIO(), worker_processes=False) as report:
        counter.inc(7)
        exiting = time.monotonic()
    assert time.monotonic() - exiting < progress.FLUSH_INTERVAL_SECONDS
    assert "decoded 7 (" in report.lines[-1]


def test_a_line_every_interval_with_the_count_and_rate_so_far():
    counter = progress.ProgressCounter("decoded")
    with reporter(interval=0.2) as report:
        for _ in range(10):
            counter.inc(5)
            time.sleep(0.1)
    lines = report.lines[:-1]
    assert len(lines) >= 3
    counts = [int(re.search(r"decoded (\d+) \(([\d.]+)/s\)", line).group(1)) for line in lines]
    assert counts == sorted(counts) and counts[-1] > 0
    assert any(float(re.search(r"decoded \d+ \(([\d.]+)/s\)", line).group(1)) > 0 for line in lines)
    assert "decoded 50 (" in report.lines[-1] and report.lines[-1].startswith("[0:0")


def test_lines_go_to_the_stream():
    stream = io.StringIO()
    with progress.ProgressReporter(interval=0.05, stream=stream) as report:
        progress.ProgressCounter("encoded").inc(3)
        time.sleep(0.2)
    assert stream.getvalue().splitlines() == report.lines
    assert "encoded 3" in report.lines[-1]


def test_the_environment_and_the_directory_are_cleaned_up_even_on_failure():
    previous = os.environ.get(progress.ENV_VAR)
    with pytest.raises(RuntimeError), reporter() as report:
        assert os.environ[progress.ENV_VAR] == report.directory
        progress.ProgressCounter("decoded").inc()
        raise RuntimeError("the pipeline failed")
    assert os.environ.get(progress.ENV_VAR) == previous
    assert not os.path.exists(report.directory)
    assert "decoded 1" in report.lines[-1]


def test_without_a_reporter_a_counter_does_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    counter = pickle.loads(pickle.dumps(progress.ProgressCounter("decoded")))  # as a DoFn ships it
    counter.inc(5)
    assert counter.stage == "decoded"
    with progress.ProgressReporter(enabled=False) as report:
        counter.inc()
    assert report.directory is None and report.lines == []
    assert progress.ENV_VAR not in os.environ


def test_format_progress_shows_rates_for_stages_and_counts_for_failures():
    line = progress.format_progress(
        {"hashed": 1300, "decoded": 1234, "encoded": 1000, "failed": 6, "duplicates": 0},
        {"hashed": 60.0, "decoded": 56.7, "encoded": 45.06},
        elapsed=62,
    )
    assert line == "[1:02] hashed 1300 (60.0/s) | decoded 1234 (56.7/s) | encoded 1000 (45.1/s) | failed 6"


@pytest.mark.parametrize(
    "argv, local",
    [
        ([], True),
        (["--runner", "DirectRunner"], True),
        (["--runner=PrismRunner"], True),
        (["--runner", "DataflowRunner"], False),
    ],
)
def test_only_local_runners_report(argv, local):
    assert progress.runs_locally(PipelineOptions(argv)) is local


class CountByProcessFn(beam.DoFn):
    def __init__(self):
        self._counter = progress.ProgressCounter("decoded")

    def process(self, element):
        self._counter.inc()
        progress.ProgressCounter(f"pid{os.getpid()}").inc()
        yield element


@pytest.mark.slow
def test_a_beam_job_in_multi_processing_mode_reports_every_element():
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | beam.Create(range(200)) | beam.Reshuffle() | beam.ParDo(CountByProcessFn())
    with reporter(interval=0.5) as report:
        pipeline.run().wait_until_finish()
    final = report.lines[-1]
    assert "decoded 200 (" in final
    by_process = {int(pid): int(count) for pid, count in re.findall(r"pid(\d+) (\d+) ", final)}
    assert sum(by_process.values()) == 200
    assert os.getpid() not in by_process, "the DoFns ran in worker processes"
