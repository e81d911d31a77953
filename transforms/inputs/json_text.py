"""JSON text input (``.json``, plain or compressed, when ``ReadConfig.json_values`` asks for it):
one object, an array of objects, or objects one after another (pretty-printed or one a line).

A unit of work is a whole file, parsed as a stream (``_JsonText``): memory holds one value and a
read chunk, never the file. ``--plan`` counts the records of a file of at most ``COUNT_BYTES``.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
from collections.abc import Iterator

from shards import storage
from transforms.core.records import BadInputError, BadRecord
from transforms.inputs.compression import StoredPosition, open_decompressed
from transforms.inputs.fields import ReadConfig, Row, object_row, skip_or_raise
from transforms.inputs.formats import RecordFileFormat
from transforms.inputs.units import InputUnit, RowCount

# A JSON text file at most this big (as stored) is read whole by --plan to count its records.
COUNT_BYTES = 32 << 20


class _JsonText:
    """JSON values from a binary stream, one at a time: memory holds one value and a read chunk.

    The stream is either one array (its elements are the values) or values one after another,
    separated by whitespace: a single object, pretty-printed objects, or JSON lines.
    """

    def __init__(self, f, path: str, chunk_chars: int = 1 << 20):
        self._f = f
        self._path = path
        self._chunk = chunk_chars
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._bytes_read = 0
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._decoder = json.JSONDecoder()

    def _more(self, at_least: int) -> bool:
        """Append at least ``at_least`` characters (fewer at the end); False at the end of the stream."""
        if self._eof:
            return False
        if self._pos:
            self._buf, self._pos = self._buf[self._pos:], 0
        added = 0
        while added < at_least:
            data = self._f.read(max(at_least - added, self._chunk))
            try:
                text = self._utf8.decode(data, final=not data)
            except UnicodeDecodeError as e:
                raise BadInputError(
                    self._path, f"is not valid UTF-8 ({e.reason} at byte {self._bytes_read + e.start})"
                ) from None
            self._bytes_read += len(data)
            self._buf += text
            added += len(text)
            if not data:
                self._eof = True
                break
        return added > 0

    def _skip_space(self) -> str:
        """The next non-whitespace character ('' at the end), not consumed."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in " \t\r\n\ufeff":
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more(1):
                return ""

    def _value(self, where: str):
        need = self._chunk
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
                # A number or literal cut by the chunk edge would decode short: read on before trusting it.
                if end < len(self._buf) or self._eof or isinstance(value, (dict, list, str)):
                    self._pos = end
                    return value
            except json.JSONDecodeError as e:
                if self._eof:
                    raise BadInputError(where, f"is not JSON ({e.msg})") from None
            # Possibly cut by the end of what has been read: read more (doubling) and try again.
            self._more(need)
            need *= 2

    def values(self) -> Iterator:
        first = self._skip_space()
        if first == "[":
            self._pos += 1
            index = 0
            if self._skip_space() == "]":
                self._pos += 1
            else:
                while True:
                    yield self._value(f"{self._path} record {index + 1}")
                    index += 1
                    c = self._skip_space()
                    self._pos += 1
                    if c == "]":
                        break
                    if c != ",":
                        raise BadInputError(f"{self._path} record {index}", "is not followed by ',' or ']'")
                    self._skip_space()
            if self._skip_space():
                raise BadInputError(self._path, "has more text after its JSON array")
            return
        index = 0
        while self._skip_space():
            yield self._value(f"{self._path} record {index + 1}")
            index += 1


def read_rows(unit: InputUnit, config: ReadConfig, position: StoredPosition | None = None) -> Iterator[Row | BadRecord]:
    """Records of a .json file: one object, an array of objects, or objects one after another;
    ``position`` follows the file as stored."""
    with open_decompressed(unit.path, position) as f:
        for index, obj in enumerate(_JsonText(f, unit.path).values()):
            try:
                yield object_row(obj, config, index, f"{unit.path} record {index + 1}")
            except BadInputError as e:
                yield skip_or_raise(e, config)


class JsonTextFormat(RecordFileFormat):
    kind = "json"

    def read_rows(self, unit: InputUnit, config: ReadConfig,
                  position: StoredPosition | None = None) -> Iterator[Row | BadRecord]:
        return read_rows(unit, config, position)

    def count_rows(self, unit: InputUnit, config: ReadConfig, sampled: bool) -> RowCount | None:
        """The records (bad ones too) of a file of at most COUNT_BYTES, read whole."""
        fs, fs_path = storage.filesystem(unit.path)
        size = int(fs.info(fs_path).get("size") or 0)
        if size > COUNT_BYTES:
            return None
        records = sum(1 for _ in read_rows(unit, dataclasses.replace(config, on_bad_record="skip")))
        return RowCount(records, size, whole=True, pooled=False)


FORMAT = JsonTextFormat()
