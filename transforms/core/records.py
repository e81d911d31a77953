"""The record types that flow through the jobs, and the error raised for bad input."""

from __future__ import annotations

from typing import NamedTuple

# The output of each step that drops records: one reason string per dropped record.
DROPPED = "dropped"


class UsageError(Exception):
    """A mistake in how a job was asked for (a flag, a path, a setting), found before it ran."""


class BadInputError(ValueError):
    """Input the job cannot use. The message names the file (and row) and what is wrong with it."""

    PREFIX = "bad input: "

    def __init__(self, where: str, problem: str, reason: str | None = None):
        super().__init__(f"{self.PREFIX}{where}: {problem}")
        self.where = where
        self.problem = problem
        # Set for a problem confined to one record (a row, a line): with --on-bad-record skip the
        # record is dropped and counted under this reason instead of stopping the job.
        self.reason = reason


class BadRecord(NamedTuple):
    """A record that could not be read, skipped under --on-bad-record skip."""

    reason: str
    where: str
    problem: str


class Document(NamedTuple):
    """One source document. ``source`` and ``row`` say where it was read, for errors and tie-breaks.
    ``fields``: the filter's columns by name (shards/conditions.py), a null as None; never mutated."""

    id: str
    text: str
    source: str
    row: int
    fields: dict = {}
