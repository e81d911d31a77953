"""ReadDocuments: parquet and JSONL documents from a glob, local or on any fsspec filesystem.

The input is planned when the pipeline is built: the glob is expanded, every parquet footer is
read and its schema checked, and the work is cut into units (a parquet row group, or a whole
JSONL file). So a missing column or a file that is not parquet fails the launch with a message
naming the file, before any worker starts and before anything is written. Workers then stream
their unit in small record batches and read only the columns the job needs.

Which files a pattern names (``expand_pattern``, in transforms.core.inputs, which imports no Beam:
the CLI checks an input there before Beam and the tokenizer load):

1. A path that exists is taken as written, even with ``*``, ``?`` or ``[`` in its name
   (``data[1].parquet``, ``runs[2024]/``). Only a path that does not exist is a glob; in it too,
   a directory name that exists as written (``runs[2024]/*.parquet``) is not a wildcard.
2. A directory stands for every file below it with a known suffix.
3. Below the directory, or below a glob's root (the directories before its first wildcard), a
   file is skipped when any name on its path from there starts with ``.`` or ``_``: hidden files,
   ``.crc`` checksums, Spark's and Hadoop's ``_temporary/``, ``_SUCCESS``, ``_committed_*``. A
   file named in full is read whatever its name.

What a value is read as:

- JSON files are ``.jsonl``, ``.ndjson`` or ``.json``, each plain or compressed as ``.gz``,
  ``.zst``, ``.bz2`` or ``.xz``. A file that cannot be decompressed (truncated, or not in the
  format its suffix says) stops the job with a BadInputError naming it, whatever
  ``on_bad_record`` says: its records cannot be told apart from the damage.
- A UTF-8 byte order mark at the start of a JSON lines file is not part of the first record.
- A float32 (or float16) value is read as the shortest decimal that rounds to it in its own
  precision: the number the writer wrote. So a float32 ``page_average_lid_score`` of 0.9 is read
  as 0.9 (not 0.8999999761581421) and passes a threshold of 0.9; the float32 just below it is
  read as 0.8999999 and does not.
- Text and id columns may be plain, large, view (``string_view``) or dictionary-encoded strings.
- A ``page_average_lid_score`` outside [0, 1] (NaN and infinities included) is a bad record,
  ``bad_lid_score``: it is no probability, so no threshold can judge it.

Which fields are read (``ReadConfig``): the id and the text, by the names ``id_field`` and
``text_field``, and for the language filter (``with_lid``) each of ``language_fields``, the LID
score's ``lid_score_field`` and the source token count's ``token_count_field`` (None reads none).
The defaults are the FinePDFs schema's; FineWeb's are ``language_fields=("language",)``,
``lid_score_field="language_score"``. In a DocBatch the id and the text are the columns ``id`` and
``text``; a filter field keeps its own name. A missing column or field is named with the flag
that names it (``--text-field``, ``--language-fields``, ...), so the fix is in the message.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import dataclasses
import gzip
import io
import json
import logging
import lzma
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from shards import storage
from shards.manifest import has_lone_surrogate, id_problem
from transforms.core.batches import DocBatch
from transforms.core.drops import Drops
from transforms.core.inputs import (  # noqa: F401 - which files a pattern names, re-exported
    COMPRESSIONS,
    GLOB_CHARS,
    JSON_BASES,
    JSON_VALUES_SUFFIXES,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    _file_kind,
    expand_pattern,
)
from transforms.core.progress import Planned, Progress
from transforms.core.records import (  # noqa: F401 - the FinePDFs field names, ReadConfig's defaults
    DEFAULT_LANGUAGE_FIELDS,
    DEFAULT_TOKEN_COUNT,
    DROPPED,
    LID_SCORE,
    BadInputError,
    BadRecord,
    Document,
)
from transforms.core.spread import SpreadEvenly

log = logging.getLogger(__name__)


# The FinePDFs filter's fields and the kind of value each must hold (ReadConfig's defaults).
LID_FIELDS: tuple[tuple[str, str], ...] = (
    ("language", "string"),
    ("page_average_lid", "string"),
    (LID_SCORE, "number"),
    ("token_count", "integer"),
)
# DocBatch's own column names: no filter field may take one.
BATCH_COLUMNS = ("row", "id", "text")


class Field(NamedTuple):
    """A field the job reads: its name in the input, the kind of value it holds (id, string,
    number, integer), and the flag that names it (for a message about a missing one)."""

    name: str
    kind: str
    flag: str


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """What to read: the id and the text, and with ``with_lid`` the language filter's fields (by
    default the FinePDFs schema's; see the module docstring)."""

    pattern: str
    id_field: str = "id"
    text_field: str = "text"
    with_lid: bool = True
    batch_rows: int = 256
    # .json files as JSON text rather than JSON lines: one object, an array of objects, or objects
    # one after another (pretty-printed or one a line). .jsonl and .ndjson files stay JSON lines.
    json_values: bool = False
    # What a record the job cannot use does: "fail" stops the job naming it, "skip" drops and
    # counts it under its reason (invalid_utf8, invalid_json, not_an_object, missing_field,
    # null_field, wrong_type, bad_id, bad_lid_score).
    on_bad_record: str = "fail"
    # The filter's fields, read when with_lid: each language field (strings), the LID score (a
    # number within [0, 1]) and the source token count (an integer); None (or ()) reads none.
    language_fields: tuple[str, ...] = DEFAULT_LANGUAGE_FIELDS
    lid_score_field: str | None = LID_SCORE
    token_count_field: str | None = DEFAULT_TOKEN_COUNT

    def __post_init__(self):
        if self.on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {self.on_bad_record!r}")
        if self.batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        object.__setattr__(self, "language_fields", tuple(self.language_fields))
        names = [f.name for f in self.fields()]
        for name in names:
            if not name:
                raise ValueError("a field name must not be empty")
            if names.count(name) > 1:
                raise ValueError(f"the field {name!r} is named twice (--id-field, --text-field, --language-fields, "
                                 "--lid-score-field, --token-count-field name different fields)")
        for f in self.filter_fields():
            if f.name in BATCH_COLUMNS:
                raise ValueError(f"{f.flag}: {f.name!r} cannot be a filter field (the job's own column name)")

    def filter_fields(self) -> list[Field]:
        """The language filter's fields, in the order its checks run."""
        if not self.with_lid:
            return []
        out = [Field(name, "string", "--language-fields (or --language none)") for name in self.language_fields]
        if self.lid_score_field:
            out.append(Field(self.lid_score_field, "number", "--lid-score-field (or none)"))
        if self.token_count_field:
            out.append(Field(self.token_count_field, "integer", "--token-count-field (or none)"))
        return out

    def fields(self) -> list[Field]:
        """Every field read: the id, the text, then the filter's."""
        return [Field(self.id_field, "id", "--id-field"), Field(self.text_field, "string", "--text-field"),
                *self.filter_fields()]


