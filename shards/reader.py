"""Read a finished output tree for training: documents by id, and windows of S+1 tokens that carry
their document boundaries.

    tree = open_tree("out/finepdfs")                       # local (memory-mapped) or any fsspec URL
    tree.document("<urn:uuid:...>")                        # one document's tokens, EOS included
    sampler = tree.sampler(seq_len=4096, seed=0, split="train", val_fraction=0.01,
                           weights={"8192": 1, "32768": 3})
    w = sampler.window(0)                                  # w.inputs, w.targets, w.cu_seqlens, w.position_ids
    b = sampler.batch(0, batch_size=8)                     # the same, stacked (cu_seqlens flattened)

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
EOS), a window of S+1 tokens starts at ``floor(u * (N - S - 1))``, its first S tokens are the
inputs and its last S the targets. ``u`` comes from a generator keyed by the seed and the window's
index, so window k is the same on every run, machine and numpy version, whichever rank or worker
draws it, and a run resumes from an index alone. With per-bucket weights, each window first draws
its bucket (probability proportional to the weight), then its start within that bucket's stream.
``align_to_docs`` starts every window at a document start, each eligible document equally likely.

Only numpy here (and fsspec for remote trees): no Beam, no torch.
"""

from __future__ import annotations

import hashlib
import posixpath
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shards import layout, llmc, manifest, storage

SPLITS = ("train", "val", "all")
# Rows parsed into one numpy chunk of ids at a time, so parsing a large manifest stays compact.
_ID_CHUNK = 1 << 18
# Tokens scanned for EOT at a time when finding llm.c document boundaries.
_SCAN_TOKENS = 1 << 24


class IncompleteTreeError(FileNotFoundError):
    """The directory is not a finished output tree: its commit marker is missing."""


# ---------------------------------------------------------------------------------------------
# Stable hashes for the split and the window generator. Each has its own BLAKE2b personalisation,
# so neither correlates with the partition or shuffle hashes of shards.layout.


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
    """

    inputs: np.ndarray  # (S,) int64
    targets: np.ndarray  # (S,) int64
    cu_seqlens: np.ndarray  # (pieces + 1,) int32
    position_ids: np.ndarray  # (S,) int64
    doc_index: np.ndarray  # (pieces,) int64
    first_offset: int
    bucket: str | None  # the weighted bucket it was drawn from; None without weights
    start: int  # its first token's position in that stream


class Batch(NamedTuple):
    """Windows stacked; ``cu_seqlens`` runs over the B*S tokens flattened, as flash-attn's varlen API takes."""

    inputs: np.ndarray  # (B, S) int64
    targets: np.ndarray  # (B, S) int64
    position_ids: np.ndarray  # (B, S) int64
    cu_seqlens: np.ndarray  # (pieces + 1,) int32
    max_seqlen: int
    windows: tuple[Window, ...]


