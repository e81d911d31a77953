"""Read a finished output tree for training: documents by id, and windows of S+1 tokens that carry
their document boundaries.

    tree = open_tree("out/finepdfs")                       # local (memory-mapped) or any fsspec URL
    tree.document("<urn:uuid:...>")                        # one document's tokens, EOS included
    sampler = tree.sampler(seq_len=4096, seed=0, split="train", val_fraction=0.01,
                           weights={"8192": 1, "32768": 3})
    len(sampler)                                           # windows in one epoch
    w = sampler.window(0)                                  # inputs, targets, cu_seqlens, position_ids, loss_mask
    b = sampler.batch(0, batch_size=8)                     # the same, stacked (cu_seqlens flattened)
    for b in sampler.batches(8): ...                       # from sampler.position; state_dict() resumes there
    stage = tree.length_sampler(tokens_per_batch=262144, buckets=["32768", "65536"])  # one length per bucket

Two formats are read:

- the bucketed layout (``{bucket}/pPP_NNNNN.npy``, ``processed_spec.txt``, ``dataset_stats.txt``):
  documents, their ids, shards and offsets come from the manifest; nothing is scanned;
- the llm.c layout of the scaffold job (``train/shard_NNN.bin``, ``val/shard_NNN.bin``): documents
  are found by splitting each split's token stream after every EOT 50256, and may continue from one
  shard into the next; their ids are ``train:0``, ``train:1``, ... in stream order.

A tree is opened only once its ``dataset_stats.txt`` exists: the jobs write it last, as the commit
point (see transforms/core/publish.py). Loose llm.c shard files, e.g. a downloaded copy of the published
dataset, are opened with ``open_llmc``; each file's header count is checked against its size.

Windows follow the chapter on data (``seeds/data-and-tokenisation-chapter.txt``): the selected
documents are concatenated into one stream of N tokens (documents are already separated by their
EOS); a window is S+1 consecutive tokens, its first S the inputs and its last S the targets. A
bucketed document's bounds come from the manifest, never from its EOS: in a tree written with
``--special-tokens tokenizer`` an EOS may stand inside a document.

By default windows come in epochs (as Megatron's GPTDataset samples do): the stream is cut every S
tokens (``WindowCut``; each document on its own with ``align_to_docs``), and epoch e takes the cut's
windows in a seeded ``Permutation`` of its own, computed per index, so window k is the same on every
run, machine and numpy version, whichever rank or worker draws it, and a run resumes from an index
alone. Per-bucket weights give each bucket its share of an epoch (``EpochMix``). ``loss_mask`` is 0
on the target after each EOS. ``replacement=True`` keeps the earlier independent draws: a start at
``floor(u * (N - S - 1))``, ``u`` from a generator keyed by the seed and the window's index (with
weights, the bucket first, by weight; ``align_to_docs``: at a document start, each eligible one
equally likely). ``LengthSampler`` makes batches of a fixed number of tokens, one bucket and one
sequence length each.

Only numpy here (and fsspec for remote trees): no Beam, no torch.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import logging
import os
import posixpath
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shards import index as reader_index
from shards import kinds, layout, llmc, manifest, storage
from shards.tree import IncompleteTreeError, OutputTree, Tree, is_ours  # noqa: F401 - IncompleteTreeError: callers catch it here

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "all")
# Rows parsed into one numpy chunk of ids at a time, so parsing a large manifest stays compact.
_ID_CHUNK = 1 << 18
# Tokens scanned for EOT at a time when finding llm.c document boundaries.
_SCAN_TOKENS = 1 << 24
# Rows tested at a time when a sampler's selection is scanned into runs.
_SELECT_ROWS = 1 << 20


# ---------------------------------------------------------------------------------------------
# Stable hashes for the split, the window generator and the epoch permutations. Each has its own
# BLAKE2b personalisation, so none correlates with another or with the hashes of shards.layout.


def validation_key(doc_id: str) -> float:
    """Where a document falls in [0, 1) for the validation split; it is held out when this is < fraction.

    A BLAKE2b-64 of the UTF-8 id personalised ``validation``, divided by 2**64. Growing the fraction
    only moves documents from train to val, never back.
    """
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, person=b"validation").digest()
    return int.from_bytes(digest, "little") / 2.0**64


def window_uniforms(seed: int, index: int) -> tuple[float, float]:
    """The two uniforms in [0, 1) of window ``index``: the first picks the bucket, the second the start."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and window index must be >= 0, got {seed} and {index}")
    digest = hashlib.blake2b(
        index.to_bytes(8, "little"), digest_size=16, key=seed.to_bytes(8, "little"), person=b"windows"
    ).digest()
    a = int.from_bytes(digest[:8], "little") >> 11
    b = int.from_bytes(digest[8:], "little") >> 11
    return a * 2.0**-53, b * 2.0**-53


def _round_keys(seed: int, *path: object) -> tuple[int, ...]:
    """The Feistel round keys of the permutation named by ``path`` (e.g. ``("windows", "1024", 3)``)."""
    digest = hashlib.blake2b("/".join(map(str, path)).encode("utf-8"), digest_size=8 * _ROUNDS,
                             key=seed.to_bytes(8, "little"), person=b"epochs").digest()
    return tuple(int.from_bytes(digest[8 * i:8 * i + 8], "little") for i in range(_ROUNDS))


_ROUNDS = 8
_M64 = (1 << 64) - 1


