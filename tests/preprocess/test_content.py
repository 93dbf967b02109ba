"""Content hashing, deduplication and the split: transforms fed with beam.Create."""

import collections
import hashlib

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from preprocess import errors
from preprocess.content import DeduplicateByContent, UniqueInput, assign_split
from preprocess.inputs import InputRecord

FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_assign_split_is_a_function_of_the_hash_alone():
    hashes = [_sha(str(i)) for i in range(2000)]
    first = [assign_split(h, FRACTIONS) for h in hashes]
    second = [assign_split(h, dict(reversed(list(FRACTIONS.items())))) for h in hashes]
    assert first == second


def test_assign_split_follows_the_fractions():
    counts = collections.Counter(assign_split(_sha(str(i)), FRACTIONS) for i in range(20000))
    assert abs(counts["train"] / 20000 - 0.8) < 0.02
    assert abs(counts["validation"] / 20000 - 0.1) < 0.01
    assert abs(counts["test"] / 20000 - 0.1) < 0.01


def test_assign_split_never_uses_a_split_with_zero_fraction():
    fractions = {"train": 0.9, "validation": 0.1, "test": 0.0}
    assert {assign_split(_sha(str(i)), fractions) for i in range(5000)} == {"train", "validation"}


def _write(tmp_path, name, data: bytes) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def test_duplicates_are_written_once_and_conflicting_labels_are_errors(tmp_path):
    a = _write(tmp_path, "cat/a.png", b"image-a")
    a_copy = _write(tmp_path, "cat/a_copy.png", b"image-a")
    b = _write(tmp_path, "cat/b.png", b"image-b")
    b_other_label = _write(tmp_path, "dog/b.png", b"image-b")
    empty = _write(tmp_path, "dog/empty.png", b"")
    missing = str(tmp_path / "dog" / "vanished.png")
    records = [
        InputRecord(a, "cat"),
        InputRecord(a_copy, "cat"),
        InputRecord(b, "cat"),
        InputRecord(b_other_label, "dog"),
        InputRecord(empty, "dog"),
        InputRecord(missing, "dog"),
    ]
    sha_a = hashlib.sha256(b"image-a").hexdigest()
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create(records) | DeduplicateByContent(FRACTIONS)
        assert_that(
            result["unique"],
            equal_to([UniqueInput(a, "cat", assign_split(sha_a, FRACTIONS), sha_a)]),
            label="unique",
        )
        assert_that(result["duplicates"], equal_to([{"uri": a_copy, "duplicate_of": a}]), label="duplicates")
        assert_that(
            result["errors"] | beam.Map(lambda error: (error.uri, error.reason)),
            equal_to(
                [
                    (b, errors.CONFLICTING_LABELS),
                    (b_other_label, errors.CONFLICTING_LABELS),
                    (empty, errors.EMPTY_FILE),
                    (missing, errors.UNREADABLE),
                ]
            ),
            label="errors",
        )


def test_a_split_named_by_the_manifest_wins_over_the_hash(tmp_path):
    path = _write(tmp_path, "cat/a.png", b"image-a")
    sha = hashlib.sha256(b"image-a").hexdigest()
    named = "test" if assign_split(sha, FRACTIONS) != "test" else "validation"
    with TestPipeline() as pipeline:
        result = pipeline | beam.Create([InputRecord(path, "cat", named)]) | DeduplicateByContent(FRACTIONS)
        assert_that(result["unique"] | beam.Map(lambda item: item.split), equal_to([named]))


@pytest.mark.parametrize("bad", ["0.5,0.5", "0.7,0.2,0.2", "0,0.5,0.5", "a,b,c"])
def test_bad_split_fractions_are_refused_with_a_message(bad):
    from preprocess.options import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--input", "x", "--output", "y", "--split", bad])
