"""Which fields are read (``ReadConfig``), and the check of one record's values.

Which fields: the id and the text, by the names ``id_field`` and ``text_field``, and (``with_lid``)
the columns the filter's conditions read (shards/conditions.py; by default the FinePDFs-Edu
card's), each as its condition's kind. In a DocBatch the id and the text are the columns ``id``
and ``text``; a condition's column keeps its own name. A missing column or field is named with the
flag that names it (``--text-field``, ``--language-fields``, ``--keep '...'``), so the fix is in the
message.

What a value is read as, checked here for a record read row by row (JSON, and a parquet batch the
Arrow path could not take whole, transforms.inputs.arrow), by kind:

- ``string``, ``id``: text and id values are strings (an integer id is read as its decimal); a
  string holding a lone UTF-16 surrogate is not valid text (``invalid_utf8``).
- ``probability`` (the LID score): a number within [0, 1]; another (NaN and infinities included)
  is a bad record, ``bad_lid_score``: it is no probability, so no threshold can judge it.
- ``number``: any number, read as a float; ``integer``: an integer; ``boolean``: true or false;
  ``any``: only whether the value is null is read (what ``== null`` asks).
- An id the manifest could not hold (``shards.manifest.id_problem``) is ``bad_id``.

This module imports no Beam and no Arrow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from shards import conditions
from shards.manifest import has_lone_surrogate, id_problem
from transforms.core.records import BadInputError, BadRecord

# DocBatch's own column names: a condition on one reads the document's id or text.
BATCH_COLUMNS = ("row", "id", "text")
# What a kind's message calls the values it expects.
EXPECTED = {"id": "a string or an integer", "probability": "number", "any": "any value"}


class Field(NamedTuple):
    """A field the job reads: its name in the input, the kind of value it holds (id, string,
    number, ...), and the flag that names it (for a message about a missing one)."""

    name: str
    kind: str
    flag: str


def condition_fields(conds: Sequence[conditions.Condition]) -> tuple[Field, ...]:
    """The input columns the conditions read, each once, as its condition's kind (``@tokens`` and
    the document's id and text are no input columns); a ValueError for a column two conditions
    would read as different kinds."""
    out: dict[str, Field] = {}
    for c in conds:
        if c.column == "row":
            raise ValueError(f"{c.flag}: 'row' cannot be a filter field (the job's own column name)")
        if c.column in BATCH_COLUMNS and c.kind not in ("string", "any"):
            raise ValueError(f"{c.flag}: the document's {c.column} is a string, compared here as {c.kind}")
        if c.column == conditions.TOKENS or c.column in BATCH_COLUMNS:
            continue
        seen = out.setdefault(c.column, Field(c.column, c.kind, c.flag))
        if seen.kind != c.kind:
            raise ValueError(f"{c.flag}: {c.column!r} is read as {seen.kind} by {seen.flag}, here as {c.kind}")
    return tuple(out.values())


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """What to read: the id and the text, and with ``with_lid`` the filter's columns (by default
    the FinePDFs-Edu card's; see the module docstring)."""

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
    # The filter's columns, read when with_lid (condition_fields); None: the default list's.
    columns: tuple[Field, ...] | None = None

    def __post_init__(self):
        if self.on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {self.on_bad_record!r}")
        if self.batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        if self.columns is None:
            object.__setattr__(self, "columns", condition_fields(conditions.conditions({})))
        object.__setattr__(self, "columns", tuple(self.columns))
        names = [f.name for f in self.fields()]
        for name in names:
            if not name:
                raise ValueError("a field name must not be empty")
            if names.count(name) > 1:
                raise ValueError(f"the field {name!r} is named twice (--id-field, --text-field, --language-fields, "
                                 "--lid-score-field, --token-count-field name different fields)")

    def filter_fields(self) -> list[Field]:
        """The filter's columns, in the order its conditions run."""
        return list(self.columns) if self.with_lid else []

    def fields(self) -> list[Field]:
        """Every field read: the id, the text, then the filter's."""
        return [Field(self.id_field, "id", "--id-field"), Field(self.text_field, "string", "--text-field"),
                *self.filter_fields()]


def check_value(value, kind: str, where: str, field: str, nullable: bool):
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
    if kind in ("number", "probability") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "any":
        return True  # only its nullness is read
    problem = f"{field!r} is {type(value).__name__} {value!r:.40}, expected {EXPECTED.get(kind, kind)}"
    raise BadInputError(where, problem, reason="wrong_type")


class Row(NamedTuple):
    """One record read row by row: its id, text, row and the filter's fields by name."""

    id: str
    text: str
    row: int
    fields: dict


def make_row(values: dict, config: ReadConfig, row: int, where: str) -> Row:
    """The checked Row of one record's ``values`` (field name -> value), or a BadInputError."""
    doc_id = check_value(values.get(config.id_field), "id", where, config.id_field, nullable=False)
    problem = id_problem(doc_id)
    if problem:
        # The manifest is '|'-separated, one row a line: such an id would be read back wrong.
        raise BadInputError(where, f"{config.id_field} {doc_id!r:.80}: {problem}", reason="bad_id")
    text = check_value(values.get(config.text_field), "string", where, config.text_field, nullable=False)
    fields = {}
    for name, kind, _ in config.filter_fields():
        fields[name] = value = check_value(values.get(name), kind, where, name, nullable=True)
        if kind == "probability" and value is not None and not 0.0 <= value <= 1.0:  # NaN fails too
            raise BadInputError(where, f"{name!r} is {value}, expected a number within [0, 1]",
                                reason="bad_lid_score")
    return Row(doc_id, text, row, fields)


def object_row(obj, config: ReadConfig, row: int, where: str) -> Row:
    """The checked Row of a record that should be an object holding every field read (JSON)."""
    if not isinstance(obj, dict):
        raise BadInputError(where, f"is a JSON {type(obj).__name__}, not an object", "not_an_object")
    missing = [f for f in config.fields() if f.name not in obj]
    if missing:
        flags = ", ".join(dict.fromkeys(f.flag for f in missing))
        raise BadInputError(where, f"missing field(s) {', '.join(f.name for f in missing)}; name the field to "
                            f"read with {flags}", "missing_field")
    return make_row(obj, config, row, where)


def skip_or_raise(error: BadInputError, config: ReadConfig) -> BadRecord:
    """The record to skip, or the error raised again when it must stop the job."""
    if error.reason is None or config.on_bad_record != "skip":
        raise error
    return BadRecord(error.reason, error.where, error.problem)
