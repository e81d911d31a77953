"""The scaffold job end to end on the FnApiRunner: shards on disk checked against an independent
derivation, llm.c-style loading, decode round trips, long documents, split stability, determinism
across workers and range counts, re-runs and failed runs, bad input."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import GPT2_RANKS, REPO, tree_hashes, write_jsonl

from pipelines import cli, decode, scaffold
from shards import layout, llmc, scaffold_verify, tree
from shards.card import CARD_NAME
from shards.llmc import ScaffoldStats
from shards.provenance import STATS_JSON_NAME
from transforms.core.records import UsageError
from transforms.scaffold.encode import annotate, format_annotated

SAMPLE = REPO / "tests" / "data" / "scaffold"
ANNOTATED = SAMPLE / "por_annotated.jsonl"
PLAIN = SAMPLE / "por_plain.jsonl"
RUNNER = ["--runner=FnApiRunner"]


def run_job(input_path, output, tokenizer, *flags) -> ScaffoldStats:
    return scaffold.run(["--input", str(input_path), "--output", str(output), "--tokenizer", tokenizer, *RUNNER,
                         *flags])


def rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def load_shard_as_the_card_does(path) -> np.ndarray:
    """The dataset card's "How to Load", written out: what a downstream user runs."""
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert header[0] == 20240520, "Invalid magic number"
    assert header[1] == 1
    token_count = header[2]
    tokens = np.fromfile(path, dtype=np.uint16, offset=1024)
    assert len(tokens) == token_count
    return tokens


def split_stream(root, split) -> tuple[np.ndarray, list[int]]:
    """A split's shards read as llm.c reads them: (all tokens in order, each shard's count)."""
    d = Path(root) / split
    if not d.is_dir():
        return np.empty(0, dtype=np.uint16), []
    names = sorted(p.name for p in d.iterdir())
    parts = [load_shard_as_the_card_does(d / n) for n in names]
    assert names == [f"shard_{i:03d}.bin" for i in range(len(names))]
    return (np.concatenate(parts) if parts else np.empty(0, dtype=np.uint16)), [len(p) for p in parts]


# --- an independent derivation of the expected shards (no code of the job's) ------------------------

def _gpt2():
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = load_tiktoken_bpe(str(GPT2_RANKS))
    return tiktoken.Encoding("gpt2-test", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def _h64(doc_id: str, person: bytes, key: bytes = b"") -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8, person=person, key=key).digest(), "little")


def expected_streams(records, val_fraction: float, seed: int = 0) -> dict[str, list[int]]:
    """What train/ and val/ must hold, derived from the card's rules: markers split off words (text
    between them, stripped), countdown 50257 + words after, GPT-2 ids of each word on its own, EOT;
    documents over 1,000 words skipped; val by BLAKE2b('llmc-split') of the id; order by the seeded
    BLAKE2b('shuffle') of the id."""
    enc = _gpt2()
    docs = {"train": [], "val": []}
    for r in records:
        words = [w.strip() for w in re.split(r"<ff_[0-9]+>", r["content-ff"])]
        words = [w for w in words if w]
        if not words or len(words) > 1000:
            continue
        tokens = []
        for i, w in enumerate(words):
            tokens.append(50257 + len(words) - 1 - i)
            tokens += enc.encode_ordinary(w)
        tokens.append(50256)
        doc_id = str(r["id"])
        split = "val" if _h64(doc_id, b"llmc-split") < val_fraction * 2**64 else "train"
        docs[split].append((_h64(doc_id, b"shuffle", seed.to_bytes(8, "little")) & (2**63 - 1), doc_id, tokens))
    return {s: [t for *_, tokens in sorted(d) for t in tokens] for s, d in docs.items()}


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory, gpt2_spec):
    out = tmp_path_factory.mktemp("scaffold") / "out"
    stats = run_job(ANNOTATED, out, gpt2_spec, "--shard-tokens", "2500", "--val-fraction", "0.2")
    return out, stats


