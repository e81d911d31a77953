"""The files a trained tokenizer is written as, and reading them back.

    tokenizer.tiktoken    one ``base64(token bytes) rank`` line per token, ranks 0..R-1: the base
                          symbols first (bytes: the byte values 0-255; chars: each character's UTF-8
                          bytes, in code-point order), then merge k at rank base + k
    tokenizer.json        a Hugging Face fast tokenizer: the same pre-tokenization pattern, byte-level
                          (GPT-2's byte-to-character map), BPE with the merges in order, the EOS an
                          added special token with id R
    merges.txt            the merges in order, one ``left right`` line each, in the byte-level spelling
                          of tokenizer.json, after a ``#version`` line that names the tool and flags
    tokenizer_config.json Hugging Face transformers' settings: a PreTrainedTokenizerFast whose
                          eos_token is the EOS, no BOS, nothing added around a text
    special_tokens_map.json  the EOS as transformers' special-tokens map, so that
                          ``AutoTokenizer.from_pretrained(DIR)`` gives ``eos_token`` and ``eos_token_id``
    tokenizer_info.json   what loading the directory needs (pattern, alphabet, EOS) and its provenance:
                          the tool and its version, every flag, the sha256 of each file above
    training_stats.txt    characters, pre-tokens, distinct words, symbols before and after the merges,
                          characters per token, the first 50 merges; written last (the commit point)

A tokenizer learnt with ``--alphabet chars`` writes the same files, but its tokens are built from
the corpus's characters, not from every byte: a text with any other character (and, in these
byte-level files, any character beyond ASCII whose bytes are not themselves tokens) cannot be
encoded. ``--tokenizer trained:DIR`` therefore loads only ``bytes`` tokenizers.

Nothing here imports Beam.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Sequence

TIKTOKEN_NAME = "tokenizer.tiktoken"
HF_NAME = "tokenizer.json"
MERGES_NAME = "merges.txt"
INFO_NAME = "tokenizer_info.json"
STATS_NAME = "training_stats.txt"
HF_CONFIG_NAME = "tokenizer_config.json"
HF_SPECIAL_NAME = "special_tokens_map.json"
FILES = (TIKTOKEN_NAME, HF_NAME, MERGES_NAME, HF_CONFIG_NAME, HF_SPECIAL_NAME, INFO_NAME, STATS_NAME)
SHOWN_MERGES = 50


def byte_to_char() -> list[str]:
    """GPT-2's map from a byte to a printable character (tokenizer.json's byte-level spelling):
    printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


_BYTE_CHARS = byte_to_char()


def spelled(token: bytes) -> str:
    """A token in tokenizer.json's byte-level spelling."""
    return "".join(_BYTE_CHARS[b] for b in token)


