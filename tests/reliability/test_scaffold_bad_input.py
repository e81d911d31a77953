"""Bad input to the scaffold job: each case gets its documented outcome (a clear error naming the
file and row, or a counted drop), and every good document still comes out exactly right: the
shards are byte-identical to a run on the good records alone, or (when the odd record is kept)
equal to an independent derivation of what the shards must hold."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, jsonl_line, write_jsonl
from test_scaffold_pipeline import expected_streams, split_stream

from pipelines import cli, decode
from shards import layout, llmc, scaffold_verify
from shards.llmc import ScaffoldStats
from transforms.scaffold.encode import annotate, format_annotated, parse_annotated

RUNNER = "--runner=FnApiRunner"
FLAGS = ["--shard-tokens", "400", "--val-fraction", "0.25"]
SAMPLE = REPO / "tests" / "data" / "scaffold"
GOOD = [json.loads(line) for line in (SAMPLE / "por_annotated.jsonl").read_text(encoding="utf-8").splitlines()[:14]]
GOOD_PLAIN = [json.loads(line) for line in (SAMPLE / "por_plain.jsonl").read_text(encoding="utf-8").splitlines()[:14]]
BIG = 50_000_000  # characters of the "50 MB" documents (ASCII, so bytes too)


def write_parquet(path: Path, records) -> Path:
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def run_scaffold(gpt2_spec, input_pattern, out, *flags) -> int:
    return cli.main(["scaffold", "--input", str(input_pattern), "--output", str(out), "--tokenizer", gpt2_spec,
                     RUNNER, *FLAGS, *flags])


def shard_hashes(out) -> dict[str, str]:
    """sha256 of every shard (the stats also count the drops, so they differ)."""
    found = {}
    for split in llmc.SPLITS:
        for path in sorted((Path(out) / split).glob("*")) if (Path(out) / split).is_dir() else []:
            found[f"{split}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def stats(out) -> ScaffoldStats:
    return ScaffoldStats.from_text((Path(out) / layout.STATS_NAME).read_text(encoding="utf-8"))


def decoded(out, gpt2_spec) -> list[str]:
    """Every stored document as text (words joined by single spaces), in stream order."""
    docs = []
    for split in llmc.SPLITS:
        if (Path(out) / split).is_dir():
            buf = io.StringIO()
            decode.decode([str(Path(out) / split)], decode.load_token_bytes(gpt2_spec), None, False, buf,
                          io.StringIO())
            docs += buf.getvalue()[:-1].split("\n\n")
    return docs


def final_message(err: str) -> str:
    """The one line the CLI ends a bad-input run with (the log lines before it hold the traceback)."""
    return next(line for line in err.splitlines() if line.startswith("pretokenize scaffold: bad input: "))


def assert_nothing_published(out):
    assert not (Path(out) / layout.STATS_NAME).exists()
    assert not any((Path(out) / split).exists() for split in llmc.SPLITS)


@pytest.fixture(scope="module")
def good_only(tmp_path_factory, gpt2_spec):
    """The content-ff good records alone: what every run that drops the bad ones must reproduce."""
    d = tmp_path_factory.mktemp("good")
    assert run_scaffold(gpt2_spec, write_jsonl(d / "good.jsonl", GOOD), d / "out") == 0
    hashes = shard_hashes(d / "out")
    assert any(k.startswith("train/shard_002") for k in hashes) and any(k.startswith("val/") for k in hashes)
    return hashes


@pytest.fixture(scope="module")
def good_plain_only(tmp_path_factory, gpt2_spec):
    """The plain good records alone, with --annotate."""
    d = tmp_path_factory.mktemp("good-plain")
    assert run_scaffold(gpt2_spec, write_jsonl(d / "good.jsonl", GOOD_PLAIN), d / "out", "--annotate") == 0
    return shard_hashes(d / "out")


# --- row-level bad records: --on-bad-record fail stops naming the line, skip counts the drop -----------

ROW_CASES = {
    # case: (the bad line, the reason it is counted under, what the error says)
    "missing_field": (jsonl_line({"id": "x", "text": "<ff_0> a"}), "missing_field", "missing field(s) content-ff"),
    "text_wrong_type": (jsonl_line({"id": "x", "content-ff": 42}), "wrong_type",
                        "'content-ff' is int 42, expected string"),
    "id_wrong_type": (jsonl_line({"id": 1.5, "content-ff": "<ff_0> a"}), "wrong_type",
                      "'id' is float, expected a string or an integer"),
    "null_text": (jsonl_line({"id": "x", "content-ff": None}), "null_field", "'content-ff' is null"),
    "null_id": (jsonl_line({"id": None, "content-ff": "<ff_0> a"}), "null_field", "'id' is null"),
    "empty_id": (jsonl_line({"id": "", "content-ff": "<ff_0> a"}), "bad_id", "the id is empty"),
    "id_with_pipe": (jsonl_line({"id": "a|b", "content-ff": "<ff_0> a"}), "bad_id", "contains '|'"),
    "id_with_newline": (jsonl_line({"id": "a\nb", "content-ff": "<ff_0> a"}), "bad_id", "line break"),
    "id_with_spaces": (jsonl_line({"id": " a ", "content-ff": "<ff_0> a"}), "bad_id",
                       "leading or trailing whitespace"),
    "invalid_utf8": (b'{"id": "x", "content-ff": "<ff_0> caf\xe9"}\n', "invalid_utf8",
                     "is not valid UTF-8 (invalid continuation byte at byte 37)"),
    # A raw NUL byte inside a JSON string is a control character JSON forbids (escaped, it is text:
    # see test_a_nul_character_is_kept_as_its_byte_token_and_decodes_back).
    "raw_nul_byte": (b'{"id": "x", "content-ff": "<ff_0> a\x00b"}\n', "invalid_json",
                     "is not JSON (Invalid control character at)"),
    "not_json": (b'{"id": "x", "content-ff": \n', "invalid_json", "is not JSON"),
    "not_an_object": (b'["x", "<ff_0> a"]\n', "not_an_object", "is a JSON list, not an object"),
}


def _with_bad_line(path: Path, line: bytes) -> Path:
    return write_jsonl(path, GOOD[:8] + [line] + GOOD[8:])


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_level_bad_input_fails_naming_the_line(case, tmp_path, capsys, gpt2_spec):
    line, _, message = ROW_CASES[case]
    src = _with_bad_line(tmp_path / "in.jsonl", line)
    assert run_scaffold(gpt2_spec, src, tmp_path / "out", "--on-bad-record", "fail") == 2
    err = capsys.readouterr().err
    assert final_message(err).startswith(f"pretokenize scaffold: bad input: {src} line 9: ")
    assert message in err and err.rstrip().endswith("; nothing was published"), err
    assert_nothing_published(tmp_path / "out")


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_level_bad_input_is_skipped_and_counted(case, tmp_path, gpt2_spec, good_only):
    line, reason, _ = ROW_CASES[case]
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, _with_bad_line(tmp_path / "in.jsonl", line), out, "--on-bad-record", "skip") == 0
    assert stats(out).drops == {reason: 1}
    assert stats(out).raw_documents == len(GOOD) + 1 and stats(out).kept_documents == len(GOOD)
    assert shard_hashes(out) == good_only
    assert scaffold_verify.check_scaffold_tree(str(out)) == []


@pytest.mark.parametrize("on_bad_record", ["fail", "skip"])
def test_a_null_in_a_parquet_row(on_bad_record, tmp_path, capsys, gpt2_spec, good_plain_only):
    src = write_parquet(tmp_path / "in.parquet", GOOD_PLAIN[:5] + [{"id": "x", "text": None}] + GOOD_PLAIN[5:])
    code = run_scaffold(gpt2_spec, src, tmp_path / "out", "--annotate", "--on-bad-record", on_bad_record)
    if on_bad_record == "fail":
        assert code == 2
        assert f"{src} row 5: 'text' is null" in capsys.readouterr().err
        assert_nothing_published(tmp_path / "out")
    else:
        assert code == 0 and stats(tmp_path / "out").drops == {"null_field": 1}
        assert shard_hashes(tmp_path / "out") == good_plain_only


LONE_SURROGATES = {
    # JSON can escape a lone surrogate, which is no Unicode character: no UTF-8 encodes it.
    "id": b'{"id": "x\\ud800", "content-ff": "<ff_0> a"}\n',
    "text": b'{"id": "x", "content-ff": "<ff_0> a\\udc00b"}\n',
}


@pytest.mark.parametrize("field", sorted(LONE_SURROGATES))
def test_a_lone_surrogate_is_bad_input(field, tmp_path, gpt2_spec, good_only):
    out = tmp_path / "out"
    src = _with_bad_line(tmp_path / "in.jsonl", LONE_SURROGATES[field])
    assert run_scaffold(gpt2_spec, src, out, "--on-bad-record", "skip") == 0
    reason = "bad_id" if field == "id" else "invalid_utf8"
    assert stats(out).drops == {reason: 1} and shard_hashes(out) == good_only


# --- whole files: stopped at launch (or, for JSON text, when read), in both modes ---------------------

@pytest.mark.parametrize("on_bad_record", ["fail", "skip"])
def test_a_truncated_parquet_file_among_good_ones_stops_the_launch(on_bad_record, tmp_path, capsys, gpt2_spec):
    write_parquet(tmp_path / "a.parquet", GOOD_PLAIN)
    data = write_parquet(tmp_path / "b.parquet", GOOD_PLAIN[:4]).read_bytes()
    (tmp_path / "b.parquet").write_bytes(data[: len(data) // 2])
    code = run_scaffold(gpt2_spec, tmp_path / "*.parquet", tmp_path / "out", "--annotate", "--on-bad-record",
                   on_bad_record)
    assert code == 2
    assert f"{tmp_path / 'b.parquet'}: not a readable parquet file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_parquet_stops_the_launch(tmp_path, capsys, gpt2_spec):
    write_parquet(tmp_path / "a.parquet", GOOD_PLAIN)
    (tmp_path / "notes.parquet").write_text("id,text\n1,hello\n")
    assert run_scaffold(gpt2_spec, tmp_path / "*.parquet", tmp_path / "out", "--annotate") == 2
    assert f"{tmp_path / 'notes.parquet'}: not a readable parquet file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "column, message",
    [({"id": ["x"], "body": ["palavra"]}, "missing column 'text' (the file has id, body)"),
     ({"id": ["x"], "text": [7]}, "column 'text' has type int64, expected string")],
)
def test_a_parquet_file_with_a_missing_or_mistyped_column_stops_the_launch(column, message, tmp_path, capsys,
                                                                           gpt2_spec):
    write_parquet(tmp_path / "a.parquet", GOOD_PLAIN)
    pq.write_table(pa.table(column), tmp_path / "b.parquet")
    assert run_scaffold(gpt2_spec, tmp_path / "*.parquet", tmp_path / "out", "--annotate", "--on-bad-record",
                   "skip") == 2
    assert f"{tmp_path / 'b.parquet'}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("on_bad_record", ["fail", "skip"])
def test_a_json_file_that_is_not_json_stops_the_job(on_bad_record, tmp_path, capsys, gpt2_spec):
    """A .json file is JSON text (one value, an array, values one after another): after a syntax
    error there is no next record to resume at, so even --on-bad-record skip stops."""
    (tmp_path / "a.json").write_text(json.dumps(GOOD, ensure_ascii=False, indent=1), encoding="utf-8")
    (tmp_path / "b.json").write_text("id,content-ff\nx,<ff_0> palavra\n", encoding="utf-8")
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, tmp_path / "*.json", out, "--on-bad-record", on_bad_record) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.json'} record 1: is not JSON" in err and "nothing was published" in err
    assert_nothing_published(out)


def test_zero_row_files_add_nothing(tmp_path, gpt2_spec, good_only, good_plain_only):
    write_parquet(tmp_path / "a.parquet", GOOD_PLAIN)
    pq.write_table(pa.Table.from_pylist(GOOD_PLAIN[:1]).slice(0, 0), tmp_path / "empty.parquet")
    assert run_scaffold(gpt2_spec, tmp_path / "*.parquet", tmp_path / "p", "--annotate") == 0
    assert shard_hashes(tmp_path / "p") == good_plain_only
    assert stats(tmp_path / "p").raw_documents == len(GOOD_PLAIN)
    # JSONL and JSON text with no records: an empty file, blank lines, an empty array.
    d = tmp_path / "json"
    d.mkdir()
    write_jsonl(d / "a.jsonl", GOOD)
    (d / "empty.jsonl").write_bytes(b"")
    (d / "blank.jsonl").write_bytes(b"\n  \n")
    (d / "empty.json").write_bytes(b"")
    (d / "array.json").write_bytes(b"[ ]\n")
    assert run_scaffold(gpt2_spec, d, tmp_path / "j") == 0
    assert shard_hashes(tmp_path / "j") == good_only
    assert stats(tmp_path / "j").raw_documents == len(GOOD) and stats(tmp_path / "j").drops == {}


def test_an_empty_glob_stops_the_launch(tmp_path, capsys, gpt2_spec):
    assert run_scaffold(gpt2_spec, tmp_path / "nothing-*.jsonl", tmp_path / "out") == 2
    assert f"{tmp_path / 'nothing-*.jsonl'}: matches no input files" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- records that are odd but readable ---------------------------------------------------------------

def test_a_nul_character_is_kept_as_its_byte_token_and_decodes_back(tmp_path, gpt2_spec):
    """U+0000, escaped in JSON, is text: GPT-2 stores it as its byte token (188) and decode gives
    it back. --annotate makes it a word of its own (it is not whitespace)."""
    nul = {"id": "nul", "content-ff": "<ff_2> a\u0000b <ff_1> \u0000 <ff_0> ."}
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, write_jsonl(tmp_path / "in.jsonl", GOOD + [nul]), out) == 0
    records = GOOD + [nul]
    expected = expected_streams(records, 0.25)
    for split in llmc.SPLITS:
        assert split_stream(out, split)[0].tolist() == expected[split]
    assert any([50259, 64, 188, 65, 50258, 188, 50257, 13, 50256] == expected[s][i:i + 9]
               for s in llmc.SPLITS for i in range(len(expected[s])))
    assert sorted(decoded(out, gpt2_spec)) == sorted(" ".join(parse_annotated(r["content-ff"]).words)
                                                     for r in records)
    assert "a\x00b \x00 ." in decoded(out, gpt2_spec)
    assert annotate("a\x00b") == ["a", "\x00", "b"]


def test_special_token_strings_are_encoded_as_text(tmp_path, gpt2_spec):
    """<|endoftext|> and <|im_start|> in a document are text: the only EOT ids in the stream are the
    ones ending documents, and decode gives the strings back."""
    words = ["<|endoftext|>", "<|im_start|>user", "olá", "<|im_end|>", "<|endoftext|><|endoftext|>", "<|im_start|>"]
    special = [{"id": "especial", "content-ff": format_annotated(words)},
               {"id": "so-especial", "content-ff": "<ff_0> <|endoftext|>"}]
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, write_jsonl(tmp_path / "in.jsonl", GOOD + special), out) == 0
    expected = expected_streams(GOOD + special, 0.25)
    for split in llmc.SPLITS:
        stream = split_stream(out, split)[0]
        assert stream.tolist() == expected[split]
        assert int((stream == llmc.GPT2_EOT).sum()) == stats(out).splits[split].sequences
    texts = decoded(out, gpt2_spec)
    assert " ".join(words) in texts and "<|endoftext|>" in texts
    # Plain text through --annotate: the strings are split into punctuation and words, text all the same.
    plain = [{"id": "p", "text": "<|endoftext|> fim"}]
    assert run_scaffold(gpt2_spec, write_jsonl(tmp_path / "p.jsonl", plain), tmp_path / "p", "--annotate") == 0
    assert decoded(tmp_path / "p", gpt2_spec) == ["< | endoftext | > fim"]


def test_a_countdown_marker_of_thousands_of_digits_is_recomputed(tmp_path, gpt2_spec):
    """Python refuses int() of over 4,300 digits: a marker's countdown is compared as digits, so
    such a marker is one more wrong countdown, recomputed and counted, never a crash."""
    odd = {"id": "digitos", "content-ff": f"<ff_{'9' * 5000}> muitos <ff_0> dígitos"}
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, write_jsonl(tmp_path / "in.jsonl", GOOD + [odd]), out) == 0
    expected = expected_streams(GOOD + [odd], 0.25)
    for split in llmc.SPLITS:
        assert split_stream(out, split)[0].tolist() == expected[split]
    assert stats(out).countdown_mismatches == 1 + sum(parse_annotated(r["content-ff"]).mismatch for r in GOOD)
    assert "muitos dígitos" in decoded(out, gpt2_spec)


# --- the same id twice ---------------------------------------------------------------------------------

def _other_text(record: dict, n_words: int | None = None) -> dict:
    words = parse_annotated(record["content-ff"]).words[::-1]
    if n_words:
        words = (words * (n_words // len(words) + 1))[:n_words]
    return {"id": record["id"], "content-ff": format_annotated(words)}


def test_the_same_id_twice_keeps_the_first_by_file_and_row(tmp_path, gpt2_spec):
    """Copies are found by id whatever their text; the one kept is the first by (input file, row),
    however the runner orders them; each other copy is counted as duplicate_id."""
    d = tmp_path / "in"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [_other_text(GOOD[0])])  # a.jsonl sorts first: this copy wins
    write_jsonl(d / "b.jsonl", GOOD + [_other_text(GOOD[5]), GOOD[7]])  # later rows: dropped
    write_jsonl(d / "c.jsonl", [GOOD[0], _other_text(GOOD[9])])  # a later file: dropped
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, d, out) == 0
    assert stats(out).drops == {"duplicate_id": 5}
    assert stats(out).raw_documents == len(GOOD) + 5 and stats(out).kept_documents == len(GOOD)
    winners = [_other_text(GOOD[0])] + GOOD[1:]
    assert run_scaffold(gpt2_spec, write_jsonl(tmp_path / "winners.jsonl", winners), tmp_path / "expected") == 0
    assert shard_hashes(out) == shard_hashes(tmp_path / "expected")
    assert {k: v for k, v in vars(stats(out)).items() if k not in ("raw_documents", "drops")} == {
        k: v for k, v in vars(stats(tmp_path / "expected")).items() if k not in ("raw_documents", "drops")}


def test_the_same_id_twice_with_long_docs_chunk_keeps_every_chunk_of_the_first_copy(tmp_path, gpt2_spec):
    """Chunks of one document have their own sort keys, so copies are matched by source id: the
    first copy is kept whole, however the copies were cut, and no chunk of another copy survives."""
    longo = _other_text(GOOD[1], 1500) | {"id": "longo"}  # 2 chunks
    colliding = {"id": "longo#1", "content-ff": "<ff_1> outro <ff_0> documento"}  # an id, not a chunk
    first = [longo, colliding] + GOOD
    later = [_other_text(GOOD[1], 2500) | {"id": "longo"},  # 3 chunks: its third must not survive
             _other_text(GOOD[2], 1200),  # the first copy is one sequence, this one two
             dict(GOOD[3])]  # an exact copy
    write_jsonl(tmp_path / "a.jsonl", first)
    write_jsonl(tmp_path / "b.jsonl", later)
    out = tmp_path / "out"
    assert run_scaffold(gpt2_spec, tmp_path / "*.jsonl", out, "--long-docs", "chunk") == 0
    assert stats(out).drops == {"duplicate_id": 3}
    assert run_scaffold(gpt2_spec, tmp_path / "a.jsonl", tmp_path / "expected", "--long-docs", "chunk") == 0
    assert shard_hashes(out) == shard_hashes(tmp_path / "expected")
    expected = stats(tmp_path / "expected")
    assert stats(out).splits == expected.splits and sum(s.sequences for s in expected.splits.values()) == 17
    # Under --long-docs skip the 1,500- and 2,500-word copies are too_many_words, dropped before the
    # copies meet; the 1,200-word copy of GOOD[2] too. The exact copy of GOOD[3] is a duplicate.
    assert run_scaffold(gpt2_spec, tmp_path / "*.jsonl", tmp_path / "skip") == 0
    assert stats(tmp_path / "skip").drops == {"too_many_words": 3, "duplicate_id": 1}


# --- 50 MB documents -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_inputs(tmp_path_factory):
    """The good records plus one 50 MB document each, written once: plain text of words (for
    --annotate), content-ff of words, and text without any whitespace (plain and content-ff)."""
    d = tmp_path_factory.mktemp("big")
    source = (REPO / "tests" / "data" / "sample_sources" / "udhr_por_PT.txt").read_text(encoding="utf-8")
    source = source.encode("ascii", "ignore").decode()
    words = (source * (BIG // len(source) + 1))[:BIG]
    block = "<ff_0> palavra "
    ff_words = (block * (BIG // len(block) + 1))[:BIG]
    no_space = "a" * BIG
    return {
        "plain_words": write_jsonl(d / "plain_words.jsonl", GOOD_PLAIN + [{"id": "grande", "text": words}]),
        "ff_words": write_jsonl(d / "ff_words.jsonl", GOOD + [{"id": "grande", "content-ff": ff_words}]),
        "plain_no_space": write_jsonl(d / "plain_no_space.jsonl", GOOD_PLAIN + [{"id": "grande", "text": no_space}]),
        "ff_no_space": write_jsonl(d / "ff_no_space.jsonl",
                                   GOOD + [{"id": "grande", "content-ff": "<ff_0> " + no_space}]),
    }


BIG_CASES = {
    # case: (input, --annotate, what it is dropped as)
    "plain_words": ("plain_words", True, "too_many_words"),
    "ff_words": ("ff_words", False, "too_many_words"),
    "plain_no_space": ("plain_no_space", True, "word_too_long"),
    "ff_no_space": ("ff_no_space", False, "word_too_long"),
}


@pytest.mark.parametrize("case", sorted(BIG_CASES))
def test_a_50_mb_document_is_dropped_and_counted(case, tmp_path, gpt2_spec, big_inputs, good_only, good_plain_only):
    name, plain, reason = BIG_CASES[case]
    assert os.path.getsize(big_inputs[name]) > BIG
    out = tmp_path / "out"
    start = time.monotonic()
    assert run_scaffold(gpt2_spec, big_inputs[name], out, *(["--annotate"] if plain else [])) == 0
    seconds = time.monotonic() - start
    print(f"\n{case}: the job with a 50 MB document took {seconds:.1f} s")
    assert stats(out).drops == {reason: 1}
    assert shard_hashes(out) == (good_plain_only if plain else good_only)
