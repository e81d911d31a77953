"""The merge learner: the chapter's BPE rule, computed incrementally.

The rule (the data-and-tokenisation chapter): the corpus is a table of words ``w`` with counts
``n_w``, each word a sequence of symbol ids. The count of a pair is

    count(a b) = sum over words of n_w * (number of positions i with w_i = a and w_i+1 = b)

(every position, so "a a a" holds the pair "a a" twice). Each step merges the pair with the
highest count into a new symbol, whose id is the next one (the base size plus the step's index),
replacing its occurrences in every word from left to right ("a a a" becomes "aa a"). Ties go to
the smaller pair of ids: the smaller ``a``, then the smaller ``b``. Learning stops after the
requested number of merges, or earlier when no word has two symbols left.

How it is computed, so that a step costs what it changes rather than the size of the corpus:

1. Every pair's count is computed once, with the list of words it occurs in.
2. A heap holds ``(-count, pair)`` entries, the pair as one int (``a << 32 | b``, so the order of
   the ints is the order of the pairs). A count only ever falls, except for the pairs a merge
   creates, which are new and are pushed when they are counted. So an entry is never below its
   pair's count: the entry popped is taken only if it still equals the count; otherwise it is
   pushed again with the current count (or dropped at zero). The first entry that holds is the
   most frequent pair, ties in id order.
3. A merge visits only the words its pair occurs in, and updates counts only around each
   occurrence: the pairs on either side of it are taken away, the pairs with the new symbol are
   added. A word listed for a pair it no longer holds (the lists are not pruned) is visited and
   left as it is.

Nothing here imports Beam. ``tests/transforms/bpe/test_bpe_learn.py`` checks it merge for merge against the
chapter's loop written plainly (recount everything each step).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

# A pair (a, b) as one int: a << SHIFT | b. Ordering these ints orders pairs by a, then b.
SHIFT = 32
MASK = (1 << SHIFT) - 1


@dataclasses.dataclass(frozen=True)
class Learned:
    """The merges, in order (merge k made id ``base_size + k``), and what they did to the words."""

    base_size: int
    merges: list[tuple[int, int]]
    symbols_before: int  # sum over words of count * length, in base symbols
    symbols_after: int  # the same once every merge is applied


def learn_merges(words: Sequence[Sequence[int]], counts: Sequence[int], base_size: int, n_merges: int,
                 on_merge=None) -> Learned:
    """Learn up to ``n_merges`` merges over ``words`` (lists of base ids below ``base_size``) with
    their ``counts``. ``on_merge(k, pair, count)`` is called after each merge (for progress)."""
    if n_merges < 0:
        raise ValueError(f"the number of merges must be >= 0, got {n_merges}")
    words = [list(w) for w in words]
    counts = list(counts)
    pair_counts: dict[int, int] = {}
    where: dict[int, list[int]] = {}
    symbols = 0
    for i, (w, n) in enumerate(zip(words, counts, strict=True)):
        symbols += n * len(w)
        for j in range(len(w) - 1):
            key = w[j] << SHIFT | w[j + 1]
            pair_counts[key] = pair_counts.get(key, 0) + n
            lst = where.get(key)
            if lst is None:
                where[key] = [i]
            elif lst[-1] != i:
                lst.append(i)
    symbols_before = symbols
    heap = [(-c, key) for key, c in pair_counts.items() if c > 0]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    new_id = base_size
    while len(merges) < n_merges and heap:
        neg, key = heapq.heappop(heap)
        current = pair_counts.get(key, 0)
        if current != -neg:
            if current > 0:
                heapq.heappush(heap, (-current, key))
            continue
        a, b = key >> SHIFT, key & MASK
        merges.append((a, b))
        symbols -= _apply(a, b, new_id, words, counts, pair_counts, where, heap)
        if on_merge is not None:
            on_merge(len(merges) - 1, (a, b), current)
        new_id += 1
    return Learned(base_size, merges, symbols_before, symbols)


def _apply(a: int, b: int, x: int, words: list[list[int]], counts: list[int], pair_counts: dict[int, int],
           where: dict[int, list[int]], heap: list) -> int:
    """Replace the pair (a, b) by ``x`` in every word listed for it; update the counts and lists,
    push the new pairs. Returns how many symbols the corpus lost (counts included)."""
    removed = 0
    ab = a << SHIFT | b
    created: set[int] = set()  # pairs with x: new, pushed once their counts are complete
    for i in where.pop(ab, ()):
        w = words[i]
        out = _merge_word(w, a, b, x, counts[i], i, pair_counts, where, created)
        if out is None:
            continue  # a stale entry: the word no longer holds the pair
        words[i] = out
        # The pair itself, once per occurrence (each made two symbols one); with a == b, "a a a"
        # held it twice and loses both.
        lost = (len(w) - len(out)) * counts[i]
        pair_counts[ab] = pair_counts.get(ab, 0) - lost
        removed += lost
    pair_counts.pop(ab, None)
    for k in created:
        heapq.heappush(heap, (-pair_counts[k], k))
    return removed


def _merge_word(w: list[int], a: int, b: int, x: int, c: int, i: int, pair_counts: dict[int, int],
                where: dict[int, list[int]], created: set[int]) -> list[int] | None:
    """Word ``w`` (the i-th, its count ``c``) with each (a, b) replaced by ``x``, left to right (each
    search going on at j + 2), the counts of the pairs on either side of each occurrence moved to
    the pairs with ``x``; None when the word no longer holds the pair."""
    last = len(w) - 1
    j = _find(w, a, b, 0, last)
    if j < 0:
        return None
    out: list[int] = []
    start = 0
    while j >= 0:
        out += w[start:j]
        # The pair on the left: (w[j-1], a) becomes (out[-1], x); out[-1] is x when the previous
        # occurrence ended right here, and then (w[j-1], a) is (b, a).
        if j:
            _move(pair_counts, where, created, w[j - 1] << SHIFT | a, out[-1] << SHIFT | x, c, i)
        out.append(x)
        nxt = _find(w, a, b, j + 2, last)
        # The pair on the right: (b, w[j+2]) becomes (x, w[j+2]), unless w[j+2] starts the next
        # occurrence (that occurrence's left side accounts for it).
        if j + 2 <= last and nxt != j + 2:
            r = w[j + 2]
            _move(pair_counts, where, created, b << SHIFT | r, x << SHIFT | r, c, i)
        start, j = j + 2, nxt
    out += w[start:]
    return out


def _find(w: list[int], a: int, b: int, start: int, last: int) -> int:
    """The first j >= ``start`` with (w[j], w[j+1]) == (a, b), or -1; ``last`` is len(w) - 1."""
    while start < last:
        try:
            j = w.index(a, start, last)
        except ValueError:
            return -1
        if w[j + 1] == b:
            return j
        start = j + 1
    return -1


def _move(pair_counts: dict[int, int], where: dict[int, list[int]], created: set[int], old: int, new: int,
          c: int, i: int) -> None:
    """One occurrence (weighing ``c``) of the pair ``old`` in word i becomes the pair ``new``: its
    count moves, and word i is listed for ``new`` (a pair this merge first makes gets a new list)."""
    pair_counts[old] = pair_counts.get(old, 0) - c
    pair_counts[new] = pair_counts.get(new, 0) + c
    if new not in created:
        created.add(new)
        where[new] = [i]
    elif where[new][-1] != i:
        where[new].append(i)
