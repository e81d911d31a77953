"""ReadDocuments: the input's documents in DocBatches, from a file, a directory or a glob, local
or on any fsspec filesystem.

The input is planned at launch (transforms.inputs.plan.plan_input, which imports no Beam: a job's
bars appear before Beam is loaded): the pattern is expanded (transforms.inputs.discover), and each
file is planned by the format its name says (transforms.inputs.registry) into units of work,
checked as far as a launch can check them: every parquet footer is read and its schema checked.
So a missing column or a file that is not parquet fails the launch with a message naming the file,
before any worker starts and before anything is written. Workers then stream their unit in record
batches (``read_batches``), reading only the columns the job needs, and check before and after that
the file is the one planned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import apache_beam as beam
import pyarrow.compute as pc

from shards import storage
from transforms.core.batches import DocBatch
from transforms.core.drops import Drops
from transforms.core.progress import Planned, Progress
from transforms.core.records import DROPPED, BadRecord, Document
from transforms.core.spread import SpreadEvenly
from transforms.inputs.arrow import documents
from transforms.inputs.compression import StoredPosition
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_input
from transforms.inputs.registry import format_of
from transforms.inputs.units import InputUnit, check_unchanged, planned_work, unit_cost

log = logging.getLogger(__name__)

RECORDS = "records"


def read_batches(unit: InputUnit, config: ReadConfig,
                 position: StoredPosition | None = None) -> Iterator[DocBatch | BadRecord]:
    """The unit's documents in DocBatches, and its bad records (only under on_bad_record="skip");
    ``position`` follows how far into the file as stored a unit whose rows were not planned is read."""
    return format_of(unit.kind).read(unit, config, position)


def read_unit(unit: InputUnit, config: ReadConfig) -> Iterator[Document | BadRecord]:
    """The unit's documents one at a time (for tools and tests), and its bad records under
    on_bad_record="skip". A filter field whose name is one of Document's is filled in."""
    return documents(read_batches(unit, config), config)


class ReadUnitFn(beam.DoFn):
    """An input unit in; DocBatches out, ``(reason, n)`` per kind of bad record skipped, and the
    number of records read (documents and bad records) to output ``records``."""

    def __init__(self, config: ReadConfig, planned: Planned | None = None, progress_dir: str | None = None):
        self._config = config
        self._planned = planned
        self._progress_dir = progress_dir
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_read")

    def setup(self):
        self._progress = Progress("read", planned=self._planned, shared_dir=self._progress_dir)
        self._drops = Drops()
        self._reported = 0

    def process(self, unit: InputUnit):
        with storage.reaching(unit.path):
            yield from self._read(unit)

    def _read(self, unit: InputUnit):
        check_unchanged(unit)
        bad: dict[str, int] = {}
        records = 0
        stored = _StoredProgress(unit)
        for item in read_batches(unit, self._config, stored.position):
            if isinstance(item, BadRecord):
                bad[item.reason] = bad.get(item.reason, 0) + 1
                records += 1
                self._progress.add(bad_records=1, **stored.since())
                if self._reported < 20:
                    self._reported += 1
                    log.warning("skipping a bad record (%s): %s: %s", item.reason, item.where, item.problem)
                continue
            n = item.size
            records += n
            self._docs.inc(n)
            self._progress.add(documents=n, bytes=pc.sum(pc.binary_length(item.table.column("text"))).as_py() or 0,
                               **stored.since())
            yield item
        # Checked again at the end: a file rewritten while it was read must not go into the output.
        check_unchanged(unit)
        self._progress.add(units=1, **stored.since(end=True))
        for reason, n in sorted(bad.items()):
            yield self._drops(reason, n)
        yield beam.pvalue.TaggedOutput(RECORDS, records)


class _StoredProgress:
    """A unit whose rows were not planned (a JSON file): its progress in ``stored_bytes``, the bytes
    of the file as stored read since the last figure, which add up to its planned size
    (``InputUnit.text_bytes``) once it is done: the display's ETA goes by them
    (pipelines/progress.py announce_write_stages), and a file read for minutes shows its share."""

    def __init__(self, unit: InputUnit):
        self._size = unit.text_bytes if unit.rows < 0 else -1
        self.position = StoredPosition() if self._size >= 0 else None
        self._said = 0

    def since(self, end: bool = False) -> dict[str, int]:
        if self.position is None:
            return {}
        now = self._size if end else min(self.position.bytes, self._size)
        added, self._said = now - self._said, max(now, self._said)
        return {"stored_bytes": added} if added > 0 else {}


class ReadDocuments(beam.PTransform):
    """DocBatches from ``config.pattern``, in units planned (and checked) at construction time, or
    the ``units`` the launcher planned from the same ``config`` (transforms.inputs.plan.plan_input).

    Outputs: ``docs`` (DocBatches), ``dropped`` (``(reason, n)`` of records skipped under
    ``on_bad_record="skip"``) and ``records`` (records read per unit: sum them for the raw count).

    Example::

        read = pipeline | "ReadDocuments" >> ReadDocuments(ReadConfig("data/*.parquet"))
        batches, bad, records = read.docs, read.dropped, read.records
    """

    def __init__(self, config: ReadConfig, progress_dir: str | None = None, units: list[InputUnit] | None = None):
        super().__init__()
        self._config = config
        self._progress_dir = progress_dir  # Progress: a local directory all workers share, or None
        self.units = plan_input(config) if units is None else units
        self.planned = planned_work(self.units)

    def log_planned(self) -> None:
        """Logs the input's units and rows. A job calls it once the launch checks that follow the
        planning (its tokenizer loads) have passed: a launch error is then the only line it says."""
        log.info("input: %d units of work from %s (%s %s)", len(self.units), self._config.pattern,
                 f"{self.planned.total:,}", self.planned.what)

    def expand(self, pbegin):
        return (
            pbegin
            | "SpreadInputUnits" >> SpreadEvenly(self.units, unit_cost)
            # The share of the planned rows is logged where the workers can add up their counts (a
            # local run); a remote runner's UI shows progress of its own.
            | "ReadUnits" >> beam.ParDo(ReadUnitFn(self._config, self.planned if self._progress_dir else None,
                                                   self._progress_dir)).with_outputs(DROPPED, RECORDS, main="docs")
        )


class CountRecords(beam.PTransform):
    """ReadDocuments' ``records`` output in; the number of records read, one element, out. Every
    record counts, the skipped ones too, so that read = written + dropped can be checked."""

    def expand(self, records):
        return records | "SumRecords" >> beam.CombineGlobally(sum)
