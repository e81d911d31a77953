"""ReadDocuments: parquet and JSONL, local and fsspec, columns checked at launch."""

from __future__ import annotations

import gzip
import json

import apache_beam as beam
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import finepdfs_row, fnapi_pipeline

from transforms.read import ReadConfig, ReadDocuments, expand_pattern, plan_input
from transforms.records import BadInputError, Document

ROWS = [
    finepdfs_row("a", "First document, in English."),
    finepdfs_row("b", "Deuxième document.", language="fra_Latn", page_average_lid="fra_Latn"),
    finepdfs_row("c", "Third <|endoftext|> document", page_average_lid_score=None, token_count=None),
]


def _expected(path: str) -> list[Document]:
    return [
        Document(r["id"], r["text"], path, i, r["language"], r["page_average_lid"],
                 r["page_average_lid_score"], r["token_count"])
        for i, r in enumerate(ROWS)
    ]


def _write_parquet(path, rows=ROWS, row_group_size=2, **extra_columns):
    table = pa.Table.from_pylist(rows)
    for name, values in extra_columns.items():
        table = table.append_column(name, values)
    pq.write_table(table, path, row_group_size=row_group_size)


def _read(pattern: str) -> list[Document]:
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(pattern))).docs
        out = docs | beam.combiners.ToList()
        result = []
        assert_that(out, lambda lists: result.extend(lists[0]) or True)
    return result


def test_parquet_rows_come_out_with_their_file_and_row(tmp_path):
    path = tmp_path / "part-0.parquet"
    _write_parquet(path, url=pa.array(["u1", "u2", "u3"]))
    units = plan_input(ReadConfig(str(path)))
    assert [(u.row_group, u.first_row) for u in units] == [(0, 0), (1, 2)]
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(tmp_path / "*.parquet")))).docs
        assert_that(docs, equal_to(_expected(str(path))))


def test_jsonl_and_gzipped_jsonl_read_the_same_fields(tmp_path):
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    zipped = tmp_path / "b.jsonl.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(tmp_path)))).docs
        assert_that(docs, equal_to(_expected(str(plain)) + _expected(str(zipped))))


def test_reads_from_an_fsspec_url():
    fs = fsspec.filesystem("memory")
    with fs.open("/readtest/in/x.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist(ROWS), f)
    assert expand_pattern("memory://readtest/in/*.parquet") == ["memory:///readtest/in/x.parquet"]
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig("memory://readtest/in/*.parquet"))).docs
        assert_that(docs | beam.Map(lambda d: d.id), equal_to(["a", "b", "c"]))


def test_integer_ids_become_decimal_strings(tmp_path):
    path = tmp_path / "ints.jsonl"
    path.write_text(json.dumps({"id": 7, "text": "seven"}) + "\n")
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(path), with_lid=False))).docs
        assert_that(docs | beam.Map(lambda d: (d.id, d.text)), equal_to([("7", "seven")]))


@pytest.mark.parametrize(
    "drop, retype, message",
    [
        ("page_average_lid_score", None, "missing column 'page_average_lid_score'"),
        (None, ("page_average_lid_score", pa.array(["0.9", "0.9", "0.9"])), "has type string, expected number"),
        (None, ("text", pa.array([1, 2, 3])), "column 'text' has type int64, expected string"),
    ],
)
def test_schema_problems_fail_at_launch_naming_the_file(tmp_path, drop, retype, message):
    table = pa.Table.from_pylist(ROWS)
    if drop:
        table = table.drop_columns([drop])
    if retype:
        name, values = retype
        table = table.set_column(table.schema.get_field_index(name), name, values)
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(BadInputError, match=message) as info:
        ReadDocuments(ReadConfig(str(tmp_path / "*.parquet")))
    assert str(path) in str(info.value)


def test_a_file_that_is_not_parquet_fails_at_launch(tmp_path):
    _write_parquet(tmp_path / "good.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(BadInputError, match=r"broken\.parquet: not a readable parquet file"):
        ReadDocuments(ReadConfig(str(tmp_path / "*.parquet")))


def test_empty_glob_and_unknown_file_types_fail(tmp_path):
    with pytest.raises(BadInputError, match="matches no input files"):
        ReadDocuments(ReadConfig(str(tmp_path / "*.parquet")))
    (tmp_path / "notes.csv").write_text("id,text\n")
    with pytest.raises(BadInputError, match="unknown file type"):
        ReadDocuments(ReadConfig(str(tmp_path / "*.csv")))


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"bad\.jsonl line 2: is not JSON"),
        ('{"id": "x"}', r"bad\.jsonl line 2: missing field\(s\) text"),
        ('{"id": null, "text": "t", "language": null, "page_average_lid": null, '
         '"page_average_lid_score": null, "token_count": null}', r"bad\.jsonl line 2: 'id' is null"),
        ('{"id": "x", "text": ["t"], "language": null, "page_average_lid": null, '
         '"page_average_lid_score": null, "token_count": null}', r"'text' is list"),
    ],
)
def test_bad_jsonl_rows_fail_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(Exception, match=message):
        _read(str(path))


def test_invalid_utf8_in_jsonl_fails_naming_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"id": "x", "text": "caf\xe9"}\n')
    with pytest.raises(Exception, match=r"latin1\.jsonl line 2: is not valid UTF-8"):
        _read(str(path))


@pytest.mark.parametrize("bad_id, problem", [("a|b", "contains '|'"), ("a\nb", "line break"), (" a", "whitespace"),
                                             ("", "is empty")])
def test_ids_the_manifest_cannot_hold_fail_naming_the_row(tmp_path, bad_id, problem):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(finepdfs_row(bad_id, "t")) + "\n")
    with pytest.raises(Exception, match=rf"ids\.jsonl line 2: id .*{problem}"):
        _read(str(path))
