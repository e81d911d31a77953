"""Long texts without whitespace: encoding them in pieces gives exactly the ids of encoding them whole.

Every backend (jet-nemotron, the GPT-2 ranks file through tiktoken, a Hugging Face fast tokenizer built
from the Qwen2.5 ranks) is checked on the whitespace-free text PDFs carry, up to a few MB each: base64
and hex dumps of real bytes, a long URL, minified JSON and CSS, runs of punctuation, and runs of letters
(a single pre-token, cut at tokens rather than pre-tokens). "Whole" is the library's own call on the
whole text: tiktoken's ``encode_ordinary``, tokenizers' ``encode``.

The same texts are also run through a splitter with small chunks, so that a few hundred KB cross
hundreds of cuts and restarts, and through seeded random mixes of the characters whose handling at a
cut differs (apostrophes before letters, spaces and line breaks before runs, digits, non-ASCII letters).
"""

from __future__ import annotations

import base64
import json
import random
import re
import unicodedata
import urllib.parse
import zlib
from pathlib import Path

import numpy as np
import pytest

from transforms.tokenizers.encoder import Encoder
from transforms.tokenizers.hf import cut_rules
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.long_text import GPT2_CUTS, QWEN2_CUTS, LongTextSplitter
from transforms.tokenizers.ranks import qwen_ranks_path
from transforms.tokenizers.vocabularies import ENDOFTEXT, QWEN2_PATTERN

SOURCES = Path(__file__).resolve().parents[2] / "data" / "sample_sources"


def _source(name: str) -> str:
    return (SOURCES / name).read_text(encoding="utf-8")


def _texts() -> dict[str, str]:
    """Whitespace-free texts of the kinds PDF extractions hold, made from the real text in sample_sources."""
    jargon = _source("jargon_file_4.4.7.txt")
    sqlite = _source("sqlite_docs_3.40.1.txt")
    raw = zlib.compress(jargon.encode("utf-8"), 9)  # ~0.5 MB of bytes that look random, as images do
    words = re.findall(r"[A-Za-z]+", jargon)
    prose_letters = "".join(re.findall(r"[A-Za-z]+", jargon + sqlite + _source("python_3.11.7_pydoc_topics.txt")))
    rng = random.Random(7)
    css = "".join(
        f".{w.lower()}-{i}{{color:#{rng.randrange(1 << 24):06x};margin:{i % 7}px;padding:{i % 5}em;font:{w}}}"
        for i, w in enumerate(words[:40_000])
    )
    records = [{"id": i, "word": w, "score": round(rng.random(), 4), "tags": [w[:3], w[-3:]]} for i, w in
               enumerate(words[:30_000])]
    return {
        "base64": base64.b64encode(raw).decode("ascii"),  # PDF images and fonts, without line breaks
        "base64-urlsafe": base64.urlsafe_b64encode(raw[:300_000]).decode("ascii"),
        "hex-dump": raw[:600_000].hex(),
        "long-url": "https://example.org/search?q=" + urllib.parse.quote(sqlite[:400_000], safe=""),
        "minified-json": json.dumps(records, separators=(",", ":")),
        "minified-css": css,
        "dot-leaders": "Contents" + "." * 700_000 + "7",
        "punctuation-mix": "".join(rng.choice("-=_*#~.,;:!?/\\|+^") for _ in range(600_000)),
        "letters-of-prose": prose_letters[:3_000_000],  # a PDF that lost its spaces and punctuation: one pre-token
        "gene-sequence": "".join(rng.choice("ACGT") for _ in range(1_500_000)),
        "one-letter": "a" * 1_000_000,
        "jargon-file": jargon,  # ordinary long text, cut at many safe cuts
    }


