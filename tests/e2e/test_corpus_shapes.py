"""Any corpus, not only the FinePDFs schema: the same documents given as a FinePDFs file, a
FineWeb file, a plain id/text parquet and plain JSONL, each through the CLI with its field flags,
come out as the same shards; a missing field is named with the flag that names it."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import GPT2_RANKS, tree_hashes

from pipelines import cli
from shards import conditions, layout, manifest, tree
from shards.card import CARD_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME

RUNNER = ["--runner=FnApiRunner"]
FINEWEB = ["--language", "en", "--language-fields", "language", "--lid-score-field", "language_score",
           "--lid-threshold", "0.65"]
PLAIN = ["--language", "none", "--token-count-field", "none"]

# (id, text, language, LID score): what each shape is made from.
DOCS = [
    ("doc-1", "The first kept document, about rivers and the sea."),
    ("doc-2", "A second one: <|endoftext|> inside it stays text."),
    ("doc-3", "Third, with digits 12345 and punctuation!?"),
    ("doc-4", "Fourth and last of the kept documents."),
]
# Rows that each shape's filter drops (the plain shapes have no such rows): (id, text, iso, score).
DROPPED = [("fr-1", "Un document en français.", "fr", 0.99), ("low-1", "An unsure English page.", "en", 0.50)]
KEPT_SCORE = 0.95
FINEPDFS_LANG = {"en": "eng_Latn", "fr": "fra_Latn"}


def _rows(with_dropped: bool) -> list[tuple[str, str, str, float]]:
    rows = [(i, t, "en", KEPT_SCORE) for i, t in DOCS]
    return rows + (DROPPED if with_dropped else [])


def write_finepdfs(path) -> None:
    pq.write_table(pa.Table.from_pylist([
        {"id": i, "text": t, "language": FINEPDFS_LANG[lang], "page_average_lid": FINEPDFS_LANG[lang],
         "page_average_lid_score": score, "token_count": len(t.split())}
        for i, t, lang, score in _rows(True)]), path)


def write_fineweb(path) -> None:
    """FineWeb's columns, in its order and types (language_score float64, token_count int64)."""
    pq.write_table(pa.Table.from_pylist([
        {"text": t, "id": f"<urn:uuid:{i}>", "dump": "CC-MAIN-2024-10", "url": f"https://example.org/{i}",
         "date": "2024-02-21T00:00:00Z", "file_path": "s3://commoncrawl/x.warc.gz", "language": lang,
         "language_score": score, "token_count": len(t.split())}
        for i, t, lang, score in _rows(True)]), path)


def fineweb_id(doc_id: str) -> str:
    return f"<urn:uuid:{doc_id}>"


def run(inp, out, *flags) -> int:
    return cli.main(["bucketed", "--input", str(inp), "--output", str(out), "--tokenizer", f"tiktoken:{GPT2_RANKS}",
                     "--partitions", "2", *RUNNER, *flags])


