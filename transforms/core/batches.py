"""The elements of the core: batches of documents, of tokens and of references, never one document.

A Beam element costs tens of microseconds in a runner, whatever it holds; a short document costs
less than that to tokenize. So documents travel in batches: per-element overhead is paid per
batch, and a runner that keeps a shuffle's input in memory (the FnApiRunner does) holds a few
compact arrays per (bundle, group), not an object per document.

    DocBatch    documents of one input file: Arrow columns (``row``, ``id``, ``text`` and the job's
                other fields), filtered with pyarrow.compute
    TokenBatch  the same documents tokenized: their tokens end to end in one array, a length each
    RefBatch    where some spilled documents' tokens are and where they sort: what is shuffled
    Refs        many RefBatches as one set of columns, for the step that writes a group's files
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class DocBatch(NamedTuple):
    """Documents read from one input file, in its order. ``table`` has ``row`` (int64, the row in
    the file), ``id`` and ``text`` (strings), and whatever other fields the job reads."""

    source: str
    table: pa.RecordBatch

    @property
    def size(self) -> int:
        return self.table.num_rows

    def filter(self, mask) -> DocBatch:
        return DocBatch(self.source, self.table.filter(mask))

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()


class TokenBatch(NamedTuple):
    """Tokenized documents (or sequences) of one input file: ``tokens`` holds them end to end,
    each with its EOS; ``extra`` holds per-document columns a job adds (numpy arrays)."""

    source: str
    ids: list[str]
    rows: np.ndarray  # int64
    lengths: np.ndarray  # int64, tokens per document, EOS included
    tokens: np.ndarray  # the output dtype
    extra: dict[str, np.ndarray] = {}

    @property
    def size(self) -> int:
        return len(self.ids)


class RefBatch(NamedTuple):
    """References to documents spilled from one TokenBatch into one spill file: the shuffled element."""

    spill_path: str
    source: str
    ids: list[str]
    sort_keys: np.ndarray  # int64, a seeded 63-bit hash of the id
    lengths: np.ndarray  # int64 tokens
    offsets: np.ndarray  # int64 bytes into the spill file
    rows: np.ndarray  # int64 row in the source file
    extra: dict[str, np.ndarray] = {}

    @property
    def size(self) -> int:
        return len(self.ids)

    def take(self, index: np.ndarray) -> RefBatch:
        ids = [self.ids[i] for i in index.tolist()]
        extra = {k: v[index] for k, v in self.extra.items()}
        return RefBatch(self.spill_path, self.source, ids, self.sort_keys[index], self.lengths[index],
                        self.offsets[index], self.rows[index], extra)


class Refs(NamedTuple):
    """References of a whole group as columns: ``spill`` and ``source`` index ``spill_paths`` and
    ``sources``. ``id_rank`` orders ids as Python orders the strings, ``source_rank`` the sources."""

    ids: np.ndarray  # object (str)
    sort_keys: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    rows: np.ndarray
    spill: np.ndarray  # int32 index into spill_paths
    source: np.ndarray  # int32 index into sources
    spill_paths: list[str]
    sources: list[str]
    extra: dict[str, np.ndarray]

    @property
    def size(self) -> int:
        return len(self.ids)

    @classmethod
    def concat(cls, batches: Sequence[RefBatch]) -> Refs:
        batches = [b for b in batches if b.size]
        paths = sorted({b.spill_path for b in batches})
        sources = sorted({b.source for b in batches})
        path_index = {p: i for i, p in enumerate(paths)}
        source_index = {s: i for i, s in enumerate(sources)}

        def cat(arrays, dtype):
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

        sizes = np.asarray([b.size for b in batches], np.int64)
        ids = np.empty(int(sizes.sum()), dtype=object)
        at = 0
        for b in batches:
            ids[at:at + b.size] = b.ids
            at += b.size
        extra_names = sorted(batches[0].extra) if batches else []
        return cls(
            ids=ids,
            sort_keys=cat([b.sort_keys for b in batches], np.int64),
            lengths=cat([b.lengths for b in batches], np.int64),
            offsets=cat([b.offsets for b in batches], np.int64),
            rows=cat([b.rows for b in batches], np.int64),
            spill=np.repeat(np.asarray([path_index[b.spill_path] for b in batches], np.int32), sizes),
            source=np.repeat(np.asarray([source_index[b.source] for b in batches], np.int32), sizes),
            spill_paths=paths,
            sources=sources,
            extra={k: cat([b.extra[k] for b in batches], batches[0].extra[k].dtype) for k in extra_names},
        )

    def take(self, index: np.ndarray) -> Refs:
        return self._replace(
            ids=self.ids[index], sort_keys=self.sort_keys[index], lengths=self.lengths[index],
            offsets=self.offsets[index], rows=self.rows[index], spill=self.spill[index],
            source=self.source[index], extra={k: v[index] for k, v in self.extra.items()},
        )

    def id_ranks(self) -> np.ndarray:
        """Each id's rank among the distinct ids, in Python's string order: ranked by Arrow over
        the ids' UTF-8 bytes, whose order is their code points' (Python's), at a third of the cost
        of numpy sorting the Python strings (a group of short documents is all ids)."""
        if not self.size:
            return np.zeros(0, np.int64)
        ranks = pc.rank(pa.array(self.ids, pa.large_string()), sort_keys="ascending", tiebreaker="dense")
        return ranks.to_numpy().astype(np.int64) - 1


def first_copies(refs: Refs, id_rank: np.ndarray) -> np.ndarray:
    """Indexes of one reference per id, the first by (input file, row): the rule that decides which
    copy of a repeated id is kept, in every job. Sources are ordered by name."""
    if not refs.size:
        return np.zeros(0, np.int64)
    order = np.lexsort((refs.rows, refs.source, id_rank))
    ranks = id_rank[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ranks[1:] != ranks[:-1]
    return np.sort(order[first])


def stream_order(refs: Refs, id_rank: np.ndarray) -> np.ndarray:
    """The order of documents in a group: the seeded sort key, ties broken by id, input file, row."""
    return np.lexsort((refs.rows, refs.source, id_rank, refs.sort_keys))