def file_fingerprint(fs, path: str, fresh: bool = False) -> str:
    """Size and the version the filesystem gives the file (storage.file_version: a hub file's
    sha256 or git blob id, an object's generation or etag, a local file's mtime). ``fresh`` asks
    the filesystem again rather than its listing cache (a hub listing is cached per process)."""
    if fresh:
        fs.invalidate_cache(path)
    return fingerprint_of(fs.info(path))


def fingerprint_of(info: dict) -> str:
    """file_fingerprint from the filesystem's ``info`` of the file."""
    return f"size={info.get('size')} version={storage.file_version(info)}"


class InputUnit(NamedTuple):
    """One piece of reading work: a row group of a parquet file, or a whole JSONL (or JSON) file."""

    path: str
    kind: str  # "parquet", "jsonl" or "json"
    row_group: int  # -1 for jsonl
    first_row: int  # index in its file of the unit's first row
    fingerprint: str = ""  # size and version of the file when the job was planned
    rows: int = -1  # rows of a parquet row group; -1 when unknown until read (jsonl)
    # What the unit costs to work through, for spreading units over workers (transforms.core.spread):
    # the text column's uncompressed bytes in a parquet row group, the file's size for JSON (its
    # compressed size, when it is compressed: a compressed file ranks below its worth).
    text_bytes: int = -1


