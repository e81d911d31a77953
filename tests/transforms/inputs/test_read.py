"""ReadDocuments: parquet and JSONL, local and fsspec, columns checked at launch."""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma

import apache_beam as beam
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from apache_beam.testing.util import assert_that, equal_to
from conftest import finepdfs_row, fnapi_pipeline
from doc_batches import documents_of

from transforms.core.batches import DocBatch
from transforms.core.records import BadInputError, Document
from transforms.inputs.arrow import column_values
from transforms.inputs.compression import open_decompressed
from transforms.inputs.discover import expand_pattern
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_input
from transforms.inputs.read import CountRecords, ReadDocuments, read_unit
from transforms.inputs.registry import JSON_VALUES_SUFFIXES, JSONL_SUFFIXES

# The columns the default conditions read (shards.conditions), as a Document holds them.
DEFAULT_COLUMNS = [f.name for f in ReadConfig("").filter_fields()]
ROWS = [
    finepdfs_row("a", "First document, in English."),
    finepdfs_row("b", "Deuxième document.", language="fra_Latn", page_average_lid="fra_Latn"),
    finepdfs_row("c", "Third <|endoftext|> document", page_average_lid_score=None, token_count=None),
]


def _expected(path: str) -> list[Document]:
    return [
        Document(r["id"], r["text"], path, i, {name: r[name] for name in DEFAULT_COLUMNS})
        for i, r in enumerate(ROWS)
    ]


def _write_parquet(path, rows=ROWS, row_group_size=2, **extra_columns):
    table = pa.Table.from_pylist(rows)
    for name, values in extra_columns.items():
        table = table.append_column(name, values)
    pq.write_table(table, path, row_group_size=row_group_size)


def _documents(batches):
    """ReadDocuments' DocBatches as Documents."""
    return batches | "Documents" >> beam.FlatMap(documents_of)


def _read(pattern: str) -> list[Document]:
    with fnapi_pipeline() as p:
        docs = _documents((p | ReadDocuments(ReadConfig(pattern))).docs)
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
        assert_that(_documents(docs), equal_to(_expected(str(path))))


def test_jsonl_and_gzipped_jsonl_read_the_same_fields(tmp_path):
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    zipped = tmp_path / "b.jsonl.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(tmp_path)))).docs
        assert_that(_documents(docs), equal_to(_expected(str(plain)) + _expected(str(zipped))))


def test_reads_from_an_fsspec_url():
    fs = fsspec.filesystem("memory")
    with fs.open("/readtest/in/x.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pylist(ROWS), f)
    assert expand_pattern("memory://readtest/in/*.parquet") == ["memory:///readtest/in/x.parquet"]
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig("memory://readtest/in/*.parquet"))).docs
        assert_that(_documents(docs) | beam.Map(lambda d: d.id), equal_to(["a", "b", "c"]))


def test_integer_ids_become_decimal_strings(tmp_path):
    path = tmp_path / "ints.jsonl"
    path.write_text(json.dumps({"id": 7, "text": "seven"}) + "\n")
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(path), with_lid=False))).docs
        assert_that(_documents(docs) | beam.Map(lambda d: (d.id, d.text)), equal_to([("7", "seven")]))


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


# --- which files a pattern names -------------------------------------------------------------------

