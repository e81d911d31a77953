"""DropRemoved: documents whose id is on a removal list leave before they are tokenized.

Each is counted with the reason ``removed``; the ids that matched go to a second output so the
job can count the listed ids that never appeared in the input.
"""

from __future__ import annotations

import apache_beam as beam

from shards.removal import read_removal_list
from transforms.filter import DROPPED
from transforms.records import Document

MATCHED = "matched"
REMOVED = "removed"


class DropRemovedFn(beam.DoFn):
    def __init__(self, removal_list: str):
        self._url = removal_list
        self._removed = beam.metrics.Metrics.counter("pretokenize", f"dropped_{REMOVED}")

    def setup(self):
        # Read once per worker from the list's URL: nothing large travels in the pickled DoFn.
        self._ids = frozenset(read_removal_list(self._url))

    def process(self, doc: Document):
        if doc.id in self._ids:
            self._removed.inc()
            yield beam.pvalue.TaggedOutput(DROPPED, REMOVED)
            yield beam.pvalue.TaggedOutput(MATCHED, doc.id)
        else:
            yield doc


class DropRemoved(beam.PTransform):
    """Documents in; outputs: main (kept), ``dropped`` (reason strings), ``matched`` (listed ids seen).

    Example::

        result = docs | "DropRemoved" >> DropRemoved("gs://bucket/removal.txt")
        kept, reasons, seen = result.kept, result.dropped, result.matched
    """

    def __init__(self, removal_list: str):
        super().__init__()
        read_removal_list(removal_list)  # a missing or unreadable list fails at launch
        self._url = removal_list

    def expand(self, docs):
        return docs | "MatchRemovalList" >> beam.ParDo(DropRemovedFn(self._url)).with_outputs(
            DROPPED, MATCHED, main="kept"
        )
