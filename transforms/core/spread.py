"""SpreadEvenly: a job's units of work, largest first, spread over the workers.

``beam.Reshuffle`` gives each element a random key. A local FnApiRunner with N worker processes
then hands the keys out in turn, so which worker gets which unit is chance: with 26 input units
of 2-9 MB of text, the two workers of a train-bpe run counted for 13.1 and 10.7 CPU seconds, and
the run waited for the slower one. Here each unit's key is its rank by cost, largest first, so a
runner that hands keys out in turn gives every worker a share within one unit's cost of the others.
A runner that balances work by itself (Dataflow) sees a plain reshuffle. Which worker does a unit
never changes what the unit gives, so the output is the same bytes either way.

    units = pipeline | "SpreadInputUnits" >> SpreadEvenly(read.units, cost=unit_cost)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.transforms.util import ReshufflePerKey


def largest_first(items: Sequence, cost: Callable[[object], float]) -> list[tuple[int, object]]:
    """``(rank, item)`` pairs, rank 0 the costliest item; ties keep the items' order."""
    order = sorted(range(len(items)), key=lambda i: (-cost(items[i]), i))
    return [(rank, items[i]) for rank, i in enumerate(order)]


class SpreadEvenly(beam.PTransform):
    """The items (known at construction), each a worker's work, keyed by ``largest_first`` and
    reshuffled on those keys; the items out, keys dropped."""

    def __init__(self, items: Sequence, cost: Callable[[object], float]):
        super().__init__()
        self._keyed = largest_first(items, cost)

    def expand(self, pbegin):
        return (
            pbegin
            # Not Create's own reshuffle, which would key the items at random again.
            | "ListByCost" >> beam.Create(self._keyed, reshuffle=False)
            | "ShuffleByRank" >> ReshufflePerKey()
            | "DropRanks" >> beam.Values()
        )