def unit_cost(unit: InputUnit) -> int:
    return unit.text_bytes


def check_unchanged(unit: InputUnit) -> None:
    """A BadInputError when the file is not the one the job planned: a job never mixes versions."""
    if not unit.fingerprint:
        return
    fs, fs_path = storage.filesystem(unit.path)
    now = file_fingerprint(fs, fs_path, fresh=True)
    if now != unit.fingerprint:
        raise BadInputError(unit.path, f"changed while the job ran ({unit.fingerprint} when planned, now {now})")


_STRING_TYPES = {pa.string(), pa.large_string()} | ({pa.string_view()} if hasattr(pa, "string_view") else set())


def _arrow_kind_ok(arrow_type: pa.DataType, kind: str) -> bool:
    if pa.types.is_dictionary(arrow_type):
        return _arrow_kind_ok(arrow_type.value_type, kind)
    if kind == "string":
        return arrow_type in _STRING_TYPES
    if kind == "id":
        return _arrow_kind_ok(arrow_type, "string") or pa.types.is_integer(arrow_type)
    if kind == "number":
        return pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type)
    if kind == "integer":
        return pa.types.is_integer(arrow_type)
    raise AssertionError(kind)


def check_parquet_schema(path: str, schema: pa.Schema, fields: Sequence[Field]) -> None:
    for name, kind, flag in fields:
        if name not in schema.names:
            raise BadInputError(path, f"missing column {name!r} (the file has {', '.join(schema.names)}); "
                                f"name the column to read with {flag}")
        got = schema.field(name).type
        if not _arrow_kind_ok(got, kind):
            raise BadInputError(path, f"column {name!r} has type {got}, expected {kind}")


def _is_json_text(path: str) -> bool:
    return path.lower().endswith(JSON_VALUES_SUFFIXES)


