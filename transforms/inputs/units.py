"""InputUnit: one piece of reading work, with the fingerprint of its file when the job was planned.

The input is planned at launch (transforms/inputs/plan.py): the pattern is expanded, every file
is planned by its format into units (a parquet row group, or a whole JSON file), and each unit
records its file's size and version. A worker checks that the file is still that one before and after it
reads the unit: a job never mixes versions. This module imports no Beam and no Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from shards import storage
from transforms.core.progress import Planned
from transforms.core.records import BadInputError


class InputUnit(NamedTuple):
    """One piece of reading work: a row group of a parquet file, or a whole JSONL (or JSON) file."""

    path: str
    kind: str  # the input format's kind (transforms.inputs.registry): "parquet", "jsonl" or "json"
    row_group: int  # -1 for jsonl
    first_row: int  # index in its file of the unit's first row
    fingerprint: str = ""  # size and version of the file when the job was planned
    rows: int = -1  # rows of a parquet row group; -1 when unknown until read (jsonl)
    # What the unit costs to work through, for spreading units over workers (transforms.core.spread):
    # the text column's uncompressed bytes in a parquet row group, the file's size for JSON (its
    # compressed size, when it is compressed: a compressed file ranks below its worth).
    text_bytes: int = -1


class RowCount(NamedTuple):
    """The records a format counted in a unit whose rows its plan does not know (``--plan``):
    ``records`` in the first ``stored_bytes`` of the file as stored, ``whole`` when that is all of
    it, and ``pooled`` when its records per stored byte may stand for other files compressed alike."""

    records: int
    stored_bytes: int
    whole: bool
    pooled: bool


def whole_file(path: str, kind: str, info: dict) -> InputUnit:
    """The unit of a file read whole (JSON), its cost the file's size as stored."""
    return InputUnit(path, kind, -1, 0, fingerprint_of(info), text_bytes=info.get("size") or 0)


def unit_cost(unit: InputUnit) -> int:
    return unit.text_bytes


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


def check_unchanged(unit: InputUnit) -> None:
    """A BadInputError when the file is not the one the job planned: a job never mixes versions."""
    if not unit.fingerprint:
        return
    fs, fs_path = storage.filesystem(unit.path)
    now = file_fingerprint(fs, fs_path, fresh=True)
    if now != unit.fingerprint:
        raise BadInputError(unit.path, f"changed while the job ran ({unit.fingerprint} when planned, now {now})")


def planned_work(units: Sequence[InputUnit]) -> Planned:
    """What the read step will do, as known at launch: rows when every unit's are known (parquet),
    else input units (a JSONL file's rows are known once it is read)."""
    if all(u.rows >= 0 for u in units):
        return Planned(sum(u.rows for u in units), "rows", ("documents", "bad_records"))
    return Planned(len(units), "input units", ("units",))