def _touch(root, *names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")


@pytest.mark.parametrize(
    "pattern, found",
    [
        ("data[1].parquet", ["data[1].parquet"]),  # as a glob it would name data1.parquet
        ("runs[2024]", ["runs[2024]/a.parquet", "runs[2024]/day1/x.parquet", "runs[2024]/day[1]/c.parquet"]),
        ("runs[2024]/*.parquet", ["runs[2024]/a.parquet"]),
        ("runs[2024]/?.parquet", ["runs[2024]/a.parquet"]),
        ("data[12].parquet", ["data1.parquet"]),  # no such file: a glob
        ("runs[0-9]*/*.parquet", ["runs2/b.parquet"]),
        ("runs[2024]/day[1]/*.parquet", ["runs[2024]/day[1]/c.parquet"]),
        ("runs[2024]/.cache[1]/*.parquet", ["runs[2024]/.cache[1]/d.parquet"]),  # the root: not skipped
    ],
)
def test_a_path_that_exists_is_taken_as_written(tmp_path, pattern, found):
    _touch(tmp_path, "data[1].parquet", "data1.parquet", "runs[2024]/a.parquet", "runs2/b.parquet",
           "runs[2024]/day[1]/c.parquet", "runs[2024]/day1/x.parquet", "runs[2024]/.cache[1]/d.parquet")
    assert expand_pattern(str(tmp_path / pattern)) == [str(tmp_path / f) for f in found]


SPARK_LIKE = ["part-0.parquet", "sub/part-1.jsonl", ".part-0.parquet.crc", ".part-2.parquet", "_SUCCESS",
              "_committed_1.parquet", "_temporary/0/part-3.parquet", ".hidden/part-4.parquet",
              "sub/_temporary/part-5.parquet", "sub/x_y.parquet", "sub/a.b.parquet"]


@pytest.mark.parametrize("pattern", ["in", "in/**", "in/**/*.*", "in/*/*.parquet"])
def test_names_starting_with_a_dot_or_underscore_below_the_root_are_skipped(tmp_path, pattern):
    _touch(tmp_path / "in", *SPARK_LIKE)
    expected = {"in": ["part-0.parquet", "sub/a.b.parquet", "sub/part-1.jsonl", "sub/x_y.parquet"],
                "in/**": ["part-0.parquet", "sub/a.b.parquet", "sub/part-1.jsonl", "sub/x_y.parquet"],
                "in/**/*.*": ["part-0.parquet", "sub/a.b.parquet", "sub/part-1.jsonl", "sub/x_y.parquet"],
                "in/*/*.parquet": ["sub/a.b.parquet", "sub/x_y.parquet"]}[pattern]
    assert expand_pattern(str(tmp_path / pattern)) == [str(tmp_path / "in" / f) for f in expected]


def test_a_hidden_root_or_a_hidden_file_named_in_full_is_read(tmp_path):
    _touch(tmp_path, "_out/.cache/a.parquet", "_out/.cache/_b.parquet", "_out/.cache/.c.parquet")
    assert expand_pattern(str(tmp_path / "_out" / ".cache")) == [str(tmp_path / "_out/.cache/a.parquet")]
    assert expand_pattern(str(tmp_path / "_out/.cache/*.parquet")) == [str(tmp_path / "_out/.cache/a.parquet")]
    assert expand_pattern(str(tmp_path / "_out/.cache/.c.parquet")) == [str(tmp_path / "_out/.cache/.c.parquet")]


def test_a_pattern_that_names_only_skipped_files_says_so(tmp_path):
    _touch(tmp_path, "in/_temporary/a.parquet", "in/.b.parquet")
    with pytest.raises(BadInputError, match=r"matches no input files \(2 skipped: a name on their path starts"):
        expand_pattern(str(tmp_path / "in"))


def test_hidden_names_are_skipped_on_an_fsspec_filesystem():
    fs = fsspec.filesystem("memory")
    for name in ("a.parquet", "_temporary/b.parquet", ".c.parquet"):
        fs.pipe_file(f"/hiddentest/in/{name}", b"")
    assert expand_pattern("memory://hiddentest/in") == ["memory:///hiddentest/in/a.parquet"]
    assert expand_pattern("memory://hiddentest/in/**/*.parquet") == ["memory:///hiddentest/in/a.parquet"]


# --- JSON suffixes and compression -----------------------------------------------------------------

COMPRESS = {".gz": gzip.compress, ".zst": zstandard.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def test_every_json_base_goes_with_every_compression():
    bases, compressions = (".jsonl", ".ndjson", ".json"), ("", ".gz", ".zst", ".bz2", ".xz")
    assert sorted(JSONL_SUFFIXES) == sorted(b + c for b in bases for c in compressions)
    assert sorted(JSON_VALUES_SUFFIXES) == sorted(".json" + c for c in compressions)


@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_compressed_files_read_whole_and_empty_ones_read_empty(tmp_path, ext):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS) * 500
    whole = tmp_path / f"whole.jsonl{ext}"
    whole.write_bytes(COMPRESS[ext](data[:1000]) + COMPRESS[ext](data[1000:]))  # two frames/members/streams
    empty = tmp_path / f"empty.jsonl{ext}"
    empty.write_bytes(b"")
    with open_decompressed(str(whole)) as f:
        assert b"".join(f) == data  # line by line, as JSON lines are read
    with open_decompressed(str(empty)) as f:
        assert list(f) == []


@pytest.mark.parametrize("ext", sorted(COMPRESS))
@pytest.mark.parametrize("damage", ["truncated", "not_compressed"])
def test_a_file_that_cannot_be_decompressed_is_bad_input_naming_it(tmp_path, ext, damage):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS) * 500
    path = tmp_path / f"bad.json{ext}"
    path.write_bytes(COMPRESS[ext](data)[:-20] if damage == "truncated" else data)
    name = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}[ext]
    message = "is truncated" if damage == "truncated" else f"is not valid {name} data"
    # Both jobs' ways of reading a .json file: as JSON lines (bucketed), as JSON text (scaffold).
    for config in (ReadConfig(str(path)), ReadConfig(str(path), with_lid=False, json_values=True)):
        with pytest.raises(BadInputError, match=f"{path}: {message}") as info:
            [doc for unit in plan_input(config) for doc in read_unit(unit, config)]
        assert info.value.reason is None  # a damaged file stops the job even under --on-bad-record skip