def _plan_file(path: str, config: ReadConfig) -> list[InputUnit]:
    kind = _file_kind(path)
    if kind is None:
        known = f"{', '.join(JSON_BASES)}, plain or {', '.join(filter(None, COMPRESSIONS))}"
        raise BadInputError(path, f"unknown file type; expected {' or '.join(PARQUET_SUFFIXES)}, or {known}")
    fs, fs_path = storage.filesystem(path)
    info = fs.info(fs_path)
    fingerprint = fingerprint_of(info)
    if kind == "jsonl":
        kind = "json" if config.json_values and _is_json_text(path) else "jsonl"
        return [InputUnit(path, kind, -1, 0, fingerprint, text_bytes=info.get("size") or 0)]
    try:
        with fs.open(fs_path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInputError(path, f"not a readable parquet file ({e})") from None
    check_parquet_schema(path, meta.schema.to_arrow_schema(), config.fields())
    units, first = [], 0
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        rows = group.num_rows
        if rows:
            text_bytes = _text_bytes(group, config.text_field)
            units.append(InputUnit(path, "parquet", rg, first, fingerprint, rows, text_bytes))
        first += rows
    return units


def _text_bytes(group: pq.RowGroupMetaData, text_field: str) -> int:
    for i in range(group.num_columns):
        column = group.column(i)
        if column.path_in_schema == text_field:
            return column.total_uncompressed_size
    return -1


def plan_input(config: ReadConfig, threads: int = 16) -> list[InputUnit]:
    """Expand the glob and check every file; the units of work, in a deterministic order. A store
    that cannot be reached (or refuses the credentials) is one storage.Unreachable naming the URL."""
    with storage.reaching(config.pattern):
        paths = expand_pattern(config.pattern)

    def plan(path: str) -> list[InputUnit]:
        with storage.reaching(path):
            return _plan_file(path, config)

    with ThreadPoolExecutor(max_workers=min(threads, len(paths))) as pool:
        planned = list(pool.map(plan, paths))
    return [u for units in planned for u in units]


def planned_work(units: Sequence[InputUnit]) -> Planned:
    """What the read step will do, as known at launch: rows when every unit's are known (parquet),
    else input units (a JSONL file's rows are known once it is read)."""
    if all(u.rows >= 0 for u in units):
        return Planned(sum(u.rows for u in units), "rows", ("documents", "bad_records"))
    return Planned(len(units), "input units", ("units",))


def _check_value(value, kind: str, where: str, field: str, nullable: bool):
    """The value converted for the record, or a BadInputError for a wrong type or a forbidden null."""
    if value is None:
        if nullable:
            return None
        raise BadInputError(where, f"{field!r} is null", reason="null_field")
    if kind == "id":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise BadInputError(
                where, f"{field!r} is {type(value).__name__}, expected a string or an integer", reason="wrong_type"
            )
        return value if isinstance(value, str) else str(value)
    if kind == "string" and isinstance(value, str):
        if has_lone_surrogate(value):
            # A tokenizer would silently turn it into U+FFFD: the stored text would not be the input.
            raise BadInputError(where, f"{field!r} holds a lone UTF-16 surrogate (not valid Unicode text)",
                                reason="invalid_utf8")
        return value
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    problem = f"{field!r} is {type(value).__name__} {value!r:.40}, expected {kind}"
    raise BadInputError(where, problem, reason="wrong_type")


class _Row(NamedTuple):
    """One record read row by row: its id, text, row and the filter's fields by name."""

    id: str
    text: str
    row: int
    fields: dict


def _make_row(values: dict, config: ReadConfig, row: int, where: str) -> _Row:
    doc_id = _check_value(values.get(config.id_field), "id", where, config.id_field, nullable=False)
    problem = id_problem(doc_id)
    if problem:
        # The manifest is '|'-separated, one row a line: such an id would be read back wrong.
        raise BadInputError(where, f"{config.id_field} {doc_id!r:.80}: {problem}", reason="bad_id")
    text = _check_value(values.get(config.text_field), "string", where, config.text_field, nullable=False)
    fields = {}
    for name, kind, _ in config.filter_fields():
        fields[name] = value = _check_value(values.get(name), kind, where, name, nullable=True)
        if kind == "number" and value is not None and not 0.0 <= value <= 1.0:  # NaN fails too
            raise BadInputError(where, f"{name!r} is {value}, expected a number within [0, 1]",
                                reason="bad_lid_score")
    return _Row(doc_id, text, row, fields)


def _bad(error: BadInputError, config: ReadConfig) -> BadRecord:
    """The record to skip, or the error raised again when it must stop the job."""
    if error.reason is None or config.on_bad_record != "skip":
        raise error
    return BadRecord(error.reason, error.where, error.problem)


_NARROW_FLOATS = {pa.float16(): np.float16, pa.float32(): np.float32}


def column_values(column: pa.Array) -> list:
    """A column's values as Python objects; a float16 or float32 value as the shortest decimal that
    rounds to it in its own precision (float32 0.9 is 0.9, not 0.8999999761581421)."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    narrow = _NARROW_FLOATS.get(column.type)
    if narrow is None:
        return column.to_pylist()
    # str() of a numpy float16/float32 is the shortest decimal that reads back as the same value.
    return [None if v is None else float(str(narrow(v))) for v in column.to_pylist()]


class _ZstdReader(io.RawIOBase):
    """The bytes of zstd frames one after another, and an EOFError when the data ends inside a frame.

    zstandard's own stream_reader returns what it has when its input ends mid-frame, and stops at
    the end of the first frame: a truncated file, or one of several frames (pzstd, ``cat a.zst
    b.zst``), would read as a shorter file without a word.
    """

    def __init__(self, raw: BinaryIO, chunk_bytes: int = 1 << 16):
        self._raw = raw
        self._chunk = chunk_bytes
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = None  # the decompressor of the frame being read; None between frames
        self._out = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._pos == len(self._out):
            data = self._raw.read(self._chunk)
            if not data:
                if self._frame is not None:
                    raise EOFError("the zstd data ends inside a frame")
                return 0
            self._out, self._pos = self._decompress(data), 0
        n = min(len(buffer), len(self._out) - self._pos)
        buffer[:n] = self._out[self._pos:self._pos + n]
        self._pos += n
        return n

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            out.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            data, self._frame = self._frame.unused_data, None
        return b"".join(out)


_DECOMPRESSORS = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "zstd": lambda raw: io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 16),
    "bz2": lambda raw: bz2.BZ2File(raw, mode="rb"),
    "xz": lambda raw: lzma.LZMAFile(raw, mode="rb"),
}


def _compression(path: str) -> str:
    """The name of the compression ``path``'s suffix says ("" for none)."""
    lower = path.lower()
    return next((name for ext, name in COMPRESSIONS.items() if ext and lower.endswith(ext)), "")


def _is_decompression_error(error: Exception) -> bool:
    """Whether a decompressor rejected its data. An OSError that carries an errno is the system's
    (a disk, a network): it is left as it is, for the runner to retry. Others (gzip's BadGzipFile,
    bz2's "Invalid data stream") are about the data."""
    if isinstance(error, (EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)):
        return True
    return isinstance(error, OSError) and error.errno is None


@contextlib.contextmanager
def open_json_file(path: str) -> Iterator[BinaryIO]:
    """The bytes of a JSON file, decompressed as its suffix says.

    Data that cannot be decompressed (a truncated file, a file not in its suffix's format) raises
    a BadInputError naming the file. It has no reason: a damaged file is not a record to skip.
    An empty file is empty whatever its suffix (bz2 and xz would call it truncated, gzip and zstd
    would not), as a parquet file without rows adds nothing.
    """
    fs, fs_path = storage.filesystem(path)
    compression = _compression(path)
    with fs.open(fs_path, "rb") as raw:
        empty = not raw.read(1)
        raw.seek(0)
        if empty or not compression:
            yield raw
            return
        try:
            with _DECOMPRESSORS[compression](raw) as f:
                yield f
        except Exception as e:
            if not _is_decompression_error(e):
                raise
            if isinstance(e, EOFError):
                problem = f"is truncated (its {compression} data ends before the end-of-stream marker)"
            else:
                problem = f"is not valid {compression} data ({e})"
            raise BadInputError(path, problem) from None


def read_jsonl_unit(unit: InputUnit, config: ReadConfig) -> Iterator[_Row | BadRecord]:
    # Binary lines, decoded one at a time, so a bad byte is reported with its line number.
    with open_json_file(unit.path) as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]  # a byte order mark, as some Windows tools write
            if not raw.strip():
                continue
            try:
                yield _jsonl_row(raw, config, line_no, f"{unit.path} line {line_no}")
            except BadInputError as e:
                yield _bad(e, config)


