"""The one reader of the error log (preprocess.errors.read_error_log), on real files."""

import json

from preprocess import errors


def _write_log(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + "not json\n\n")
    return str(path)


def _records(reason, count):
    return [{"uri": f"{reason}-{i}.jpg", "reason": reason, "detail": f"d{i}"} for i in range(count)]


def test_without_wanted_every_line_is_read_and_counted(tmp_path):
    first = _write_log(tmp_path / "errors-0.jsonl", _records("truncated", 4))
    second = _write_log(tmp_path / "errors-1.jsonl", _records("not_an_image", 2) + _records("truncated", 1))
    sample = errors.read_error_log([first, second], per_reason=2)
    assert sample.counts == {"truncated": 5, "not_an_image": 2}
    assert [record.uri for record in sample.examples["truncated"]] == ["truncated-0.jpg", "truncated-1.jpg"]
    assert sample.examples["not_an_image"][1] == errors.ErrorRecord(
        "not_an_image-1.jpg", "not_an_image", "d1"
    )
    assert sample.notes == []


def test_with_wanted_it_stops_once_each_reason_has_its_examples(tmp_path):
    first = _write_log(tmp_path / "errors-0.jsonl", _records("truncated", 3))
    second = _write_log(tmp_path / "errors-1.jsonl", _records("truncated", 100))
    sample = errors.read_error_log([first, second], per_reason=2, wanted={"truncated": 103})
    assert sample.counts == {"truncated": 2}
    assert sample.bytes_read < (tmp_path / "errors-0.jsonl").stat().st_size


def test_a_missing_file_and_the_byte_budget_are_noted(tmp_path):
    log = _write_log(tmp_path / "errors-0.jsonl", _records("truncated", 1) + _records("unreadable", 50))
    sample = errors.read_error_log(
        [str(tmp_path / "gone.jsonl"), log],
        per_reason=5,
        wanted={"truncated": 1, "unreadable": 50},
        max_bytes=100,
    )
    assert sample.notes[0] == f"error file {tmp_path / 'gone.jsonl'} is missing"
    assert "stopped reading the error log after 0 MB" in sample.notes[1]
    assert sample.bytes_read >= 100 and sample.counts["truncated"] == 1