def _edge_mix(seed: int, n: int = 300_000) -> str:
    """Random text of the characters whose treatment at a cut differs, with long runs mixed in."""
    rng = random.Random(seed)
    pieces = ["'", "'s", "'re", "'LL", " ", "  ", "\t", "\n", "\r\n", ".", "-", "'", "7", "42", "é", "日本", "ß",
              "ﬁ", "e\u0301", "x", "Ab", "_", "\x1c", "<|endoftext|>"]
    runs = [lambda k: "a" * k, lambda k: "-" * k, lambda k: "".join(rng.choice("xyz") for _ in range(k)),
            lambda k: "9" * k, lambda k: "".join(rng.choice("+-") for _ in range(k))]
    out, size = [], 0
    while size < n:
        piece = rng.choice(runs)(rng.randrange(1, 20_000)) if rng.random() < 0.05 else rng.choice(pieces)
        out.append(piece)
        size += len(piece)
    return "".join(out)


TEXTS = _texts()


# --- backends ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jet() -> Encoder:
    return load_encoder("jet-nemotron")


@pytest.fixture(scope="module")
def gpt2() -> Encoder:
    return load_encoder("gpt2")  # the ranks shipped in the package


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Encoder:
    """The Qwen2.5 ranks converted by transformers' TikTokenConverter, loaded as an hf: backend."""
    pytest.importorskip("transformers")
    import tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    backend = TikTokenConverter(
        vocab_file=qwen_ranks_path(), pattern=QWEN2_PATTERN, extra_special_tokens=[ENDOFTEXT]
    ).converted()
    backend.normalizer = tokenizers.normalizers.NFC()
    path = tmp_path_factory.mktemp("hf-qwen25-long")
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=ENDOFTEXT).save_pretrained(str(path))
    return load_encoder(f"hf:{path}")


BACKENDS = ["jet", "gpt2", "hf"]


def _whole(encoder: Encoder, text: str) -> list[int]:
    """The library's own call on the whole text, as the backend would make it without cutting."""
    if encoder.spec.startswith("hf:"):
        return encoder.backend.encode(text, add_special_tokens=False).ids
    if encoder.spec.startswith("jet-nemotron"):
        text = unicodedata.normalize("NFC", text)
    return encoder.backend.encode_ordinary(text)


def _encode_one(encoder: Encoder):
    if encoder.spec.startswith("hf:"):
        return lambda s: np.asarray(encoder.backend.encode(s, add_special_tokens=False).ids, dtype=np.uint32)
    return lambda s: np.asarray(encoder.backend.encode_ordinary(s), dtype=np.uint32)


def _small(encoder: Encoder) -> LongTextSplitter:
    """The backend's rules with tiny chunks: many more cuts and restarts per byte than the defaults."""
    return LongTextSplitter(
        encoder.splitter.rules, encoder.splitter.token_bytes, chunk_chars=3000, window_chars=512, run_chunk_chars=700
    )


def _diff(got: list[int], want: list[int]) -> str:
    i = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return f"{len(got)} ids vs {len(want)} whole; first difference at {i}: {got[i:i + 5]} vs {want[i:i + 5]}"


# --- the ids are those of the whole text -------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(TEXTS))
def test_long_text_ids_equal_whole_encoding(request, backend, name):
    encoder: Encoder = request.getfixturevalue(backend)
    text = TEXTS[name]
    assert not re.search(r"\s", text) or name == "jargon-file"
    assert encoder.splitter.plan(text), "the text is long enough to be cut"
    got = encoder.encode_arrays([text])[0].tolist()
    want = _whole(encoder, text)
    assert got == want, f"{name}: {_diff(got, want)}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["base64", "hex-dump", "minified-json", "letters-of-prose", "dot-leaders"])
def test_many_small_cuts_keep_the_ids(request, backend, name):
    encoder: Encoder = request.getfixturevalue(backend)
    text = TEXTS[name][:400_000]
    splitter = _small(encoder)
    assert len(splitter.plan(text)) > 100
    prepared = unicodedata.normalize("NFC", text) if backend == "jet" else text  # as encode_arrays would
    got = splitter.encode(prepared, _encode_one(encoder)).tolist()
    assert got == _whole(encoder, text), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_random_edge_mixes_keep_the_ids(request, backend, seed):
    encoder: Encoder = request.getfixturevalue(backend)
    text = _edge_mix(seed)
    want = _whole(encoder, text)
    # jet-nemotron normalizes before cutting (as encode_arrays does); the hf tokenizer normalizes each piece.
    prepared = unicodedata.normalize("NFC", text) if backend == "jet" else text
    got = _small(encoder).encode(prepared, _encode_one(encoder)).tolist()
    assert got == want, f"seed {seed}: {_diff(got, want)}"
    assert encoder.encode_arrays([text])[0].tolist() == want