def _jsonl_row(raw: bytes, config: ReadConfig, line_no: int, where: str) -> _Row:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInputError(where, f"is not valid UTF-8 ({e.reason} at byte {e.start})", "invalid_utf8") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadInputError(where, f"is not JSON ({e.msg})", "invalid_json") from None
    # Rows are numbered from 0 like parquet rows; the messages give 1-based lines.
    return _object_row(obj, config, line_no - 1, where)


def _object_row(obj, config: ReadConfig, row: int, where: str) -> _Row:
    if not isinstance(obj, dict):
        raise BadInputError(where, f"is a JSON {type(obj).__name__}, not an object", "not_an_object")
    missing = [f for f in config.fields() if f.name not in obj]
    if missing:
        flags = ", ".join(dict.fromkeys(f.flag for f in missing))
        raise BadInputError(where, f"missing field(s) {', '.join(f.name for f in missing)}; name the field to "
                            f"read with {flags}", "missing_field")
    return _make_row(obj, config, row, where)


class _JsonText:
    """JSON values from a binary stream, one at a time: memory holds one value and a read chunk.

    The stream is either one array (its elements are the values) or values one after another,
    separated by whitespace: a single object, pretty-printed objects, or JSON lines.
    """

    def __init__(self, f, path: str, chunk_chars: int = 1 << 20):
        import codecs

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


