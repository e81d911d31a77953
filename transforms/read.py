"""ReadDocuments: parquet and JSONL documents from a glob, local or on any fsspec filesystem.

The input is planned when the pipeline is built: the glob is expanded, every parquet footer is
read and its schema checked, and the work is cut into units (a parquet row group, or a whole
JSONL file). So a missing column or a file that is not parquet fails the launch with a message
naming the file, before any worker starts and before anything is written. Workers then stream
their unit in small record batches and read only the columns the job needs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from shards import storage
from shards.manifest import has_lone_surrogate, id_problem
from transforms.progress import Progress
from transforms.records import DROPPED, BadInputError, BadRecord, Document

log = logging.getLogger(__name__)

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.bz2", ".jsonl.xz", ".json", ".json.gz", ".ndjson")
# Read as JSON text, not JSON lines, when ReadConfig.json_values is set.
JSON_VALUES_SUFFIXES = (".json", ".json.gz")

# Each field the jobs can read: (field name, the record attribute, the kind of value it must hold).
LID_FIELDS: tuple[tuple[str, str], ...] = (
    ("language", "string"),
    ("page_average_lid", "string"),
    ("page_average_lid_score", "number"),
    ("token_count", "integer"),
)


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """What to read. ``with_lid`` adds the language-ID fields the FinePDFs filter needs."""

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
    # null_field, wrong_type, bad_id).
    on_bad_record: str = "fail"

    def __post_init__(self):
        if self.on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {self.on_bad_record!r}")
        if self.batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")

    def fields(self) -> list[tuple[str, str]]:
        out = [(self.id_field, "id"), (self.text_field, "string")]
        return out + (list(LID_FIELDS) if self.with_lid else [])


class InputUnit(NamedTuple):
    """One piece of reading work: a row group of a parquet file, or a whole JSONL (or JSON) file."""

    path: str
    kind: str  # "parquet", "jsonl" or "json"
    row_group: int  # -1 for jsonl
    first_row: int  # index in its file of the unit's first row
    fingerprint: str = ""  # size and version of the file when the job was planned


_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "mtime", "LastModified", "updated", "created")


def file_fingerprint(fs, path: str) -> str:
    """Size and the first version marker the filesystem reports (etag, generation, mtime)."""
    info = fs.info(path)
    version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), "")
    return f"size={info.get('size')} version={version}"


def check_unchanged(unit: InputUnit) -> None:
    """A BadInputError when the file is not the one the job planned: a job never mixes versions."""
    if not unit.fingerprint:
        return
    fs, fs_path = storage.filesystem(unit.path)
    now = file_fingerprint(fs, fs_path)
    if now != unit.fingerprint:
        raise BadInputError(unit.path, f"changed while the job ran ({unit.fingerprint} when planned, now {now})")


def _file_kind(path: str) -> str | None:
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def expand_pattern(pattern: str) -> list[str]:
    """The input files a glob, a file or a directory names, sorted; a BadInputError when none."""
    url = storage.normalize(pattern)
    fs, path = storage.filesystem(url)
    if fs.isdir(path):
        found = [p for p in fs.find(path) if _file_kind(p)]
    elif any(c in path for c in "*?["):
        found = [p for p in fs.glob(path) if not fs.isdir(p)]
    else:
        found = [path] if fs.exists(path) else []
    if not found:
        raise BadInputError(pattern, "matches no input files")
    return sorted(storage.unstrip(fs, p, url) for p in found)


def _arrow_kind_ok(arrow_type: pa.DataType, kind: str) -> bool:
    if kind == "string":
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    if kind == "id":
        return _arrow_kind_ok(arrow_type, "string") or pa.types.is_integer(arrow_type)
    if kind == "number":
        return pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type)
    if kind == "integer":
        return pa.types.is_integer(arrow_type)
    raise AssertionError(kind)


def check_parquet_schema(path: str, schema: pa.Schema, fields: Sequence[tuple[str, str]]) -> None:
    for name, kind in fields:
        if name not in schema.names:
            raise BadInputError(path, f"missing column {name!r} (the file has {', '.join(schema.names)})")
        got = schema.field(name).type
        if not _arrow_kind_ok(got, kind):
            raise BadInputError(path, f"column {name!r} has type {got}, expected {kind}")


def _is_json_text(path: str) -> bool:
    return path.lower().endswith(JSON_VALUES_SUFFIXES)


def _plan_file(path: str, config: ReadConfig) -> list[InputUnit]:
    kind = _file_kind(path)
    if kind is None:
        raise BadInputError(path, f"unknown file type; expected one of {PARQUET_SUFFIXES + JSONL_SUFFIXES}")
    fs, fs_path = storage.filesystem(path)
    fingerprint = file_fingerprint(fs, fs_path)
    if kind == "jsonl":
        kind = "json" if config.json_values and _is_json_text(path) else "jsonl"
        return [InputUnit(path, kind, -1, 0, fingerprint)]
    try:
        with fs.open(fs_path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInputError(path, f"not a readable parquet file ({e})") from None
    check_parquet_schema(path, meta.schema.to_arrow_schema(), config.fields())
    units, first = [], 0
    for rg in range(meta.num_row_groups):
        rows = meta.row_group(rg).num_rows
        if rows:
            units.append(InputUnit(path, "parquet", rg, first, fingerprint))
        first += rows
    return units


def plan_input(config: ReadConfig, threads: int = 16) -> list[InputUnit]:
    """Expand the glob and check every file; the units of work, in a deterministic order."""
    paths = expand_pattern(config.pattern)
    with ThreadPoolExecutor(max_workers=min(threads, len(paths))) as pool:
        planned = list(pool.map(lambda p: _plan_file(p, config), paths))
    return [u for units in planned for u in units]


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


def _make_document(values: dict, config: ReadConfig, path: str, row: int, where: str) -> Document:
    doc_id = _check_value(values.get(config.id_field), "id", where, config.id_field, nullable=False)
    problem = id_problem(doc_id)
    if problem:
        # The manifest is '|'-separated, one row a line: such an id would be read back wrong.
        raise BadInputError(where, f"{config.id_field} {doc_id!r:.80}: {problem}", reason="bad_id")
    text = _check_value(values.get(config.text_field), "string", where, config.text_field, nullable=False)
    lid = {}
    if config.with_lid:
        for name, kind in LID_FIELDS:
            lid[name] = _check_value(values.get(name), kind, where, name, nullable=True)
    return Document(id=doc_id, text=text, source=path, row=row, **lid)


def _bad(error: BadInputError, config: ReadConfig) -> BadRecord:
    """The record to skip, or the error raised again when it must stop the job."""
    if error.reason is None or config.on_bad_record != "skip":
        raise error
    return BadRecord(error.reason, error.where, error.problem)


def read_parquet_unit(unit: InputUnit, config: ReadConfig) -> Iterator[Document | BadRecord]:
    fs, fs_path = storage.filesystem(unit.path)
    columns = [name for name, _ in config.fields()]
    row = unit.first_row
    try:
        with fs.open(fs_path, "rb") as f:
            pf = pq.ParquetFile(f)
            check_parquet_schema(unit.path, pf.schema_arrow, config.fields())
            for batch in pf.iter_batches(batch_size=config.batch_rows, row_groups=[unit.row_group], columns=columns):
                cols = {name: batch.column(name).to_pylist() for name in columns}
                for i in range(batch.num_rows):
                    values = {name: cols[name][i] for name in columns}
                    try:
                        yield _make_document(values, config, unit.path, row, f"{unit.path} row {row}")
                    except BadInputError as e:
                        yield _bad(e, config)
                    row += 1
    except (pa.ArrowInvalid, pa.ArrowIOError) as e:
        raise BadInputError(f"{unit.path} row group {unit.row_group}", f"cannot be read ({e})") from None


def read_jsonl_unit(unit: InputUnit, config: ReadConfig) -> Iterator[Document | BadRecord]:
    import fsspec

    # Binary lines, decoded one at a time, so a bad byte is reported with its line number.
    with fsspec.open(unit.path, "rb", compression="infer") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield _jsonl_document(raw, config, unit.path, line_no)
            except BadInputError as e:
                yield _bad(e, config)


def _jsonl_document(raw: bytes, config: ReadConfig, path: str, line_no: int) -> Document:
    where = f"{path} line {line_no}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInputError(where, f"is not valid UTF-8 ({e.reason} at byte {e.start})", "invalid_utf8") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadInputError(where, f"is not JSON ({e.msg})", "invalid_json") from None
    # Rows are numbered from 0 like parquet rows; the messages give 1-based lines.
    return _object_document(obj, config, path, line_no - 1, where)


def _object_document(obj, config: ReadConfig, path: str, row: int, where: str) -> Document:
    if not isinstance(obj, dict):
        raise BadInputError(where, f"is a JSON {type(obj).__name__}, not an object", "not_an_object")
    fields = [name for name, _ in config.fields()]
    missing = [k for k in (fields if config.with_lid else fields[:2]) if k not in obj]
    if missing:
        raise BadInputError(where, f"missing field(s) {', '.join(missing)}", "missing_field")
    return _make_document(obj, config, path, row, where)


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


def read_json_unit(unit: InputUnit, config: ReadConfig) -> Iterator[Document | BadRecord]:
    """Documents of a .json file: one object, an array of objects, or objects one after another."""
    import fsspec

    with fsspec.open(unit.path, "rb", compression="infer") as f:
        for index, obj in enumerate(_JsonText(f, unit.path).values()):
            try:
                yield _object_document(obj, config, unit.path, index, f"{unit.path} record {index + 1}")
            except BadInputError as e:
                yield _bad(e, config)


def read_unit(unit: InputUnit, config: ReadConfig) -> Iterator[Document]:
    if unit.kind == "parquet":
        return read_parquet_unit(unit, config)
    if unit.kind == "json":
        return read_json_unit(unit, config)
    return read_jsonl_unit(unit, config)


class ReadUnitFn(beam.DoFn):
    def __init__(self, config: ReadConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_read")
        self._bad = beam.metrics.Metrics.counter("pretokenize", "bad_records_skipped")

    def setup(self):
        self._progress = Progress("read")
        self._reported = 0

    def process(self, unit: InputUnit):
        check_unchanged(unit)
        for item in read_unit(unit, self._config):
            if isinstance(item, BadRecord):
                self._bad.inc()
                if self._reported < 20:
                    self._reported += 1
                    log.warning("skipping a bad record (%s): %s: %s", item.reason, item.where, item.problem)
                yield beam.pvalue.TaggedOutput(DROPPED, item.reason)
                continue
            self._docs.inc()
            self._progress.add(documents=1, chars=len(item.text))
            yield item
        # Checked again at the end: a file rewritten while it was read must not go into the output.
        check_unchanged(unit)


class ReadDocuments(beam.PTransform):
    """Documents from ``config.pattern``, in units planned (and checked) at construction time.

    Outputs: ``docs`` (Documents) and ``dropped`` (the reason of each record skipped under
    ``on_bad_record="skip"``).

    Example::

        read = pipeline | "ReadDocuments" >> ReadDocuments(ReadConfig("data/*.parquet"))
        docs, bad = read.docs, read.dropped
    """

    def __init__(self, config: ReadConfig):
        super().__init__()
        self._config = config
        self.units = plan_input(config)
        log.info("input: %d units of work from %s", len(self.units), config.pattern)

    def expand(self, pbegin):
        return (
            pbegin
            | "ListInputUnits" >> beam.Create(self.units)
            | "SpreadInputUnits" >> beam.Reshuffle()
            | "ReadUnits" >> beam.ParDo(ReadUnitFn(self._config)).with_outputs(DROPPED, main="docs")
        )


class CountRecords(beam.PTransform):
    """(documents, skipped bad records) in; the number of records read, one element, out.

    Every record counts, the skipped ones too, so that read = written + dropped can be checked.

    Example::

        read = pipeline | ReadDocuments(config)
        raw = (read.docs, read.dropped) | "CountDocuments" >> CountRecords()
    """

    def expand(self, pcolls):
        # One small value per record into the Flatten, never the records: a Flatten of outputs of a
        # fused stage is materialized by the FnApiRunner, and that would hold every document's text.
        ones = [pc | f"OnePerRecord{i}" >> beam.Map(lambda _: 1) for i, pc in enumerate(pcolls)]
        return ones | "AllRecords" >> beam.Flatten() | "Count" >> beam.combiners.Count.Globally()
