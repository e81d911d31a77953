"""An opened tree (``ShardTree``): its documents by row and by id, selections of them (split,
validation fraction, buckets, partitions), its fingerprint, and the samplers over them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from shards import kinds, layout, manifest
from shards.reading.records import DocumentInfo
from shards.reading.samplers import LengthSampler, WindowSampler
from shards.reading.store import Documents, TokenStore
from shards.reading.streams import join_runs, runs_of_mask

SPLITS = ("train", "val", "all")
# Rows tested at a time when a sampler's selection is scanned into runs.
_SELECT_ROWS = 1 << 20


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