def test_a_bom_before_the_first_json_line_is_not_part_of_it(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(path)))).docs
        assert_that(_documents(docs), equal_to(_expected(str(path))))


# --- column types and values ------------------------------------------------------------------------

def test_narrow_floats_read_as_the_decimal_written():
    values = pa.array(np.array([0.9, 0.1, np.nan, np.inf, 1.0], dtype=np.float32))
    assert column_values(values)[:2] == [0.9, 0.1] and column_values(values)[4] == 1.0
    assert np.isnan(column_values(values)[2]) and column_values(values)[3] == float("inf")
    assert column_values(pa.array([0.9, None], type=pa.float32())) == [0.9, None]
    assert column_values(pa.array(np.array([0.9], dtype=np.float16))) == [0.9]
    assert column_values(pa.array([0.9], type=pa.float32()).dictionary_encode()) == [0.9]
    assert column_values(pa.array([0.8999999999999999])) == [0.8999999999999999]  # float64 unchanged


@pytest.mark.parametrize("encode", ["dictionary", "string_view", "large_string"])
def test_dictionary_view_and_large_string_columns_read_like_strings(tmp_path, encode):
    if encode == "string_view" and not hasattr(pa, "string_view"):
        pytest.skip("this pyarrow has no string_view")
    table = pa.Table.from_pylist(ROWS)
    for name in ("id", "text", "language", "page_average_lid"):
        column = table.column(name)
        column = (column.dictionary_encode() if encode == "dictionary"
                  else column.cast(pa.string_view() if encode == "string_view" else pa.large_string()))
        table = table.set_column(table.schema.get_field_index(name), name, column)
    path = tmp_path / "encoded.parquet"
    pq.write_table(table, path, row_group_size=2)
    assert str(pq.read_schema(path).field("text").type) != "string"
    with fnapi_pipeline() as p:
        docs = (p | ReadDocuments(ReadConfig(str(path)))).docs
        assert_that(_documents(docs), equal_to(_expected(str(path))))


@pytest.mark.parametrize("score", [1.5, -0.1, float("nan"), float("inf"), float("-inf")])
def test_a_lid_score_outside_0_1_is_a_bad_record(tmp_path, score):
    path = tmp_path / "scores.parquet"
    _write_parquet(path, ROWS + [finepdfs_row("d", "text", page_average_lid_score=score)])
    with pytest.raises(Exception, match=rf"scores\.parquet row 3: 'page_average_lid_score' is {score}, expected"):
        _read(str(path))
    with fnapi_pipeline() as p:
        read = p | ReadDocuments(ReadConfig(str(path), on_bad_record="skip"))
        assert_that(_documents(read.docs) | beam.Map(lambda d: (d.id, d.row)),
                    equal_to([("a", 0), ("b", 1), ("c", 2)]), label="Docs")
        assert_that(read.dropped, equal_to([("bad_lid_score", 1)]), label="Dropped")
        # Every record read counts, the skipped one too.
        assert_that(read.records | CountRecords(), equal_to([4]), label="Records")


# --- ids the manifest cannot hold, found on a whole column -------------------------------------------

# Line breaks, every character Python strips as whitespace, and look-alikes it does not ('\u200b',
# '\u180e', '\ufeff', '\x1b', '\x7f'), beside ordinary letters, digits and '|'.
ID_ALPHABET = ("|\n\r\t\x0b\x0c\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000"
               "\u200b\u180e\ufeff\x1b\x7f" + "abcXYZ019é東-_#")