def stack_windows(windows: Sequence[Window]) -> Batch:
    if not windows:
        raise ValueError("a batch needs at least one window")
    s = len(windows[0].inputs)
    cu = [w.cu_seqlens[:-1].astype(np.int64) + i * s for i, w in enumerate(windows)]
    cu.append(np.array([len(windows) * s], dtype=np.int64))
    cu_seqlens = np.concatenate(cu).astype(np.int32)
    return Batch(
        inputs=np.stack([w.inputs for w in windows]),
        targets=np.stack([w.targets for w in windows]),
        position_ids=np.stack([w.position_ids for w in windows]),
        cu_seqlens=cu_seqlens,
        max_seqlen=int(np.diff(cu_seqlens).max()),
        windows=tuple(windows),
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
            m = np.memmap(self.path(i), dtype=self.dtype, mode="r", offset=self.header_bytes, shape=(self.count(i),))
            self._maps[i] = m
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
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
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
        self.kind = kind  # "bucketed" or "llmc"
        self.store = store
        self.documents = documents
        self.eos_id = eos_id
        self.stats = stats

    def __len__(self) -> int:
        return len(self.documents)

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
        if self.kind == "llmc":
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
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        d = self.documents
        keep = np.ones(len(d), dtype=bool)
        if split != "all":
            val = self.is_validation(val_fraction)
            keep &= val if split == "val" else ~val
        elif val_fraction and self.kind == "llmc":
            self.is_validation(val_fraction)  # the same clear error
        if buckets is not None:
            names = list(buckets)
            unknown = [b for b in names if b not in layout.BUCKET_NAMES]
            if unknown:
                raise ValueError(f"unknown bucket(s) {unknown}; buckets are {list(layout.BUCKET_NAMES)}")
            keep &= np.isin(d.bucket, [layout.BUCKET_NAMES.index(b) for b in names])
        if partitions is not None:
            keep &= np.isin(d.partition, np.asarray(list(partitions), dtype=np.int64))
        return np.flatnonzero(keep)

    def sampler(self, seq_len: int, seed: int = 0, *, split: str = "train", val_fraction: float = 0.0,
                buckets: Iterable[str] | None = None, partitions: Iterable[int] | None = None,
                weights: Mapping[str, float] | None = None, align_to_docs: bool = False) -> WindowSampler:
        return WindowSampler(self, seq_len, seed, split=split, val_fraction=val_fraction, buckets=buckets,
                             partitions=partitions, weights=weights, align_to_docs=align_to_docs)


# ---------------------------------------------------------------------------------------------
# Streams of selected documents, and the window sampler.


class DocumentStream:
    """Selected documents laid end to end: N tokens, with runs of documents adjacent on disk read
    in one piece."""

    def __init__(self, tree: ShardTree, rows: np.ndarray, name: str | None = None):
        self.tree = tree
        self.rows = np.asarray(rows, dtype=np.int64)
        self.name = name
        d = tree.documents
        lengths = d.length[self.rows]
        self.vstart = np.zeros(len(self.rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.vstart[1:])
        gstart = d.start[self.rows]
        # A run starts wherever a document does not follow the previous one on disk.
        breaks = np.ones(len(self.rows), dtype=bool)
        if len(self.rows) > 1:
            breaks[1:] = gstart[1:] != gstart[:-1] + lengths[:-1]
        first = np.flatnonzero(breaks)
        self.run_vstart = np.append(self.vstart[first], self.vstart[-1])
        self.run_gstart = gstart[first]

    @property
    def tokens(self) -> int:
        return int(self.vstart[-1])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of this stream."""
        if not 0 <= start <= stop <= self.tokens:
            raise IndexError(f"range [{start}, {stop}) is outside a stream of {self.tokens} tokens")
        r = int(np.searchsorted(self.run_vstart, start, side="right")) - 1
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

    def window_at(self, start: int, seq_len: int) -> Window:
        """The window of seq_len + 1 tokens starting at ``start`` of this stream."""
        stop = start + seq_len
        tokens = self.read(start, stop + 1).astype(np.int64)
        lo = int(np.searchsorted(self.vstart, start, side="right")) - 1
        hi = int(np.searchsorted(self.vstart, stop, side="left"))  # documents starting before the inputs end
        cu = np.empty(hi - lo + 1, dtype=np.int32)
        cu[0] = 0
        cu[1:-1] = self.vstart[lo + 1:hi] - start
        cu[-1] = seq_len
        position_ids = np.arange(seq_len, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), np.diff(cu))
        return Window(
            inputs=tokens[:-1],
            targets=tokens[1:],
            cu_seqlens=cu,
            position_ids=position_ids,
            doc_index=self.rows[lo:hi],
            first_offset=start - int(self.vstart[lo]),
            bucket=self.name,
            start=start,
        )


class WindowSampler:
    """Seeded windows of ``seq_len + 1`` tokens over the selected documents of a tree.

    Window k depends only on (tree, selection, seq_len, seed, k): ``window(k)`` is random access,
    and ``batch(b, B)`` holds windows b*B .. b*B + B - 1.
    """

    def __init__(self, tree: ShardTree, seq_len: int, seed: int = 0, *, split: str = "train",
                 val_fraction: float = 0.0, buckets: Iterable[str] | None = None,
                 partitions: Iterable[int] | None = None, weights: Mapping[str, float] | None = None,
                 align_to_docs: bool = False):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.tree = tree
        self.seq_len = seq_len
        self.seed = seed
        self.align_to_docs = align_to_docs
        buckets = None if buckets is None else list(buckets)
        rows = tree.select(split, val_fraction, buckets, partitions)
        if weights is None:
            self.streams = [DocumentStream(tree, rows)]
            self.cumulative = np.array([1.0])
        else:
            unknown = [b for b in weights if b not in layout.BUCKET_NAMES]
            if unknown:
                raise ValueError(f"weights name unknown bucket(s) {unknown}; buckets are {list(layout.BUCKET_NAMES)}")
            if any(not np.isfinite(w) or w < 0 for w in weights.values()):
                raise ValueError(f"weights must be finite and >= 0, got {dict(weights)}")
            named = [b for b in layout.BUCKET_NAMES if weights.get(b, 0) > 0]
            if not named:
                raise ValueError("at least one bucket needs a weight above 0")
            bucket_of_row = tree.documents.bucket[rows]
            self.streams = [
                DocumentStream(tree, rows[bucket_of_row == layout.BUCKET_NAMES.index(b)], b) for b in named
            ]
            w = np.array([weights[b] for b in named], dtype=np.float64)
            self.cumulative = np.cumsum(w) / w.sum()
            self.cumulative[-1] = 1.0
        self._eligible = []
        for stream in self.streams:
            if stream.tokens < seq_len + 2:
                where = f" of bucket {stream.name}" if stream.name else ""
                raise ValueError(
                    f"the selected {split} documents{where} hold {stream.tokens} tokens; windows of {seq_len} + 1 "
                    f"tokens need a stream of at least {seq_len + 2}"
                )
            # Documents a window may start at: those with seq_len + 1 tokens of stream from their start on.
            self._eligible.append(int(np.searchsorted(stream.vstart[:-1], stream.tokens - seq_len - 1, side="right")))

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    def window(self, index: int) -> Window:
        u_bucket, u_start = window_uniforms(self.seed, index)
        k = int(np.searchsorted(self.cumulative, u_bucket, side="right")) if len(self.streams) > 1 else 0
        stream = self.streams[k]
        if self.align_to_docs:
            doc = int(u_start * self._eligible[k])
            start = int(stream.vstart[doc])
        else:
            start = int(u_start * (stream.tokens - self.seq_len - 1))
        return stream.window_at(start, self.seq_len)

    def batch(self, index: int, batch_size: int) -> Batch:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        first = index * batch_size
        return stack_windows([self.window(first + j) for j in range(batch_size)])

    def windows(self, start: int = 0, step: int = 1) -> Iterator[Window]:
        """Windows start, start + step, ... without end."""
        index = start
        while True:
            yield self.window(index)
            index += step

    def batches(self, batch_size: int, start: int = 0, step: int = 1) -> Iterator[Batch]:
        index = start
        while True:
            yield self.batch(index, batch_size)
            index += step


# ---------------------------------------------------------------------------------------------
# Opening trees.


def _read_text(fs, path: str) -> str:
    with fs.open(path, "r", encoding="utf-8") as f:
        return f.read()


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


def _require_marker(fs, root: str, url: str) -> None:
    if not fs.exists(posixpath.join(root, layout.STATS_NAME)):
        raise IncompleteTreeError(
            f"{url} has no {layout.STATS_NAME}, so it is not a finished output tree: the job writes that file "
            "last, as its commit point, and a tree without it may still be publishing, may have died midway, "
            "or may be in the middle of a removal. Finish or re-run the job that writes it, then open it again."
        )


def open_tree(url: str) -> ShardTree:
    """Open a finished output tree of the bucketed or the scaffold (llm.c) job, local or fsspec."""
    url = storage.normalize(url)
    fs, root = storage.filesystem(url)
    root = root.rstrip("/") or "/"
    if not fs.isdir(root):
        raise FileNotFoundError(f"{url} is not a directory")
    _require_marker(fs, root, url)
    if fs.exists(posixpath.join(root, layout.MANIFEST_NAME)):
        return _open_bucketed(fs, root, url)
    if any(fs.isdir(posixpath.join(root, s)) for s in llmc.SPLITS):
        files = {}
        for split in llmc.SPLITS:
            d = posixpath.join(root, split)
            if fs.isdir(d):
                names = sorted((posixpath.basename(p) for p in fs.glob(posixpath.join(d, "shard_*.bin"))),
                               key=_shard_number)
                files[split] = [f"{split}/{n}" for n in names]
        return _open_llmc(fs, root, url, files)
    raise ValueError(f"{url} has neither {layout.MANIFEST_NAME} nor train/ or val/ llm.c shards")


def _shard_number(name: str) -> int:
    """``shard_012.bin`` -> 12: llm.c shards in stream order, whatever the width of their numbers."""
    digits = name[len("shard_"):-len(".bin")]
    if not digits.isdigit():
        raise ValueError(f"{name} is not an llm.c shard name (shard_NNN.bin)")
    return int(digits)


def _open_bucketed(fs, root: str, url: str) -> ShardTree:
    stats = manifest.DatasetStats.from_text(_read_text(fs, posixpath.join(root, layout.STATS_NAME)))
    dtype = layout.DTYPES[stats.dtype]
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
    del file_col, len_col

    # Files in layout order: bucket, partition, rolling index.
    rel_paths = sorted(file_of, key=lambda r: (layout.BUCKET_NAMES.index((n := layout.parse_shard_rel_path(r)).bucket),
                                               n.partition, n.index))
    rank = np.empty(len(rel_paths), dtype=np.int64)
    for new, rel in enumerate(rel_paths):
        rank[file_of[rel]] = new
    file = rank[manifest_file] if len(manifest_file) else manifest_file
    counts = np.bincount(file, weights=length, minlength=len(rel_paths)).astype(np.int64)

    sizes = _sizes(fs, root, sorted({r.split("/", 1)[0] for r in rel_paths}))
    for rel, count in zip(rel_paths, counts, strict=True):
        if rel not in sizes:
            raise FileNotFoundError(f"{url}: the manifest names {rel}, which does not exist")
        if sizes[rel] != count * dtype.itemsize:
            raise ValueError(
                f"{url}: {rel} holds {sizes[rel]} bytes, the manifest's rows sum to {count} tokens "
                f"({count * dtype.itemsize} bytes of {stats.dtype}); the tree is damaged or being rewritten"
            )
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
    start = np.concatenate(starts)
    length = np.concatenate(lengths)
    split = np.concatenate(splits)
    ids = np.concatenate([
        np.char.add(f"{llmc.SPLITS[s[0]]}:".encode(), np.arange(len(s)).astype(np.bytes_)) for s in splits
    ])
    documents = Documents(
        ids=ids,
        start=start,
        length=length,
        file=(np.searchsorted(store.starts, start, side="right") - 1).astype(np.int32),
        bucket=_bucket_indices(length),
        partition=np.full(len(length), -1, dtype=np.int32),
        split=split,
    )
    return ShardTree(url, "llmc", store, documents, llmc.GPT2_EOT)
