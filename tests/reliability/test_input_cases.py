"""Input cases of issue 11, run through the whole jobs: compressed files that cannot be read, a
float32 score at the threshold, dictionary and string_view columns, literal paths with '[',
hidden and '_' paths under a directory or a glob, a UTF-8 BOM, every JSON suffix and compression,
and LID scores that are no probability.

Each good input must come out byte for byte as the same documents written as plain JSON lines do;
each bad one must stop the job with one line naming the file (and row), or be counted."""

from __future__ import annotations

import bz2
import codecs
import gzip
import hashlib
import json
import lzma
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import REPO, finepdfs_row, stored_ids, tree_hashes

from pipelines import cli
from shards import layout, llmc
from shards.card import CARD_NAME
from shards.llmc import ScaffoldStats
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME

RUNNER = "--runner=FnApiRunner"
GOOD = [finepdfs_row(f"good-{i:02d}", f"Good document {i}: plain English text, kept as it is. " * (2 + i % 5))
        for i in range(15)]
# Documents that must not be read: a half-written attempt, a hidden copy, a look-alike file name.
OTHER = [finepdfs_row(f"other-{i}", f"Another document {i}, which this run must not read. " * 3) for i in range(3)]

COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress, "zst": zstandard.compress}
COMPRESSION_NAMES = {"gz": "gzip", "bz2": "bz2", "xz": "xz", "zst": "zstd"}


def jsonl(rows) -> bytes:
    return b"".join((json.dumps(r) + "\n").encode("utf-8") for r in rows)


