"""The quick check's index of the previous ledger (ledger.known_keys): on disk, read by key, with the map's
answers (a URI listed twice keeps its last entry; an entry without size or mtime is not in it); one per
process, its file unlinked as soon as it is open (nothing left behind however the process ends), its
connection closed when another replaces it."""

import json
import os
import sqlite3
import tempfile
import threading

import pytest

from preprocess.reuse import ledger


def _ledger(path, entries):
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return str(path)


def test_the_index_answers_as_the_map_did_leaves_no_file_and_is_replaced(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    key = [f"{index:064x}" for index in range(4)]
    first = _ledger(
        tmp_path / "ledger-0.jsonl",
        [
            {"uri": "/a.png", "key": key[0], "size": 10, "mtime_ns": 5},
            {"uri": "/b.png", "key": key[1]},  # no stat recorded: hashed
            {"uri": "/c.png", "key": key[2], "size": 3, "mtime_ns": 7, "failed": {"reason": "truncated"}},
        ],
    )
    second = _ledger(
        tmp_path / "ledger-1.jsonl", [{"uri": "/a.png", "key": key[3], "size": 11, "mtime_ns": 6}]
    )
    index = ledger.known_keys((first, second))
    assert ledger.known_keys((first, second)) is index  # built once per process
    assert index.get("/a.png") == (11, 6, key[3])
    assert index.get("/b.png") is None and index.get("/elsewhere.png") is None
    assert index.get("/c.png") == (3, 7, key[2])  # a failure's line keys its input too
    assert os.listdir(scratch) == []  # unlinked once open: a worker killed now leaves nothing in /tmp
    answers = []
    reader = threading.Thread(
        target=lambda: answers.append(index.get("/a.png"))
    )  # the runner's threads share it
    reader.start()
    reader.join()
    assert answers == [(11, 6, key[3])]
    other = ledger.known_keys((first,))
    assert other.get("/a.png") == (10, 5, key[0])
    with pytest.raises(sqlite3.ProgrammingError):  # the replaced index's connection is closed
        index.get("/a.png")
    assert os.listdir(scratch) == []
    other.remove()
