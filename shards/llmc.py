"""The llm.c token file format, used by the scaffold (countdown) job.

    header  256 x little-endian int32: [0] = 20240520 (magic), [1] = 1 (version), [2] = token count
    body    token count x little-endian uint16

Files are ``{split}/shard_NNN.bin`` with split ``train`` or ``val``. Documents follow each other
in the token stream, each ending with EOT; a shard holds exactly ``shard_tokens`` tokens except
the last of a split, so a document may continue in the next shard (as llm.c's own data files do).

Scaffold token ids: GPT-2 BPE 0..50255, EOT 50256, and the countdown token ``<ff_N>`` =
50257 + N for N = 0..999 (ids 50257..51256).

A scaffold output tree (the ``pretokenize scaffold`` job) is

    train/shard_000.bin ...   val/shard_000.bin ...   dataset_stats.txt (written last: the commit point)

Besides the format this module holds the split hash, where documents go among a split's shards,
the stats file, and ``check_llmc_shard`` / ``check_llmc_split``: the format checks a verifier runs.
Nothing here imports Beam.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")

GPT2_EOT = 50256
FF_BASE = 50257
FF_MAX_N = 999
MAX_TOKEN_ID = FF_BASE + FF_MAX_N  # 51256
SPLITS = ("train", "val")
DEFAULT_SHARD_TOKENS = 100_000_000
MAX_SHARD_TOKENS = 2**31 - 1  # the header's count is an int32
MAX_WORDS = FF_MAX_N + 1  # a document counted down with <ff_999> .. <ff_0>
DEFAULT_VAL_FRACTION = 0.05


def ff_token(n: int) -> int:
    """The id of the countdown token <ff_n>."""
    if not 0 <= n <= FF_MAX_N:
        raise ValueError(f"countdown {n} is outside 0..{FF_MAX_N}")
    return FF_BASE + n


def shard_rel_path(split: str, index: int, width: int = 3) -> str:
    """``train/shard_007.bin``. ``width`` (see shard_digits) keeps a split's names sorting in order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return f"{split}/shard_{index:0{width}d}.bin"


def make_header(token_count: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, token_count
    return header.tobytes()


def parse_header(data: bytes, where: str = "shard") -> int:
    """The token count a header declares; a ValueError naming ``where`` if it is not a valid header."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"{where}: {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
    if header[0] != MAGIC:
        raise ValueError(f"{where}: magic number is {header[0]}, expected {MAGIC}")
    if header[1] != VERSION:
        raise ValueError(f"{where}: version is {header[1]}, expected {VERSION}")
    if header[2] < 0:
        raise ValueError(f"{where}: negative token count {header[2]}")
    return int(header[2])


def read_tokens(path: str) -> np.ndarray:
    """A local shard's tokens, memory-mapped, checked against the header's count."""
    with open(path, "rb") as f:
        count = parse_header(f.read(HEADER_BYTES), path)
    body_bytes = os.path.getsize(path) - HEADER_BYTES
    if body_bytes != count * TOKEN_DTYPE.itemsize:
        raise ValueError(f"{path}: header says {count} tokens, the file holds {body_bytes} bytes of tokens")
    if count == 0:
        return np.empty(0, dtype=TOKEN_DTYPE)
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES)
    if len(tokens) != count:
        raise ValueError(f"{path}: header says {count} tokens, the file holds {len(tokens)}")
    return tokens
