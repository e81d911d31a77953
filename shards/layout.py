"""The bucketed (FinePDFs-Edu) layout: length buckets, file names, dtypes and stable hashes.

This module is the one place that knows where a document goes. Writers, the verifier and the
reader import it; nothing here imports Beam.

    {bucket}/pPP_NNNNN.npy   raw little-endian token ids, no header, documents back to back,
                             each ending with exactly one EOS; a document never spans two files.

A bucket named ``N`` holds documents whose final length n (text tokens + EOS) satisfies
``previous bound < n <= N``; ``beyond`` holds everything longer than the last bound.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

import numpy as np

BUCKET_BOUNDS: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
BEYOND = "beyond"
BUCKET_NAMES: tuple[str, ...] = tuple(str(b) for b in BUCKET_BOUNDS) + (BEYOND,)

DEFAULT_PARTITIONS = 32
DEFAULT_MAX_SHARD_BYTES = 1_500_000_000
DEFAULT_SEED = 0

SHARD_SUFFIX = ".npy"
MANIFEST_NAME = "processed_spec.txt"
# sha256 of every shard, in sha256sum's format ("HEX  rel_path"): `sha256sum -c` checks a tree.
CHECKSUMS_NAME = "checksums.sha256"
STATS_NAME = "dataset_stats.txt"
# Files other tools derive from a finished tree (pretokenize export megatron, pretokenize stats):
# a new run's publish deletes them, since they would describe the old shards.
DERIVED_NAMES = ("megatron", "length_stats.txt", "length_histogram.png")
# Work in progress of a run lives here, on the output filesystem, until it is published.
TEMP_DIR_NAME = ".pretokenize-tmp"
# The ownership record: which files of the tree are the tool's (shards/tree.py).
RECORD_NAME = ".pretokenize-tree.json"
# The audit log of the documents `remove` took out of a tree (shards/removal/lists.py, shards/removal/audit.py).
REMOVALS_NAME = "removals.txt"

# Little-endian on every machine: the files must read the same everywhere.
DTYPES: dict[str, np.dtype] = {"uint32": np.dtype("<u4"), "uint16": np.dtype("<u2")}
DEFAULT_DTYPE = "uint32"

_BOUNDS = np.asarray(BUCKET_BOUNDS, dtype=np.int64)


def bucket_index(length: int) -> int:
    """Index into BUCKET_NAMES of the bucket holding a document of ``length`` tokens (EOS included)."""
    if length < 1:
        raise ValueError(f"a stored document has at least one token (its EOS), got length {length}")
    return int(np.searchsorted(_BOUNDS, length, side="left"))


def bucket_name(length: int) -> str:
    return BUCKET_NAMES[bucket_index(length)]


def bucket_range(name: str) -> tuple[int, int | None]:
    """Inclusive (low, high) lengths a bucket accepts; high is None for ``beyond``."""
    i = BUCKET_NAMES.index(name)
    low = 1 if i == 0 else BUCKET_BOUNDS[i - 1] + 1
    high = BUCKET_BOUNDS[i] if i < len(BUCKET_BOUNDS) else None
    return low, high


def check_dtype(dtype: str, max_token_id: int) -> np.dtype:
    """The numpy dtype for ``dtype``, or a ValueError if it is unknown or too small for the ids."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    np_dtype = DTYPES[dtype]
    limit = np.iinfo(np_dtype).max
    if max_token_id > limit:
        raise ValueError(
            f"dtype {dtype} holds ids up to {limit}, but this tokenizer has ids up to {max_token_id}; "
            f"use --dtype uint32"
        )
    return np_dtype


def partition_digits(num_partitions: int) -> int:
    return max(2, len(str(num_partitions - 1)))


def shard_rel_path(bucket: str, partition: int, index: int, num_partitions: int = DEFAULT_PARTITIONS) -> str:
    """``1024/p07_00000.npy``: the path of a shard file relative to the output root."""
    width = partition_digits(num_partitions)
    return f"{bucket}/p{partition:0{width}d}_{index:05d}{SHARD_SUFFIX}"


class ShardName(NamedTuple):
    bucket: str
    partition: int
    index: int


_SHARD_RE = re.compile(r"^(?P<bucket>[0-9a-z]+)/p(?P<partition>\d{2,})_(?P<index>\d{5,})\.npy$")


def parse_shard_rel_path(rel_path: str) -> ShardName:
    """Inverse of shard_rel_path; a ValueError names what is wrong with a path that does not fit."""
    m = _SHARD_RE.match(rel_path)
    if not m or m.group("bucket") not in BUCKET_NAMES:
        raise ValueError(f"not a shard path of this layout: {rel_path!r}")
    return ShardName(m.group("bucket"), int(m.group("partition")), int(m.group("index")))


def _hash64(data: bytes, person: bytes, key: bytes = b"") -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=person, key=key).digest(), "little")


def partition_of(doc_id: str, num_partitions: int) -> int:
    """The partition of a document: a hash of its id that is the same on every machine and Python."""
    return _hash64(doc_id.encode("utf-8"), b"partition") % num_partitions


SEED_LIMIT = 1 << 64  # a seed is 8 bytes of the shuffle hash's key: 0 <= seed < SEED_LIMIT


def shuffle_key(doc_id: str, seed: int) -> int:
    """Where a document sorts inside its (bucket, partition): a seeded hash of its id, 63 bits."""
    key = seed.to_bytes(8, "little", signed=False)
    return _hash64(doc_id.encode("utf-8"), b"shuffle", key=key) & ((1 << 63) - 1)


def hashes64(raw_ids, person: bytes, key: bytes = b"") -> np.ndarray:
    """_hash64 of every id in ``raw_ids`` (UTF-8 bytes), as uint64. The personalised (and keyed)
    state is set up once and copied per id, and the digests are joined and read as one array: a
    third of the per-id cost of _hash64, which matters at millions of short documents."""
    copy = hashlib.blake2b(digest_size=8, person=person, key=key).copy

    def digest(raw: bytes) -> bytes:
        h = copy()
        h.update(raw)
        return h.digest()

    return np.frombuffer(b"".join(map(digest, raw_ids)), dtype="<u8").astype(np.uint64)


def partitions_of(raw_ids, num_partitions: int) -> np.ndarray:
    """partition_of of every id (given as UTF-8 bytes), as one int64 array."""
    return (hashes64(raw_ids, b"partition") % np.uint64(num_partitions)).astype(np.int64)


def shuffle_keys(raw_ids, seed: int) -> np.ndarray:
    """shuffle_key of every id (given as UTF-8 bytes), as one int64 array."""
    key = seed.to_bytes(8, "little", signed=False)
    return (hashes64(raw_ids, b"shuffle", key) & np.uint64((1 << 63) - 1)).astype(np.int64)
