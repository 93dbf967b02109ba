"""The quick check of a re-run (issue 32): a local input whose size and mtime are those the previous version's
ledger recorded is keyed by the recorded key, not read; any other is hashed. One tiny real Beam run of the
deduplication step over files on disk and a ledger file."""

import hashlib
import json
import os

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from preprocess.config import parse_split_fractions
from preprocess.inputs.content import RACY_MTIME_NS, DeduplicateByContent, trustworthy_mtime
from preprocess.inputs.reading import key_of_md5
from preprocess.inputs.rules import InputRecord


def recorded_key(index: int) -> str:
    """A key no bytes hash to: an input keyed by it was trusted, not read."""
    return f"{index:064x}"


OLD_NS = 1_600_000_000 * 10**9


def _file(path, data: bytes, mtime_ns: int = OLD_NS):
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return str(path)


def _listed(path) -> InputRecord:
    stat = os.stat(path)
    return InputRecord(uri=path, label="cat", size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def _key(data: bytes) -> str:
    return key_of_md5(hashlib.md5(data).hexdigest())


def test_an_input_of_unchanged_size_and_mtime_is_keyed_by_the_recorded_key_without_being_read(tmp_path):
    unchanged = _file(tmp_path / "unchanged.png", b"a" * 10)
    touched = _file(tmp_path / "touched.png", b"b" * 10)  # same bytes and size, another mtime: hashed
    grown = _file(tmp_path / "grown.png", b"c" * 11)  # same mtime, another size: hashed
    rewritten = _file(tmp_path / "rewritten.png", b"d" * 10)  # the trade-off: same size, mtime restored
    unrecorded = _file(tmp_path / "unrecorded.png", b"e" * 10)  # no stat in the ledger: hashed
    row = _file(tmp_path / "row.png", b"f" * 10)  # a manifest's row: stat'ed by the check itself
    ledger = tmp_path / "ledger-0.jsonl"
    entries = [
        {"uri": unchanged, "key": recorded_key(1), "size": 10, "mtime_ns": OLD_NS},
        {"uri": touched, "key": recorded_key(2), "size": 10, "mtime_ns": OLD_NS - 10**9},
        {"uri": grown, "key": recorded_key(3), "size": 10, "mtime_ns": OLD_NS},
        {"uri": rewritten, "key": recorded_key(4), "size": 10, "mtime_ns": OLD_NS},
        {"uri": unrecorded, "key": recorded_key(5)},
        {"uri": row, "key": recorded_key(6), "size": 10, "mtime_ns": OLD_NS},
    ]
    ledger.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    expected = {
        unchanged: recorded_key(1),
        touched: _key(b"b" * 10),
        grown: _key(b"c" * 11),
        rewritten: recorded_key(4),
        unrecorded: _key(b"e" * 10),
        row: recorded_key(6),
    }
    records = [_listed(path) for path in (unchanged, touched, grown, rewritten, unrecorded)]
    records.append(InputRecord(uri=row, label="cat"))
    fractions = parse_split_fractions("1,0,0")
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        out = pipeline | beam.Create(records) | DeduplicateByContent(fractions, known_keys=[str(ledger)])
        assert_that(
            out["unique"] | beam.Map(lambda image: (image.uri, image.key)),
            equal_to(list(expected.items())),
        )
    # Without the ledger (--checksum, a full rebuild) every file is hashed.
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        out = pipeline | beam.Create(records[:1]) | DeduplicateByContent(fractions)
        assert_that(out["unique"] | beam.Map(lambda image: image.key), equal_to([_key(b"a" * 10)]))


def test_a_file_modified_within_seconds_of_its_listing_records_no_mtime():
    now = OLD_NS + 10 * RACY_MTIME_NS
    assert trustworthy_mtime(now - RACY_MTIME_NS - 1, now) == now - RACY_MTIME_NS - 1
    assert trustworthy_mtime(now - RACY_MTIME_NS + 1, now) is None
    assert trustworthy_mtime(None, now) is None