class Permutation:
    """A seeded bijection of ``range(n)``, computed for one index at a time: no table, so an epoch of
    a billion windows costs no memory, and window k is found without the k before it.

    A Feistel network over the bits of ``n - 1``, split into a left and a right half (floor and ceil
    of half the bits): 8 rounds, each XORing into one half a splitmix64-style mix of the other half
    and a round key; then walked back into range (applied again until the value is below ``n``,
    at most twice on average, as ``n`` is more than half the network's range). Integers only, so the
    same on every machine, Python and numpy version. The round keys are a BLAKE2b of the seed and
    ``path``, which names the permutation.
    """

    def __init__(self, n: int, seed: int, *path: object):
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = n
        bits = max(1, (n - 1).bit_length())
        self._right_bits = bits - bits // 2
        self._masks = ((1 << (bits // 2)) - 1, (1 << self._right_bits) - 1)
        keys = _round_keys(seed, *path)
        self._key_pairs = tuple(zip(keys[0::2], keys[1::2], strict=True))

    def __len__(self) -> int:
        return self.n

    def _network(self, x: int) -> int:
        shift = self._right_bits
        mask_left, mask_right = self._masks
        left, right = x >> shift, x & mask_right
        for key_left, key_right in self._key_pairs:
            z = ((right ^ key_left) * 0x9E3779B97F4A7C15) & _M64
            z ^= z >> 29
            z = (z * 0xBF58476D1CE4E5B9) & _M64
            left ^= (z ^ (z >> 32)) & mask_left
            z = ((left ^ key_right) * 0x9E3779B97F4A7C15) & _M64
            z ^= z >> 29
            z = (z * 0xBF58476D1CE4E5B9) & _M64
            right ^= (z ^ (z >> 32)) & mask_right
        return (left << shift) | right

    def __call__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} is outside 0..{self.n - 1}")
        x = self._network(index)
        while x >= self.n:
            x = self._network(x)
        return x


# ---------------------------------------------------------------------------------------------
# Records handed to the caller.


class DocumentInfo(NamedTuple):
    """A stored document: ``tokens = shard[offset:offset + length]``, EOS included."""

    index: int  # row in the tree's document table (storage order)
    id: str
    shard: str  # rel path of the file holding its first token
    offset: int  # in tokens, within that file
    length: int
    bucket: str
    partition: int  # -1 for llm.c trees
    split: str  # "train" / "val" for llm.c trees, "" for bucketed ones (see ShardTree.split_of)


class Window(NamedTuple):
    """S+1 consecutive tokens of a stream as inputs and targets, with the documents inside them.

    ``cu_seqlens`` are the cumulative lengths of the document pieces in ``inputs`` (0, each document
    start inside the inputs, S), as varlen attention kernels take them; ``position_ids`` count from 0
    at the window's start and again at each document start. ``doc_index[j]`` is the document of
    piece j (a row of ``tree.documents``), and ``first_offset`` where in its document the window starts.

    ``loss_mask[i]`` is 1.0 where ``targets[i]`` is trained on. It is 0.0 where ``targets[i]`` is the
    first token of a document, i.e. the target after each EOS (Megatron's ``eod_mask_loss``): no
    model can predict the next document from the end of the last. With ``mask_across_docs`` it is
    also 0.0 on every later target, so that only the window's first document is trained on.
    """

    inputs: np.ndarray  # (S,) int64
    targets: np.ndarray  # (S,) int64
    cu_seqlens: np.ndarray  # (pieces + 1,) int32
    position_ids: np.ndarray  # (S,) int64
    doc_index: np.ndarray  # (pieces,) int64
    first_offset: int
    bucket: str | None  # the bucket whose stream it was cut from; None when the sampler has one stream
    start: int  # its first token's position in that stream
    loss_mask: np.ndarray  # (S,) float32


class Batch(NamedTuple):
    """Windows stacked; ``cu_seqlens`` runs over the B*S tokens flattened, as flash-attn's varlen API takes.

    Shifted, as Megatron's: ``targets[:, i]`` is the token after ``inputs[:, i]``. Hugging Face's
    convention (labels = the inputs, -100 where ``loss_mask`` is 0) is shards.torch_dataset.hf_labels.
    """

    inputs: np.ndarray  # (B, S) int64
    targets: np.ndarray  # (B, S) int64
    position_ids: np.ndarray  # (B, S) int64
    cu_seqlens: np.ndarray  # (pieces + 1,) int32
    max_seqlen: int
    windows: tuple[Window, ...]
    loss_mask: np.ndarray  # (B, S) float32


def stack_windows(windows: Sequence[Window]) -> Batch:
    if not windows:
        raise ValueError("a batch needs at least one window")
    s = len(windows[0].inputs)
    cu = [w.cu_seqlens[:-1] + i * s for i, w in enumerate(windows)]
    cu.append(np.array([len(windows) * s], dtype=np.int32))
    cu_seqlens = np.concatenate(cu)
    return Batch(
        inputs=np.stack([w.inputs for w in windows]),
        targets=np.stack([w.targets for w in windows]),
        position_ids=np.stack([w.position_ids for w in windows]),
        cu_seqlens=cu_seqlens,
        max_seqlen=int(np.diff(cu_seqlens).max()),
        windows=tuple(windows),
        loss_mask=np.stack([w.loss_mask for w in windows]),
    )


def block_causal_mask(cu_seqlens: np.ndarray) -> np.ndarray:
    """(S, S) bool, True where query i may attend to key j: j <= i and both in the same document piece.

    For attention without a varlen kernel (e.g. ``scaled_dot_product_attention(attn_mask=...)``).
    """
    lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
    piece = np.repeat(np.arange(len(lengths)), lengths)
    return (piece[:, None] == piece[None, :]) & np.tri(len(piece), dtype=bool)


# ---------------------------------------------------------------------------------------------
# The token files of a tree, as one stream.


class TokenStore:
    """The token files of a tree laid end to end: global token position -> (file, offset).

    Local files are memory-mapped lazily; files on other filesystems are read by byte range.
    """

    def __init__(self, fs, root: str, rel_paths: Sequence[str], counts: Sequence[int], dtype: np.dtype,
                 header_bytes: int = 0):
        self.fs = fs
        self.root = root
        self.rel_paths = list(rel_paths)
        self.dtype = np.dtype(dtype)
        self.header_bytes = header_bytes
        self.starts = np.zeros(len(self.rel_paths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(counts, dtype=np.int64), out=self.starts[1:])
        self.local = isinstance(fs, LocalFileSystem)
        self._maps: list[np.ndarray | None] = [None] * len(self.rel_paths)

    def __getstate__(self):
        # Memory maps are reopened in the receiving process (a DataLoader worker), never pickled.
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self.rel_paths)
        return state

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def path(self, i: int) -> str:
        return posixpath.join(self.root, self.rel_paths[i])

    def count(self, i: int) -> int:
        return int(self.starts[i + 1] - self.starts[i])

    def _map(self, i: int) -> np.ndarray:
        m = self._maps[i]
        if m is None:
            mapped = np.memmap(self.path(i), dtype=self.dtype, mode="r", offset=self.header_bytes,
                               shape=(self.count(i),))
            # A plain ndarray over the map: slicing np.memmap itself costs ten times as much.
            m = self._maps[i] = mapped.view(np.ndarray)
        return m

    def _slice(self, i: int, a: int, b: int) -> np.ndarray:
        if self.local:
            return self._map(i)[a:b]
        size = self.dtype.itemsize
        data = self.fs.cat_file(self.path(i), start=self.header_bytes + a * size, end=self.header_bytes + b * size)
        return np.frombuffer(data, dtype=self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream; a view into the memory map when they lie in one local file."""
        if not 0 <= start <= stop <= self.total:
            raise IndexError(f"token range [{start}, {stop}) is outside the stream of {self.total} tokens")
        if start == stop:
            return np.empty(0, dtype=self.dtype)
        i = int(self.starts.searchsorted(start, "right")) - 1
        if stop <= self.starts[i + 1]:  # one file, the common case
            base = int(self.starts[i])
            return self._slice(i, start - base, stop - base)
        pieces = []
        while start < stop:
            end = min(stop, int(self.starts[i + 1]))
            if end > start:
                base = int(self.starts[i])
                pieces.append(self._slice(i, start - base, end - base))
            start = end
            i += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


# ---------------------------------------------------------------------------------------------
# The document table.


class Documents:
    """Every document of a tree in storage order, as numpy columns (compact, and shared rather than
    copied by forked DataLoader workers)."""

    def __init__(self, ids: np.ndarray, start: np.ndarray, length: np.ndarray, file: np.ndarray,
                 bucket: np.ndarray, partition: np.ndarray, split: np.ndarray):
        self.ids = ids  # UTF-8 bytes ('S' dtype)
        self.start = start  # int64, global position of the first token in the TokenStore
        self.length = length  # int64, EOS included
        self.file = file  # int32, file of the first token
        self.bucket = bucket  # int8 index into layout.BUCKET_NAMES, by length
        self.partition = partition  # int32, -1 when the format has none
        self.split = split  # int8: 0 train, 1 val, -1 when the tree has no split of its own
        self._by_id: np.ndarray | None = None
        self._val_keys: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.length)

    def id(self, i: int) -> str:
        return self.ids[i].decode("utf-8")

    def index_of(self, doc_id: str) -> int:
        """The row of ``doc_id``; KeyError when the tree does not hold it."""
        key = doc_id.encode("utf-8")
        if self._by_id is None:
            self._by_id = np.argsort(self.ids, kind="stable")
        if len(key) <= self.ids.itemsize and len(self):
            pos = int(np.searchsorted(self.ids, np.bytes_(key), sorter=self._by_id))
            if pos < len(self) and self.ids[self._by_id[pos]] == key:
                return int(self._by_id[pos])
        raise KeyError(f"no document with id {doc_id!r} in this tree")

    def validation_keys(self) -> np.ndarray:
        """validation_key of every document, computed once."""
        if self._val_keys is None:
            self._val_keys = np.fromiter((validation_key(i.decode("utf-8")) for i in self.ids), dtype=np.float64,
                                         count=len(self))
        return self._val_keys


# ---------------------------------------------------------------------------------------------
# The tree.


class ShardTree:
    """An opened output tree: its documents, its tokens, and samplers over them."""

    def __init__(self, url: str, kind: str, store: TokenStore, documents: Documents, eos_id: int,
                 stats: manifest.DatasetStats | None = None):
        self.url = url
        self.kind = kind  # a tree kind's name (shards/kinds.py): "bucketed" or "scaffold"
        self.store = store
        self.documents = documents
        self.eos_id = eos_id
        self.stats = stats
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def fingerprint(self) -> str:
        """What the tree holds, in 32 hex digits: a BLAKE2b of its kind, its dataset_stats, its token
        files with their token counts and every document's length. Not its URL: a copied or moved tree
        keeps it; a re-run that changes a document, or a removal, does not."""
        if self._fingerprint is None:
            h = hashlib.blake2b(digest_size=16, person=b"tree")
            word = kinds.get(self.kind).fingerprint_word
            h.update(f"{word}\n{self.stats.to_text() if self.stats is not None else ''}\n".encode())
            for i, rel in enumerate(self.store.rel_paths):
                h.update(f"{rel} {self.store.count(i)}\n".encode())
            h.update(np.ascontiguousarray(self.documents.length, dtype="<i8").tobytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    @property
    def dtype(self) -> np.dtype:
        return self.store.dtype

    @property
    def total_tokens(self) -> int:
        return int(self.documents.length.sum())

    def row(self, doc: int | str) -> int:
        """The row of a document given by row (any integer) or by id."""
        if isinstance(doc, (int, np.integer)):
            if not 0 <= doc < len(self):
                raise IndexError(f"document row {doc} is outside 0..{len(self) - 1}")
            return int(doc)
        return self.documents.index_of(doc)

    def info(self, doc: int | str) -> DocumentInfo:
        i = self.row(doc)
        d = self.documents
        f = int(d.file[i])
        split = int(d.split[i])
        return DocumentInfo(
            index=i,
            id=d.id(i),
            shard=self.store.rel_paths[f],
            offset=int(d.start[i] - self.store.starts[f]),
            length=int(d.length[i]),
            bucket=layout.BUCKET_NAMES[int(d.bucket[i])],
            partition=int(d.partition[i]),
            split=SPLITS[split] if split >= 0 else "",
        )

    def list_documents(self, indices: Iterable[int] | None = None) -> Iterator[DocumentInfo]:
        """DocumentInfo of each document (of ``indices``, e.g. from ``select``), in storage order."""
        for i in range(len(self)) if indices is None else indices:
            yield self.info(i)

    def document(self, doc: int | str) -> np.ndarray:
        """A document's tokens, EOS included, by id or row; a memory-map view when local."""
        i = self.row(doc)
        start = int(self.documents.start[i])
        return self.store.read(start, start + int(self.documents.length[i]))

    def is_validation(self, val_fraction: float) -> np.ndarray:
        """Bool per document: held out for validation."""
        d = self.documents
        if kinds.get(self.kind).own_splits:
            if val_fraction:
                raise ValueError(
                    "an llm.c tree carries its own split (train/ and val/, chosen by the job); "
                    "use split='train' or 'val' without val_fraction"
                )
            return d.split == 1
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be within [0, 1), got {val_fraction}")
        if val_fraction == 0.0:
            return np.zeros(len(d), dtype=bool)
        return d.validation_keys() < val_fraction

    def select(self, split: str = "all", val_fraction: float = 0.0, buckets: Iterable[str] | None = None,
               partitions: Iterable[int] | None = None) -> np.ndarray:
        """Rows of the documents in ``split`` (train / val / all) and the given buckets and partitions."""
        keep = self._selector(split, val_fraction, buckets, partitions)
        return np.arange(len(self), dtype=np.int64) if keep is None else np.flatnonzero(keep(0, len(self)))

    def select_runs(self, split: str = "all", val_fraction: float = 0.0, buckets: Iterable[str] | None = None,
                    partitions: Iterable[int] | None = None) -> np.ndarray:
        """The rows ``select`` gives, as runs of consecutive rows: ``(k, 2)`` of ``[lo, hi)``. Every
        document is one run, found without reading any; a filtered selection is scanned a slice of
        rows at a time, so it holds its runs, never a row per document."""
        keep = self._selector(split, val_fraction, buckets, partitions)
        n = len(self)
        if keep is None:
            return np.array([[0, n]], dtype=np.int64) if n else np.zeros((0, 2), np.int64)
        return join_runs([runs_of_mask(keep(a, min(n, a + _SELECT_ROWS)), a) for a in range(0, n, _SELECT_ROWS)])

    def _selector(self, split: str, val_fraction: float, buckets: Iterable[str] | None,
                  partitions: Iterable[int] | None):
        """``keep(a, b)``: the bool mask of rows [a, b) in the selection; None when it is every row.
        A ValueError for a bad split, fraction or bucket."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        d = self.documents
        tests = []
        if split != "all" and (kinds.get(self.kind).own_splits or val_fraction != 0.0):
            val = self.is_validation(val_fraction)
            tests.append((lambda a, b: val[a:b]) if split == "val" else (lambda a, b: ~val[a:b]))
        elif split == "val":  # a bucketed tree with no fraction held out: no validation document
            tests.append(lambda a, b: np.zeros(b - a, dtype=bool))
        elif val_fraction and kinds.get(self.kind).own_splits:
            self.is_validation(val_fraction)  # the same clear error
        if buckets is not None:
            names = list(buckets)
            unknown = [b for b in names if b not in layout.BUCKET_NAMES]
            if unknown:
                raise ValueError(f"unknown bucket(s) {unknown}; buckets are {list(layout.BUCKET_NAMES)}")
            wanted = [layout.BUCKET_NAMES.index(b) for b in names]
            tests.append(lambda a, b: np.isin(d.bucket[a:b], wanted))
        if partitions is not None:
            parts = np.asarray(list(partitions), dtype=np.int64)
            tests.append(lambda a, b: np.isin(d.partition[a:b], parts))
        if not tests:
            return None

        def keep(a: int, b: int) -> np.ndarray:
            mask = np.ones(b - a, dtype=bool)
            for test in tests:
                mask &= test(a, b)
            return mask

        return keep

    def buckets_held(self, split: str = "all", val_fraction: float = 0.0,
                     partitions: Iterable[int] | None = None) -> list[str]:
        """The buckets that hold a selected document, in layout order (scanned a slice at a time)."""
        keep = self._selector(split, val_fraction, None, partitions)
        held: set[int] = set()
        for a in range(0, len(self), _SELECT_ROWS):
            b = min(len(self), a + _SELECT_ROWS)
            column = self.documents.bucket[a:b]
            held.update(np.unique(column if keep is None else column[keep(a, b)]).tolist())
        return [layout.BUCKET_NAMES[i] for i in sorted(held)]

    def sampler(self, seq_len: int, seed: int = 0, *, split: str = "train", val_fraction: float = 0.0,
                buckets: Iterable[str] | None = None, partitions: Iterable[int] | None = None,
                weights: Mapping[str, float] | None = None, align_to_docs: bool = False,
                replacement: bool = False, mask_across_docs: bool = False) -> WindowSampler:
        """Windows of ``seq_len + 1`` tokens, epoch by epoch (see WindowSampler)."""
        return WindowSampler(self, seq_len, seed, split=split, val_fraction=val_fraction, buckets=buckets,
                             partitions=partitions, weights=weights, align_to_docs=align_to_docs,
                             replacement=replacement, mask_across_docs=mask_across_docs)

    def length_sampler(self, tokens_per_batch: int, seed: int = 0, *, split: str = "train",
                       val_fraction: float = 0.0, buckets: Iterable[str] | None = None,
                       partitions: Iterable[int] | None = None, seq_lens: Mapping[str, int] | None = None,
                       weights: Mapping[str, float] | None = None, align_to_docs: bool = False,
                       mask_across_docs: bool = False) -> LengthSampler:
        """Batches of ``tokens_per_batch`` tokens, each from one bucket at its own length (see LengthSampler)."""
        return LengthSampler(self, tokens_per_batch, seed, split=split, val_fraction=val_fraction, buckets=buckets,
                             partitions=partitions, seq_lens=seq_lens, weights=weights, align_to_docs=align_to_docs,
                             mask_across_docs=mask_across_docs)


# ---------------------------------------------------------------------------------------------
# Streams of selected documents, how an epoch cuts them into windows, and the samplers.


class DocumentStream:
    """Selected documents laid end to end: N tokens.

    The selection is held as runs of consecutive rows ``(lo, hi)``; a tree's rows are in storage
    order, each document right after the one before, so a run is one stretch of the token files,
    read in one piece. A whole tree, a bucket or a set of partitions is a few runs, so a stream costs
    memory by its runs, not by its documents: where a document starts is looked up in the tree's
    ``start`` column (a binary search in a mapped index touches a few pages).
    """

    def __init__(self, tree: ShardTree, runs: np.ndarray, name: str | None = None):
        self.tree = tree
        self.name = name
        runs = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
        self.run_lo, self.run_hi = runs[:, 0].copy(), runs[:, 1].copy()
        self.run_first = np.zeros(len(runs) + 1, dtype=np.int64)  # the stream's document number of each run's first
        np.cumsum(self.run_hi - self.run_lo, out=self.run_first[1:])
        d = tree.documents
        self.run_gstart = np.asarray(d.start[self.run_lo], dtype=np.int64)
        last = self.run_hi - 1
        ends = np.asarray(d.start[last], dtype=np.int64) + np.asarray(d.length[last], dtype=np.int64)
        self.run_vstart = np.zeros(len(runs) + 1, dtype=np.int64)
        np.cumsum(ends - self.run_gstart, out=self.run_vstart[1:])
        self._vstart: np.ndarray | None = None
        # Per run, as Python ints for the per-window lookups: rows lo, hi, global - stream position, end.
        self._runs = list(zip(self.run_lo.tolist(), self.run_hi.tolist(),
                              (self.run_gstart - self.run_vstart[:-1]).tolist(), self.run_vstart[1:].tolist(),
                              strict=True))

    @classmethod
    def of_rows(cls, tree: ShardTree, rows: np.ndarray, name: str | None = None) -> DocumentStream:
        """The stream of ``rows`` (ascending), as runs."""
        return cls(tree, runs_of_rows(rows), name)

    @property
    def tokens(self) -> int:
        return int(self.run_vstart[-1])

    @property
    def documents(self) -> int:
        return int(self.run_first[-1])

    @property
    def rows(self) -> np.ndarray:
        """The stream's rows of the tree, in order (one int64 a document: for small selections)."""
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(self.run_lo.tolist(),
                                                                               self.run_hi.tolist(), strict=True)]
                              or [np.zeros(0, np.int64)])

    @property
    def vstart(self) -> np.ndarray:
        """Where each document starts in the stream, and N last: made on first use (8 bytes a
        document), for cuts aligned to documents; windows laid end to end never need it."""
        if self._vstart is None:
            start = self.tree.documents.start
            parts = [np.asarray(start[a:b], dtype=np.int64) - g + v for a, b, g, v in
                     zip(self.run_lo.tolist(), self.run_hi.tolist(), self.run_gstart.tolist(),
                         self.run_vstart[:-1].tolist(), strict=True)]
            self._vstart = np.concatenate([*parts, [self.tokens]]).astype(np.int64)
        return self._vstart

    def doc_start(self, j: int) -> int:
        """Where the stream's document j starts (N for j = its number of documents)."""
        if j >= self.documents:
            return self.tokens
        r = int(self.run_first.searchsorted(j, "right")) - 1
        row = int(self.run_lo[r]) + j - int(self.run_first[r])
        return int(self.run_vstart[r]) + int(self.tree.documents.start[row]) - int(self.run_gstart[r])

    def doc_at(self, pos: int) -> int:
        """The stream's document that holds position ``pos`` (0 <= pos < N)."""
        r = int(self.run_vstart.searchsorted(pos, "right")) - 1
        lo, hi = int(self.run_lo[r]), int(self.run_hi[r])
        g = int(self.run_gstart[r]) + pos - int(self.run_vstart[r])
        return int(self.run_first[r]) + int(np.searchsorted(self.tree.documents.start[lo:hi], g, "right")) - 1

    def starts_between(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The documents that start at a stream position in [a, b): their rows of the tree and
        those positions, in order."""
        rows, places = [], []
        start = self.tree.documents.start
        r = max(0, int(self.run_vstart.searchsorted(a, "right")) - 1)
        while r < len(self.run_lo) and self.run_vstart[r] < b:
            lo, hi, g, v = int(self.run_lo[r]), int(self.run_hi[r]), int(self.run_gstart[r]), int(self.run_vstart[r])
            column = start[lo:hi]
            i = int(np.searchsorted(column, g + a - v, "left"))
            k = int(np.searchsorted(column, g + b - v, "left"))
            rows.append(np.arange(lo + i, lo + k, dtype=np.int64))
            places.append(np.asarray(column[i:k], dtype=np.int64) - g + v)
            r += 1
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(rows), np.concatenate(places)

    def row_of(self, j: int) -> int:
        """The tree's row of the stream's document j."""
        r = int(self.run_first.searchsorted(j, "right")) - 1
        return int(self.run_lo[r]) + j - int(self.run_first[r])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of this stream."""
        if not 0 <= start <= stop <= self.tokens:
            raise IndexError(f"range [{start}, {stop}) is outside a stream of {self.tokens} tokens")
        r = int(self.run_vstart.searchsorted(start, "right")) - 1
        if r < len(self.run_lo) and stop <= self.run_vstart[r + 1]:  # one run, the common case
            g = int(self.run_gstart[r]) + start - int(self.run_vstart[r])
            return self.tree.store.read(g, g + stop - start)
        pieces = []
        while start < stop:
            end = min(stop, int(self.run_vstart[r + 1]))
            g = int(self.run_gstart[r]) + start - int(self.run_vstart[r])
            pieces.append(self.tree.store.read(g, g + end - start))
            start = end
            r += 1
        if not pieces:
            return np.empty(0, dtype=self.tree.dtype)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def window_at(self, start: int, seq_len: int, mask_across_docs: bool = False,
                  out: tuple[np.ndarray, ...] | None = None) -> Window:
        """The window of seq_len + 1 tokens starting at ``start`` of this stream.

        ``out`` is one row of each array of a batch, to fill in place: inputs, targets, position_ids
        (holding 0 .. S-1) and loss_mask (holding 1.0).
        """
        stop = start + seq_len
        inputs, targets, position_ids, loss_mask = self._window_arrays(start, seq_len, out)
        doc_index, inner, first_offset, ends_at_stop = self._documents_in(start, stop)
        cu = np.empty(len(inner) + 2, dtype=np.int32)
        cu[0], cu[1:-1], cu[-1] = 0, inner, seq_len
        if len(inner):
            _restart_positions(position_ids, cu)
            loss_mask[inner - 1] = 0.0  # the inputs there are EOS: their targets start documents
            if mask_across_docs:
                loss_mask[int(inner[0]) - 1:] = 0.0  # and every target after the window's first document
        if ends_at_stop:  # the last target starts a document
            loss_mask[-1] = 0.0
        return Window(
            inputs=inputs,
            targets=targets,
            cu_seqlens=cu,
            position_ids=position_ids,
            doc_index=doc_index,
            first_offset=first_offset,
            bucket=self.name,
            start=start,
            loss_mask=loss_mask,
        )

    def _documents_in(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """Of the window whose inputs are [start, stop): the rows of its documents, where those
        after the first start (from the window's start), where in the first it starts, and
        whether a document starts at its last target."""
        r = 0 if len(self._runs) == 1 else int(self.run_vstart.searchsorted(start, "right")) - 1
        lo, hi, shift, end = self._runs[r]
        if stop < end:  # inside one run, the common case: two searches of its starts
            base = shift + start  # the window's first token in the files end to end
            column = self.tree.documents.start[lo:hi]
            i = int(column.searchsorted(base, "right")) - 1
            k = int(column.searchsorted(base + stop - start, "left"))
            ends = k < len(column) and int(column[k]) == base + stop - start
            return (np.arange(lo + i, lo + k, dtype=np.int64), column[i + 1:k] - base, base - int(column[i]), ends)
        first = self.doc_at(start)
        rows, places = self.starts_between(start + 1, stop + 1)
        ends = len(places) > 0 and int(places[-1]) == stop
        if ends:
            rows, places = rows[:-1], places[:-1]
        return (np.concatenate(([self.row_of(first)], rows)).astype(np.int64), places - start,
                start - self.doc_start(first), ends)

    def _window_arrays(self, start: int, seq_len: int, out: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...]:
        """inputs, targets, position_ids (0 .. S-1) and loss_mask (1.0) of the window at ``start``:
        new arrays, or the rows of a batch's (``out``) filled in place."""
        raw = self.read(start, start + seq_len + 1)
        if out is None:
            tokens = raw.astype(np.int64)
            return tokens[:-1], tokens[1:], np.arange(seq_len, dtype=np.int64), np.ones(seq_len, dtype=np.float32)
        inputs, targets, position_ids, loss_mask = out
        inputs[:] = raw[:-1]
        targets[:] = raw[1:]
        return inputs, targets, position_ids, loss_mask


def _restart_positions(position_ids: np.ndarray, cu: np.ndarray) -> None:
    """Count ``position_ids`` (0 .. S-1) from 0 again at each document start inside ``cu``."""
    if len(cu) <= 17:
        bounds = cu.tolist()
        for a, b in zip(bounds[1:-1], bounds[2:], strict=True):
            position_ids[a:b] -= a
    else:
        position_ids -= np.repeat(cu[:-1], np.diff(cu))


def runs_of_rows(rows: np.ndarray) -> np.ndarray:
    """Ascending rows as runs of consecutive rows, ``(k, 2)`` of ``[lo, hi)``."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return np.zeros((0, 2), np.int64)
    breaks = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1
    lo = rows[np.concatenate(([0], breaks))]
    hi = rows[np.concatenate((breaks - 1, [len(rows) - 1]))] + 1
    return np.stack([lo, hi], axis=1)


def runs_of_mask(keep: np.ndarray, base: int = 0) -> np.ndarray:
    """The runs of True in ``keep`` as ``(k, 2)`` of ``[lo, hi)``, counted from ``base``."""
    edges = np.diff(np.concatenate(([0], keep.view(np.int8) if keep.dtype == bool else keep, [0])).astype(np.int8))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1).astype(np.int64) + base


def join_runs(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Runs in order, those that meet (one's hi the next's lo) made one."""
    runs = np.concatenate([*parts, np.zeros((0, 2), np.int64)])
    if len(runs) < 2:
        return runs
    new = np.ones(len(runs), dtype=bool)
    new[1:] = runs[1:, 0] != runs[:-1, 1]
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:], len(runs)) - 1
    return np.stack([runs[firsts, 0], runs[lasts, 1]], axis=1)


def batch_at(places: Sequence[tuple[DocumentStream, int]], seq_len: int, mask_across_docs: bool = False) -> Batch:
    """The batch of the windows at ``(stream, start)`` of ``places``, as ``stack_windows`` of their
    ``window_at``, but with every window written straight into the batch's arrays."""
    n = len(places)
    inputs = np.empty((n, seq_len), dtype=np.int64)
    targets = np.empty((n, seq_len), dtype=np.int64)
    position_ids = np.empty((n, seq_len), dtype=np.int64)
    position_ids[:] = np.arange(seq_len, dtype=np.int64)
    loss_mask = np.ones((n, seq_len), dtype=np.float32)
    windows = tuple(
        stream.window_at(start, seq_len, mask_across_docs, (inputs[i], targets[i], position_ids[i], loss_mask[i]))
        for i, (stream, start) in enumerate(places)
    )
    cu = [w.cu_seqlens[:-1] + i * seq_len for i, w in enumerate(windows)]
    cu.append(np.array([n * seq_len], dtype=np.int32))
    cu_seqlens = np.concatenate(cu)
    return Batch(inputs=inputs, targets=targets, position_ids=position_ids, cu_seqlens=cu_seqlens,
                 max_seqlen=int(np.diff(cu_seqlens).max()), windows=windows, loss_mask=loss_mask)


class WindowCut:
    """Where the windows of an epoch start in one stream: every S tokens, each window S + 1 long.

    Laid end to end (the default), the stream is one cut unit: windows start at 0, S, 2S, ... for
    as long as S + 1 tokens remain, so there are (N - 1) // S of them, their inputs cover the first
    count * S tokens once each, and the last 1 + (N - 1) % S tokens (1 to S) are never an input.

    Aligned to documents, every document is a cut unit: a document of L tokens gives (L - 1) // S
    windows, at its first token and every S tokens after, none reaching into the next document;
    it leaves its last 1 + (L - 1) % S tokens, all of them when L <= S.
    """

    def __init__(self, stream: DocumentStream, seq_len: int, align_to_docs: bool):
        self.stream = stream
        self.seq_len = seq_len
        self.aligned = align_to_docs
        if align_to_docs:
            per_doc = (np.diff(stream.vstart) - 1) // seq_len
            self._first = np.zeros(len(per_doc) + 1, dtype=np.int64)  # first window of each document
            np.cumsum(per_doc, out=self._first[1:])
            self.count = int(self._first[-1])
        else:
            self.count = max(0, (stream.tokens - 1) // seq_len)

    def start(self, j: int) -> int:
        """Where window j of the cut (0 <= j < count, in stream order) starts in the stream."""
        if not self.aligned:
            return j * self.seq_len
        i = int(self._first.searchsorted(j, "right")) - 1
        return int(self.stream.vstart[i]) + (j - int(self._first[i])) * self.seq_len

    @property
    def leftover(self) -> int:
        """Tokens of the stream that are the input of no window of the cut."""
        return self.stream.tokens - self.count * self.seq_len


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` by largest remainders (ties to the earlier one)."""
    w = np.asarray(weights, dtype=np.float64)
    raw = w / w.sum() * total
    shares = np.floor(raw).astype(np.int64)
    extra = total - int(shares.sum())
    order = sorted(range(len(w)), key=lambda i: (-(raw[i] - shares[i]), i))
    for i in order[:extra]:
        shares[i] += 1
    return [int(s) for s in shares]


class EpochMix:
    """Which source, which of its passes and which item of that pass each draw k takes.

    Source b (a bucket's stream) holds ``counts[b]`` items (windows, or batches of windows) in one
    pass. Draw k belongs to epoch ``k // len(mix)``. With one source an epoch is one pass, in order
    (the caller permutes the pass). With several, epoch e gives source b ``shares[b]`` draws (by
    default its count; with weights, its share of the sum of the counts, see ``apportion``), placed
    in the epoch by a seeded permutation; they are draws e * shares[b] ... of that source, which
    goes through its items pass after pass. A source whose share exceeds its count repeats items
    within an epoch (a fresh permutation each pass); one whose share is smaller carries on in the
    next epoch where it stopped, so no item repeats before its whole pass is used.
    """

    def __init__(self, counts: Sequence[int], seed: int, weights: Sequence[float] | None = None):
        self.counts = [int(c) for c in counts]
        self.shares = list(self.counts) if weights is None else apportion(sum(self.counts), weights)
        self.first = [0]
        for s in self.shares:
            self.first.append(self.first[-1] + s)
        self.seed = seed
        self._epochs: dict[int, Permutation] = {}

    def __len__(self) -> int:
        return self.first[-1]

    def locate(self, k: int) -> tuple[int, int, int]:
        """(source, pass of that source, item within the pass) of draw k."""
        if len(self.counts) == 1:
            q, r = divmod(k, self.counts[0])
            return 0, q, r
        epoch, i = divmod(k, len(self))
        perm = self._epochs.get(epoch)
        if perm is None:
            if len(self._epochs) > 8:
                self._epochs.clear()
            perm = self._epochs[epoch] = Permutation(len(self), self.seed, "mix", epoch)
        v = perm(i)
        b = bisect.bisect_right(self.first, v) - 1
        q, r = divmod(epoch * self.shares[b] + v - self.first[b], self.counts[b])
        return b, q, r


def as_json(value: object) -> object:
    """``value`` as JSON gives it back (tuples as lists, ints as keys as strings), so that a
    fingerprint compares equal to its own copy read back from a JSON or pickled checkpoint."""
    return json.loads(json.dumps(value))


def refuse_other_fingerprint(state: Mapping, fingerprint: Mapping, what: str) -> None:
    """A ValueError, in one line naming the first field that differs, unless ``state["fingerprint"]``
    holds every field of ``fingerprint`` with the same value."""
    saved = state.get("fingerprint")
    if not isinstance(saved, Mapping):
        raise ValueError(f"the state has no fingerprint of what made its {what}s (saved by an older version, or "
                         "not a state of this loader); start a new run at a step instead")
    for field, here in fingerprint.items():
        if field not in saved:
            raise ValueError(f"the state was saved without {field} (this {what}: {here!r}); it is not this "
                             f"{what}'s state")
        if as_json(saved[field]) != here:
            raise ValueError(f"the state was saved by another {what}: {field} {saved[field]!r} (this {what}: "
                             f"{here!r})")


class _Epochs:
    """What both samplers share: each source's windows in a fresh permutation per pass, and
    iteration from a position, with the position as state (torchdata's ``Stateful`` protocol).

    A sampler is a pure function of the index; its iterators hand out indices from ``position``
    and advance it, so ``state_dict()`` is that position with the sampler's ``fingerprint()``
    (everything that decides which windows come at which index), and ``load_state_dict`` puts the
    iteration back there, refusing a state of another fingerprint (naming the first field that differs).
    """

    position: int
    tree: ShardTree
    selection: dict
    streams: list[DocumentStream]
    mix: EpochMix

    def _settings(self) -> dict:
        raise NotImplementedError

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    def __len__(self) -> int:
        """Draws in one epoch: windows (WindowSampler) or batches (LengthSampler)."""
        return len(self.mix)

    def _take(self, tree: ShardTree, seed: int, split: str, val_fraction: float, buckets: Iterable[str] | None,
              partitions: Iterable[int] | None) -> tuple[list[str] | None, list[int] | None]:
        """What both samplers take first: the tree, the seed (>= 0) and the selection as the
        fingerprint names it; the buckets and partitions as lists (None: all)."""
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.tree, self.seed = tree, seed
        buckets = None if buckets is None else list(buckets)
        partitions = None if partitions is None else list(partitions)
        self.selection = _selection(split, val_fraction, buckets, partitions)
        return buckets, partitions

    def fingerprint(self) -> dict:
        """What decides the windows, JSON-ready, in the order a mismatch is looked for: the tree,
        the sampler's kind and shape, the seed, the selection, the weights, the masking, and the
        epoch's size it all gives."""
        return as_json({"tree": self.tree.fingerprint, **self._settings()})

    def state_dict(self) -> dict:
        return {"position": self.position, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: Mapping) -> None:
        refuse_other_fingerprint(state, self.fingerprint(), "sampler")
        position = state.get("position")
        if not isinstance(position, (int, np.integer)) or position < 0:
            raise ValueError(f"state position must be an integer >= 0, got {position!r}")
        self.position = int(position)

    def _permutation(self, b: int, q: int) -> Permutation:
        """The order of source b's windows in its pass q."""
        perm = self._perms.get((b, q))
        if perm is None:
            if len(self._perms) > 64:
                self._perms.clear()
            name = self.streams[b].name
            path = ("windows", q) if name is None else ("windows", name, q)
            perm = self._perms[(b, q)] = Permutation(self.cuts[b].count, self.seed, *path)
        return perm


class WindowSampler(_Epochs):
    """Windows of ``seq_len + 1`` tokens over the selected documents of a tree, epoch by epoch.

    Window k depends only on (tree, selection, seq_len, seed, k): ``window(k)`` is random access,
    ``batch(b, B)`` holds windows b*B .. b*B + B - 1. ``len(sampler)`` windows make an epoch; window
    ``k + e * len(sampler)`` is window k's place in epoch e. Each epoch is a fresh permutation of
    the windows of ``WindowCut`` (one stream, or one per weighted bucket, mixed by ``EpochMix``), so
    an epoch visits every token of the selection once, but for the cut's leftover.

    ``replacement=True`` draws every window independently instead, as this reader did before
    epochs: a start at ``floor(u * (N - S - 1))`` from a generator keyed by the seed and k.
    """

    def __init__(self, tree: ShardTree, seq_len: int, seed: int = 0, *, split: str = "train",
                 val_fraction: float = 0.0, buckets: Iterable[str] | None = None,
                 partitions: Iterable[int] | None = None, weights: Mapping[str, float] | None = None,
                 align_to_docs: bool = False, replacement: bool = False, mask_across_docs: bool = False):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        buckets, partitions = self._take(tree, seed, split, val_fraction, buckets, partitions)
        self.seq_len = seq_len
        self.align_to_docs, self.replacement, self.mask_across_docs = align_to_docs, replacement, mask_across_docs
        if weights is None:
            self.streams = [DocumentStream(tree, tree.select_runs(split, val_fraction, buckets, partitions))]
            self.weights = None
        else:
            named = _check_weights(weights)
            self.streams = bucket_streams(tree, named, split, val_fraction, buckets, partitions)
            self.weights = {b: float(weights[b]) for b in named}
        w = None if weights is None else np.array(list(self.weights.values()), dtype=np.float64)
        self.cumulative = np.array([1.0]) if w is None else np.cumsum(w) / w.sum()
        self.cumulative[-1] = 1.0
        self._eligible = []
        for stream in self.streams:
            if stream.tokens < seq_len + 2:
                raise ValueError(
                    f"the selected {split} documents{_of_bucket(stream)} hold {stream.tokens} tokens; windows of "
                    f"{seq_len} + 1 tokens need a stream of at least {seq_len + 2}"
                )
            # Documents a window may start at: those with seq_len + 1 tokens of stream from their start on.
            self._eligible.append(stream.doc_at(stream.tokens - seq_len - 1) + 1)
        self.cuts = [WindowCut(s, seq_len, align_to_docs) for s in self.streams]
        if not replacement:
            for stream, cut in zip(self.streams, self.cuts, strict=True):
                if cut.count == 0:
                    raise ValueError(
                        f"no selected {split} document{_of_bucket(stream)} is longer than {seq_len} tokens, so "
                        f"align_to_docs cuts no window of {seq_len} + 1 tokens from them"
                    )
        self.mix = EpochMix([c.count for c in self.cuts], seed, w)
        self._perms: dict[tuple[int, int], Permutation] = {}
        self.position = 0

    def _settings(self) -> dict:
        return {"sampler": "windows", "seq_len": self.seq_len, "seed": self.seed, **self.selection,
                "weights": self.weights, "align_to_docs": self.align_to_docs,
                "mask_across_docs": self.mask_across_docs, "replacement": self.replacement,
                "epoch_windows": len(self), "tokens": self.tokens}

    def place(self, index: int) -> tuple[DocumentStream, int]:
        """The stream window ``index`` is cut from, and its start there."""
        if index < 0:
            raise ValueError(f"window index must be >= 0, got {index}")
        if self.replacement:
            u_bucket, u_start = window_uniforms(self.seed, index)
            b = int(self.cumulative.searchsorted(u_bucket, "right")) if len(self.streams) > 1 else 0
            stream = self.streams[b]
            if self.align_to_docs:
                return stream, stream.doc_start(int(u_start * self._eligible[b]))
            return stream, int(u_start * (stream.tokens - self.seq_len - 1))
        b, q, r = self.mix.locate(index)
        return self.streams[b], self.cuts[b].start(self._permutation(b, q)(r))

    def window(self, index: int) -> Window:
        stream, start = self.place(index)
        return stream.window_at(start, self.seq_len, self.mask_across_docs)

    def batch(self, index: int, batch_size: int) -> Batch:
        """Windows ``index * batch_size`` .. ``index * batch_size + batch_size - 1``, stacked."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return self._windows_from(index * batch_size, batch_size)

    def _windows_from(self, first: int, count: int) -> Batch:
        return batch_at([self.place(first + j) for j in range(count)], self.seq_len, self.mask_across_docs)

    def __iter__(self) -> Iterator[Window]:
        return self.windows()

    def windows(self, start: int | None = None, step: int = 1) -> Iterator[Window]:
        """Windows without end: from ``position`` one by one, advancing it (so ``state_dict`` resumes
        after the last one handed out); or, given ``start``, windows start, start + step, ...
        leaving ``position`` alone."""
        if start is None:
            return iter(self._next_window, None)
        return map(self.window, itertools.count(start, step))

    def batches(self, batch_size: int, start: int | None = None, step: int = 1) -> Iterator[Batch]:
        """Batches without end: the next ``batch_size`` windows from ``position``, advancing it; or,
        given ``start``, batches start, start + step, ... (as ``batch``), leaving ``position`` alone."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if start is None:
            return iter(functools.partial(self._next_batch, batch_size), None)
        return map(functools.partial(self.batch, batch_size=batch_size), itertools.count(start, step))

    # Iterators over callables rather than generators: a suspended generator would hold on to the
    # batch it last yielded while the next one is made, and fresh pages for every batch cost ~40%.
    def _next_window(self) -> Window:
        window = self.window(self.position)
        self.position += 1
        return window

    def _next_batch(self, batch_size: int) -> Batch:
        batch = self._windows_from(self.position, batch_size)
        self.position += batch_size
        return batch


class LengthSampler(_Epochs):
    """Batches of ``tokens_per_batch`` tokens, each from a single bucket, as sequences of that bucket's
    length: ``tokens_per_batch // seq_lens[b]`` windows of ``seq_lens[b] + 1`` tokens, cut from the
    bucket's documents as ``WindowSampler`` cuts them (OLMo-core's variable sequence length).

    A bucket's sequence length defaults to its bound (``"8192"``: 8192 tokens, as long as its
    longest document), ``"beyond"`` has none and needs ``seq_lens``. ``len(sampler)`` batches make an
    epoch: every bucket's full batches, in a seeded order across buckets (``EpochMix``; with
    ``weights``, shares of the batches). Per pass, a bucket uses the windows of its cut in a fresh
    permutation, ``len // per_batch`` batches of them; the rest (fewer than one batch of windows)
    waits for the next pass.
    """

    def __init__(self, tree: ShardTree, tokens_per_batch: int, seed: int = 0, *, split: str = "train",
                 val_fraction: float = 0.0, buckets: Iterable[str] | None = None,
                 partitions: Iterable[int] | None = None, seq_lens: Mapping[str, int] | None = None,
                 weights: Mapping[str, float] | None = None, align_to_docs: bool = False,
                 mask_across_docs: bool = False):
        if tokens_per_batch < 1:
            raise ValueError(f"tokens_per_batch must be >= 1, got {tokens_per_batch}")
        buckets, partitions = self._take(tree, seed, split, val_fraction, buckets, partitions)
        self.tokens_per_batch = tokens_per_batch
        self.mask_across_docs, self.align_to_docs = mask_across_docs, align_to_docs
        if weights is not None:
            names = _check_weights(weights)
        elif buckets is not None:
            tree._selector(split, val_fraction, buckets, partitions)  # the same errors for bad arguments
            names = [b for b in layout.BUCKET_NAMES if b in set(buckets)]
        else:
            names = tree.buckets_held(split, val_fraction, partitions)
        if not names:
            raise ValueError(f"no selected {split} documents to draw batches from")
        self.seq_lens = _bucket_seq_lens(names, seq_lens, tokens_per_batch)
        self.streams = bucket_streams(tree, names, split, val_fraction, buckets, partitions)
        self.cuts = [WindowCut(st, self.seq_lens[b], align_to_docs) for b, st in zip(names, self.streams, strict=True)]
        self.per_batch = [tokens_per_batch // self.seq_lens[b] for b in names]
        counts = [c.count // g for c, g in zip(self.cuts, self.per_batch, strict=True)]
        for b, stream, cut, g, n in zip(names, self.streams, self.cuts, self.per_batch, counts, strict=True):
            if n == 0:
                raise ValueError(
                    f"the selected {split} documents of bucket {b} hold {stream.tokens} tokens, {cut.count} windows of "
                    f"{self.seq_lens[b]} + 1{' aligned to documents' if align_to_docs else ''}; a batch takes {g}. "
                    "Leave the bucket out (buckets=...) or give it a shorter sequence (seq_lens=...)"
                )
        self.weights = None if weights is None else {b: float(weights[b]) for b in names}
        self.mix = EpochMix(counts, seed, None if weights is None else [float(weights[b]) for b in names])
        self._perms: dict[tuple[int, int], Permutation] = {}
        self.position = 0

    @property
    def buckets(self) -> list[str]:
        return [s.name for s in self.streams]

    def _settings(self) -> dict:
        return {"sampler": "lengths", "tokens_per_batch": self.tokens_per_batch, "seed": self.seed, **self.selection,
                "weights": self.weights, "seq_lens": dict(self.seq_lens), "align_to_docs": self.align_to_docs,
                "mask_across_docs": self.mask_across_docs, "epoch_batches": len(self), "tokens": self.tokens}

    def batch(self, index: int) -> Batch:
        """Batch ``index``: ``index // len(self)`` is its epoch."""
        if index < 0:
            raise ValueError(f"batch index must be >= 0, got {index}")
        b, q, r = self.mix.locate(index)
        perm, cut, g, stream = self._permutation(b, q), self.cuts[b], self.per_batch[b], self.streams[b]
        return batch_at([(stream, cut.start(perm(r * g + j))) for j in range(g)], cut.seq_len, self.mask_across_docs)

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def batches(self, start: int | None = None, step: int = 1) -> Iterator[Batch]:
        """Batches without end, from ``position`` (advancing it) or from ``start`` by ``step``."""
        if start is None:
            return iter(self._next_batch, None)
        return map(self.batch, itertools.count(start, step))

    def _next_batch(self) -> Batch:
        batch = self.batch(self.position)
        self.position += 1
        return batch


def _bucket_seq_lens(names: Sequence[str], seq_lens: Mapping[str, int] | None, tokens_per_batch: int) -> dict[str, int]:
    """Each bucket's sequence length: as given, else its bound; a ValueError for an unknown bucket,
    for ``beyond`` without one, and for a length that does not divide ``tokens_per_batch``."""
    given = dict(seq_lens or {})
    unknown = [b for b in given if b not in layout.BUCKET_NAMES]
    if unknown:
        raise ValueError(f"seq_lens name unknown bucket(s) {unknown}; buckets are {list(layout.BUCKET_NAMES)}")
    out = {}
    for b in names:
        if b not in given and b == layout.BEYOND:
            raise ValueError(f"bucket {b} has no bound to take as its sequence length: give seq_lens={{'{b}': S}}")
        s = int(given.get(b, b))
        if s < 1 or tokens_per_batch % s:
            raise ValueError(
                f"bucket {b}'s sequence length {s} does not divide tokens_per_batch {tokens_per_batch}; "
                "every batch holds the same number of tokens"
            )
        out[b] = s
    return out


def bucket_streams(tree: ShardTree, names: Sequence[str], split: str, val_fraction: float,
                   buckets: list[str] | None, partitions: list[int] | None) -> list[DocumentStream]:
    """A stream per bucket of ``names``, of the documents the selection holds there (none for a
    bucket that ``buckets`` leaves out)."""
    tree._selector(split, val_fraction, buckets, partitions)  # the same errors for bad arguments
    return [DocumentStream(tree, tree.select_runs(split, val_fraction, [b] if buckets is None or b in buckets else [],
                                                  partitions), b) for b in names]


def _selection(split: str, val_fraction: float, buckets: list[str] | None, partitions: list[int] | None) -> dict:
    """The documents a sampler draws from, as its fingerprint names them."""
    return {"split": split, "val_fraction": float(val_fraction),
            "buckets": None if buckets is None else sorted(buckets, key=_bucket_order),
            "partitions": None if partitions is None else sorted(int(p) for p in partitions)}


def _bucket_order(name: str) -> tuple[int, str]:
    return (layout.BUCKET_NAMES.index(name), name) if name in layout.BUCKET_NAMES else (len(layout.BUCKET_NAMES), name)


def _check_weights(weights: Mapping[str, float]) -> list[str]:
    """The buckets with a weight above 0, in layout order; ValueError on a bad mapping."""
    unknown = [b for b in weights if b not in layout.BUCKET_NAMES]
    if unknown:
        raise ValueError(f"weights name unknown bucket(s) {unknown}; buckets are {list(layout.BUCKET_NAMES)}")
    if any(not np.isfinite(w) or w < 0 for w in weights.values()):
        raise ValueError(f"weights must be finite and >= 0, got {dict(weights)}")
    named = [b for b in layout.BUCKET_NAMES if weights.get(b, 0) > 0]
    if not named:
        raise ValueError("at least one bucket needs a weight above 0")
    return named


def _of_bucket(stream: DocumentStream) -> str:
    return f" of bucket {stream.name}" if stream.name else ""


# ---------------------------------------------------------------------------------------------
# Opening trees.


def _sizes(fs, root: str, dirs: Iterable[str]) -> dict[str, int]:
    """Byte size of every file in the given subdirectories, by path relative to root."""
    sizes = {}
    for d in dirs:
        full = posixpath.join(root, d)
        if not fs.isdir(full):
            continue
        for entry in fs.ls(full, detail=True):
            if entry["type"] == "file":
                sizes[f"{d}/{posixpath.basename(entry['name'].rstrip('/'))}"] = int(entry["size"])
    return sizes


def open_tree(url: str) -> ShardTree:
    """Open a finished output tree of the bucketed or the scaffold (llm.c) job, local or fsspec.

    Which kind it is, and whether it is finished, is shards.tree.OutputTree's answer; the kind's
    opener (``_OPENERS``) reads it.
    """
    fs, _ = storage.filesystem(url)
    if not isinstance(fs, LocalFileSystem):
        # An object store's client caches listings per process: a tree rewritten since an earlier
        # open here (a removal applied elsewhere) would be read through the old sizes and index.
        fs.invalidate_cache()
    out = OutputTree.open(url).require_finished()
    fs, root = storage.filesystem(out.url)
    opened = _OPENERS[out.kind](out, fs, root.rstrip("/") or "/") if out.kind in _OPENERS else None
    if opened is None:
        raise ValueError(f"{out.url} has neither {layout.MANIFEST_NAME} nor train/ or val/ llm.c shards")
    return opened


def _open_bucketed_tree(out: OutputTree, fs, root: str) -> ShardTree | None:
    if not fs.exists(posixpath.join(root, layout.MANIFEST_NAME)):
        return None
    stats = out.stats()
    indexed = _open_indexed(fs, root, out.url, stats, out.record)
    return indexed if indexed is not None else _open_bucketed(fs, root, out.url, stats)


def _open_scaffold_tree(out: OutputTree, fs, root: str) -> ShardTree:
    url = out.url
    files = {}
    for split in llmc.SPLITS:
        d = posixpath.join(root, split)
        if fs.isdir(d):
            # Listed, not globbed: the tree's path is the user's and may hold '[' or '*'.
            names = sorted((n for n in (posixpath.basename(p.rstrip("/")) for p in fs.ls(d, detail=False))
                            if n.startswith("shard_") and n.endswith(".bin")
                            and is_ours(out.record, f"{split}/{n}")), key=_shard_number)
            files[split] = [f"{split}/{n}" for n in names]
    names_in = Tree(url)  # every file read resolves inside the tree (no link out of it)
    for rel in (r for rels in files.values() for r in rels):
        names_in.path(rel, "shard")
    return _open_llmc(fs, root, url, files)


# Each tree kind's opener (shards/kinds.py names the kinds); None: the tree holds nothing to open.
_OPENERS = {kinds.BUCKETED.name: _open_bucketed_tree, kinds.SCAFFOLD.name: _open_scaffold_tree}


def _shard_number(name: str) -> int:
    """``shard_012.bin`` -> 12: llm.c shards in stream order, whatever the width of their numbers."""
    digits = name[len("shard_"):-len(".bin")]
    if not digits.isdigit():
        raise ValueError(f"{name} is not an llm.c shard name (shard_NNN.bin)")
    return int(digits)


def _open_bucketed(fs, root: str, url: str, stats: manifest.DatasetStats) -> ShardTree:
    """The tree through its text manifest: parsed into columns, its files checked against it."""
    dtype = layout.DTYPES[stats.dtype]
    ids, length, manifest_file, file_of = _parse_manifest(fs, root, url)

    # Files in layout order: bucket, partition, rolling index.
    rel_paths = sorted(file_of, key=lambda r: (layout.BUCKET_NAMES.index((n := layout.parse_shard_rel_path(r)).bucket),
                                               n.partition, n.index))
    rank = np.empty(len(rel_paths), dtype=np.int64)
    for new, rel in enumerate(rel_paths):
        rank[file_of[rel]] = new
    file = rank[manifest_file] if len(manifest_file) else manifest_file
    counts = np.bincount(file, weights=length, minlength=len(rel_paths)).astype(np.int64)
    _check_shards(fs, root, url, rel_paths, counts, dtype, stats.dtype)
    store = TokenStore(fs, root, rel_paths, counts, dtype)

    # Rows of a file are in that file's order, so a document's offset is the sum of the counts before
    # it; with the files laid end to end in layout order, its place in the store is the running sum.
    order = np.argsort(file, kind="stable")
    start = np.empty_like(length)
    start[order] = np.cumsum(length[order]) - length[order]
    # Storage order: the manifest's already for a published tree, so usually nothing moves.
    if len(start) > 1 and not np.all(start[1:] > start[:-1]):
        by_start = np.argsort(start, kind="stable")
        ids, start, length, file = ids[by_start], start[by_start], length[by_start], file[by_start]
    partition = np.array([layout.parse_shard_rel_path(r).partition for r in rel_paths], dtype=np.int32)
    documents = Documents(
        ids=ids,
        start=start,
        length=length,
        file=file.astype(np.int32),
        bucket=_bucket_indices(length),
        partition=partition[file] if len(file) else np.empty(0, dtype=np.int32),
        split=np.full(len(length), -1, dtype=np.int8),
    )
    return ShardTree(url, "bucketed", store, documents, stats.eos_id, stats)


def _parse_manifest(fs, root: str, url: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """The manifest's ids ('S' bytes), lengths and file numbers (in order of first mention) by
    row, and those numbers by rel path; compact while parsing (8 bytes a number, ids in chunks)."""
    file_of: dict[str, int] = {}
    id_chunks, chunk = [], []
    file_col, len_col = array("q"), array("q")  # 8 bytes a row while parsing, not a Python int's ~36
    with fs.open(posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as f:
        for rel, doc_id, n in manifest.read_rows(f):
            fi = file_of.get(rel)
            if fi is None:
                layout.parse_shard_rel_path(rel)
                fi = file_of[rel] = len(file_of)
            if n < 1:
                raise ValueError(f"{url}: manifest row of {doc_id!r} has token count {n}")
            file_col.append(fi)
            len_col.append(n)
            chunk.append(doc_id.encode("utf-8"))
            if len(chunk) == _ID_CHUNK:
                id_chunks.append(np.array(chunk, dtype=np.bytes_))
                chunk = []
    if chunk or not id_chunks:
        id_chunks.append(np.array(chunk, dtype=np.bytes_) if chunk else np.empty(0, dtype="S1"))
    ids = np.concatenate(id_chunks) if len(id_chunks) > 1 else id_chunks[0]
    length = np.frombuffer(len_col, dtype=np.int64).copy()
    manifest_file = np.frombuffer(file_col, dtype=np.int64).copy()
    return ids, length, manifest_file, file_of


def _check_shards(fs, root: str, url: str, rel_paths: Sequence[str], counts: np.ndarray, dtype: np.dtype,
                  dtype_name: str) -> None:
    """Every file the manifest names is inside the tree, exists, and holds its rows' tokens."""
    names_in = Tree(url)  # every file read resolves inside the tree (no link out of it)
    for rel in rel_paths:
        names_in.path(rel, "manifest row")
    sizes = _sizes(fs, root, sorted({r.split("/", 1)[0] for r in rel_paths}))
    for rel, count in zip(rel_paths, counts, strict=True):
        if rel not in sizes:
            raise FileNotFoundError(f"{url}: the manifest names {rel}, which does not exist")
        if sizes[rel] != count * dtype.itemsize:
            raise ValueError(
                f"{url}: {rel} holds {sizes[rel]} bytes, the manifest's rows sum to {count} tokens "
                f"({count * dtype.itemsize} bytes of {dtype_name}); the tree is damaged or being rewritten"
            )


def _open_indexed(fs, root: str, url: str, stats: manifest.DatasetStats, record) -> ShardTree | None:
    """The tree through its reader index (shards.index): mapped, not parsed, so opening costs the
    same for ten documents or ten million. A remote tree's index is copied to a local file first
    (once per machine and version of the index: shards.index.local_copy), then mapped alike. None
    (parse the manifest) when the record does not list an index or the index does not describe
    this manifest."""
    path = posixpath.join(root, reader_index.INDEX_NAME)
    listed = record is not None and reader_index.INDEX_NAME in record.derived
    local = isinstance(fs, LocalFileSystem)
    if not (listed and fs.isfile(path) and not (local and os.path.islink(path))):
        return None
    try:
        mapped = path if local else reader_index.local_copy(fs, path, storage.join(url, reader_index.INDEX_NAME))
        index = reader_index.open_index(mapped)
    except ValueError:
        return None  # another version's, or damaged: verify says so; the manifest still opens the tree
    except OSError as e:  # the local cache cannot hold a copy (read-only home, full disk): parse the manifest
        log.warning("%s: no local copy of its reader index (%s); reading its manifest instead", url, e)
        return None
    if index.manifest_bytes != fs.size(posixpath.join(root, layout.MANIFEST_NAME)):
        return None  # the manifest changed after the index was written
    dtype = layout.DTYPES[stats.dtype]
    sizes = _sizes(fs, root, sorted({r.split("/", 1)[0] for r in index.files}))
    for rel, count in zip(index.files, index.file_tokens.tolist(), strict=True):
        if sizes.get(rel) != count * dtype.itemsize:
            return None  # the shards are not those the index describes: the manifest decides
    store = TokenStore(fs, root, index.files, index.file_tokens, dtype)
    return ShardTree(url, "bucketed", store, IndexedDocuments(mapped, index), stats.eos_id, stats)


class IndexedIds:
    """The ids column of a reader index: ``ids[i]`` is document i's id (UTF-8 bytes)."""

    def __init__(self, index):
        self._index = index

    def __len__(self) -> int:
        return self._index.documents

    def __getitem__(self, i: int) -> bytes:
        return self._index.id(int(i))

    def __iter__(self) -> Iterator[bytes]:
        return (self._index.id(i) for i in range(self._index.documents))


class IndexedDocuments(Documents):
    """Documents whose columns are views of a mapped reader index; pickled as the index's path
    (a DataLoader worker maps it again), and found by id through the index's hash table."""

    def __init__(self, path: str, index=None):
        self._path = path
        index = index if index is not None else reader_index.open_index(path)
        self._index = index
        n = index.documents
        # Plain arrays over the map (slicing np.memmap itself costs ten times as much).
        columns = (np.asarray(c) for c in (index.start, index.length, index.file, index.bucket, index.partition))
        super().__init__(IndexedIds(index), *columns,
                         np.broadcast_to(np.int8(-1), (n,)))

    def __getstate__(self):
        return {"path": self._path}

    def __setstate__(self, state):
        self.__init__(state["path"])

    def index_of(self, doc_id: str) -> int:
        row = self._index.find(doc_id.encode("utf-8"))
        if row is None:
            raise KeyError(f"no document with id {doc_id!r} in this tree")
        return row


def _bucket_indices(lengths: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(layout.BUCKET_BOUNDS, dtype=np.int64), lengths, side="left").astype(np.int8)


def open_llmc(files: Mapping[str, Sequence[str]]) -> ShardTree:
    """Open loose llm.c shard files, ``{"train": [paths...], "val": [paths...]}``, in the order given.

    For files outside a finished tree (e.g. a downloaded copy of the published dataset); each
    file's header count must match its size.
    """
    unknown = [s for s in files if s not in llmc.SPLITS]
    if unknown:
        raise ValueError(f"splits must be among {llmc.SPLITS}, got {unknown}")
    urls = [storage.normalize(p) for s in llmc.SPLITS for p in files.get(s, ())]
    if not urls:
        raise ValueError("no llm.c shard files given")
    fs, _ = storage.filesystem(urls[0])
    rels = {s: [storage.filesystem(storage.normalize(p))[1] for p in files.get(s, ())] for s in llmc.SPLITS}
    return _open_llmc(fs, "", ",".join(urls), rels)


def _open_llmc(fs, root: str, url: str, files: Mapping[str, Sequence[str]]) -> ShardTree:
    rel_paths, counts, split_of_file = [], [], []
    for split in llmc.SPLITS:
        for rel in files.get(split, ()):
            path = posixpath.join(root, rel) if root else rel
            with fs.open(path, "rb") as f:
                count = llmc.parse_header(f.read(llmc.HEADER_BYTES), path)
            body = fs.size(path) - llmc.HEADER_BYTES
            if body != count * llmc.TOKEN_DTYPE.itemsize:
                raise ValueError(f"{path}: header says {count} tokens, the file holds {body} bytes of tokens")
            rel_paths.append(rel)
            counts.append(count)
            split_of_file.append(llmc.SPLITS.index(split))
    if not rel_paths:
        raise ValueError(f"{url} holds no llm.c shard files (train/shard_NNN.bin, val/shard_NNN.bin)")
    store = TokenStore(fs, root, rel_paths, counts, llmc.TOKEN_DTYPE, header_bytes=llmc.HEADER_BYTES)
    start, length, split = _llmc_documents(store, split_of_file, url)
    ids = np.concatenate([
        np.char.add(f"{llmc.SPLITS[s]}:".encode(), np.arange(np.count_nonzero(split == s)).astype(np.bytes_))
        for s in np.unique(split).tolist()
    ]) if len(split) else np.empty(0, dtype="S1")
    documents = Documents(
        ids=ids,
        start=start,
        length=length,
        file=(np.searchsorted(store.starts, start, side="right") - 1).astype(np.int32),
        bucket=_bucket_indices(length),
        partition=np.full(len(length), -1, dtype=np.int32),
        split=split,
    )
    return ShardTree(url, kinds.SCAFFOLD.name, store, documents, llmc.GPT2_EOT)


def _llmc_documents(store: TokenStore, split_of_file: Sequence[int], url: str) -> tuple[np.ndarray, ...]:
    """Start, length and split of every document of llm.c shards, found by scanning each split's
    stream for EOT (``_SCAN_TOKENS`` at a time); a ValueError when a split does not end with one."""
    starts, lengths, splits = [], [], []
    for split_index in range(len(llmc.SPLITS)):
        in_split = [i for i, s in enumerate(split_of_file) if s == split_index]
        if not in_split:
            continue
        lo, hi = int(store.starts[in_split[0]]), int(store.starts[in_split[-1] + 1])
        if lo == hi:
            continue
        ends = [np.flatnonzero(store.read(a, min(a + _SCAN_TOKENS, hi)) == llmc.GPT2_EOT) + a
                for a in range(lo, hi, _SCAN_TOKENS)]
        ends = np.concatenate(ends)
        if len(ends) == 0 or ends[-1] != hi - 1:
            raise ValueError(
                f"{url}: the {llmc.SPLITS[split_index]} split does not end with EOT {llmc.GPT2_EOT}; "
                "its last document is cut off"
            )
        doc_start = np.concatenate(([lo], ends[:-1] + 1))
        starts.append(doc_start)
        lengths.append(ends + 1 - doc_start)
        splits.append(np.full(len(ends), split_index, dtype=np.int8))
    # Splits and their files are laid out in order, so this is storage order already.
    return np.concatenate(starts), np.concatenate(lengths), np.concatenate(splits)
