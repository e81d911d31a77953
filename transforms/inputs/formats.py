"""InputFormat: what every input format is, behind the registry (transforms.inputs.registry).

A format is a module holding ``FORMAT``, an object with:

- ``kind``: the name its units carry (``InputUnit.kind``), also its registry entry's;
- ``plan(path, info, config)``: the file cut into units of work, checked as far as a launch can
  check it (a parquet footer, its columns); ``info`` is the filesystem's ``info`` of the file;
- ``read(unit, config, position=None)``: the unit's documents in DocBatches (transforms.core.batches),
  and its bad records as BadRecords under ``on_bad_record="skip"``; a BadInputError otherwise. A
  format whose units' rows are not planned (``unit.rows < 0``) has ``position`` (a
  transforms.inputs.compression.StoredPosition) follow how far into the file as stored it has read:
  the unit's progress, where no share of planned rows can be;
- ``count_rows(unit, config, sampled)``: for ``--plan``, the records of a unit whose rows the plan
  does not know (``unit.rows < 0``), or None to let them be estimated from other files; ``sampled``
  says the unit is among the sampled ones (reading it costs no more than the sample).

The endings a format reads are in its registry entry, so that discovering files needs no format's
module (nor Arrow). A new format is a module with its ``FORMAT`` and one entry in the registry; a
format whose unit is a whole file read a record at a time (JSON lines, JSON text) subclasses
``RecordFileFormat`` and writes only ``read_rows`` (and ``count_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from transforms.inputs.arrow import batched
from transforms.inputs.units import whole_file

if TYPE_CHECKING:
    from transforms.core.batches import DocBatch
    from transforms.core.records import BadRecord
    from transforms.inputs.compression import StoredPosition
    from transforms.inputs.fields import ReadConfig, Row
    from transforms.inputs.units import InputUnit, RowCount


class InputFormat(Protocol):
    kind: str

    def plan(self, path: str, info: dict, config: ReadConfig) -> list[InputUnit]: ...

    def read(self, unit: InputUnit, config: ReadConfig,
             position: StoredPosition | None = None) -> Iterator[DocBatch | BadRecord]: ...

    def count_rows(self, unit: InputUnit, config: ReadConfig, sampled: bool) -> RowCount | None: ...


class RecordFileFormat:
    """A format whose unit of work is a whole file, read a record at a time: its records (checked
    Rows, transforms.inputs.fields) are gathered into DocBatches (transforms.inputs.arrow)."""

    kind: str

    def read_rows(self, unit: InputUnit, config: ReadConfig,
                  position: StoredPosition | None = None) -> Iterator[Row | BadRecord]:
        """The file's records one at a time, and its bad records under on_bad_record="skip";
        ``position`` follows the file as stored (transforms.inputs.compression.open_decompressed)."""
        raise NotImplementedError

    def plan(self, path: str, info: dict, config: ReadConfig) -> list[InputUnit]:
        return [whole_file(path, self.kind, info)]

    def read(self, unit: InputUnit, config: ReadConfig,
             position: StoredPosition | None = None) -> Iterator[DocBatch | BadRecord]:
        return batched(self.read_rows(unit, config, position), unit.path, config)
