"""--max-failed-fraction fails the job while it decodes, once crossing it is certain or as good as certain."""

import io
import re

import pytest
from PIL import Image

from preprocess.decode.failure_budget import FAILED, FOUND, UNIQUE, FailureBudget
from preprocess.errors import TooManyFailuresError
from preprocess.launch import command


def _known(found, unique, failed=None):
    return {FOUND: found, UNIQUE: unique, FAILED: failed or {}}


def test_failures_before_decoding_plus_this_workers_own_that_exceed_the_fraction_stop_the_job():
    budget = FailureBudget(0.1)
    known = _known(1000, 990, {"unreadable": 10})
    budget.start_bundle()
    for _ in range(90):
        budget.record("decode_error", known)  # 100 of 1000: not more than 10% yet
    with pytest.raises(TooManyFailuresError) as raised:
        budget.record("decode_error", known)
    message = str(raised.value)
    assert "at least 101 of the 1000 inputs found fail (certain)" in message
    assert "Failed before decoding: unreadable 10" in message
    assert "decoded 91 of the 990 unique inputs and 91 failed: decode_error 91" in message


def test_a_worker_whose_every_read_fails_stops_the_job_from_its_sample_long_before_the_end():
    """A bucket the job cannot read: 1M inputs over many workers, every read a 403."""
    budget = FailureBudget(0.05)
    known = _known(1_000_000, 1_000_000)
    budget.start_bundle()
    with pytest.raises(TooManyFailuresError, match="estimated with 1 - 1e-09 confidence") as raised:
        for _ in range(10_000):
            budget.record("unreadable", known)
    assert "decoded 256 of the 1000000" in str(raised.value)


def test_a_worker_failing_at_the_threshold_rate_is_never_stopped_on_its_sample():
    budget = FailureBudget(0.1)
    known = _known(1_000_000, 1_000_000)
    budget.start_bundle()
    for attempt in range(50_000):
        budget.record("decode_error" if attempt % 10 == 0 else None, known)  # 10%: allowed


def test_a_retried_bundle_is_not_counted_twice():
    budget = FailureBudget(0.1)
    known = _known(100, 100)
    budget.start_bundle()
    for _ in range(6):
        budget.record("unreadable", known)
    # The bundle fails for another reason and is retried on this instance: its 6 failures are not kept.
    for _ in range(3):
        budget.start_bundle()
        for _ in range(6):
            budget.record("unreadable", known)
    budget.finish_bundle()
    budget.start_bundle()
    for _ in range(4):
        budget.record("unreadable", known)  # 10 of 100: not more than 10%
    with pytest.raises(TooManyFailuresError):
        budget.record("unreadable", known)


def _jpeg(green: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (12, 12), (10, green, 30)).save(buffer, "JPEG")
    return buffer.getvalue()


def test_a_corpus_that_is_mostly_not_images_fails_while_decoding_with_the_counts_by_reason(tmp_path, capsys):
    for green, label in ((100, "cat"), (200, "dog")):
        folder = tmp_path / "corpus" / label
        folder.mkdir(parents=True)
        (folder / "good.jpg").write_bytes(_jpeg(green))
        for index in range(30):
            (folder / f"notes-{index}.jpg").write_bytes(f"not an image {label} {index}".encode())
    with pytest.raises(SystemExit) as exited:
        command.main(
            [
                "--input",
                str(tmp_path / "corpus"),
                "--output",
                str(tmp_path / "out"),
                "--image-size",
                "16",
                "--max-failed-fraction",
                "0.2",
            ]
        )
    # The input's fault: exit 2, its message alone on stderr (preprocess/launch/command.py).
    assert exited.value.code == 2
    message = capsys.readouterr().err
    assert "stopped early: at least 13 of the 62 inputs found fail (certain)" in message
    assert "Failed before decoding: none." in message
    decoded = int(
        re.search(
            r"This worker decoded (\d+) of the 62 unique inputs and 13 failed: not_an_image 13", message
        )[1]
    )
    assert decoded < 62  # it did not decode them all first
    assert not (tmp_path / "out" / "dataset.json").exists()
