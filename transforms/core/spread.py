"""SpreadEvenly: a job's units of work, costliest first, reshuffled over the workers.

``beam.Create(units)`` followed by ``beam.Reshuffle()`` leaves which worker gets which unit to
chance: with 26 input units of 2-9 MB of text, the two worker processes of a local train-bpe run
counted for 13.1 and 10.7 CPU seconds, and the run waited for the slower one. Here the units enter
the reshuffle in one bundle, costliest first. A runner that deals the reshuffled elements out in
turn, in the order they came (the FnApiRunner's worker processes; Flink, where Beam translates a
Reshuffle to a rebalance: not run here), so gives every worker a share within one unit's cost of the
others'. Runners that balance work themselves (Dataflow) see the same Reshuffle as before. Which
worker does a unit never changes what the unit gives, so the output is the same bytes either way.

    units = pipeline | "SpreadInputUnits" >> SpreadEvenly(read.units, cost=unit_cost)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import apache_beam as beam


def costliest_first(items: Sequence, cost: Callable[[object], float]) -> list:
    """``items`` by descending cost; ties keep their order (sorted is stable, reversed too)."""
    return sorted(items, key=cost, reverse=True)


class SpreadEvenly(beam.PTransform):
    """The items (known at construction), each a unit of a worker's work, out in a reshuffle that
    they enter costliest first."""

    def __init__(self, items: Sequence, cost: Callable[[object], float]):
        super().__init__()
        self._items = costliest_first(items, cost)

    def expand(self, pbegin):
        return (
            pbegin
            # One bundle, in this order: Create's own reshuffle would mix the order first.
            | "ListCostliestFirst" >> beam.Create(self._items, reshuffle=False)
            | "Reshuffle" >> beam.Reshuffle()
        )
