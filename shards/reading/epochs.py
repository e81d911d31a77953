"""What an epoch is made of when it mixes sources: each source's share of the draws (``apportion``)
and which source, pass and item each draw takes (``EpochMix``); and the check that a saved state
belongs to the sampler or loader it is loaded into (``refuse_other_fingerprint``)."""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence

import numpy as np

from shards.reading.hashes import Permutation


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
