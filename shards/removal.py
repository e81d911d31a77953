"""Removal lists and the removal audit log.

A removal list holds original ids, one per line. It has no comment syntax: every line that is not
blank, stripped of surrounding whitespace, is an id, so ``#tag-1`` is the id ``#tag-1``. Stripping
loses nothing, because the job refuses ids with surrounding whitespace (and ids holding ``|`` or a
line break: see ``shards.manifest.id_problem``). Lines end at ``\n``, ``\r\n`` or ``\r``; a UTF-8
byte order mark at the start of the file is not part of the first id. An id listed twice counts once.

``removals.txt`` in an output tree records every document a surgical removal took out, one line
each, appended by each removal run, under a header line:

    utc_time | removal_run | original_id | rel_path | tokens

Wherever a removal list is accepted, an audit log is accepted too (its ids are the third column), so a
removals.txt copied from one output can be applied to another. The two are told apart by content,
never by file name: a file whose first line is that header (surrounding whitespace aside) is an audit
log, as no id can be (the header holds ``|``); anything else is a list, whatever it is called, even
``removals.txt``. ``read_removal_list`` reads both; every reader of a removal list goes through it.
"""

from __future__ import annotations

from collections.abc import Iterable

import fsspec

REMOVALS_NAME = "removals.txt"
REMOVALS_HEADER = "utc_time | removal_run | original_id | rel_path | tokens"


def is_removal_log(lines: list[str]) -> bool:
    """Whether a removal file's lines (BOM and line ends removed) are an audit log rather than a list."""
    return bool(lines) and lines[0].strip() == REMOVALS_HEADER


def parse_removal_list(lines: Iterable[str]) -> list[str]:
    """The distinct ids of a plain removal list, in the order they first appear: every non-blank line, stripped."""
    return list(dict.fromkeys(doc_id for doc_id in (line.strip() for line in lines) if doc_id))


def parse_removal_log(lines: list[str]) -> list[str]:
    """The distinct ids an audit log records as removed (its header first), in the order they first appear."""
    return list(dict.fromkeys(parse_removal_line(line)[2] for line in lines[1:] if line.strip()))


def parse_removal_file(lines: list[str]) -> list[str]:
    """The ids of a removal list or an audit log, told apart by the first line."""
    return parse_removal_log(lines) if is_removal_log(lines) else parse_removal_list(lines)


def _read_lines(url: str) -> list[str]:
    try:
        with fsspec.open(url, "rt", encoding="utf-8-sig", compression="infer", newline=None) as f:
            return [line.rstrip("\n") for line in f]  # universal newlines: \r\n and \r arrive as \n
    except FileNotFoundError:
        raise FileNotFoundError(f"removal list not found: {url}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"removal list {url} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_removal_list(url: str) -> list[str]:
    """The ids in the removal list or removals.txt audit log at ``url`` (local path or fsspec URL)."""
    lines = _read_lines(url)
    try:
        return parse_removal_file(lines)
    except ValueError as e:
        raise ValueError(f"{url} starts with the removals.txt header but is not an audit log: {e}") from None


def read_removal_log(url: str) -> list[str]:
    """The ids an output tree's own removals.txt records as removed; a ValueError if it is not an audit log."""
    lines = _read_lines(url)
    if not is_removal_log(lines):
        raise ValueError(f"{url} does not start with the removals.txt header {REMOVALS_HEADER!r}")
    try:
        return parse_removal_log(lines)
    except ValueError as e:
        raise ValueError(f"{url}: {e}") from None


def format_removal_line(utc_time: str, run: str, doc_id: str, rel_path: str, tokens: int) -> str:
    return f"{utc_time} | {run} | {doc_id} | {rel_path} | {tokens}\n"


def parse_removal_line(line: str) -> tuple[str, str, str, str, int]:
    parts = line.rstrip("\n").split(" | ")
    if len(parts) != 5:
        raise ValueError(f"removals.txt line does not have 5 ' | '-separated fields: {line!r}")
    return parts[0], parts[1], parts[2], parts[3], int(parts[4])
