"""JSON lines input (``.jsonl``, ``.ndjson``, and ``.json`` unless JSON text is asked for), plain
or compressed (transforms.inputs.compression): a unit of work per file, one record a line.

Lines are read as bytes and decoded one at a time, so a bad byte is reported with its line
number; blank lines are skipped, and a UTF-8 byte order mark at the start of the file is not part
of the first record. A file's rows are known once it is read: ``--plan`` counts them in the first
``SAMPLE_BYTES`` of a sampled file (all of a smaller one).
"""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterator

from shards import storage
from transforms.core.records import BadInputError, BadRecord
from transforms.inputs.compression import DECOMPRESSORS, StoredPosition, compression_of, open_decompressed
from transforms.inputs.fields import ReadConfig, Row, object_row, skip_or_raise
from transforms.inputs.formats import RecordFileFormat
from transforms.inputs.units import InputUnit, RowCount

# The bytes of a sampled JSON lines file read to count its rows (all of a smaller file).
SAMPLE_BYTES = 4 << 20


def _line_row(raw: bytes, config: ReadConfig, line_no: int, where: str) -> Row:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInputError(where, f"is not valid UTF-8 ({e.reason} at byte {e.start})", "invalid_utf8") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadInputError(where, f"is not JSON ({e.msg})", "invalid_json") from None
    # Rows are numbered from 0 like parquet rows; the messages give 1-based lines.
    return object_row(obj, config, line_no - 1, where)


def read_rows(unit: InputUnit, config: ReadConfig, position: StoredPosition | None = None) -> Iterator[Row | BadRecord]:
    """The file's records one at a time, and its bad records under on_bad_record="skip"; ``position``
    follows the file as stored."""
    with open_decompressed(unit.path, position) as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]  # a byte order mark, as some Windows tools write
            if not raw.strip():
                continue
            try:
                yield _line_row(raw, config, line_no, f"{unit.path} line {line_no}")
            except BadInputError as e:
                yield skip_or_raise(e, config)


class _CountingReader(io.RawIOBase):
    """A binary file that counts the bytes read through it, and notes before each read how many
    of them there were and how many lines the reader above had taken by then."""

    def __init__(self, raw):
        self.raw, self.count, self.lines, self.marks = raw, 0, 0, []

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.marks.append((self.count, self.lines))
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


def line_density(unit: InputUnit, budget: int) -> tuple[int, int, bool]:
    """(records, file bytes that hold them, whether that is the whole file) from the first
    ``budget`` bytes of a JSON lines file as stored (compressed or not). Bytes and records are
    paired where the reader asked for more bytes: what it took before then came from the bytes
    read before then, so the buffering of the decompressor adds no error worth naming."""
    fs, path = storage.filesystem(unit.path)
    compression = compression_of(unit.path)
    with fs.open(path, "rb") as raw:
        counting = _CountingReader(raw)
        stream = io.BufferedReader(counting, buffer_size=1 << 16)
        f = DECOMPRESSORS[compression](stream) if compression else stream
        for line in f:
            if line.strip():
                counting.lines += 1
                if counting.count >= budget and len(counting.marks) >= 3:
                    break
        else:
            return counting.lines, counting.count, True
        used, records = counting.marks[-1]
        return records, used, False


class JsonLinesFormat(RecordFileFormat):
    kind = "jsonl"

    def read_rows(self, unit: InputUnit, config: ReadConfig,
                  position: StoredPosition | None = None) -> Iterator[Row | BadRecord]:
        return read_rows(unit, config, position)

    def count_rows(self, unit: InputUnit, config: ReadConfig, sampled: bool) -> RowCount | None:
        """A sampled file's records in its first SAMPLE_BYTES (a line a record, bad ones too)."""
        if not sampled:
            return None
        records, used, whole = line_density(unit, SAMPLE_BYTES)
        return RowCount(records, used, whole, pooled=True)


FORMAT = JsonLinesFormat()