def token_bytes(chars: Sequence[str] | None, merges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of every id: the base symbols, then one per merge. A ValueError if two ids have
    the same bytes (no file format could tell them apart)."""
    tokens = [bytes([b]) for b in range(256)] if chars is None else [c.encode("utf-8") for c in chars]
    for a, b in merges:
        tokens.append(tokens[a] + tokens[b])
    seen: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise ValueError(f"ids {seen[t]} and {i} are the same bytes {t!r}: the merges cannot be written as ranks")
        seen[t] = i
    return tokens


@dataclasses.dataclass(frozen=True)
class TokenizerInfo:
    """tokenizer_info.json: how to load the directory, and where it came from."""

    pattern: str  # a name of transforms.bpe.pretokenize.PATTERNS
    regex: str
    alphabet: str
    ranks: int  # base symbols + merges
    eos_token: str
    eos_id: int
    merges: int
    tool: str = "beam-pretokenize"
    version: str = ""
    flags: tuple[str, ...] = ()
    sha256: dict = dataclasses.field(default_factory=dict)
    # The --removal-list the documents were read with: {"source", "sha256" (of the list's bytes, or
    # of the tree's removals.txt), "ids"}; None when there was none.
    removal_list: dict | None = None

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["flags"] = list(self.flags)
        return json.dumps(d, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> TokenizerInfo:
        try:
            d = json.loads(text)
            d["flags"] = tuple(d.get("flags", ()))
            return cls(**d)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where} is not a tokenizer_info.json written by train-bpe ({e})") from None


def tiktoken_text(tokens: Sequence[bytes]) -> bytes:
    return "".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)).encode()


def hf_json(tokens: Sequence[bytes], merges: Sequence[tuple[int, int]], pattern: str, regex: str,
            eos_token: str) -> bytes:
    """tokenizer.json: the pattern's split, GPT-2's byte-level map, BPE over the merges in order.

    ``ignore_merges``: a word that is a token as a whole is that token, as tiktoken does it.
    """
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    if pattern == "gpt2":
        pre = dict(byte_level, use_regex=True)  # ByteLevel's own regex is GPT-2's
    else:
        split = {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        pre = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    names = [spelled(t) for t in tokens]
    config = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": len(tokens), "content": eos_token, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
            "vocab": {name: i for i, name in enumerate(names)},
            "merges": [[names[a], names[b]] for a, b in merges],
        },
    }
    return (json.dumps(config, ensure_ascii=False, indent=1) + "\n").encode()


def _eos_entry(eos_token: str) -> dict:
    """The EOS as transformers writes an AddedToken: matched whole, never normalised."""
    return {"content": eos_token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def hf_config_json(eos_token: str, eos_id: int) -> bytes:
    """tokenizer_config.json: AutoTokenizer loads tokenizer.json as a PreTrainedTokenizerFast with
    this EOS. No BOS, and ``add_bos_token``/``add_eos_token`` off, so ``encode(text)`` gives the
    text's ids alone, as tokenizer.tiktoken's ``encode_ordinary`` (tokenizer.json has no post-processor).
    As any Hugging Face tokenizer, it takes a literal EOS string inside a text as the EOS; the jobs'
    ``--special-tokens text`` (the default) and tiktoken's ``encode_ordinary`` take it as text."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(eos_id): {**_eos_entry(eos_token), "special": True}},
        "eos_token": eos_token,
        "bos_token": None,
        "pad_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    return (json.dumps(config, ensure_ascii=False, indent=1) + "\n").encode()


def hf_special_json(eos_token: str) -> bytes:
    """special_tokens_map.json: the EOS, the only special token a trained tokenizer has."""
    return (json.dumps({"eos_token": _eos_entry(eos_token)}, ensure_ascii=False, indent=1) + "\n").encode()


def merges_text(tokens: Sequence[bytes], merges: Sequence[tuple[int, int]], header: str) -> bytes:
    lines = [f"#version: 0.2 {header}"] + [f"{spelled(tokens[a])} {spelled(tokens[b])}" for a, b in merges]
    return ("\n".join(lines) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class TrainingStats:
    """training_stats.txt: what was counted and what the merges did (no timings: the same input and
    flags give the same bytes)."""

    header: str  # the tool, its version and the flags
    documents_read: int
    documents_kept: int
    drops: dict  # reason -> documents
    characters: int  # of the kept documents
    pre_tokens: int
    distinct_words: int
    words_kept: int  # after --min-count and --max-words
    characters_kept: int  # in the kept words, counts included
    pattern: str
    alphabet: str
    base_size: int
    merges: int
    eos_token: str
    eos_id: int
    tokens_before: int  # base symbols of the kept words, counts included
    tokens_after: int  # once every merge is applied
    first_merges: tuple[str, ...]  # the first SHOWN_MERGES tokens the merges made, as text
    removal_list: dict | None = None  # as TokenizerInfo.removal_list

    def to_text(self) -> str:
        per_token = self.characters_kept / self.tokens_after if self.tokens_after else 0.0
        lines = [
            f"# {self.header}",
            f"documents read: {self.documents_read}",
            f"documents kept: {self.documents_kept}",
        ]
        lines += [f"documents dropped ({reason}): {n}" for reason, n in sorted(self.drops.items())]
        if self.removal_list is not None:
            rl = self.removal_list
            lines.append(f"removal list: {rl['ids']} ids, sha256 {rl['sha256']} ({rl['source']})")
        lines += [
            f"characters: {self.characters}",
            f"pre-tokens: {self.pre_tokens}",
            f"distinct words: {self.distinct_words}",
            f"words kept: {self.words_kept}",
            f"characters in kept words: {self.characters_kept}",
            f"pattern: {self.pattern}",
            f"alphabet: {self.alphabet}",
            f"base symbols: {self.base_size}",
            f"merges: {self.merges}",
            f"eos: {json.dumps(self.eos_token, ensure_ascii=False)} = {self.eos_id}",
            f"vocabulary size: {self.eos_id + 1}",
            f"tokens before merges: {self.tokens_before}",
            f"tokens after merges: {self.tokens_after}",
            f"characters per token: {per_token:.4f}",
            f"first {len(self.first_merges)} merges:",
        ]
        lines += [f"  {k:>3} {json.dumps(s, ensure_ascii=False)}" for k, s in enumerate(self.first_merges)]
        return "\n".join(lines) + "\n"


def shown(token: bytes) -> str:
    """A token as text for training_stats.txt: its UTF-8, with a byte that is not (part of) valid
    UTF-8 written as \\xNN."""
    return token.decode("utf-8", "backslashreplace")