def test_the_column_check_flags_exactly_the_ids_the_manifest_refuses():
    import pyarrow.compute as pc

    from shards.manifest import id_problem
    from transforms.inputs.arrow import _SUSPECT_ID

    rng = np.random.default_rng(12)
    ids = ["", " ", "a", "a b", "|", "a|b", "\x85a", "a\u3000", "\u200ba\u200b", "a\x1fb", "a\x1f"]
    for _ in range(4000):
        n = int(rng.integers(1, 7))
        ids.append("".join(ID_ALPHABET[i] for i in rng.integers(0, len(ID_ALPHABET), n)))
    column = pa.array(ids, pa.string())
    flagged = pc.or_(pc.match_substring_regex(column, _SUSPECT_ID), pc.equal(pc.binary_length(column), 0))
    refused = [id_problem(i) is not None for i in ids]
    mismatched = [i for i, f, r in zip(ids, flagged.to_pylist(), refused, strict=True) if f != r]
    assert mismatched == []
    assert 500 < sum(refused) < len(ids) - 500  # both kinds are well represented


class _Recorded:
    """transforms.core.progress.Progress, recording what a step adds."""

    adds: list[dict] = []

    def __init__(self, step, planned=None, shared_dir=None):
        pass

    def add(self, **counts):
        self.adds.append(counts)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_json_lines_file_shares_its_bytes_as_stored_while_it_is_read(suffix, tmp_path, monkeypatch):
    """A JSON file is one unit and its rows are not planned: its share is the bytes of the file as
    stored read so far, said with every batch (a file read for minutes shows its progress), adding
    up to its planned size once read."""
    import random

    from transforms.inputs import read
    from transforms.inputs.plan import plan_input

    rng = random.Random(7)
    lines = b"".join(json.dumps({"id": f"d{i}", "text": f"{rng.getrandbits(128):032x}" * 4}).encode() + b"\n"
                     for i in range(3 * 4096 + 5))
    path = tmp_path / f"in{suffix}"
    opener = {".jsonl": lambda b: b, ".jsonl.gz": gzip.compress, ".jsonl.zst": zstandard.compress}[suffix]
    path.write_bytes(opener(lines))
    config = ReadConfig(str(path), with_lid=False)
    [unit] = plan_input(config)
    monkeypatch.setattr(read, "Progress", _Recorded)
    _Recorded.adds = []
    fn = read.ReadUnitFn(config)
    fn.setup()
    out = [x for x in fn.process(unit) if isinstance(x, DocBatch)]
    assert len(out) == 4
    stored = [add.get("stored_bytes", 0) for add in _Recorded.adds]
    assert sum(stored) == path.stat().st_size == unit.text_bytes
    # said batch by batch, before the unit is done: three batches of four say some of it
    assert sum(1 for add in _Recorded.adds[:-1] if add.get("stored_bytes")) >= 2, _Recorded.adds
    assert _Recorded.adds[-1].get("units") == 1


def test_parquet_units_share_no_bytes_as_stored(tmp_path, monkeypatch):
    """Their rows were planned: the display's share goes by rows and text bytes."""
    from transforms.inputs import read
    from transforms.inputs.plan import plan_input

    _write_parquet(tmp_path / "a.parquet")
    config = ReadConfig(str(tmp_path / "a.parquet"))
    monkeypatch.setattr(read, "Progress", _Recorded)
    _Recorded.adds = []
    fn = read.ReadUnitFn(config)
    fn.setup()
    for unit in plan_input(config):
        list(fn.process(unit))
    assert _Recorded.adds and not [add for add in _Recorded.adds if "stored_bytes" in add]


def test_a_file_of_bad_records_shares_its_bytes_as_stored_as_they_are_skipped(tmp_path, monkeypatch):
    from transforms.inputs import read
    from transforms.inputs.plan import plan_input

    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(b"not json %d %s\n" % (i, b"x" * 200) for i in range(20_000))))
    config = ReadConfig(str(path), with_lid=False, on_bad_record="skip")
    [unit] = plan_input(config)
    monkeypatch.setattr(read, "Progress", _Recorded)
    _Recorded.adds = []
    fn = read.ReadUnitFn(config)
    fn.setup()
    list(fn.process(unit))
    stored = [add.get("stored_bytes", 0) for add in _Recorded.adds]
    assert sum(stored) == unit.text_bytes
    assert sum(1 for add in _Recorded.adds[:-1] if add.get("stored_bytes")) >= 2, _Recorded.adds[-3:]