def read_json_unit(unit: InputUnit, config: ReadConfig) -> Iterator[_Row | BadRecord]:
    """Records of a .json file: one object, an array of objects, or objects one after another."""
    with open_json_file(unit.path) as f:
        for index, obj in enumerate(_JsonText(f, unit.path).values()):
            try:
                yield _object_row(obj, config, index, f"{unit.path} record {index + 1}")
            except BadInputError as e:
                yield _bad(e, config)


def read_unit(unit: InputUnit, config: ReadConfig) -> Iterator[Document | BadRecord]:
    """The unit's documents one at a time (for tools and tests), and its bad records under
    on_bad_record="skip". A filter field whose name is one of Document's is filled in."""
    return _documents(read_batches(unit, config), config)


# Documents a batch holds at most, and the text bytes a parquet batch aims at: a batch is the unit
# every later step works on, so it is large enough to make a Beam element's cost small, and small
# enough that a worker holds a few of them at once.
BATCH_DOCS = 4096
BATCH_TEXT_BYTES = 16 << 20

# Python's whitespace (str.isspace: what str.strip removes), as an RE2 class.
_SPACE = (r"\t\n\x0b\x0c\r\x1c-\x20\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}"
          r"\x{205f}\x{3000}")
# An id manifest.id_problem refuses: a '|' or a line break anywhere, or whitespace at either end
# (an empty id is checked by its length). The rows it matches go through the exact per-row check.
_SUSPECT_ID = rf"[|\n\r\x0b\x0c\x1c\x1d\x1e\x{{85}}\x{{2028}}\x{{2029}}]|^[{_SPACE}]|[{_SPACE}]$"


