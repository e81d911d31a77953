"""DropRemoved: documents whose id is on a removal list leave before they are tokenized.

The sources are removal lists (ids one per line, no comment syntax) and output trees, whose
removals.txt is read as their audit log (the output's own among them, so a re-run into an output
that had documents removed from it keeps them out). Each source is read by
``shards.removal.read_removal_list``: a file is a list, a directory a tree, never guessed from content.

Each is counted with the reason ``removed``; a digest of each id that matched goes to a second
output so the job can count the listed ids that never appeared in the input.
"""

from __future__ import annotations

import hashlib

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from shards.removal import read_removal_list
from transforms.core.batches import DocBatch
from transforms.core.drops import Drops
from transforms.core.records import DROPPED

MATCHED = "matched"
REMOVED = "removed"


def matched_key(doc_id: str) -> str:
    """What the ``matched`` output carries for a listed id seen: its sha256 (hex), not the id. The
    job counts the distinct ones, and the per-unit outputs are saved work (a unit's completion
    marker under .pretokenize-tmp/), which would otherwise hold the ids of the very documents
    removed, in the tree, after a killed run."""
    return hashlib.sha256(doc_id.encode("utf-8")).hexdigest()


class DropRemovedFn(beam.DoFn):
    def __init__(self, sources: tuple[str, ...]):
        self._sources = sources

    def setup(self):
        # Read once per worker from the lists' URLs: nothing large travels in the pickled DoFn.
        self._ids = pa.array(sorted({i for url in self._sources for i in read_removal_list(url)}), pa.string())
        self._drops = Drops()

    def process(self, batch: DocBatch):
        listed = pc.is_in(batch.table.column("id"), value_set=self._ids).to_numpy(zero_copy_only=False)
        n = int(listed.sum())
        if not n:
            yield batch
            return
        yield self._drops(REMOVED, n)
        for doc_id in batch.table.column("id").filter(pa.array(listed)).to_pylist():
            yield beam.pvalue.TaggedOutput(MATCHED, matched_key(doc_id))
        if n < batch.size:
            yield batch.filter(pa.array(~listed))


class DropRemoved(beam.PTransform):
    """DocBatches in; outputs: main (kept), ``dropped`` (("removed", n)), ``matched`` (matched_key of
    each listed id seen).

    Example::

        result = docs | "DropRemoved" >> DropRemoved("gs://bucket/removal.txt", "out/removals.txt")
        kept, reasons, seen = result.kept, result.dropped, result.matched
    """

    def __init__(self, *sources: str):
        super().__init__()
        # A missing or unreadable list fails at launch.
        self.ids = list(dict.fromkeys(i for url in sources for i in read_removal_list(url)))
        self._sources = sources

    def expand(self, docs):
        return docs | "MatchRemovalList" >> beam.ParDo(DropRemovedFn(self._sources)).with_outputs(
            DROPPED, MATCHED, main="kept"
        )
