"""BENCHMARKS.md as sections, so that a run rewrites the sections it measured and keeps every other one.

A section is a ``## `` heading and the lines up to the next one (``###`` headings belong to it; a
heading inside a fenced block is text); the lines before the first heading, the title and the main
table, belong to the full ``make bench``. A section is matched by its key: its heading with every
figure left out, so that ``## 2 MB documents without whitespace`` (a run with ``--long-doc-mb 2``)
replaces ``## 20 MB documents without whitespace`` instead of standing beside it. Sections added by
hand (``## Resume after a kill (issue 15)``, ...) are never matched by a run's, and stay where they are.
"""

from __future__ import annotations

import re

TITLE = "# Benchmarks"


def key(heading: str) -> str:
    """What two headings of the same section share: the heading without its figures."""
    return re.sub(r"\d[\d.,]*", "N", heading.strip())


def split(text: str) -> tuple[list[str], list[list[str]]]:
    """The lines before the first ``## `` heading, and each section's lines (its heading first)."""
    head: list[str] = []
    sections: list[list[str]] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
        else:
            head.append(line)
    return head, sections


def _trimmed(lines: list[str]) -> list[str]:
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def splice(old: str, sections: list[list[str]], head: list[str] | None = None) -> str:
    """``old`` with each of ``sections`` in place of its section of the same key; a section ``old``
    lacks goes after the one before it in ``sections`` (the first, after the head). ``head``, when
    given, replaces the lines before the first heading; an empty ``old`` gets the title."""
    old_head, placed = split(old)
    if head is None:
        head = old_head if any(line.strip() for line in old_head) else [TITLE]
    keys = [key(s[0]) for s in placed]
    previous = -1  # where the last of ``sections`` stands in ``placed``
    for section in sections:
        k = key(section[0])
        if k in keys:
            previous = keys.index(k)
            placed[previous] = section
        else:
            previous += 1
            placed.insert(previous, section)
            keys.insert(previous, k)
    blocks = [_trimmed(head), *(_trimmed(s) for s in placed)]
    return "\n\n".join("\n".join(block) for block in blocks if block) + "\n"
