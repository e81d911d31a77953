"""quicktok (PyPI quicktok-v1, a C++ BPE with a tiktoken-shaped API): a faster backend for Qwen2's pattern.

quicktok reads an encoding from a directory: NAME.vocab (a count, then per token, in rank order, its
length, bytes and rank), NAME.special (a count, then per special token its id, length and bytes) and
NAME.enc (which hand-written scanner, and whether to apply NFC), next to its character-class table.
The encoding is written from the same ranks tiktoken loads, so a ranks file given with
jet-nemotron:PATH reaches both backends; without "nfc=1" quicktok leaves normalization to us.

Its hand-written scanners cover Qwen2's pattern, not GPT-2's, so it encodes jet-nemotron only. NFC and
the replacement of lone surrogates stay ours (Python's unicodedata), so the text quicktok sees is the text
tiktoken sees; quicktok's own NFC (a newer Unicode version than Python 3.11's) is switched off. Linear on
long runs: no cuts. Each quicktok encoder is probed against tiktoken when it loads (load.py).
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import struct
import tempfile
import unicodedata
from collections.abc import Sequence

import numpy as np

from shards.tokenizer_spec import TokenizerSpec
from transforms.tokenizers.encoder import BpeVocabulary, Encoder, replace_surrogates
from transforms.tokenizers.vocabularies import ENDOFTEXT, QWEN2_PATTERN

NAME = "quicktok"
# The quicktok release whose ids were proven equal to tiktoken's (pyproject pins it): ``auto`` uses
# quicktok only at this version; ``quicktok`` takes any, the probe still checks it.
QUICKTOK_VERSION = "0.4.0"
# quicktok's scanner for each pre-tokenization pattern it covers.
SCANNERS = {QWEN2_PATTERN: "qwen"}


def version() -> str | None:
    """The installed quicktok's version, or None when it is not installed."""
    try:
        import quicktok
    except ImportError:
        return None
    return str(quicktok.__version__)


def quicktok_tokenizer(ranks: dict[bytes, int], eos_id: int, scanner: str):
    import quicktok

    name = "beam-pretokenize"
    with tempfile.TemporaryDirectory(prefix="quicktok-") as data_dir:
        with open(os.path.join(data_dir, f"{name}.vocab"), "wb") as f:
            f.write(vocab_records(ranks))
        eos = ENDOFTEXT.encode()
        with open(os.path.join(data_dir, f"{name}.special"), "wb") as f:
            f.write(struct.pack("<IIH", 1, eos_id, len(eos)) + eos)
        with open(os.path.join(data_dir, f"{name}.enc"), "w") as f:
            f.write(f"scanner={scanner}\n")
        tables = importlib.resources.files("quicktok") / "data" / "uniclass.bin"
        with importlib.resources.as_file(tables) as path:
            shutil.copyfile(path, os.path.join(data_dir, "uniclass.bin"))
        return quicktok.Tokenizer(name, data_dir)  # reads everything now: the directory can go


def vocab_records(ranks: dict[bytes, int]) -> bytes:
    """quicktok's NAME.vocab: the count (uint32), then per token in rank order its length (uint16),
    bytes and rank (uint32), little-endian. Packed by numpy: a struct call per token, 151,643 of
    them, cost a tenth of a second of every load."""
    tokens = list(ranks)
    n = len(tokens)
    values = np.fromiter(ranks.values(), np.int64, n)
    lengths = np.fromiter(map(len, tokens), np.int64, n)
    if n and (lengths.max() > 0xFFFF or values.min() < 0 or values.max() > 0xFFFFFFFF):
        raise ValueError("a token longer than 65,535 bytes or a rank outside uint32 cannot be given to quicktok")
    token_starts = np.cumsum(lengths) - lengths  # in ``blob``: the tokens end to end as the dict holds them
    blob = np.frombuffer(b"".join(tokens), np.uint8)
    order = np.argsort(values, kind="stable")
    lengths, values, token_starts = lengths[order], values[order], token_starts[order]
    record_starts = 4 + np.cumsum(lengths + 6) - (lengths + 6)
    out = np.empty(4 + int((lengths + 6).sum()), np.uint8)
    out[:4] = np.frombuffer(struct.pack("<I", n), np.uint8)
    for j, byte in enumerate(np.asarray(lengths, "<u2").view(np.uint8).reshape(-1, 2).T):
        out[record_starts + j] = byte
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(record_starts + 2, lengths) + within] = blob[np.repeat(token_starts, lengths) + within]
    for j, byte in enumerate(np.asarray(values, "<u4").view(np.uint8).reshape(-1, 4).T):
        out[record_starts + 2 + lengths + j] = byte
    return out.tobytes()


def encodes(spec: TokenizerSpec) -> bool:
    """Whether quicktok has an exact encoding for ``spec`` (Qwen2's pattern: jet-nemotron only)."""
    return spec.kind == "jet-nemotron"


def pinned() -> bool:
    """Whether the installed quicktok is the release ``auto`` may choose."""
    return version() == QUICKTOK_VERSION


def refusal(spec: TokenizerSpec) -> str | None:
    """Why ``--tokenizer-backend quicktok`` cannot be used with ``spec``, or None."""
    if not encodes(spec):
        return (f"--tokenizer-backend quicktok: quicktok cannot encode {spec.text!r} exactly (its scanners cover "
                "Qwen2's pattern, not GPT-2's; hf: files stay on HF); use auto or tiktoken")
    if version() is None:
        return f"--tokenizer-backend quicktok: quicktok is not installed (pip install quicktok-v1=={QUICKTOK_VERSION})"
    return None


def build(vocabulary: BpeVocabulary, threads: int = 1) -> Encoder:
    """The vocabulary through quicktok: our NFC and surrogate replacement, then its batch call on ``threads``."""
    v = vocabulary
    tok = quicktok_tokenizer(v.ranks, v.eos_id, SCANNERS[v.pattern])

    def prepare(text: str) -> str:
        return text if text.isascii() or not v.nfc else unicodedata.normalize("NFC", text)

    def encode_flat(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        prepared = [prepare(t) for t in texts]
        try:
            tokens, offsets = tok.encode_batch(prepared, threads, False)
        except TypeError:  # a lone surrogate cannot cross into C++ as UTF-8
            prepared = [t if t.isascii() else replace_surrogates(t) for t in prepared]
            tokens, offsets = tok.encode_batch(prepared, threads, False)
        return tokens, offsets

    def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
        tokens, offsets = encode_flat(texts)
        return np.split(tokens, offsets[1:-1])

    return Encoder(v.spec, v.eos_id, v.vocab_size, encode_arrays, backend=tok, splitter=None,
                   library=f"quicktok {version()}", encode_flat=encode_flat, files=v.files)
