"""Megatron-LM's indexed-dataset index (``.idx``), written for token files that already exist.

Megatron reads a dataset prefix ``P`` as ``P.bin`` (tokens, back to back) and ``P.idx`` (where
each sequence is). A bucketed shard ``1024/p00_00000.npy`` is already a valid ``.bin``: raw tokens,
no header. So an index and a link named ``P.bin`` pointing at the shard are all Megatron needs, and
no token is copied (pipelines/export.py puts them under ``megatron/`` in the tree). An llm.c shard
``train/shard_000.bin`` keeps its 1,024-byte header: the index's byte pointers start after it.

The ``.idx`` format (version 1, every number little-endian):

    magic              9 bytes           b"MMIDIDX\\x00\\x00"
    version            uint64            1
    dtype code         uint8             the token dtype (DTYPE_CODES)
    sequence count     uint64            S
    document count     uint64            D, the number of entries in document_indices
    sequence lengths   int32   x S       tokens in each sequence
    sequence pointers  int64   x S       byte offset of each sequence in the .bin
    document indices   int64   x D       0, then the index of the sequence after each document's
                                         last one; here each document is one sequence: 0, 1, ..., S

Megatron has no code for uint32. Its int32 has the same bytes for every id below 2**31, so uint32
shards are declared int32, and the exporter refuses a vocabulary that reaches 2**31.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron-LM's dtype codes.
DTYPE_CODES: dict[str, int] = {
    "uint8": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "float64": 6,
    "float32": 7,
    "uint16": 8,
}
INT32_LIMIT = 2**31
IDX_SUFFIX = ".idx"
BIN_SUFFIX = ".bin"


def dtype_code(dtype: np.dtype | str, vocab_size: int) -> tuple[int, np.dtype]:
    """The code to declare for tokens stored as ``dtype`` and the dtype Megatron will read them as.

    uint32 is read as int32, which is exact only while every id is below 2**31.
    """
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not np.little_endian):
        raise ValueError(f"Megatron reads little-endian tokens; got {dtype.str}")
    name = dtype.name
    if name == "uint32":
        if vocab_size > INT32_LIMIT:
            raise ValueError(
                f"a vocabulary of {vocab_size} ids does not fit Megatron's int32; uint32 shards are exported "
                "as int32 only while every id is below 2**31"
            )
        return DTYPE_CODES["int32"], np.dtype("<i4")
    if name not in DTYPE_CODES:
        raise ValueError(f"Megatron has no dtype code for {name}; it knows {sorted(DTYPE_CODES)}")
    return DTYPE_CODES[name], dtype


def index_bytes(lengths: Sequence[int] | np.ndarray, code: int, first_pointer: int = 0) -> bytes:
    """The whole ``.idx`` for a ``.bin`` holding one document per sequence, of these token lengths.

    ``first_pointer`` is the byte offset of the first sequence (the size of any header before it).
    """
    if code not in DTYPE_CODES.values():
        raise ValueError(f"unknown Megatron dtype code {code}")
    itemsize = np.dtype(_CODE_NAMES[code]).itemsize
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() >= INT32_LIMIT):
        raise ValueError("every sequence needs 1 .. 2**31 - 1 tokens to be indexed")
    pointers = np.zeros(len(lengths), dtype="<i8")
    np.cumsum(lengths[:-1] * itemsize, out=pointers[1:])
    pointers += first_pointer
    document_indices = np.arange(len(lengths) + 1, dtype="<i8")
    return b"".join(
        [
            MAGIC,
            struct.pack("<Q", VERSION),
            struct.pack("<B", code),
            struct.pack("<Q", len(lengths)),
            struct.pack("<Q", len(document_indices)),
            lengths.astype("<i4").tobytes(),
            pointers.tobytes(),
            document_indices.tobytes(),
        ]
    )


_CODE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


def prefix_of(rel_path: str) -> str:
    """``1024/p00_00000.npy`` -> ``1024/p00_00000``: the name Megatron is given for a shard."""
    stem, dot, _ = rel_path.rpartition(".")
    return stem if dot else rel_path
