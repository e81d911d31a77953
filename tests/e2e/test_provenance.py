"""Provenance (issue 14): `pretokenize --version`, dataset_stats.json, the README.md dataset card in
every tree (its figures against the stats, its reading snippets run against the tree), `remove`
keeping both true, and `pretokenize stats --json`. Every job is run through the CLI."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from conftest import DEFAULT_FILTER, REPO, SAMPLE_PARQUET, bucketed_sample, finepdfs_row, tree_hashes

from pipelines import cli
from shards import layout, llmc, manifest, tree
from shards.card import CARD_NAME
from shards.llmc import ScaffoldStats
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from transforms.inputs.units import file_fingerprint
from transforms.tokenizers.ranks import gpt2_ranks_path, qwen_ranks_path

RUNNER = ["--runner=FnApiRunner"]
SCAFFOLD_SAMPLE = REPO / "tests" / "data" / "scaffold" / "por_annotated.jsonl"
# 30 short documents and one alone in the 2048 bucket, for the removal tests.
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Sentence {i} of a small document. " * (2 + i % 7)) for i in range(30)]
ROWS.append(finepdfs_row("long-one", "A longer document about provenance. " * 250))
ROWS.append(finepdfs_row("french", "Un document en français.", language="fra_Latn"))


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def read_json(out) -> dict:
    return json.loads((out / STATS_JSON_NAME).read_text(encoding="utf-8"))


def card_rows(card: str, first_cell: str) -> dict[str, list[str]]:
    """{name: cells} of the markdown table rows whose first cell is a backquoted name, in the section
    that starts with the ``first_cell`` header; ``**Total**`` rows under the key "total"."""
    section = card.split(f"| {first_cell} |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        rows["total" if cells[0] == "Total" else cells[0].strip("`")] = cells[1:]
    return rows


def number(cell: str) -> int:
    return int(cell.replace(",", "").strip("*"))


def run_card_snippets(card: str, cwd) -> str:
    """Every python block of the card's "Reading it" section but the ones that need a tokenizer
    library, run in order as one script from ``cwd``, as a user would paste them."""
    reading = card.split("## Reading it", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", reading, flags=re.S)
    runnable = [b for b in blocks if "transformers" not in b and "tiktoken" not in b]
    assert len(runnable) >= 2 and len(blocks) > len(runnable), "the card should show reading and decoding"
    done = subprocess.run([sys.executable, "-c", "\n".join(runnable)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    return bucketed_sample(tmp_path_factory.mktemp("prov") / "sample", *RUNNER)


@pytest.fixture(scope="module")
def small_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def test_version_from_the_package_metadata(capsys):
    want = importlib.metadata.version("beam-pretokenize")
    assert cli.main(["--version"]) == 0
    assert cli.main(["bucketed", "--version"]) == 0
    assert cli.main(["stats", "--output", "anything", "--version"]) == 0
    assert capsys.readouterr().out == f"pretokenize (beam-pretokenize) {want}\n" * 3


def test_dataset_stats_json_of_the_sample(sample_tree):
    doc = read_json(sample_tree)
    stats = DatasetStats.from_text((sample_tree / layout.STATS_NAME).read_text())
    assert doc["job"] == "bucketed"
    assert doc["versions"] == {
        "beam-pretokenize": importlib.metadata.version("beam-pretokenize"),
        "apache-beam": importlib.metadata.version("apache-beam"),
        "python": platform.python_version(),
        "tokenizer_library": stats.tokenizer_backend,
    }
    assert doc["tokenizer"] == {"spec": "jet-nemotron", "files": [{"name": "qwen.tiktoken", "sha256": sha256(
        qwen_ranks_path())}], "eos_id": 151643, "vocab_size": 151936, "dtype": "uint32"}
    # Every flag of the job, at its default here, but --output: the bytes do not depend on it.
    assert doc["flags"] == {
        "input": SAMPLE_PARQUET.name, "language": "eng_Latn", "lid_threshold": 0.9, "min_token_count": 1,
        "tokenizer": "jet-nemotron", "eos_token": None, "tokenizer_backend": "auto", "tokenizer_threads": 1,
        "dtype": "uint32", "partitions": 32, "max_shard_bytes": 1_500_000_000, "seed": 0, "batch_docs": 64,
        "removal_list": None, "on_bad_record": "fail",
    } | {k: v for k, v in doc["flags"].items() if k not in (
        "input", "language", "lid_threshold", "min_token_count", "tokenizer", "eos_token", "tokenizer_backend",
        "tokenizer_threads", "dtype", "partitions", "max_shard_bytes", "seed", "batch_docs", "removal_list",
        "on_bad_record")}  # flags other changes add keep their own tests
    assert "output" not in doc["flags"]
    fs_fingerprint = file_fingerprint(*_local_fs(SAMPLE_PARQUET))
    # Typed as an absolute path: named below its root (issue 28), never by this machine's path.
    assert doc["inputs"] == [{"url": SAMPLE_PARQUET.name, "fingerprint": fs_fingerprint}]
    # The counts are dataset_stats.txt's.
    assert doc["documents"] == {"read": stats.raw_documents, "kept": stats.kept_documents,
                                "dropped": stats.dropped_documents} == {"read": 190, "kept": 149, "dropped": 41}
    assert (doc["tokens"], doc["files"]) == (stats.total_tokens, stats.total_files)
    assert [b["bucket"] for b in doc["buckets"]] == list(layout.BUCKET_NAMES)
    for b in doc["buckets"]:
        s = stats.buckets[b["bucket"]]
        assert (b["documents"], b["tokens"], b["files"]) == (s.documents, s.tokens, s.files)
        assert (b["min_length"], b["max_length"]) == layout.bucket_range(b["bucket"])
    assert doc["drops"] == stats.drops and sum(doc["drops"].values()) == 41
    # Listed as the tool's, so a later publish replaces them; checksums.sha256 stays the shards'.
    record = tree.read_record(str(sample_tree))
    assert {STATS_JSON_NAME, CARD_NAME} <= set(record.derived)
    assert set(manifest.parse_checksums((sample_tree / layout.CHECKSUMS_NAME).read_text())) == set(record.files)


def _local_fs(path):
    from shards import storage

    return storage.filesystem(str(path))


def test_the_card_figures_are_the_stats_and_its_snippets_run(sample_tree):
    card = (sample_tree / CARD_NAME).read_text(encoding="utf-8")
    stats = DatasetStats.from_text((sample_tree / layout.STATS_NAME).read_text())
    rows = card_rows(card, "Bucket")
    assert list(rows) == [*layout.BUCKET_NAMES, "total"]
    for name in layout.BUCKET_NAMES:
        _, docs, tokens, token_share, files = rows[name]
        b = stats.buckets[name]
        assert (number(docs), number(tokens), number(files)) == (b.documents, b.tokens, b.files)
        assert token_share == f"{100 * b.tokens / stats.total_tokens:.1f}%"
    assert [number(rows["total"][i]) for i in (1, 2, 4)] == [stats.kept_documents, stats.total_tokens,
                                                            stats.total_files]
    drops = card_rows(card, "Reason")
    assert {k: number(v[0]) for k, v in drops.items()} == {**stats.drops, "total": stats.dropped_documents}
    assert "| **Documents kept** | **149** of 190 read (78.4% kept) |" in card
    assert "| **Tokens** | **740,208**" in card
    assert "EOS `151643`" in card and "little-endian `uint32`" in card
    assert f"beam-pretokenize {importlib.metadata.version('beam-pretokenize')}" in card
    assert sha256(qwen_ranks_path()) in card
    printed = run_card_snippets(card, sample_tree)
    first_row = (sample_tree / layout.MANIFEST_NAME).read_text().splitlines()[1].split(" | ")
    assert printed.startswith(f"{first_row[0]} ")
    assert f"the first is {first_row[1]}\n" in printed


def test_the_command_in_the_card_rebuilds_the_same_tree(sample_tree, tmp_path, monkeypatch):
    """The card's command, run as written (with --output filled in) on two threads from the input's
    root (it names the input below it), writes the same bytes, the description files included:
    nothing in them depends on the run or its runner."""
    monkeypatch.chdir(SAMPLE_PARQUET.parent)
    card = (sample_tree / CARD_NAME).read_text(encoding="utf-8")
    command = re.search(r"```bash\n(pretokenize bucketed .*)\n```", card).group(1)
    args = shlex.split(command.replace("--output DIR", f"--output {tmp_path / 'again'}"))
    assert args[:2] == ["pretokenize", "bucketed"]
    threads = ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]
    assert cli.main([*args[1:], *RUNNER, *threads]) == 0
    assert tree_hashes(tmp_path / "again") == tree_hashes(sample_tree)


def test_the_description_is_written_before_the_commit_point(small_source, tmp_path, monkeypatch):
    written = []
    real = tree.Tree.write

    def noting(self, name, data, *args, **kwargs):  # every write into a tree goes through the tree layer
        written.append(name)
        return real(self, name, data, *args, **kwargs)

    monkeypatch.setattr(tree.Tree, "write", noting)
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(small_source), "--output", str(out), "--tokenizer", "gpt2",
                     *RUNNER]) == 0
    published = [rel for rel in written if rel != tree.RECORD_NAME]
    assert published[-3:] == [CARD_NAME, STATS_JSON_NAME, layout.STATS_NAME]
    assert published.index(layout.CHECKSUMS_NAME) < published.index(CARD_NAME)


def test_remove_rewrites_the_json_and_the_card(small_source, tmp_path, monkeypatch):
    out = tmp_path / "out"
    flags = ["--tokenizer", "gpt2", "--dtype", "uint16", "--partitions", "4", *RUNNER]
    assert cli.main(["bucketed", "--input", str(small_source), "--output", str(out), *flags]) == 0
    before = read_json(out)
    assert before["tokenizer"]["files"] == [{"name": "gpt2.tiktoken", "sha256": sha256(gpt2_ranks_path())}]
    card = (out / CARD_NAME).read_text(encoding="utf-8")
    assert 'DTYPE = np.dtype("<u2")' in card and "EOS_ID = 50256" in card
    assert "No document has been left out by id." in card
    run_card_snippets(card, out)

    ids = tmp_path / "ids.txt"
    ids.write_text("doc-03\nlong-one\n", encoding="utf-8")
    # As the card says, from the tree's directory.
    assert "pretokenize remove --output . --removal-list ids.txt" in card
    monkeypatch.chdir(out)
    assert cli.main(["remove", "--output", ".", "--removal-list", str(ids), *RUNNER]) == 0
    assert cli.main(["verify", "--output", ".", *RUNNER]) == 0
    monkeypatch.chdir(tmp_path)
    stats = DatasetStats.from_text((out / layout.STATS_NAME).read_text())
    after = read_json(out)
    for key in ("schema", "job", "versions", "tokenizer", "flags", "inputs"):
        assert after[key] == before[key], f"a removal changed {key}"
    assert after["documents"] == {"read": 32, "kept": 29, "dropped": 3} == {
        "read": stats.raw_documents, "kept": stats.kept_documents, "dropped": stats.dropped_documents}
    assert after["drops"] == stats.drops == {"language": 1, "removed": 2}
    assert {b["bucket"]: (b["documents"], b["tokens"], b["files"]) for b in after["buckets"]} == {
        name: (b.documents, b.tokens, b.files) for name, b in stats.buckets.items()}
    assert after["buckets"][1]["documents"] == 0, "the long document was alone in 2048"
    card = (out / CARD_NAME).read_text(encoding="utf-8")
    rows = card_rows(card, "Bucket")
    assert number(rows["2048"][1]) == 0 and number(rows["total"][1]) == 29
    assert "Documents left out by id so far: **2**." in card
    assert {k: number(v[0]) for k, v in card_rows(card, "Reason").items()} == {"language": 1, "removed": 2,
                                                                               "total": 3}
    assert "2048/" not in card.split("## Layout", 1)[1].split("### File format")[0]
    run_card_snippets(card, out)

    # A re-run with other flags replaces both; the record still lists them as the tool's.
    assert cli.main(["bucketed", "--input", str(small_source), "--output", str(out), *flags, "--seed", "7"]) == 0
    rerun = read_json(out)
    assert rerun["flags"]["seed"] == 7 and rerun["drops"] == {"language": 1, "removed": 2}
    assert "keyed with seed 7" in (out / CARD_NAME).read_text(encoding="utf-8")
    assert {STATS_JSON_NAME, CARD_NAME} <= set(tree.read_record(str(out)).derived)


def test_remove_finishes_when_the_json_is_damaged(small_source, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(small_source), "--output", str(out), "--tokenizer", "gpt2",
                     *RUNNER]) == 0
    (out / STATS_JSON_NAME).write_text("{not json", encoding="utf-8")
    ids = tmp_path / "ids.txt"
    ids.write_text("doc-05\n", encoding="utf-8")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(ids), *RUNNER]) == 0
    assert (out / layout.STATS_NAME).exists() and DatasetStats.from_text(
        (out / layout.STATS_NAME).read_text()).drops["removed"] == 1
    # A description that can no longer agree with the counts is gone rather than wrong.
    assert not (out / STATS_JSON_NAME).exists() and not (out / CARD_NAME).exists()


def test_the_scaffold_json_and_card(tmp_path):
    out = tmp_path / "out"
    flags = ["--tokenizer", "gpt2", "--shard-tokens", "4000", *RUNNER]
    assert cli.main(["scaffold", "--input", str(SCAFFOLD_SAMPLE), "--output", str(out), *flags]) == 0
    stats = ScaffoldStats.from_text((out / layout.STATS_NAME).read_text())
    doc = read_json(out)
    assert doc["job"] == "scaffold" and doc["versions"]["tokenizer_library"].startswith("tiktoken ")
    assert doc["tokenizer"]["files"] == [{"name": "gpt2.tiktoken", "sha256": sha256(gpt2_ranks_path())}]
    assert doc["flags"]["shard_tokens"] == 4000 and "output" not in doc["flags"]
    assert doc["documents"] == {"read": stats.raw_documents, "kept": stats.kept_documents,
                                "dropped": stats.dropped_documents}
    assert {s["split"]: (s["documents"], s["sequences"], s["words"], s["tokens"], s["files"])
            for s in doc["splits"]} == {
        name: (s.documents, s.sequences, s.words, s.tokens, s.files) for name, s in stats.splits.items()}
    assert doc["drops"] == stats.drops
    card = (out / CARD_NAME).read_text(encoding="utf-8")
    rows = card_rows(card, "Split")
    for name in llmc.SPLITS:
        s = stats.splits[name]
        assert [number(c) for c in rows[name]] == [s.documents, s.sequences, s.words, s.tokens, s.files]
    assert [number(c) for c in rows["total"]][3] == stats.total_tokens
    assert "`pretokenize remove` works on bucketed trees only" in card
    train = sorted(os.listdir(out / "train"))
    assert f"└── {train[0]} … {train[-1]}" in card
    printed = run_card_snippets(card, out)
    words = stats.splits["train"].words
    assert printed.endswith(f"{stats.splits['train'].sequences} documents; {words} words\n")
    assert {STATS_JSON_NAME, CARD_NAME} <= set(tree.read_record(str(out)).derived)


def test_stats_json(sample_tree, capsys):
    capsys.readouterr()
    assert cli.main(["stats", "--output", str(sample_tree), "--json", "--png", "none"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # stdout is the JSON alone
    assert "table: " in captured.err
    lengths: dict[str, list[int]] = {}
    for rel, _, count in manifest.read_rows(open(sample_tree / layout.MANIFEST_NAME, encoding="utf-8")):
        lengths.setdefault(rel.split("/")[0], []).append(count)
    total = sum(map(sum, lengths.values()))
    assert [b["bucket"] for b in summary["buckets"]] == list(layout.BUCKET_NAMES)
    for b in summary["buckets"]:
        got = np.array(sorted(lengths.get(b["bucket"], [])))
        assert (b["documents"], b["tokens"]) == (len(got), int(got.sum()))
        if len(got):
            assert (b["min"], b["max"], b["p50"]) == (got[0], got[-1], got[(len(got) - 1) // 2])
            assert b["token_share"] == pytest.approx(got.sum() / total)
        else:
            assert b["min"] is None and b["mean"] is None
    assert summary["total"]["documents"] == 149 and summary["total"]["tokens"] == total
    assert summary["split"] == "all" and summary["tree"] == str(sample_tree)


def test_a_readme_the_record_does_not_list_is_left_alone(small_source, tmp_path):
    """A tree written before the card existed, with the user's own README.md: the card is not
    written over it (the tool changes only what its record lists), the JSON is."""
    out = tmp_path / "out"
    flags = ["--tokenizer", "gpt2", *RUNNER]
    assert cli.main(["bucketed", "--input", str(small_source), "--output", str(out), *flags]) == 0
    record = tree.read_record(str(out))
    tree.record_files(str(out), record, drop_derived=[CARD_NAME, STATS_JSON_NAME])
    (out / CARD_NAME).write_text("my own notes\n", encoding="utf-8")
    (out / STATS_JSON_NAME).unlink()
    assert cli.main(["bucketed", "--input", str(small_source), "--output", str(out), *flags, "--seed", "3"]) == 0
    assert (out / CARD_NAME).read_text(encoding="utf-8") == "my own notes\n"
    assert read_json(out)["flags"]["seed"] == 3
    derived = tree.read_record(str(out)).derived
    assert STATS_JSON_NAME in derived and CARD_NAME not in derived


def test_tokenizer_files_of_each_kind_of_spec(tmp_path):
    from transforms.run.provenance import tokenizer_files

    gpt2 = ("gpt2.tiktoken", sha256(gpt2_ranks_path()))
    assert tokenizer_files("gpt2") == [gpt2]
    assert tokenizer_files(f"tiktoken:{gpt2_ranks_path()}") == [gpt2]
    assert tokenizer_files("jet-nemotron") == [("qwen.tiktoken", sha256(qwen_ranks_path()))]
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "tokenizer.json").write_text('{"model": {}}')
    (hf_dir / "tokenizer_config.json").write_text("{}")
    (hf_dir / "model.safetensors").write_bytes(b"not the tokenizer")
    assert tokenizer_files(f"hf:{hf_dir}") == [("tokenizer.json", sha256(hf_dir / "tokenizer.json")),
                                               ("tokenizer_config.json", sha256(hf_dir / "tokenizer_config.json"))]
    # A spec naming a directory of its own files (a trained tokenizer): every file of it, by name.
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "vocab.bin").write_bytes(b"\x00\x01")
    (trained / "merges.txt").write_text("a b\n")
    (trained / ".hidden").write_text("skipped")
    assert tokenizer_files(f"trained:{trained}") == [("merges.txt", sha256(trained / "merges.txt")),
                                                     ("vocab.bin", sha256(trained / "vocab.bin"))]
    assert tokenizer_files(f"tiktoken:{tmp_path / 'missing'}") == []


def _bucketed_doc(kept_per_bucket: dict[str, int], flags: dict) -> dict:
    from shards.manifest import BucketStats
    from shards.provenance import Provenance, bucketed_document

    buckets = {name: BucketStats(n, n * 10, 1 if n else 0) for name, n in kept_per_bucket.items()}
    stats = DatasetStats(raw_documents=sum(kept_per_bucket.values()) + 1, filter=DEFAULT_FILTER,
                         tokenizer="jet-nemotron", eos_id=151643, vocab_size=151936,
                         dtype="uint32", partitions=32, seed=0, buckets=buckets, drops={"lid_score": 1},
                         tokenizer_backend="tiktoken 0.9.0")
    provenance = Provenance("bucketed", {"beam-pretokenize": "9.9", "apache-beam": "2.77.0", "python": "3.11"},
                            "jet-nemotron", (("qwen.tiktoken", "ab" * 32),), flags, (("in.parquet", "size=1"),))
    return bucketed_document(provenance, stats)


def test_a_card_written_with_special_token_ids_finds_documents_by_the_manifest_only():
    from shards.card import render

    flags = {"input": "in.parquet", "max_shard_bytes": 1000, "special_tokens": "tokenizer"}
    card = render(_bucketed_doc({"1024": 3}, flags))
    assert "the manifest, not the EOS, says where documents end" in card
    assert "Or by splitting on EOS" not in card and "became their single ids" in card
    assert "--special-tokens tokenizer" in card  # in the command it prints
    plain = render(_bucketed_doc({"1024": 3}, {**flags, "special_tokens": "text"}))
    assert "Or by splitting on EOS" in plain and "never as their special ids" in plain


def test_a_card_of_a_tree_with_no_documents():
    from shards.card import render

    card = render(_bucketed_doc({}, {"input": "in.parquet", "max_shard_bytes": 1000}))
    assert "This tree holds no documents." in card and "```python" not in card
    assert "| **Documents kept** | **0** of 1 read (0.0% kept) |" in card
    assert "| **Total** | | **0** | **0** | - | **0** |" in card


def test_the_card_names_the_filter_the_field_flags_chose():
    from shards.card import render

    base = {"input": "in.parquet", "max_shard_bytes": 1000}
    finepdfs = render(_bucketed_doc({"1024": 3}, base))
    assert ("| **Kept when** | `language` and `page_average_lid` are `eng_Latn`, `page_average_lid_score` ≥ 0.9, "
            "`token_count` ≥ 1, the text is not empty |") in finepdfs
    fineweb = render(_bucketed_doc({"1024": 3}, {**base, "language": "en", "language_fields": "language",
                                                 "lid_score_field": "language_score"}))
    assert "| **Kept when** | `language` is `en`, `language_score` ≥ 0.9, `token_count` ≥ 1, the text is not empty |" \
        in fineweb
    assert "page_average_lid" not in fineweb
    plain = render(_bucketed_doc({"1024": 3}, {**base, "language": "none", "token_count_field": "none"}))
    assert "| **Kept when** | the text is not empty |" in plain
    assert "2. **Kept** a document only when the text is not empty;" in plain
    assert "page_average_lid" not in plain and "`token_count`" not in plain.split("## Provenance")[0]
