"""Arrow columns normalized into DocBatches, and DocBatches of records checked row by row.

A batch of input columns goes whole into a DocBatch when every row of it is good (``arrow_batch``,
pyarrow.compute over the columns); otherwise it is checked row by row (``checked_rows``, the exact
message and reason of each bad record, transforms.inputs.fields). The columns a DocBatch holds are
``row``, ``id`` and ``text`` and the filter's columns by their names (each as its condition's
kind, transforms.inputs.fields), with the same types on both paths. What a value is read as:

- A float32 (or float16) value is read as the shortest decimal that rounds to it in its own
  precision: the number the writer wrote. So a float32 LID score of 0.9 is read as 0.9 (not
  0.8999999761581421) and passes a threshold of 0.9; the float32 just below it is read as
  0.8999999 and does not.
- Text and id columns may be plain, large, view (``string_view``) or dictionary-encoded strings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.core.batches import DocBatch
from transforms.core.records import BadInputError, BadRecord, Document
from transforms.inputs.fields import EXPECTED, Field, ReadConfig, Row, make_row, skip_or_raise

# Documents a batch holds at most, and the text bytes a parquet batch aims at: a batch is the unit
# every later step works on, so it is large enough to make a Beam element's cost small, and small
# enough that a worker holds a few of them at once.
BATCH_DOCS = 4096
BATCH_TEXT_BYTES = 16 << 20

_STRING_TYPES = {pa.string(), pa.large_string()} | ({pa.string_view()} if hasattr(pa, "string_view") else set())
_NARROW_FLOATS = {pa.float16(): np.float16, pa.float32(): np.float32}
_ARROW_TYPES = {"string": pa.string(), "number": pa.float64(), "probability": pa.float64(), "integer": pa.int64(),
                "boolean": pa.bool_(), "any": pa.bool_()}

# Python's whitespace (str.isspace: what str.strip removes), as an RE2 class.
_SPACE = (r"\t\n\x0b\x0c\r\x1c-\x20\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}"
          r"\x{205f}\x{3000}")
# An id manifest.id_problem refuses: a '|' or a line break anywhere, whitespace at either end, U+FEFF
# first (an empty id is checked by its length). The rows it matches go through the exact per-row check.
_SUSPECT_ID = rf"[|\n\r\x0b\x0c\x1c\x1d\x1e\x{{85}}\x{{2028}}\x{{2029}}]|^[{_SPACE}\x{{feff}}]|[{_SPACE}]$"


def _arrow_kind_ok(arrow_type: pa.DataType, kind: str) -> bool:
    if pa.types.is_dictionary(arrow_type):
        return _arrow_kind_ok(arrow_type.value_type, kind)
    if kind == "string":
        return arrow_type in _STRING_TYPES
    if kind == "id":
        return _arrow_kind_ok(arrow_type, "string") or pa.types.is_integer(arrow_type)
    if kind in ("number", "probability"):
        return pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type)
    if kind == "integer":
        return pa.types.is_integer(arrow_type)
    if kind == "boolean":
        return pa.types.is_boolean(arrow_type)
    return kind == "any"


def check_schema(path: str, schema: pa.Schema, fields: Sequence[Field]) -> None:
    """A BadInputError naming the first field ``schema`` lacks or holds with the wrong type."""
    for name, kind, flag in fields:
        if name not in schema.names:
            raise BadInputError(path, f"missing column {name!r} (the file has {', '.join(schema.names)}); "
                                f"name the column to read with {flag}")
        got = schema.field(name).type
        if not _arrow_kind_ok(got, kind):
            raise BadInputError(path, f"column {name!r} has type {got}, expected {EXPECTED.get(kind, kind)} (read "
                                f"for {flag})")


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
        column = _filter_column(batch.column(name), kind)
        if column is None:
            return None
        columns[name] = column
    return pa.RecordBatch.from_pydict(columns)


def _filter_column(column: pa.Array, kind: str) -> pa.Array | None:
    """A filter column as its kind is read on both paths, or None when a value of it is a bad
    record (a probability out of [0, 1] or NaN)."""
    if kind == "string":
        return _string_column(column)
    if kind in ("number", "probability"):
        column = _score_column(column)
        if kind == "number":
            return column
        valid = pc.and_kleene(pc.greater_equal(column, 0.0), pc.less_equal(column, 1.0))
        return column if pc.all(pc.or_kleene(valid, pc.is_null(column, nan_is_null=False))).as_py() else None
    if kind == "any":  # only whether it is null
        return pc.if_else(pc.is_null(column), pa.scalar(None, pa.bool_()), True)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column.cast(_ARROW_TYPES[kind])


def rows_batch(source: str, rows: Sequence[Row], filter_fields: Sequence[Field]) -> DocBatch:
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
    """A DocBatch of Documents, with the default filter's columns when ``with_lid`` (for tests; a
    column a Document lacks is null)."""
    fields = ReadConfig("", with_lid=with_lid).filter_fields()
    rows = [Row(d.id, d.text, d.row, {f.name: d.fields.get(f.name) for f in fields}) for d in docs]
    return rows_batch(source, rows, fields)


def checked_rows(batch: pa.RecordBatch, config: ReadConfig, path: str, row: int) -> Iterator[DocBatch | BadRecord]:
    """A batch of input columns checked row by row: the exact message and reason of each bad record."""
    columns = [f.name for f in config.fields()]
    cols = {name: column_values(batch.column(name)) for name in columns}
    rows = []
    for i in range(batch.num_rows):
        try:
            rows.append(make_row({name: cols[name][i] for name in columns}, config, row + i, f"{path} row {row + i}"))
        except BadInputError as e:
            yield skip_or_raise(e, config)
    if rows:
        yield rows_batch(path, rows, config.filter_fields())


def batched(items: Iterator[Row | BadRecord], source: str, config: ReadConfig) -> Iterator[DocBatch | BadRecord]:
    """Records read one at a time, in DocBatches of at most BATCH_DOCS documents or about
    BATCH_TEXT_BYTES of text; bad records pass through as they come."""
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


def documents(items: Iterator[DocBatch | BadRecord], config: ReadConfig) -> Iterator[Document | BadRecord]:
    """Batches as one Document at a time (for tools and tests that look at documents one by one)."""
    named = [f.name for f in config.filter_fields()]
    for item in items:
        if isinstance(item, BadRecord):
            yield item
            continue
        columns = {name: item.column(name) for name in ("id", "text", "row", *named)}
        for i in range(item.size):
            fields = {name: columns[name][i] for name in named}
            yield Document(columns["id"][i], columns["text"][i], item.source, columns["row"][i], fields)
