"""The input formats, and which one reads a file: the one place a new format is listed.

Each entry names a format's kind (``InputUnit.kind``, recorded in a run's work description), the
file name endings it reads, and the module that holds it (an ``InputFormat``, transforms.inputs.formats,
named ``FORMAT``). The module is imported when a file of its kind is planned or read, so this table,
and the discovery of files that uses it, import no Arrow and no Beam.

The first entry that matches a file reads it. An entry with an ``option`` matches only when the
ReadConfig has that option set: ``.json`` files are JSON lines unless ``json_values`` asks for JSON
text.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

from transforms.inputs.compression import COMPRESSIONS

if TYPE_CHECKING:
    from transforms.inputs.fields import ReadConfig
    from transforms.inputs.formats import InputFormat

PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_BASES = (".jsonl", ".ndjson", ".json")
JSONL_SUFFIXES = tuple(base + ext for base in JSON_BASES for ext in COMPRESSIONS)
# Read as JSON text, not JSON lines, when ReadConfig.json_values is set.
JSON_VALUES_SUFFIXES = tuple(".json" + ext for ext in COMPRESSIONS)


class Registered(NamedTuple):
    """One input format: its kind, the (lower-case) endings it reads, its module, the ReadConfig
    option it needs (None: always), how a message lists its endings ("" for a format whose
    endings another entry lists), and its name in a flag's help."""

    kind: str
    suffixes: tuple[str, ...]
    module: str
    option: str | None = None
    described: str = ""
    title: str = ""


FORMATS: tuple[Registered, ...] = (
    Registered("parquet", PARQUET_SUFFIXES, "transforms.inputs.parquet", described=" or ".join(PARQUET_SUFFIXES),
               title="parquet"),
    Registered("json", JSON_VALUES_SUFFIXES, "transforms.inputs.json_text", option="json_values", title="JSON text"),
    Registered("jsonl", JSONL_SUFFIXES, "transforms.inputs.jsonl",
               described=f"{', '.join(JSON_BASES)}, plain or {', '.join(filter(None, COMPRESSIONS))}",
               title="JSON lines"),
)


def _entry(path: str, config: ReadConfig | None) -> Registered | None:
    lower = path.lower()
    for entry in FORMATS:
        if lower.endswith(entry.suffixes) and (entry.option is None or config is None
                                               or getattr(config, entry.option)):
            return entry
    return None


def is_input_file(path: str) -> bool:
    """Whether some format reads ``path`` (by its name): what a directory stands for."""
    return _entry(path, None) is not None


def unknown_type() -> str:
    """The problem of a file no format reads, listing the endings that are read."""
    return f"unknown file type; expected {', or '.join(e.described for e in FORMATS if e.described)}"


def input_help(options: tuple[str, ...] = ()) -> str:
    """The files a job reads, for its ``--input`` help: each format that reads files when the
    ReadConfig ``options`` are set (in the table's order), with the endings it is the first to
    read, compressed ones folded: ``.parquet/.pq (parquet) or .jsonl/... (JSON lines, plain or .gz/...)``."""
    packed = tuple(filter(None, COMPRESSIONS))
    claimed: set[str] = set()
    parts = []
    for entry in FORMATS:
        if entry.option is not None and entry.option not in options:
            continue
        mine = [s for s in entry.suffixes if s not in claimed]
        claimed.update(mine)
        plain = [s for s in mine if not s.endswith(packed)]
        folded = [c for c in packed if any(s.endswith(c) for s in mine)]
        also = f", plain or {'/'.join(folded)}" if folded else ""
        parts.append(f"{'/'.join(plain)} ({entry.title or entry.kind}{also})")
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


def _load(entry: Registered) -> InputFormat:
    return importlib.import_module(entry.module).FORMAT


def format_for(path: str, config: ReadConfig) -> InputFormat | None:
    """The format that reads ``path`` under ``config``; None when no format reads it."""
    entry = _entry(path, config)
    return None if entry is None else _load(entry)


def format_of(kind: str) -> InputFormat:
    """The format of an input unit's ``kind`` (one of the table's: the module is never named by data)."""
    for entry in FORMATS:
        if entry.kind == kind:
            return _load(entry)
    raise ValueError(f"no input format of kind {kind!r} (the formats: {', '.join(e.kind for e in FORMATS)})")
