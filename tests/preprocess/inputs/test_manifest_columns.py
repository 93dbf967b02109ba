"""A CSV/JSONL manifest as people write them: a header naming the columns in any order, pandas' index
column, `val` for validation; a header is never read as a row."""

import dataclasses
import json

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from preprocess import errors
from preprocess.inputs import checks as input_checks
from preprocess.inputs.listing import ListInputs
from preprocess.inputs.rules import CSV, JSONL, InputRecord, parse_manifest_rows
from tests.user_mistakes import write_image

# What pandas 3.1's DataFrame({"filename": [...], "class": [...], "split": [...]}).to_csv(path) writes:
# its index as a first column with an empty header. Held against pandas itself below, where installed.
PANDAS_CSV = (
    ",filename,class,split\n0,images/a.jpg,cat,train\n1,images/b.jpg,dog,val\n2,images/c.jpg,cat,valid\n"
)


def test_the_bytes_here_are_what_pandas_writes(tmp_path):
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(
        {
            "filename": ["images/a.jpg", "images/b.jpg", "images/c.jpg"],
            "class": ["cat", "dog", "cat"],
            "split": ["train", "val", "valid"],
        }
    )
    frame.to_csv(tmp_path / "labels.csv")
    assert (tmp_path / "labels.csv").read_text() == PANDAS_CSV


def test_a_pandas_csv_reads_by_its_header_its_index_ignored_and_val_is_validation():
    rows = list(parse_manifest_rows(PANDAS_CSV, CSV, "/data/labels.csv"))
    assert rows == [
        InputRecord("/data/images/a.jpg", "cat", "train"),
        InputRecord("/data/images/b.jpg", "dog", "validation"),
        InputRecord("/data/images/c.jpg", "cat", "validation"),
    ]


def test_a_pandas_csv_without_its_header_still_drops_the_index_column():
    rows = list(parse_manifest_rows("0,a.jpg,cat\n1,b.jpg,dog\n", CSV, "/data/labels.csv"))
    assert rows == [InputRecord("/data/a.jpg", "cat"), InputRecord("/data/b.jpg", "dog")]


@pytest.mark.parametrize(
    "header, row",
    [
        ("filename,class", "x.jpg,cat"),
        ("Path,Category", "x.jpg,cat"),
        ("label,image", "cat,x.jpg"),  # any order
        ("image,label,split", "x.jpg,cat,"),
        ("file,label,notes", "x.jpg,cat,taken at noon"),  # other columns ignored
    ],
)
def test_common_headers_name_the_columns_and_are_never_a_row(header, row):
    rows = list(parse_manifest_rows(f"{header}\n{row}\n", CSV, "/data/m.csv"))
    assert rows == [InputRecord("/data/x.jpg", "cat")]


@pytest.mark.parametrize(
    "written, split",
    [("val", "validation"), ("VALID", "validation"), ("eval", "validation"), ("test", "test")],
)
def test_split_names_people_use(written, split):
    (row,) = parse_manifest_rows(f"uri,label,split\nx.jpg,cat,{written}\n", CSV, "/data/m.csv")
    assert row == InputRecord("/data/x.jpg", "cat", split)
    (row,) = parse_manifest_rows(
        json.dumps({"path": "x.jpg", "class": "cat", "split": written}), JSONL, "/m.jsonl"
    )
    assert row == InputRecord("/x.jpg", "cat", split)


def test_an_unknown_split_is_still_an_error_naming_the_accepted_ones():
    (row,) = parse_manifest_rows("uri,label,split\nx.jpg,cat,holdout\n", CSV, "/data/m.csv")
    assert row.reason == errors.UNKNOWN_SPLIT and "val" in row.detail


@pytest.fixture(scope="module")
def pandas_corpus(tmp_path_factory):
    base = tmp_path_factory.mktemp("pandas_corpus")
    for number, name in enumerate("abc"):
        write_image(base / "images" / f"{name}.jpg", number)
    (base / "labels.csv").write_text(PANDAS_CSV)
    return base


def test_a_pandas_csv_is_listed_by_the_job_with_its_header_and_index_dropped(pandas_corpus):
    with TestPipeline() as pipeline:
        listed = pipeline | ListInputs(str(pandas_corpus / "labels.csv"))
        assert_that(
            listed.records
            | beam.Map(lambda record: (record.uri.rsplit("/", 1)[1], record.label, record.split)),
            equal_to(
                [("a.jpg", "cat", "train"), ("b.jpg", "dog", "validation"), ("c.jpg", "cat", "validation")]
            ),
            label="records",
        )
        assert_that(listed.errors | beam.Map(dataclasses.astuple), equal_to([]), label="errors")


def test_a_pandas_csv_passes_the_checks_before_the_job(pandas_corpus, tmp_path):
    survey = input_checks.check_inputs(str(pandas_corpus / "labels.csv"), str(tmp_path / "out"))
    assert survey.classes == ("cat", "dog")