def write_parquet(path: Path, rows, schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def run_bucketed(input_pattern, out, *flags) -> int:
    return cli.main(["bucketed", "--input", str(input_pattern), "--output", str(out), "--partitions", "2", RUNNER,
                     *flags])


def final_message(err: str, job: str = "bucketed") -> str:
    """The one line a bad-input run ends with (log lines before it may hold a traceback)."""
    return next(line for line in err.splitlines() if line.startswith(f"pretokenize {job}: bad input: "))


def shard_hashes(out) -> dict[str, str]:
    """sha256 of the shards and the manifest: what a reader takes (the stats also count the drops,
    and dataset_stats.json and the card name the input files)."""
    return tree_hashes(out, skip=(layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME))


def stats(out) -> DatasetStats:
    return DatasetStats.from_text((Path(out) / layout.STATS_NAME).read_text())


@pytest.fixture(scope="module")
def good_only(tmp_path_factory) -> dict[str, str]:
    """The shards of GOOD read from one plain JSONL file: what every good input must reproduce."""
    d = tmp_path_factory.mktemp("good")
    (d / "good.jsonl").write_bytes(jsonl(GOOD))
    assert run_bucketed(d / "good.jsonl", d / "out") == 0
    assert stats(d / "out").kept_documents == len(GOOD)
    return shard_hashes(d / "out")


# --- 1. a compressed file that cannot be decompressed stops the job, naming it -----------------------

DAMAGE = {
    # how: (the bytes of the file, what the message says)
    "truncated": (lambda ext, data: COMPRESS[ext](data)[: len(COMPRESS[ext](data)) // 2],
                  lambda name: f"is truncated (its {name} data ends before the end-of-stream marker)"),
    "not_compressed": (lambda ext, data: data, lambda name: f"is not valid {name} data ("),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("ext", sorted(COMPRESS))
def test_a_compressed_file_that_cannot_be_read_stops_naming_it(ext, damage, tmp_path, capsys):
    make, message = DAMAGE[damage]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(jsonl(GOOD[:6]))
    broken = tmp_path / "in" / f"b.jsonl.{ext}"
    broken.write_bytes(make(ext, jsonl(GOOD[6:] * 40)))
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / "in", out) == 2
    err = capsys.readouterr().err
    assert final_message(err).startswith(f"pretokenize bucketed: bad input: {broken}: "
                                         f"{message(COMPRESSION_NAMES[ext])}"), err
    assert err.rstrip().endswith("; nothing was published")
    assert not (out / layout.STATS_NAME).exists() and not (out / layout.MANIFEST_NAME).exists()


def test_a_truncated_file_stops_the_job_even_when_bad_records_are_skipped(tmp_path, capsys):
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(gzip.compress(jsonl(GOOD * 40))[:-100])
    assert run_bucketed(src, tmp_path / "out", "--on-bad-record", "skip") == 2
    assert final_message(capsys.readouterr().err) == (
        f"pretokenize bucketed: bad input: {src}: is truncated (its gzip data ends before the end-of-stream marker)"
        "; nothing was published")


# --- 2. a float32 score is the decimal it was written as: 0.9 passes --lid-threshold 0.9 -------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_score_at_the_threshold_is_kept_in_its_columns_precision(dtype, tmp_path):
    at = dtype(0.9)
    scores = {"below": np.nextafter(at, dtype(0)), "at": at, "above": np.nextafter(at, dtype(1))}
    rows = [finepdfs_row(name, f"A document scored just {name} the threshold. " * 3, page_average_lid_score=float(s))
            for name, s in scores.items()]
    schema = pa.Table.from_pylist(rows).schema
    schema = schema.set(schema.get_field_index("page_average_lid_score"),
                        pa.field("page_average_lid_score", pa.from_numpy_dtype(dtype)))
    src = write_parquet(tmp_path / "scores.parquet", rows, schema)
    assert pq.read_schema(src).field("page_average_lid_score").type == pa.from_numpy_dtype(dtype)
    out = tmp_path / "out"
    assert run_bucketed(src, out, "--lid-threshold", "0.9") == 0
    assert set(stored_ids(out)) == {"at", "above"}
    assert stats(out).drops == {"lid_score": 1}


# --- 3. dictionary-encoded and string_view columns read like plain strings ---------------------------

STRING_COLUMNS = ("id", "text", "language", "page_average_lid")


def _recoded(rows, encoding: str) -> pa.Table:
    table = pa.Table.from_pylist(rows)
    for name in STRING_COLUMNS:
        column = table.column(name)
        column = column.dictionary_encode() if encoding == "dictionary" else column.cast(pa.string_view())
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table


@pytest.mark.parametrize("encoding", ["dictionary", "string_view"])
def test_dictionary_and_string_view_columns_read_like_plain_strings(encoding, tmp_path, good_only):
    if encoding == "string_view" and not hasattr(pa, "string_view"):
        pytest.skip("this pyarrow has no string_view")
    src = tmp_path / "in.parquet"
    pq.write_table(_recoded(GOOD, encoding), src, use_dictionary=True, row_group_size=5)
    types = {str(pq.read_schema(src).field(name).type) for name in STRING_COLUMNS}
    assert types == {"dictionary<values=string, indices=int32, ordered=0>" if encoding == "dictionary"
                     else "string_view"}
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 0
    assert shard_hashes(out) == good_only


# --- 4. a path that exists is read as written, '[' and all --------------------------------------------

def test_a_file_name_with_brackets_is_read_as_written(tmp_path, good_only):
    write_parquet(tmp_path / "data[1].parquet", GOOD)
    write_parquet(tmp_path / "data1.parquet", OTHER)  # what "data[1].parquet" matches as a glob
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / "data[1].parquet", out) == 0
    assert shard_hashes(out) == good_only


@pytest.mark.parametrize("pattern", ["runs[2024]", "runs[2024]/*.parquet"])
def test_a_directory_name_with_brackets_is_read_as_written(pattern, tmp_path, good_only):
    write_parquet(tmp_path / "runs[2024]" / "part-0.parquet", GOOD[:5])
    write_parquet(tmp_path / "runs[2024]" / "part-1.parquet", GOOD[5:])
    write_parquet(tmp_path / "runs2" / "part-0.parquet", OTHER)  # what "runs[2024]" matches as a glob
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / pattern, out) == 0
    assert shard_hashes(out) == good_only


# --- 5. hidden and '_' paths below a directory or a glob are skipped; a file named in full is read ----

def _spark_like_output(root: Path) -> None:
    write_parquet(root / "part-0.parquet", GOOD[:7])
    write_parquet(root / "sub" / "part-1.parquet", GOOD[7:])
    (root / ".part-0.parquet.crc").write_bytes(b"\x00crc")
    (root / "_SUCCESS").write_bytes(b"")
    (root / ".part-2.parquet").write_bytes(b"not parquet: a checksum file, say")
    write_parquet(root / "_temporary" / "0" / "part-3.parquet", OTHER)  # an attempt still being written
    write_parquet(root / "_committed_1.parquet", OTHER)
    write_parquet(root / ".hidden" / "part-4.parquet", OTHER)
    write_parquet(root / "sub" / "_temporary" / "part-5.parquet", OTHER)


