"""The epoch samplers: ``WindowSampler`` (windows of S+1 tokens, epoch by epoch, or drawn with
replacement) and ``LengthSampler`` (batches of a fixed number of tokens, one bucket and sequence
length each), both pure functions of an index, resumable from one integer (``state_dict``).

A sampler reads its tree through ``tree.select_runs``, ``tree.buckets_held``, ``tree._selector``
(the same errors for bad arguments) and ``tree.fingerprint``: any ShardTree
(shards.reading.shard_tree, which imports this module for ``tree.sampler``, so the tree is not
named here).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from shards import layout
from shards.reading.epochs import EpochMix, as_json, refuse_other_fingerprint
from shards.reading.hashes import Permutation, window_uniforms
from shards.reading.records import Batch, Window
from shards.reading.streams import DocumentStream, WindowCut, batch_at


class _Epochs:
    """What both samplers share: each source's windows in a fresh permutation per pass, and
    iteration from a position, with the position as state (torchdata's ``Stateful`` protocol).

    A sampler is a pure function of the index; its iterators hand out indices from ``position``
    and advance it, so ``state_dict()`` is that position with the sampler's ``fingerprint()``
    (everything that decides which windows come at which index), and ``load_state_dict`` puts the
    iteration back there, refusing a state of another fingerprint (naming the first field that differs).
    """

    position: int
    tree: object  # a ShardTree (see the module docstring)
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

    def _take(self, tree, seed: int, split: str, val_fraction: float, buckets: Iterable[str] | None,
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

    def __init__(self, tree, seq_len: int, seed: int = 0, *, split: str = "train",
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

    def __init__(self, tree, tokens_per_batch: int, seed: int = 0, *, split: str = "train",
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


def bucket_streams(tree, names: Sequence[str], split: str, val_fraction: float,
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
