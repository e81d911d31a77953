"""Parquet input (``.parquet``, ``.pq``): a unit of work per row group, read as Arrow batches.

Every footer is read at launch and its schema checked, so a missing column or a file that is not
parquet fails before any worker starts. A worker reads only the columns the job needs, in batches
of about BATCH_TEXT_BYTES of text; a batch goes whole into a DocBatch when every row is good, else
row by row (transforms.inputs.arrow). A row group's rows are known from its footer.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from shards import storage
from transforms.core.batches import DocBatch
from transforms.core.records import BadInputError, BadRecord
from transforms.inputs.arrow import BATCH_DOCS, BATCH_TEXT_BYTES, arrow_batch, check_schema, checked_rows
from transforms.inputs.fields import ReadConfig
from transforms.inputs.units import InputUnit, RowCount, fingerprint_of


def _text_bytes(group: pq.RowGroupMetaData, text_field: str) -> int:
    for i in range(group.num_columns):
        column = group.column(i)
        if column.path_in_schema == text_field:
            return column.total_uncompressed_size
    return -1


def _batch_rows(pf: pq.ParquetFile, row_group: int, text_field: str) -> int:
    """Rows per batch so that a batch holds about BATCH_TEXT_BYTES of text."""
    meta = pf.metadata.row_group(row_group)
    rows = max(meta.num_rows, 1)
    names = [meta.column(i).path_in_schema for i in range(meta.num_columns)]
    text_bytes = meta.column(names.index(text_field)).total_uncompressed_size if text_field in names else 0
    return int(min(BATCH_DOCS, max(16, BATCH_TEXT_BYTES * rows // max(text_bytes, 1))))


class ParquetFormat:
    kind = "parquet"

    def plan(self, path: str, info: dict, config: ReadConfig) -> list[InputUnit]:
        """A unit per row group that has rows, with its rows and its text column's size."""
        fs, fs_path = storage.filesystem(path)
        fingerprint = fingerprint_of(info)
        try:
            with fs.open(fs_path, "rb") as f:
                meta = pq.ParquetFile(f).metadata
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInputError(path, f"not a readable parquet file ({e})") from None
        check_schema(path, meta.schema.to_arrow_schema(), config.fields())
        units, first = [], 0
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            rows = group.num_rows
            if rows:
                text_bytes = _text_bytes(group, config.text_field)
                units.append(InputUnit(path, self.kind, rg, first, fingerprint, rows, text_bytes))
            first += rows
        return units

    def read(self, unit: InputUnit, config: ReadConfig, position=None) -> Iterator[DocBatch | BadRecord]:
        """The row group's documents; its rows were planned, so ``position`` is not followed."""
        fs, fs_path = storage.filesystem(unit.path)
        columns = [f.name for f in config.fields()]
        row = unit.first_row
        try:
            with fs.open(fs_path, "rb") as f:
                pf = pq.ParquetFile(f)
                check_schema(unit.path, pf.schema_arrow, config.fields())
                size = _batch_rows(pf, unit.row_group, config.text_field)
                for batch in pf.iter_batches(batch_size=size, row_groups=[unit.row_group], columns=columns):
                    table = arrow_batch(batch, config, row)
                    if table is not None:
                        yield DocBatch(unit.path, table)
                    else:
                        yield from checked_rows(batch, config, unit.path, row)
                    row += batch.num_rows
        except (pa.ArrowInvalid, pa.ArrowIOError) as e:
            raise BadInputError(f"{unit.path} row group {unit.row_group}", f"cannot be read ({e})") from None

    def count_rows(self, unit: InputUnit, config: ReadConfig, sampled: bool) -> RowCount | None:
        return None  # a row group's rows are in its unit, from the footer


FORMAT = ParquetFormat()
