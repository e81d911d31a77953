"""Removal's Beam steps (the rest of removal is shards/removal/, without Beam).

DropRemoved: in the jobs that read input, documents whose id a removal source lists (a list, or a
tree's removals.txt: ``shards.removal.lists.read_removal_list``) leave before they are tokenized,
counted as ``removed``; a digest of each id matched goes to a second output, so the job can count
the listed ids the input never held. RemoveDocuments (``pretokenize remove``): the plan's files
rewritten in parallel, then the removal finished once (shards/removal/__init__.py).
"""

from __future__ import annotations

import hashlib
import logging

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from shards import storage
from shards.removal import journal, rewrite
from shards.removal.journal import RemovalPlan
from shards.removal.lists import read_removal_list
from transforms.core.batches import DocBatch
from transforms.core.drops import Drops
from transforms.core.progress import Progress
from transforms.core.records import DROPPED

log = logging.getLogger(__name__)

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


class RewriteFileFn(beam.DoFn):
    """Rewrites the plan's k-th file; its rows are read from the plan's directory, on the output's
    filesystem, so the job graph holds no row."""

    def __init__(self, output: str, plan_url: str, itemsize: int):
        self._output = output
        self._plan_url = plan_url
        self._itemsize = itemsize
        self._rewritten = beam.metrics.Metrics.counter("pretokenize", "files_rewritten")

    def setup(self):
        with storage.reaching(self._output):
            self._plan = journal.read_plan(self._plan_url)
        self._progress = Progress("rewrite")

    def process(self, k: int):
        with storage.reaching(self._output):  # a store that fails: one line naming the tree
            plan = self._plan.file_plan(k)
            outcome, digest = rewrite.rewrite_file(self._output, plan, self._itemsize)
        self._rewritten.inc()
        self._progress.add(files=1)
        log.info("%s: %s", plan.rel_path, outcome)
        yield plan.rel_path, digest


class FinishRemovalFn(beam.DoFn):
    """Finishes the removal once every file is rewritten (shards.removal.rewrite.finish_removal)."""

    def __init__(self, output: str, plan_url: str):
        self._output = output
        self._plan_url = plan_url

    def process(self, outcomes: list[tuple[str, str | None]]):
        with storage.reaching(self._output):  # a store that fails: one line naming the tree
            stats = rewrite.finish_removal(self._output, journal.read_plan(self._plan_url), dict(outcomes))
        yield stats


class RemoveDocuments(beam.PTransform):
    """Rewrites the plan's files in parallel, then finishes the removal once all are done. Only the
    files' numbers travel in the job; workers read each file's rows from the plan's directory.

    Example::

        plan = shards.removal.journal.make_plan("out/", ids, run="r1", utc_time="2026-01-01T00:00:00Z")
        shards.removal.journal.write_journal("out/", plan)
        pipeline | "RemoveDocuments" >> RemoveDocuments("out/", plan, itemsize=4)
    """

    def __init__(self, output: str, plan: RemovalPlan, itemsize: int):
        super().__init__()
        self._output, self._plan_url, self._itemsize = output, plan.plan_url, itemsize
        self._count = len(plan.files)

    def expand(self, pbegin):
        return (
            pbegin
            | "ListAffectedFiles" >> beam.Create(list(range(self._count)))
            | "SpreadFiles" >> beam.Reshuffle()
            | "RewriteFiles" >> beam.ParDo(RewriteFileFn(self._output, self._plan_url, self._itemsize))
            | "CollectOutcomes" >> beam.combiners.ToList()
            | "FinishRemoval" >> beam.ParDo(FinishRemovalFn(self._output, self._plan_url))
        )