@pytest.mark.parametrize("pattern", ["in", "in/**/*.parquet", "in/*/part-*.parquet"])
def test_hidden_and_underscore_paths_are_skipped(pattern, tmp_path, good_only):
    _spark_like_output(tmp_path / "in")
    if pattern == "in/*/part-*.parquet":
        (tmp_path / "in" / "sub" / "part-1.parquet").rename(tmp_path / "in" / "sub" / "part-0.parquet")
        (tmp_path / "in" / "part-0.parquet").rename(tmp_path / "in" / "sub" / "part-1.parquet")
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / pattern, out) == 0
    assert shard_hashes(out) == good_only


def test_a_hidden_file_named_in_full_is_read(tmp_path, good_only):
    src = write_parquet(tmp_path / "_temporary" / ".part-0.parquet", GOOD)
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 0
    assert shard_hashes(out) == good_only


def test_a_glob_that_matches_only_hidden_files_says_so(tmp_path, capsys):
    write_parquet(tmp_path / "in" / "_temporary" / "part-0.parquet", GOOD)
    assert run_bucketed(tmp_path / "in", tmp_path / "out") == 2
    assert final_message(capsys.readouterr().err).startswith(
        f"pretokenize bucketed: bad input: {tmp_path / 'in'}: matches no input files (1 skipped")


# --- 6. a UTF-8 byte order mark before the first record ---------------------------------------------

@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz"])
def test_a_utf8_bom_at_the_start_of_a_jsonl_file_is_ignored(name, tmp_path, good_only):
    data = codecs.BOM_UTF8 + jsonl(GOOD)
    src = tmp_path / name
    src.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 0
    assert shard_hashes(out) == good_only


# --- 7. every base suffix (.jsonl, .ndjson, .json) with every compression ----------------------------

def test_every_json_suffix_and_compression_is_read(tmp_path, good_only):
    (tmp_path / "in").mkdir()
    names = [f"{i:02d}{base}{ext}" for i, (base, ext) in enumerate(
        (base, ext) for base in (".jsonl", ".ndjson", ".json") for ext in ("", ".gz", ".zst", ".bz2", ".xz"))]
    assert len(names) == 15
    for i, name in enumerate(names):
        ext = name.rsplit(".", 1)[1]
        data = jsonl(GOOD[i:i + 1])
        (tmp_path / "in" / name).write_bytes(COMPRESS[ext](data) if ext in COMPRESS else data)
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / "in", out) == 0
    assert stats(out).raw_documents == len(GOOD)
    assert shard_hashes(out) == good_only


def test_a_multi_frame_zstd_file_is_read_whole(tmp_path, good_only):
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(zstandard.compress(jsonl(GOOD[:5])) + zstandard.compress(jsonl(GOOD[5:])))
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 0
    assert shard_hashes(out) == good_only


# --- 8. a LID score outside [0, 1] (NaN and infinities included) is a bad record ----------------------

# json.dumps writes NaN and the infinities as JSON's common extension does (NaN, Infinity, -Infinity).
BAD_SCORES = {"above_one": 1.5, "below_zero": -0.1, "nan": float("nan"), "infinity": float("inf"),
              "minus_infinity": float("-inf")}


def _with_bad_score(tmp_path, fmt: str, score: float) -> tuple[Path, str]:
    """An input of GOOD with a row scored ``score`` after the first eight; where the error points."""
    bad = finepdfs_row("bad-score", "A document with an impossible score.", page_average_lid_score=score)
    if fmt == "jsonl":
        src = tmp_path / "in.jsonl"
        src.write_bytes(jsonl(GOOD[:8] + [bad] + GOOD[8:]))
        return src, f"{src} line 9"
    src = write_parquet(tmp_path / "in.parquet", GOOD[:8] + [bad] + GOOD[8:])
    return src, f"{src} row 8"


