"""hf:NAME_OR_PATH: a Hugging Face fast tokenizer (transformers' AutoTokenizer, its Rust tokenizer underneath).

HF itself is the reference for its added tokens, whatever their flags: in ``special_tokens="tokenizer"``
mode it matches them itself. Its long texts are cut (LongTextSplitter) when its pipeline is a known
regex split + byte-level BPE (``cut_rules``), in text mode only: a cut could fall inside an added token.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np

from shards.tokenizer_spec import TokenizerSpec
from transforms.tokenizers.encoder import Encoder, library_version
from transforms.tokenizers.long_text import GPT2_CUTS, QWEN2_CUTS, CutRules, LongTextSplitter
from transforms.tokenizers.ranks import token_bytes
from transforms.tokenizers.vocabularies import GPT2_PATTERN, QWEN2_PATTERN

# Files a Hugging Face tokenizer is built from (AutoTokenizer reads those that exist).
HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def cut_rules(config: dict) -> CutRules | None:
    """The cut rules of a tokenizer.json whose pipeline is a known regex split + byte-level BPE, else None."""
    from tiktoken_ext.openai_public import r50k_pat_str

    model, normalizer, pre = config.get("model") or {}, config.get("normalizer"), config.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or model.get("dropout") or config.get("truncation") or config.get("padding"):
        return None
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    if any(not t.get("special") for t in config.get("added_tokens") or []):
        return None  # a non-special added token is matched inside text, wherever the cuts fall
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or any(s.get("type") == "ByteLevel" and s.get("add_prefix_space") for s in steps):
        return None
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex"):
        return GPT2_CUTS
    if len(steps) == 2 and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex"):
        split = steps[0]
        if split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert"):
            pattern = (split.get("pattern") or {}).get("Regex")
            if pattern == QWEN2_PATTERN:
                return QWEN2_CUTS
            if pattern in (GPT2_PATTERN, r50k_pat_str):
                return GPT2_CUTS
    return None


def load(spec: TokenizerSpec, eos_token: str | None, special_tokens: str = "text") -> Encoder:
    """The encoder of ``hf:NAME_OR_PATH``; its files' sha256 when NAME_OR_PATH is a local directory."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("--tokenizer hf:... needs transformers: pip install 'beam-pretokenize[hf]'") from None
    name = spec.arg
    before = local_files(name)
    tok = AutoTokenizer.from_pretrained(name)
    files = local_files(name)
    if files != before:
        raise ValueError(f"--tokenizer {spec}: its files changed while they were loaded; try again")
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{name} has no fast (Rust) tokenizer; only fast tokenizers are supported")
    backend = _text_mode(backend) if special_tokens == "text" else _tokenizer_mode(backend)
    eos_id = _eos_id(tok, name, eos_token)
    # Long texts are not cut in tokenizer mode: a cut could fall inside an added token's string.
    cuts = cut_rules(json.loads(backend.to_str())) if special_tokens == "text" else None
    splitter = None
    if cuts is not None:
        # Byte-level BPE: one vocabulary character per byte.
        vocab = backend.get_vocab(with_added_tokens=False)
        splitter = LongTextSplitter(cuts, token_bytes({i: len(s) for s, i in vocab.items()}, max(vocab.values()) + 1))
    return Encoder(spec.text, int(eos_id), len(tok), _encode_arrays(backend, splitter), backend=backend,
                   splitter=splitter, library=library_version("tokenizers"), special_tokens=special_tokens,
                   files=files)


def _text_mode(backend):
    """The Rust tokenizer made to encode every added-token string as text, as every other backend does.
    HF's encode_special_tokens covers only tokens marked special: a copy with every added token so
    marked (Qwen2.5's <tool_call>, <|fim_prefix|>, ... are not) leaves none matched. The mark changes
    nothing else of encoding."""
    config = json.loads(backend.to_str())
    if any(not t.get("special") for t in config.get("added_tokens") or []):
        from tokenizers import Tokenizer

        for t in config["added_tokens"]:
            t["special"] = True
        backend = Tokenizer.from_str(json.dumps(config))
    backend.encode_special_tokens = True
    return backend


def _tokenizer_mode(backend):
    """HF matches its added tokens itself: encode_special_tokens false is AutoTokenizer's default."""
    backend.encode_special_tokens = False
    return backend


def _eos_id(tok, name: str, eos_token: str | None) -> int:
    if eos_token is not None:
        eos_id = tok.convert_tokens_to_ids(eos_token)
        if eos_id is None or eos_id == tok.unk_token_id:
            raise ValueError(f"{name} has no token {eos_token!r} to use as EOS")
        return eos_id
    if tok.eos_token_id is None:
        raise ValueError(f"{name} defines no EOS token; name one with --eos-token")
    return tok.eos_token_id


def _encode_arrays(backend, splitter: LongTextSplitter | None):
    def encode_one(text: str) -> np.ndarray:
        return np.asarray(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids, dtype=np.uint32)

    def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast: the same ids as encode_batch without computing character offsets, which
        # also costs more per byte the longer a text is.
        texts = list(texts)
        out: list[np.ndarray] = [np.empty(0, np.uint32)] * len(texts)
        short = [i for i, t in enumerate(texts) if splitter is None or not splitter.is_long(t)]
        batch = backend.encode_batch_fast([texts[i] for i in short], add_special_tokens=False) if short else []
        for i, encoding in zip(short, batch, strict=True):
            out[i] = np.asarray(encoding.ids, dtype=np.uint32)
        for i in sorted(set(range(len(texts))) - set(short)):
            out[i] = splitter.encode(texts[i], encode_one)
        return out

    return encode_arrays


def local_files(name: str) -> tuple[tuple[str, str], ...]:
    """(name, sha256) of the tokenizer files AutoTokenizer reads from a local directory ``name``
    (none for a Hub name: its files are the cache's, fixed by their revision)."""
    if not os.path.isdir(name):
        return ()
    out = []
    for file in HF_TOKENIZER_FILES:
        path = os.path.join(name, file)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out.append((file, hashlib.sha256(f.read()).hexdigest()))
    return tuple(out)