def stored(out) -> dict[str, str]:
    """Every stored document, id -> text, read through the manifest and decoded (without its EOS)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    gpt2 = tiktoken.Encoding("gpt2", pat_str=r"\S+|\s+", mergeable_ranks=load_tiktoken_bpe(str(GPT2_RANKS)),
                             special_tokens={"<|endoftext|>": 50256})
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        rows = list(manifest.read_rows(f))
    docs, offsets = {}, {}
    for rel, doc_id, n in rows:
        tokens = np.fromfile(out / rel, dtype="<u4")[offsets.get(rel, 0):offsets.get(rel, 0) + n]
        offsets[rel] = offsets.get(rel, 0) + n
        assert tokens[-1] == 50256 and 50256 not in tokens[:-1].tolist()
        docs[doc_id] = gpt2.decode(tokens[:-1].tolist())
    return docs


def shard_hashes(out) -> dict[str, str]:
    """The shards' and manifest's bytes (the stats and the tree's description, which name the flags,
    the input and the counts, aside)."""
    return tree_hashes(out, skip=(layout.STATS_NAME, tree.RECORD_NAME, STATS_JSON_NAME, CARD_NAME))


@pytest.fixture(scope="module")
def finepdfs_tree(tmp_path_factory):
    d = tmp_path_factory.mktemp("finepdfs")
    write_finepdfs(d / "finepdfs.parquet")
    assert run(d / "finepdfs.parquet", d / "out") == 0
    return d / "out"


def test_finepdfs_shape_with_the_defaults(finepdfs_tree):
    assert stored(finepdfs_tree) == dict(DOCS)
    stats = tree.OutputTree.open(str(finepdfs_tree)).stats()
    assert stats.drops == {"language": 1, "lid_score": 1} and stats.field_settings == {}
    # A run with the defaults records no field settings: its stats are those it always wrote.
    text = (finepdfs_tree / layout.STATS_NAME).read_text()
    assert not any(f"\n{key}: " in text for key in (*manifest.FIELD_SETTINGS, *conditions.STATS_TAIL, conditions.KEEP))


def test_fineweb_shape_with_its_flags(tmp_path, finepdfs_tree, capsys):
    write_fineweb(tmp_path / "fineweb.parquet")
    assert run(tmp_path / "fineweb.parquet", tmp_path / "out", *FINEWEB) == 0
    assert stored(tmp_path / "out") == {fineweb_id(i): t for i, t in DOCS}
    stats = tree.OutputTree.open(str(tmp_path / "out")).stats()
    assert stats.raw_documents == len(DOCS) + len(DROPPED) and stats.filter["language"] == "en"
    assert stats.drops == {"language": 1, "lid_score": 1}
    assert stats.field_settings == {}
    assert stats.filter == {"language": "en", "lid_threshold": 0.65, "min_token_count": 1,
                            "language_fields": "language", "lid_score_field": "language_score"}
    assert "language_fields: language\nlid_score_field: language_score\n" in (
        tmp_path / "out" / layout.STATS_NAME).read_text()
    # verify re-reads the source with the fields the stats record, and finds every document.
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(tmp_path / "out"), "--input", str(tmp_path / "fineweb.parquet"),
                     *RUNNER]) == 0
    assert "source compared on all ids" in capsys.readouterr().out


def test_a_lower_fineweb_threshold_keeps_the_unsure_page(tmp_path):
    write_fineweb(tmp_path / "fineweb.parquet")
    flags = [f if f != "0.65" else "0.5" for f in FINEWEB]
    assert run(tmp_path / "fineweb.parquet", tmp_path / "out", *flags) == 0
    assert fineweb_id("low-1") in stored(tmp_path / "out")


def test_plain_id_text_parquet_and_jsonl_give_the_same_shards(tmp_path, finepdfs_tree):
    pq.write_table(pa.Table.from_pylist([{"id": i, "text": t} for i, t in DOCS]), tmp_path / "plain.parquet")
    (tmp_path / "plain.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS))
    for name in ("plain.parquet", "plain.jsonl"):
        out = tmp_path / f"out-{name}"
        assert run(tmp_path / name, out, *PLAIN) == 0
        assert stored(out) == dict(DOCS)
        # The same documents kept from the FinePDFs file: the same bytes, file for file.
        assert shard_hashes(out) == shard_hashes(finepdfs_tree)
        stats = tree.OutputTree.open(str(out)).stats()
        assert stats.drops == {} and stats.filter["language"] == "none"
        assert stats.field_settings == {} and stats.filter["token_count_field"] == "none"


def test_other_id_and_text_field_names(tmp_path, finepdfs_tree):
    rows = [{"url": i, "content": t, "text": "not this column"} for i, t in DOCS]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "named.parquet")
    out = tmp_path / "out"
    assert run(tmp_path / "named.parquet", out, *PLAIN, "--id-field", "url", "--text-field", "content") == 0
    assert shard_hashes(out) == shard_hashes(finepdfs_tree)
    assert tree.OutputTree.open(str(out)).stats().field_settings == {"id_field": "url", "text_field": "content"}


def test_language_none_keeps_every_language_but_still_checks_the_count(tmp_path):
    write_finepdfs(tmp_path / "finepdfs.parquet")
    out = tmp_path / "out"
    assert run(tmp_path / "finepdfs.parquet", out, "--language", "none", "--min-token-count", "6") == 0
    expected = {i: t for i, t, _, _ in _rows(True) if len(t.split()) >= 6}
    assert stored(out) == expected
    assert tree.OutputTree.open(str(out)).stats().drops == {"token_count": len(_rows(True)) - len(expected)}


# --- what is missing, and the flag that names it ------------------------------------------------

@pytest.mark.parametrize(
    "shape, flags, message",
    [
        ("plain", [], "missing column 'language' (the file has id, text); name the column to read with "
                      "--language-fields (or --language none)"),
        ("fineweb", [], "missing column 'page_average_lid' (the file has text, id, dump, url, date, file_path, "
                        "language, language_score, token_count); name the column to read with --language-fields"),
        ("fineweb", ["--language", "en", "--language-fields", "language"],
         "missing column 'page_average_lid_score' (the file has text, id, dump, url, date, file_path, language, "
         "language_score, token_count); name the column to read with --lid-score-field (or none)"),
        ("plain", ["--language", "none"], "missing column 'token_count' (the file has id, text); name the column to "
                                          "read with --token-count-field (or none)"),
        ("plain", [*PLAIN, "--text-field", "body"], "missing column 'body' (the file has id, text); name the column "
                                                    "to read with --text-field"),
        ("fineweb", [*FINEWEB, "--id-field", "doc_id"], "missing column 'doc_id'"),
    ],
)
def test_a_missing_column_names_the_file_and_the_flag(tmp_path, capsys, shape, flags, message):
    path = tmp_path / f"{shape}.parquet"
    if shape == "fineweb":
        write_fineweb(path)
    else:
        pq.write_table(pa.Table.from_pylist([{"id": i, "text": t} for i, t in DOCS]), path)
    assert run(path, tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err
    assert f"pretokenize bucketed: bad input: {path}: {message}" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_missing_jsonl_field_names_the_line_and_the_flag(tmp_path, capsys):
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS))
    assert run(path, tmp_path / "out", "--language", "en", "--language-fields", "lang") == 2
    assert (f"{path} line 1: missing field(s) lang, page_average_lid_score, token_count; name the field to read "
            "with --language-fields (or --language none), --lid-score-field (or none), --token-count-field (or none)"
            ) in capsys.readouterr().err


def test_the_scaffold_job_names_its_text_flag_too(tmp_path, capsys):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"id": "a", "body": "uma palavra"}) + "\n")
    code = cli.main(["scaffold", "--input", str(path), "--output", str(tmp_path / "out"), "--annotate",
                     "--tokenizer", f"tiktoken:{GPT2_RANKS}", *RUNNER])
    assert code == 2
    assert f"{path} line 1: missing field(s) text; name the field to read with --text-field" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--language-fields", ""], "--language-fields names no field to check --language eng_Latn in"),
        (["--language-fields", "language,language"], "the name 'language' is given twice"),
        (["--language-fields", "row"], "--language-fields (or --language none): 'row' cannot be a filter field"),
        (["--language-fields", "lid_score"], "the name 'lid_score' is given twice"),
        (["--lid-score-field", "id"], "--lid-score-field (or none): the document's id is a string"),
        (["--token-count-field", "language"], "'language' is read as string by --language-fields"),
        (["--language", "none", "--lid-threshold", "0.95"],
         "--lid-threshold 0.95 would be ignored: --language none checks no LID score"),
        (["--lid-score-field", "none", "--lid-threshold", "0.5"],
         "--lid-threshold 0.5 would be ignored: --lid-score-field none checks no LID score"),
    ],
)
def test_field_flags_that_cannot_work_are_refused_at_launch(tmp_path, capsys, flags, message):
    write_finepdfs(tmp_path / "in.parquet")
    assert run(tmp_path / "in.parquet", tmp_path / "out", *flags) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_field_settings_survive_the_stats_round_trip():
    filt = {"language": "en", "lid_threshold": 0.65, "min_token_count": 1, "lid_score_field": "language_score",
            "keep": ("is_truncated == false",)}
    stats = DatasetStats(raw_documents=1, filter=filt, tokenizer="gpt2", eos_id=50256, vocab_size=50257,
                         dtype="uint32", partitions=2, seed=0, buckets={}, drops={},
                         field_settings={"text_field": "content"})
    back = DatasetStats.from_text(stats.to_text())
    assert back.field_settings == stats.field_settings and back.to_text() == stats.to_text()
    assert back.filter == filt


def test_own_field_names_through_verify_and_remove(tmp_path, capsys):
    """A language field of the user's own name is its own drop reason; verify (re-reading the source
    with the fields the stats record) and remove (rewriting the stats) both keep to them."""
    rows = [{"doc": i, "body": t, "lang": "pt" if i == "doc-4" else "en", "conf": 0.99} for i, t in DOCS]
    src = tmp_path / "own.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    flags = ["--id-field", "doc", "--text-field", "body", "--language", "en", "--language-fields", "lang",
             "--lid-score-field", "conf", "--token-count-field", "none"]
    assert run(src, out, *flags) == 0
    assert stored(out) == dict(DOCS[:3])
    assert tree.OutputTree.open(str(out)).stats().drops == {"lang": 1}
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), "--input", str(src), *RUNNER]) == 0
    assert "source compared on all ids" in capsys.readouterr().out
    (tmp_path / "remove.txt").write_text("doc-2\n")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(tmp_path / "remove.txt"), *RUNNER]) == 0
    stats = tree.OutputTree.open(str(out)).stats()
    assert stats.drops == {"lang": 1, "removed": 1}
    assert stats.field_settings == {"id_field": "doc", "text_field": "body"}
    assert stats.filter == {"language": "en", "lid_threshold": 0.9, "min_token_count": 1, "language_fields": "lang",
                            "lid_score_field": "conf", "token_count_field": "none"}
    assert cli.main(["verify", "--output", str(out), "--input", str(src), *RUNNER]) == 0
