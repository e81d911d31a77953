"""The tree's audit log, removals.txt, as the commands that change a tree read and write it: checked
strictly before any change, counted, and appended to (a removal's lines once per run; a
--removal-list's ids a bucketed run kept out), streamed, never gathered. Its line format and its
strict reading are shards/removal/lists.py's."""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Iterable, Iterator

from shards import layout, storage, tree
from shards.manifest import DatasetStats
from shards.removal import idmatch, journal, lists

log = logging.getLogger(__name__)

COUNT_DIR = "distinct"  # in the journal's directory: the partition files counting a long log's ids
# The rel_path of an audit line for an id a --removal-list run kept out: it was never stored.
NOT_STORED = "-"


def scan_tree_log(output: str, repairing: str | None = None) -> lists.LogHead | None:
    """The tree's removals.txt, read through once strictly as its audit log, holding no id: its id
    field and runs (None when it has none); a ValueError naming the line that is not a log line,
    or saying that the log is missing or shorter than the stats' count of removed ids. That last
    is only a warning for a bucketed run given a removal list (``repairing``: the list), which
    records the list's ids again (a tree written before runs logged their lists has no log)."""
    url = storage.join(output, lists.REMOVALS_NAME)
    head = lists.scan_log(url) if lists.tree_log_exists(output) else None
    problem = lists.shortened_log_problem(url, head.entries if head else None, _stats_removal_ids(output))
    if problem is not None and repairing is None:
        raise ValueError(problem)
    if problem is not None:
        log.warning("%s; this run keeps out and records the ids of --removal-list %s and of the log as it is",
                    problem, repairing)
    return head


def _stats_removal_ids(output: str) -> int | None:
    """The removal_list_ids of the tree's dataset_stats.txt; None without one, or one that does not
    parse (the commands that need the stats say so themselves)."""
    fs, root = storage.filesystem(output)
    path = posixpath.join(root, layout.STATS_NAME)
    try:
        if not fs.exists(path):
            return None
        return DatasetStats.from_text(storage.read_bytes(fs, path).decode("utf-8")).removal_list_ids
    except (ValueError, KeyError, TypeError):
        return None


def logged_count(output: str) -> int:
    """The distinct ids the tree's removals.txt lists, streamed (idmatch.count_distinct,
    its partitions in the journal's directory): the stats' removal_list_ids."""
    if not lists.tree_log_exists(output):
        return 0
    url = storage.join(output, lists.REMOVALS_NAME)
    return idmatch.count_distinct(lambda: lists.log_ids(url), idmatch.Scratch(output, journal.journal_name(COUNT_DIR)))


def _existing_log(output: str) -> Callable[[], Iterator[str]] | None:
    """The tree's removals.txt (None without one), checked strictly before any change, as its
    lines afresh for each call: decoded as the launch check (scan_tree_log) decodes them."""
    if not lists.tree_log_exists(output):
        return None
    url = storage.join(output, lists.REMOVALS_NAME)
    lists.scan_log(url)  # strictly, before any change
    return lambda: lists.iter_log_lines(url)


def log_chunks(existing: Callable[[], Iterator[str]] | None, id_field: str, lines: Iterable[str]) -> Iterator[str]:
    """removals.txt with ``lines`` appended, piece by piece (the old lines and the new as they
    come): a new log gets its header and id field line; a log written before the id field was
    recorded gets the line now (every other line kept as it was, each ending in a line break)."""
    if existing is None:
        yield lists.REMOVALS_HEADER + "\n" + lists.id_field_line(id_field)
    else:
        old = existing()
        yield next(old) + "\n"  # the header (scan_log checked it)
        second = next(old, None)
        if second is None or not second.startswith(lists.ID_FIELD_PREFIX):
            yield lists.id_field_line(id_field)
        if second is not None:
            yield second + "\n"
        yield from (line + "\n" for line in old)
    yield from lines


def append_audit_lines(output: str, plan: journal.RemovalPlan) -> None:
    """One removals.txt line per document the plan takes out, once per removal run; the old lines
    are copied and the new written as each affected file's rows are read, never gathered."""
    existing = _existing_log(output)
    runs = set() if existing is None else lists.scan_log(storage.join(output, lists.REMOVALS_NAME)).runs
    if plan.run not in runs:
        rows = plan.iter_removed_rows()
        lines = (lists.format_removal_line(plan.utc_time, plan.run, d, rel, n) for rel, d, n in rows)
        id_field = lists.tree_id_field(plan.stats_before) or lists.DEFAULT_ID_FIELD
        journal.write_streamed(output, lists.REMOVALS_NAME, log_chunks(existing, id_field, lines), "removal log")


def record_removal_list(output: str, ids: list[str], run: str, utc_time: str, id_field: str) -> int:
    """Append to removals.txt every id of a --removal-list that it does not list yet (rel_path
    ``-``, tokens 0: left out before tokenizing), so that every later run keeps it out too; the
    ids are values of ``id_field``, the run's --id-field. Returns how many lines were added."""
    existing = _existing_log(output)
    known = set() if existing is None else set(lists.log_ids(storage.join(output, lists.REMOVALS_NAME)))
    new = [i for i in ids if i not in known]
    if new:
        lines = [lists.format_removal_line(utc_time, run, i, NOT_STORED, 0) for i in new]
        tree.write_file(output, lists.REMOVALS_NAME, "".join(log_chunks(existing, id_field, lines)).encode("utf-8"))
    return len(new)


def record_published_run(output: str, pending_run: str | None, removal_list: str | None, run_id: str,
                         id_field: str) -> None:
    """What a bucketed run that has just published records of removal: the audit lines of the
    pending removal ``pending_run`` whose documents it kept out (then its journal goes), and the
    ids of its ``removal_list`` the log does not list yet, so every later run keeps them out too."""
    if pending_run is not None:
        plan = journal.load_journal(output)
        if plan is not None and plan.run == pending_run:
            append_audit_lines(output, plan)
            journal.delete_journal(output)
    if removal_list is not None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        record_removal_list(output, lists.read_removal_list(removal_list), run_id, now, id_field)