@pytest.mark.parametrize("case", sorted(BAD_SCORES))
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_impossible_lid_score_stops_naming_the_row(fmt, case, tmp_path, capsys):
    src, where = _with_bad_score(tmp_path, fmt, BAD_SCORES[case])
    assert run_bucketed(src, tmp_path / "out") == 2
    assert final_message(capsys.readouterr().err) == (
        f"pretokenize bucketed: bad input: {where}: 'page_average_lid_score' is {BAD_SCORES[case]}, "
        "expected a number within [0, 1]; nothing was published")
    assert not (tmp_path / "out" / layout.STATS_NAME).exists()


@pytest.mark.parametrize("case", sorted(BAD_SCORES))
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_impossible_lid_score_is_skipped_and_counted(fmt, case, tmp_path, good_only):
    src, _ = _with_bad_score(tmp_path, fmt, BAD_SCORES[case])
    out = tmp_path / "out"
    assert run_bucketed(src, out, "--on-bad-record", "skip") == 0
    assert stats(out).drops == {"bad_lid_score": 1} and stats(out).raw_documents == len(GOOD) + 1
    assert shard_hashes(out) == good_only


# --- the scaffold job shares the reading: cases 1, 4, 5, 6 and 7 with --annotate ----------------------

PLAIN = [json.loads(line) for line in
         (REPO / "tests" / "data" / "scaffold" / "por_plain.jsonl").read_text(encoding="utf-8").splitlines()[:8]]


def run_scaffold(gpt2_spec, input_pattern, out, *flags) -> int:
    return cli.main(["scaffold", "--input", str(input_pattern), "--output", str(out), "--tokenizer", gpt2_spec,
                     "--annotate", "--shard-tokens", "400", "--val-fraction", "0.25", RUNNER, *flags])


def scaffold_hashes(out) -> dict[str, str]:
    return {f"{split}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
            for split in llmc.SPLITS if (Path(out) / split).is_dir() for p in sorted((Path(out) / split).iterdir())}


@pytest.fixture(scope="module")
def plain_only(tmp_path_factory, gpt2_spec) -> dict[str, str]:
    d = tmp_path_factory.mktemp("plain")
    (d / "plain.jsonl").write_bytes(jsonl(PLAIN))
    assert run_scaffold(gpt2_spec, d / "plain.jsonl", d / "out") == 0
    stats_ = ScaffoldStats.from_text((d / "out" / layout.STATS_NAME).read_text(encoding="utf-8"))
    assert stats_.kept_documents == len(PLAIN)
    return scaffold_hashes(d / "out")


def test_scaffold_stops_on_a_truncated_compressed_file_naming_it(tmp_path, capsys, gpt2_spec):
    src = tmp_path / "in.jsonl.xz"
    src.write_bytes(lzma.compress(jsonl(PLAIN * 20))[:-50])
    assert run_scaffold(gpt2_spec, src, tmp_path / "out") == 2
    assert final_message(capsys.readouterr().err, "scaffold") == (
        f"pretokenize scaffold: bad input: {src}: is truncated (its xz data ends before the end-of-stream marker)"
        "; nothing was published")


def test_scaffold_reads_literal_brackets_skips_hidden_paths_and_a_bom(tmp_path, gpt2_spec, plain_only):
    root = tmp_path / "runs[2024]"
    root.mkdir()
    (root / "a.jsonl").write_bytes(codecs.BOM_UTF8 + jsonl(PLAIN[:4]))
    (root / "b.ndjson.gz").write_bytes(gzip.compress(jsonl(PLAIN[4:6])))
    (root / "c.json.zst").write_bytes(zstandard.compress(json.dumps(PLAIN[6:], indent=1).encode()))  # JSON text
    (root / "_temporary").mkdir()
    (root / "_temporary" / "d.jsonl").write_bytes(jsonl([{"id": "other", "text": "not to be read"}]))
    (root / ".e.jsonl").write_bytes(b"{not even json\n")
    (tmp_path / "runs2").mkdir()
    (tmp_path / "runs2" / "f.jsonl").write_bytes(jsonl([{"id": "other", "text": "not to be read"}]))
    for i, pattern in enumerate([root, root / "*"]):
        out = tmp_path / f"out-{i}"
        assert run_scaffold(gpt2_spec, pattern, out) == 0
        assert scaffold_hashes(out) == plain_only
