"""One way to drop records: a Beam counter ``dropped_<reason>`` and a ``(reason, count)`` output.

Every step that leaves records out (a bad record, the language filter, a removal list, a copy of
an id, a scaffold document with too many words) says so through a Drops, so that the counters a
runner shows and the rows of ``dataset_stats.txt`` name the same reasons, and the publish step can
check that every record read was written or dropped.

    drops = Drops()
    ...
    yield drops("empty_text", 12)     # inside a DoFn's process(): 12 records dropped for one reason
"""

from __future__ import annotations

import apache_beam as beam

from transforms.core.records import DROPPED

NAMESPACE = "pretokenize"
# Every job keeps the first copy of a repeated id (by input file, then row) and drops the others.
DUPLICATE_ID = "duplicate_id"


class Drops:
    """Counts and reports dropped records by reason; build one per DoFn."""

    def __init__(self):
        self._counters: dict[str, object] = {}

    def __call__(self, reason: str, n: int = 1) -> beam.pvalue.TaggedOutput:
        counter = self._counters.get(reason)
        if counter is None:
            counter = self._counters[reason] = beam.metrics.Metrics.counter(NAMESPACE, f"dropped_{reason}")
        counter.inc(n)
        return beam.pvalue.TaggedOutput(DROPPED, (reason, int(n)))


class CountDrops(beam.PTransform):
    """``(reason, n)`` pairs from any number of steps in; ``(reason, total)`` out, one per reason."""

    def expand(self, pcolls):
        return pcolls | "CollectDrops" >> beam.Flatten() | "SumDrops" >> beam.CombinePerKey(sum)