def test_sample_shards_match_an_independent_derivation(sample_run):
    out, stats = sample_run
    expected = expected_streams(rows(ANNOTATED), 0.2)
    for split in llmc.SPLITS:
        stream, counts = split_stream(out, split)
        assert stream.tolist() == expected[split], split
        # Filled exactly as llm.c does: every shard but the last holds --shard-tokens, the last the rest.
        assert counts == llmc.shard_lengths(len(expected[split]), 2500)
        assert stats.splits[split].tokens == len(stream) and stats.splits[split].files == len(counts)
    assert len(split_stream(out, "train")[1]) >= 4 and len(split_stream(out, "val")[1]) >= 1
    # Documents cross shard boundaries: some shard after the first does not start with a countdown.
    train = split_stream(out, "train")[0]
    assert any(train[i * 2500] < llmc.FF_BASE for i in range(1, len(train) // 2500))
    # Accounting: 64 records, the whole declaration (1,987 words) skipped, one miscounted record.
    assert stats.raw_documents == 64 and stats.drops == {"too_many_words": 1}
    assert stats.kept_documents == 63 and stats.countdown_mismatches == 1
    on_disk = set(tree_hashes(out))
    assert on_disk == {layout.STATS_NAME, layout.CHECKSUMS_NAME, tree.RECORD_NAME, STATS_JSON_NAME, CARD_NAME} | {
        f"{s}/shard_{i:03d}.bin" for s in llmc.SPLITS for i in range(stats.splits[s].files)}
    with open(out / layout.STATS_NAME, encoding="utf-8") as f:
        assert ScaffoldStats.from_text(f.read()) == stats


def test_the_shards_pass_the_format_checks(sample_run):
    out, stats = sample_run
    for split in llmc.SPLITS:
        paths = sorted(str(p) for p in (out / split).iterdir())
        assert llmc.check_llmc_split(paths, shard_tokens=stats.shard_tokens) == []
    assert scaffold_verify.check_scaffold_tree(str(out)) == []


def test_the_tree_check_finds_damage(sample_run, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(sample_run[0], out)
    shard = out / "train" / "shard_001.bin"
    data = bytearray(shard.read_bytes())
    tokens = np.frombuffer(bytes(data[llmc.HEADER_BYTES:]), dtype="<u2")
    ff = np.flatnonzero(tokens >= llmc.FF_BASE)
    # A countdown token with another one before it in the same document: raising it by one breaks the step.
    at = next(int(b) for a, b in zip(ff[:-1], ff[1:], strict=True) if not (tokens[a:b] == llmc.GPT2_EOT).any())
    data[llmc.HEADER_BYTES + 2 * at:llmc.HEADER_BYTES + 2 * at + 2] = (int(tokens[at]) + 1).to_bytes(2, "little")
    shard.write_bytes(bytes(data))
    problems = scaffold_verify.check_scaffold_tree(str(out))
    assert any(f"countdown tokens that are not one less than the countdown before them (first at "
               f"train/shard_001.bin token {at})" in p for p in problems), problems
    last = sorted((out / "train").iterdir())[-1]
    last.unlink()
    problems = scaffold_verify.check_scaffold_tree(str(out))
    assert any("train: the last document does not end with EOT" in p for p in problems)
    assert any("files on disk, the stats say" in p for p in problems)
    (out / layout.STATS_NAME).unlink()
    assert scaffold_verify.check_scaffold_tree(str(out)) == [
        "dataset_stats.txt: missing: the tree is not finished (a job died or is still publishing)"]


def test_training_code_style_loader_reads_them(sample_run):
    """The published model's loader: header via frombuffer of 1024 bytes, then the rest as uint16."""
    out, stats = sample_run
    total = 0
    for path in sorted((out / "train").iterdir()):
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(256 * 4), dtype=np.int32)
            assert header[0] == 20240520 and header[1] == 1
            tokens = np.frombuffer(f.read(), dtype=np.uint16)
        assert len(tokens) == header[2]
        assert int(tokens.max()) <= 51256
        total += len(tokens)
    assert total == stats.splits["train"].tokens
    # Documents are found by splitting at EOT: their count is the sequences the stats report.
    stream = split_stream(out, "train")[0]
    assert int((stream == 50256).sum()) == stats.splits["train"].sequences


def _decoded(paths, gpt2_spec, markers=False) -> list[str]:
    out = io.StringIO()
    decode.decode([str(p) for p in paths], decode.load_token_bytes(gpt2_spec), None, markers, out, io.StringIO())
    text = out.getvalue()
    assert text == "" or text.endswith("\n")
    return text[:-1].split("\n\n") if text else []


def test_round_trip_text_to_shards_to_decode_gives_back_the_words(tmp_path, gpt2_spec):
    out = tmp_path / "out"
    stats = run_job(PLAIN, out, gpt2_spec, "--annotate", "--shard-tokens", "1000", "--val-fraction", "0.3")
    expected = {}
    for r in rows(PLAIN):
        words = annotate(r["text"])
        if len(words) <= 1000:
            expected[" ".join(words)] = format_annotated(words)
    decoded = [d for s in llmc.SPLITS for d in _decoded([out / s], gpt2_spec)]
    assert sorted(decoded) == sorted(expected)
    with_markers = [d for s in llmc.SPLITS for d in _decoded([out / s], gpt2_spec, markers=True)]
    assert sorted(with_markers) == sorted(expected.values())
    # Accents survive: the decoded text has them as the source does.
    assert any("Ninguém será" in d for d in decoded) and any("ação" in d for d in decoded)
    assert stats.splits["train"].files > 5


def test_annotated_and_plain_input_give_the_same_shards(tmp_path, gpt2_spec):
    """The sample's content-ff file is its plain file annotated by the --annotate rule (plus one
    synthetic record and one miscounted one): both paths must store the very same bytes."""
    annotated = [r for r in rows(ANNOTATED) if r["id"] != "sinais-menor-maior"]
    write_jsonl(tmp_path / "annotated.jsonl", annotated)
    a = run_job(tmp_path / "annotated.jsonl", tmp_path / "a", gpt2_spec, "--shard-tokens", "3000")
    b = run_job(PLAIN, tmp_path / "b", gpt2_spec, "--annotate", "--shard-tokens", "3000")
    # (The stats count the mismatch; dataset_stats.json and the card name the input and its flags.)
    skip = (layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME)
    assert tree_hashes(tmp_path / "a", skip=skip) == tree_hashes(tmp_path / "b", skip=skip)
    assert (a.countdown_mismatches, b.countdown_mismatches) == (1, 0)


def test_a_document_with_angle_brackets(tmp_path, gpt2_spec):
    records = [
        {"id": "menor", "content-ff": "<ff_4> se <ff_3> a<b <ff_2> e <ff_1> b>c <ff_0> <ff_9x>"},
        {"id": "tag", "text": "Use <b>negrito</b> se 1 < 2 > 0."},
    ]
    write_jsonl(tmp_path / "a.jsonl", records[:1])
    write_jsonl(tmp_path / "p.jsonl", records[1:])
    run_job(tmp_path / "a.jsonl", tmp_path / "a", gpt2_spec, "--val-fraction", "0")
    run_job(tmp_path / "p.jsonl", tmp_path / "p", gpt2_spec, "--val-fraction", "0", "--annotate")
    assert _decoded([tmp_path / "a" / "train"], gpt2_spec, markers=True) == [
        "<ff_4> se <ff_3> a<b <ff_2> e <ff_1> b>c <ff_0> <ff_9x>"]
    assert _decoded([tmp_path / "p" / "train"], gpt2_spec) == [
        "Use < b > negrito < / b > se 1 < 2 > 0 ."]
    stream = split_stream(tmp_path / "a", "train")[0].tolist()
    assert stream[:2] == [50261, *_gpt2().encode_ordinary("se")] and 27 in stream and 29 in stream  # '<', '>'


def _long_record(n_words: int) -> dict:
    """The first ``n_words`` words of the pt-PT declaration (repeated if it is shorter) as content-ff."""
    source = annotate((REPO / "tests" / "data" / "sample_sources" / "udhr_por_PT.txt").read_text(encoding="utf-8"))
    words = (source * (n_words // len(source) + 1))[:n_words]
    return {"id": "longo", "content-ff": format_annotated(words)}


def test_a_1001_word_document_under_both_long_doc_settings(tmp_path, gpt2_spec):
    short = {"id": "curto", "content-ff": "<ff_1> Artigo <ff_0> 1.º"}
    long = _long_record(1001)
    write_jsonl(tmp_path / "in.jsonl", [short, long])
    skipped = run_job(tmp_path / "in.jsonl", tmp_path / "skip", gpt2_spec, "--val-fraction", "0")
    assert skipped.drops == {"too_many_words": 1} and skipped.kept_documents == 1
    assert _decoded([tmp_path / "skip" / "train"], gpt2_spec) == ["Artigo 1.º"]

    chunked = run_job(tmp_path / "in.jsonl", tmp_path / "chunk", gpt2_spec, "--val-fraction", "0",
                      "--long-docs", "chunk")
    assert chunked.drops == {} and chunked.kept_documents == 2
    assert chunked.splits["train"].sequences == 3 and chunked.splits["train"].words == 1003
    stream = split_stream(tmp_path / "chunk", "train")[0]
    docs = np.split(stream, np.flatnonzero(stream == 50256)[:-1] + 1)
    countdowns = sorted((d[d >= llmc.FF_BASE] - llmc.FF_BASE).tolist() for d in docs)
    assert countdowns == [[0], [1, 0], list(range(999, -1, -1))]
    assert llmc.check_llmc_split([str(p) for p in sorted((tmp_path / "chunk" / "train").iterdir())]) == []


def test_the_val_split_is_stable_when_documents_are_added(tmp_path, gpt2_spec):
    records = rows(PLAIN)
    write_jsonl(tmp_path / "half.jsonl", records[::2])
    write_jsonl(tmp_path / "all.jsonl", records[::-1])  # more documents, and in another order
    flags = ["--annotate", "--val-fraction", "0.3", "--shard-tokens", "2000"]
    run_job(tmp_path / "half.jsonl", tmp_path / "half", gpt2_spec, *flags)
    run_job(tmp_path / "all.jsonl", tmp_path / "all", gpt2_spec, *flags)
    half = {s: set(_decoded([tmp_path / "half" / s], gpt2_spec)) for s in llmc.SPLITS}
    full = {s: set(_decoded([tmp_path / "all" / s], gpt2_spec)) for s in llmc.SPLITS}
    assert half["val"] and half["train"]
    assert half["val"] <= full["val"] and half["train"] <= full["train"]
    assert full["val"] - half["val"], "new documents should reach val too"


def test_one_and_two_workers_give_identical_bytes(tmp_path, gpt2_spec):
    flags = ["--annotate", "--long-docs", "chunk", "--shard-tokens", "700", "--val-fraction", "0.2"]
    run_job(PLAIN, tmp_path / "one", gpt2_spec, *flags)
    run_job(PLAIN, tmp_path / "two", gpt2_spec, *flags, "--direct_running_mode=multi_processing",
            "--direct_num_workers=2")
    one, two = tree_hashes(tmp_path / "one"), tree_hashes(tmp_path / "two")
    assert one == two
    assert len([k for k in one if k.startswith("train/")]) > 10


def test_order_ranges_and_reruns_do_not_change_the_bytes(tmp_path, gpt2_spec):
    flags = ["--shard-tokens", "900", "--val-fraction", "0.1"]
    run_job(ANNOTATED, tmp_path / "r1", gpt2_spec, *flags, "--order-ranges", "1")
    run_job(ANNOTATED, tmp_path / "r64", gpt2_spec, *flags, "--order-ranges", "64")
    # Every byte but the flags dataset_stats.json and the card record (--order-ranges among them).
    description = (STATS_JSON_NAME, CARD_NAME)
    assert tree_hashes(tmp_path / "r1", skip=description) == tree_hashes(tmp_path / "r64", skip=description)
    one, many = (json.loads((tmp_path / r / STATS_JSON_NAME).read_text()) for r in ("r1", "r64"))
    assert (one["flags"].pop("order_ranges"), many["flags"].pop("order_ranges")) == (1, 64) and one == many
    # Re-running into a used output replaces it: shards the new run does not write are removed.
    run_job(ANNOTATED, tmp_path / "r1", gpt2_spec, "--shard-tokens", "100000", "--val-fraction", "0.1")
    assert sorted(tree_hashes(tmp_path / "r1")) == sorted(
        [tree.RECORD_NAME, layout.CHECKSUMS_NAME, layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME,
         "train/shard_000.bin", "val/shard_000.bin"])
    run_job(ANNOTATED, tmp_path / "r1", gpt2_spec, *flags, "--order-ranges", "64")
    assert tree_hashes(tmp_path / "r1") == tree_hashes(tmp_path / "r64")


def test_the_seed_changes_only_the_order(tmp_path, gpt2_spec):
    run_job(ANNOTATED, tmp_path / "s0", gpt2_spec, "--val-fraction", "0.2")
    run_job(ANNOTATED, tmp_path / "s7", gpt2_spec, "--val-fraction", "0.2", "--seed", "7")
    for split in llmc.SPLITS:
        a = _decoded([tmp_path / "s0" / split], gpt2_spec)
        b = _decoded([tmp_path / "s7" / split], gpt2_spec)
        assert sorted(a) == sorted(b) and (a != b or len(a) < 3)


def test_a_failed_run_leaves_the_previous_output_whole(tmp_path, gpt2_spec):
    good = write_jsonl(tmp_path / "good.jsonl", rows(ANNOTATED)[:10])
    out = tmp_path / "out"
    run_job(good, out, gpt2_spec, "--shard-tokens", "500")
    before = tree_hashes(out)
    bad = write_jsonl(tmp_path / "bad.jsonl", rows(ANNOTATED)[:10])
    with open(bad, "a", encoding="utf-8") as f:
        f.write('{"id": "x", "content-ff": \n')
    with pytest.raises(Exception, match=r"bad\.jsonl line 11: is not JSON"):
        run_job(bad, out, gpt2_spec, "--shard-tokens", "300")
    after = {k: v for k, v in tree_hashes(out).items() if not k.startswith(layout.TEMP_DIR_NAME)}
    assert after == before
    run_job(good, out, gpt2_spec, "--shard-tokens", "500")
    assert tree_hashes(out) == before


def test_bad_input_exits_2_naming_the_file(tmp_path, capsys, monkeypatch, gpt2_spec):
    bad = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "content-ff": "<ff_0> x"}, {"id": "b", "text": "t"}])
    code = cli.main(["scaffold", "--input", str(bad), "--output", str(tmp_path / "out"), "--tokenizer", gpt2_spec,
                     *RUNNER])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{bad} line 2: missing field(s) content-ff" in err and "nothing was published" in err
    assert not (tmp_path / "out" / layout.STATS_NAME).exists()


def test_a_tokenizer_that_is_not_gpt2_fails_before_the_pipeline_starts(tmp_path):
    with pytest.raises(UsageError, match="GPT-2's vocabulary"):
        run_job(ANNOTATED, tmp_path / "out", "jet-nemotron")
    assert not (tmp_path / "out").exists()


def test_fsspec_urls_end_to_end(gpt2_spec):
    import fsspec

    fs = fsspec.filesystem("memory")
    with fs.open("/scaffold-e2e/in/docs.json", "w") as f:
        f.write(json.dumps(rows(ANNOTATED)[:8], ensure_ascii=False, indent=1))
    stats = run_job("memory://scaffold-e2e/in/*.json", "memory://scaffold-e2e/out", gpt2_spec,
                    "--shard-tokens", "400", "--val-fraction", "0")
    assert stats.kept_documents == 8
    data = b"".join(fs.cat(p) for p in sorted(fs.glob("/scaffold-e2e/out/train/shard_*.bin")))
    assert data.count(llmc.make_header(400)) == stats.splits["train"].files - 1
    assert not fs.exists(f"/scaffold-e2e/out/{layout.TEMP_DIR_NAME}")
    assert llmc.check_llmc_split(sorted(f"memory://{p}" for p in fs.glob("/scaffold-e2e/out/train/shard_*.bin")),
                                 shard_tokens=400) == []


def test_the_hand_written_ids_are_gpt2s():
    """The ids the tests write by hand are GPT-2's: check a few against the ranks file's bytes."""
    table = {}
    for line in GPT2_RANKS.read_bytes().splitlines():
        token, rank = line.split()
        table[int(rank)] = base64.b64decode(token)
    assert b"".join(table[i] for i in (721, 261, 27083, 9383, 292)).decode() == "econômicas"
    assert b"".join(table[i] for i in (22540, 68)).decode() == "presidente"


def test_when_every_document_is_dropped_only_the_stats_are_written(tmp_path, gpt2_spec):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "content-ff": " "}, {"id": "b", "content-ff": "<ff_0>"}])
    stats = run_job(tmp_path / "in.jsonl", tmp_path / "out", gpt2_spec)
    assert stats.drops == {"no_words": 2} and stats.total_files == 0
    assert sorted(tree_hashes(tmp_path / "out")) == sorted([tree.RECORD_NAME, layout.CHECKSUMS_NAME, layout.STATS_NAME,
                                                            STATS_JSON_NAME, CARD_NAME])
    assert "This tree holds no documents." in (tmp_path / "out" / CARD_NAME).read_text(encoding="utf-8")
    assert scaffold_verify.check_scaffold_tree(str(tmp_path / "out")) == []
