"""Selected documents laid end to end as one stream of tokens (``DocumentStream``), the windows of
S+1 tokens read from it (``DocumentStream.window_at``, ``batch_at``), and where an epoch cuts it
into windows (``WindowCut``). A selection is held as runs of consecutive rows (``runs_of_rows``,
``runs_of_mask``, ``join_runs``), never a row per document.

A stream reads its tree through ``tree.documents`` (the ``start`` and ``length`` columns),
``tree.store`` and ``tree.dtype``: any ShardTree (shards.reading.shard_tree, which imports this
module, so the tree is not named here).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shards.reading.records import Batch, Window


class DocumentStream:
    """Selected documents laid end to end: N tokens.

    The selection is held as runs of consecutive rows ``(lo, hi)``; a tree's rows are in storage
    order, each document right after the one before, so a run is one stretch of the token files,
    read in one piece. A whole tree, a bucket or a set of partitions is a few runs, so a stream costs
    memory by its runs, not by its documents: where a document starts is looked up in the tree's
    ``start`` column (a binary search in a mapped index touches a few pages).
    """

    def __init__(self, tree, runs: np.ndarray, name: str | None = None):
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
    def of_rows(cls, tree, rows: np.ndarray, name: str | None = None) -> DocumentStream:
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
