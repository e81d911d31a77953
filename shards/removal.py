"""Removal lists and the removal audit log.

A removal list holds original ids, one per line; blank lines and lines starting with ``#`` are
ignored, and surrounding whitespace is not part of an id.

``removals.txt`` in an output tree records every document a surgical removal took out, one line
each, appended by each removal run:

    utc_time | removal_run | original_id | rel_path | tokens
"""

from __future__ import annotations

from collections.abc import Iterable

import fsspec

REMOVALS_NAME = "removals.txt"
REMOVALS_HEADER = "utc_time | removal_run | original_id | rel_path | tokens"


def parse_removal_list(lines: Iterable[str]) -> list[str]:
    """The distinct ids of a removal list, in the order they first appear."""
    seen: dict[str, None] = {}
    for line in lines:
        doc_id = line.strip()
        if doc_id and not doc_id.startswith("#"):
            seen.setdefault(doc_id, None)
    return list(seen)


def read_removal_list(url: str) -> list[str]:
    """The ids in the removal list at ``url`` (local path or fsspec URL)."""
    try:
        with fsspec.open(url, "rt", encoding="utf-8", compression="infer") as f:
            return parse_removal_list(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"removal list not found: {url}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"removal list {url} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_removal_log(url: str) -> list[str]:
    """The ids a removals.txt records as removed, in order, each once."""
    with fsspec.open(url, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[1:]
    return list(dict.fromkeys(parse_removal_line(line)[2] for line in lines if line.strip()))


def load_removal_ids(url: str) -> list[str]:
    """The ids of a removal list, or of a removals.txt audit log (told apart by the file name)."""
    if url.rstrip("/").rsplit("/", 1)[-1] == REMOVALS_NAME:
        return read_removal_log(url)
    return read_removal_list(url)


def format_removal_line(utc_time: str, run: str, doc_id: str, rel_path: str, tokens: int) -> str:
    return f"{utc_time} | {run} | {doc_id} | {rel_path} | {tokens}\n"


def parse_removal_line(line: str) -> tuple[str, str, str, str, int]:
    parts = line.rstrip("\n").split(" | ")
    if len(parts) != 5:
        raise ValueError(f"removals.txt line does not have 5 ' | '-separated fields: {line!r}")
    return parts[0], parts[1], parts[2], parts[3], int(parts[4])