def _string_column(column: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.type not in (pa.string(), pa.large_string()):
        column = column.cast(pa.large_string() if pa.types.is_large_string(column.type) else pa.string())
    return column


def _score_column(column: pa.Array) -> pa.Array:
    """float64 scores; a float16 or float32 score as the decimal it was written as (column_values)."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.type in _NARROW_FLOATS:
        narrow = column.to_numpy(zero_copy_only=False).astype(_NARROW_FLOATS[column.type])
        decimal = narrow.astype(str).astype(np.float64)  # numpy's shortest round-trip repr, in C
        return pa.array(decimal, pa.float64(), mask=column.is_null().to_numpy(zero_copy_only=False))
    return column.cast(pa.float64())


def arrow_batch(batch: pa.RecordBatch, config: ReadConfig, first_row: int) -> pa.RecordBatch | None:
    """The columns the jobs read, normalized (``row``, ``id``, ``text``, and the filter's fields by
    their names), or None when a row might be a bad record: the caller then checks that batch row
    by row."""
    ids = batch.column(config.id_field)
    if pa.types.is_dictionary(ids.type):
        ids = ids.dictionary_decode()
    ids = ids.cast(pa.string()) if pa.types.is_integer(ids.type) else _string_column(ids)
    text = _string_column(batch.column(config.text_field))
    if ids.null_count or text.null_count:
        return None
    try:
        text.validate(full=True)
        ids.validate(full=True)
    except pa.ArrowInvalid:  # invalid UTF-8: the row-by-row path names the row
        return None
    if pc.any(pc.match_substring_regex(ids, _SUSPECT_ID)).as_py() or pc.any(
            pc.equal(pc.binary_length(ids), 0)).as_py():
        return None
    columns = {"row": pa.array(np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)), "id": ids,
               "text": text}
    for name, kind, _ in config.filter_fields():
        column = batch.column(name)
        if kind == "string":
            column = _string_column(column)
        elif kind == "number":
            column = _score_column(column)
            valid = pc.and_kleene(pc.greater_equal(column, 0.0), pc.less_equal(column, 1.0))
            if not pc.all(pc.or_kleene(valid, pc.is_null(column, nan_is_null=False))).as_py():
                return None  # out of [0, 1] or NaN
        else:
            column = column.cast(pa.int64())
        columns[name] = column
    return pa.RecordBatch.from_pydict(columns)


_ARROW_TYPES = {"string": pa.string(), "number": pa.float64(), "integer": pa.int64()}


def rows_batch(source: str, rows: Sequence[_Row], filter_fields: Sequence[Field]) -> DocBatch:
    """A DocBatch of records read row by row (JSON input, and parquet batches that needed it), with
    the column types arrow_batch gives."""
    columns = {
        "row": pa.array([r.row for r in rows], pa.int64()),
        "id": pa.array([r.id for r in rows], pa.string()),
        "text": pa.array([r.text for r in rows], pa.large_string()),
    }
    for name, kind, _ in filter_fields:
        columns[name] = pa.array([r.fields[name] for r in rows], _ARROW_TYPES[kind])
    return DocBatch(source, pa.RecordBatch.from_pydict(columns))


def documents_batch(source: str, docs: Sequence[Document], with_lid: bool) -> DocBatch:
    """A DocBatch of Documents, with the FinePDFs filter's fields when ``with_lid`` (for tests)."""
    fields = ReadConfig("", with_lid=with_lid).filter_fields()
    rows = [_Row(d.id, d.text, d.row, {f.name: getattr(d, f.name) for f in fields}) for d in docs]
    return rows_batch(source, rows, fields)


def _parquet_batch_rows(pf: pq.ParquetFile, row_group: int, text_field: str) -> int:
    """Rows per batch so that a batch holds about BATCH_TEXT_BYTES of text."""
    meta = pf.metadata.row_group(row_group)
    rows = max(meta.num_rows, 1)
    names = [meta.column(i).path_in_schema for i in range(meta.num_columns)]
    text_bytes = meta.column(names.index(text_field)).total_uncompressed_size if text_field in names else 0
    return int(min(BATCH_DOCS, max(16, BATCH_TEXT_BYTES * rows // max(text_bytes, 1))))


def read_parquet_batches(unit: InputUnit, config: ReadConfig) -> Iterator[DocBatch | BadRecord]:
    fs, fs_path = storage.filesystem(unit.path)
    columns = [f.name for f in config.fields()]
    row = unit.first_row
    try:
        with fs.open(fs_path, "rb") as f:
            pf = pq.ParquetFile(f)
            check_parquet_schema(unit.path, pf.schema_arrow, config.fields())
            size = _parquet_batch_rows(pf, unit.row_group, config.text_field)
            for batch in pf.iter_batches(batch_size=size, row_groups=[unit.row_group], columns=columns):
                table = arrow_batch(batch, config, row)
                if table is not None:
                    yield DocBatch(unit.path, table)
                else:
                    yield from _rows_one_by_one(batch, config, unit.path, row)
                row += batch.num_rows
    except (pa.ArrowInvalid, pa.ArrowIOError) as e:
        raise BadInputError(f"{unit.path} row group {unit.row_group}", f"cannot be read ({e})") from None


def _rows_one_by_one(batch: pa.RecordBatch, config: ReadConfig, path: str, row: int) -> Iterator:
    """A parquet batch checked row by row: the exact message and reason of each bad record."""
    columns = [f.name for f in config.fields()]
    cols = {name: column_values(batch.column(name)) for name in columns}
    rows = []
    for i in range(batch.num_rows):
        try:
            rows.append(_make_row({name: cols[name][i] for name in columns}, config, row + i, f"{path} row {row + i}"))
        except BadInputError as e:
            yield _bad(e, config)
    if rows:
        yield rows_batch(path, rows, config.filter_fields())


def _batched(items: Iterator[_Row | BadRecord], source: str, config: ReadConfig) -> Iterator[DocBatch | BadRecord]:
    rows, size = [], 0
    for item in items:
        if isinstance(item, BadRecord):
            yield item
            continue
        rows.append(item)
        size += len(item.text)
        if len(rows) >= BATCH_DOCS or size >= BATCH_TEXT_BYTES:
            yield rows_batch(source, rows, config.filter_fields())
            rows, size = [], 0
    if rows:
        yield rows_batch(source, rows, config.filter_fields())


def _documents(items: Iterator[DocBatch | BadRecord], config: ReadConfig) -> Iterator[Document | BadRecord]:
    """Batches as one Document at a time (for tools and tests that look at documents one by one)."""
    named = [f.name for f in config.filter_fields() if f.name in Document._fields]
    for item in items:
        if isinstance(item, BadRecord):
            yield item
            continue
        columns = {name: item.column(name) for name in ("id", "text", "row", *named)}
        for i in range(item.size):
            lid = {name: columns[name][i] for name in named}
            yield Document(columns["id"][i], columns["text"][i], item.source, columns["row"][i], **lid)


def read_batches(unit: InputUnit, config: ReadConfig) -> Iterator[DocBatch | BadRecord]:
    """The unit's documents in DocBatches, and its bad records (only under on_bad_record="skip")."""
    if unit.kind == "parquet":
        return read_parquet_batches(unit, config)
    rows = read_json_unit(unit, config) if unit.kind == "json" else read_jsonl_unit(unit, config)
    return _batched(rows, unit.path, config)


RECORDS = "records"


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
        for item in read_batches(unit, self._config):
            if isinstance(item, BadRecord):
                bad[item.reason] = bad.get(item.reason, 0) + 1
                records += 1
                self._progress.add(bad_records=1)
                if self._reported < 20:
                    self._reported += 1
                    log.warning("skipping a bad record (%s): %s: %s", item.reason, item.where, item.problem)
                continue
            n = item.size
            records += n
            self._docs.inc(n)
            self._progress.add(documents=n, bytes=pc.sum(pc.binary_length(item.table.column("text"))).as_py() or 0)
            yield item
        # Checked again at the end: a file rewritten while it was read must not go into the output.
        check_unchanged(unit)
        self._progress.add(units=1)
        for reason, n in sorted(bad.items()):
            yield self._drops(reason, n)
        yield beam.pvalue.TaggedOutput(RECORDS, records)


class ReadDocuments(beam.PTransform):
    """DocBatches from ``config.pattern``, in units planned (and checked) at construction time.

    Outputs: ``docs`` (DocBatches), ``dropped`` (``(reason, n)`` of records skipped under
    ``on_bad_record="skip"``) and ``records`` (records read per unit: sum them for the raw count).

    Example::

        read = pipeline | "ReadDocuments" >> ReadDocuments(ReadConfig("data/*.parquet"))
        batches, bad, records = read.docs, read.dropped, read.records
    """

    def __init__(self, config: ReadConfig, progress_dir: str | None = None):
        super().__init__()
        self._config = config
        self._progress_dir = progress_dir  # Progress: a local directory all workers share, or None
        self.units = plan_input(config)
        self.planned = planned_work(self.units)
        log.info("input: %d units of work from %s (%s %s)", len(self.units), config.pattern,
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