def test_a_letter_run_is_cut_inside_the_run(jet):
    """A single pre-token of 2.5 MB is encoded in restartable chunks, not in one call."""
    text = TEXTS["letters-of-prose"]
    plan = jet.splitter.plan(text)
    in_run = [pos for pos, run in plan if run >= 0]
    assert len(in_run) > len(text) // (2 * jet.splitter.run_chunk_chars)
    assert all(jet.splitter.margin <= pos <= len(text) - jet.splitter.margin for pos in in_run)


def test_safe_cuts_fall_between_pre_tokens(jet):
    import regex

    text = TEXTS["minified-json"][:200_000]
    ends = {m.end() for m in regex.finditer(QWEN2_PATTERN, text)}
    cuts = [pos for pos, run in _small(jet).plan(text) if run < 0]
    assert cuts and all(pos in ends for pos in cuts)


def test_when_no_restart_holds_the_run_is_encoded_whole(jet, monkeypatch):
    """The fallback: from the last safe cut to the next one in one call, the same ids."""
    text = "head-1" + TEXTS["gene-sequence"][:300_000] + "-2tail" + TEXTS["hex-dump"][:20_000]
    splitter = _small(jet)
    monkeypatch.setattr(LongTextSplitter, "RESTARTS", ())
    calls = []

    def encode_one(s):
        calls.append(len(s))
        return np.asarray(jet.backend.encode_ordinary(s), dtype=np.uint32)

    assert splitter.encode(text, encode_one).tolist() == jet.backend.encode_ordinary(text)
    assert max(calls) > 300_000


def test_lone_surrogates_are_replaced_as_encode_ordinary_does(jet, gpt2):
    text = ("x\ud800y" + "Q" * 200_000 + "\udfff-1") * 2
    for encoder in (jet, gpt2):
        assert encoder.encode_arrays([text])[0].tolist() == encoder.backend.encode_ordinary(text)


# --- which tokenizer.json pipelines are cut ----------------------------------------------------------------


def _config(pre_tokenizer, normalizer=None, added=(), model_type="BPE"):
    return {
        "model": {"type": model_type, "dropout": None},
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "added_tokens": [{"content": c, "special": special} for c, special in added],
    }


SPLIT_QWEN = {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False}
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def test_hf_cut_rules_recognise_known_pipelines(hf):
    assert hf.splitter is not None and hf.splitter.rules is QWEN2_CUTS
    assert cut_rules(_config({"type": "Sequence", "pretokenizers": [SPLIT_QWEN, BYTE_LEVEL]})) is QWEN2_CUTS
    gpt2_style = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    assert cut_rules(_config(gpt2_style)) is GPT2_CUTS


@pytest.mark.parametrize(
    "config",
    [
        _config({**BYTE_LEVEL, "use_regex": True, "add_prefix_space": True}),  # a space before every piece
        _config({"type": "Sequence", "pretokenizers": [SPLIT_QWEN, BYTE_LEVEL]}, normalizer={"type": "NFKC"}),
        _config({"type": "Sequence", "pretokenizers": [SPLIT_QWEN, BYTE_LEVEL]}, added=[("<x>", False)]),
        _config({"type": "Sequence", "pretokenizers": [{**SPLIT_QWEN, "pattern": {"Regex": r"\w+|\W"}}, BYTE_LEVEL]}),
        _config({"type": "Metaspace", "replacement": "▁"}),
        _config({"type": "Sequence", "pretokenizers": [SPLIT_QWEN, BYTE_LEVEL]}, model_type="Unigram"),
    ],
    ids=["prefix-space", "nfkc", "non-special-added-token", "unknown-pattern", "metaspace", "unigram"],
)
def test_hf_pipelines_we_cannot_prove_safe_are_never_cut(config):
    assert cut_rules(config) is None
