"""Removal lists and the removal audit log.

A removal list holds original ids, one per line. It has no comment syntax: every line that is not
blank, stripped of surrounding whitespace, is an id, so ``#tag-1`` is the id ``#tag-1``. Stripping
loses nothing, because the job refuses ids with surrounding whitespace or U+FEFF first (and ids holding ``|`` or a
line break: see ``shards.manifest.id_problem``). Lines end at ``\\n``, ``\\r\\n`` or ``\\r``; a UTF-8
byte order mark at the start of the file is not part of the first id. An id listed twice counts once.
A line holding ``|`` names no document any job stores, so a list with one is refused, naming the
line: it is usually an audit log given as a list, which would otherwise match nothing.

``removals.txt`` in an output tree records every document a surgical removal took out, one line
each, appended by each removal run, under a header line and a line saying which input field the
ids are values of (the ``--id-field`` the tree was written with):

    utc_time | removal_run | original_id | rel_path | tokens
    # id_field: "id"

The second line is JSON after ``# id_field: ``; logs written before it existed lack it (their
field is then the one the tree's stats record). A run that would read ids from another field is
refused: under it every removed document would come back, under its other id.

A file is a list or a log by how it is given, never by its content: the tree's own removals.txt is
always read as its log, strictly (a line that is not a log line stops the command, naming it); a
``--removal-list`` naming a file is always a list; one naming a directory (another output tree)
means that tree's removals.txt, read as its log, so a log can be applied to another tree.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import itertools
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator

import fsspec

from shards import storage, tree
from shards.layout import REMOVALS_NAME
from shards.manifest import DatasetStats

REMOVALS_HEADER = "utc_time | removal_run | original_id | rel_path | tokens"
ID_FIELD_PREFIX = "# id_field: "
DEFAULT_ID_FIELD = "id"


@dataclasses.dataclass(frozen=True)
class RemovalLog:
    """What an audit log says: the removed ids (distinct, in order), the runs that wrote lines,
    and the input field the ids are values of (None: a log written before that was recorded)."""

    ids: tuple[str, ...]
    runs: frozenset[str]
    id_field: str | None


def parse_removal_list(lines: Iterable[str], where: str = "the removal list") -> list[str]:
    """The distinct ids of a plain removal list, in the order they first appear: every non-blank line, stripped."""
    return list(dict.fromkeys(iter_removal_list(lines, where)))


def iter_removal_list(lines: Iterable[str], where: str = "the removal list") -> Iterator[str]:
    """The ids of a plain removal list as they come (an id listed twice comes twice): every
    non-blank line, stripped; a ValueError at a line holding ``|``."""
    for n, line in enumerate(lines, 1):
        doc_id = line.strip()
        if "|" in doc_id:
            raise ValueError(
                f"{where} line {n} holds '|', which no stored id can hold (an audit log? give the tree's "
                f"directory as the list to apply its {REMOVALS_NAME}): {doc_id[:80]!r}"
            )
        if doc_id:
            yield doc_id

def id_field_line(id_field: str) -> str:
    return ID_FIELD_PREFIX + json.dumps(id_field) + "\n"


def parse_removal_log(lines: Iterable[str], where: str = REMOVALS_NAME) -> RemovalLog:
    """An audit log's lines (BOM and line ends removed), strictly: ValueError naming the line."""
    id_field, entries = open_log(lines, where)
    ids, runs = [], set()
    for run, doc_id in entries:
        ids.append(doc_id)
        runs.add(run)
    return RemovalLog(tuple(dict.fromkeys(ids)), frozenset(runs), id_field)


def open_log(lines: Iterable[str], where: str = REMOVALS_NAME) -> tuple[str | None, Iterator[tuple[str, str]]]:
    """An audit log read as it comes: its id field (None: not recorded), and (run, id) of each
    line after, as they come (an id removed twice comes twice); a ValueError naming the line that
    is not a log line, when it is reached."""
    it = iter(lines)
    first = next(it, None)
    if first is None or first.strip() != REMOVALS_HEADER:
        raise ValueError(f"{where} does not start with the removals.txt header {REMOVALS_HEADER!r}")
    second = next(it, None)
    if second is None or not second.startswith(ID_FIELD_PREFIX):
        body = it if second is None else itertools.chain([second], it)
        return None, _log_entries(body, 2, where)
    try:
        id_field = json.loads(second[len(ID_FIELD_PREFIX):])
    except ValueError:
        id_field = None
    if not isinstance(id_field, str) or not id_field:
        raise ValueError(f"{where} line 2: not an id field line: {second[:80]!r}")
    return id_field, _log_entries(it, 3, where)


def _log_entries(lines: Iterable[str], first: int, where: str) -> Iterator[tuple[str, str]]:
    for n, line in enumerate(lines, first):
        if not line.strip():
            continue
        try:
            _, run, doc_id, _, _ = parse_removal_line(line)
        except ValueError as e:
            raise ValueError(f"{where} line {n}: {e}") from None
        yield run, doc_id


@dataclasses.dataclass(frozen=True)
class LogHead:
    """What an audit log says but its ids: the input field they are values of, and the runs that wrote lines."""

    id_field: str | None
    runs: frozenset[str]
    entries: int = 0  # its id lines (an id logged twice counts twice)


def scan_log(url: str) -> LogHead:
    """The audit log at ``url`` read through once, strictly (ValueError naming the file and line),
    holding no id: the common reading of every command that needs no more of it."""
    id_field, entries = open_log(iter_log_lines(url), where=url)
    runs, count = set(), 0
    for run, _ in entries:
        runs.add(run)
        count += 1
    return LogHead(id_field, frozenset(runs), count)


def shortened_log_problem(where: str, entries: int | None, removal_list_ids: int | None) -> str | None:
    """Why the tree's audit log (``entries`` id lines, None: no log at all) cannot be the one its
    stats were written from (``removal_list_ids`` distinct ids), or None: a log holds at least as
    many lines as the stats count ids, so one with fewer was deleted or cut by hand, and the ids
    it lost would be stored again by the next run."""
    if not removal_list_ids or (entries or 0) >= removal_list_ids:
        return None
    found = "is missing" if entries is None else f"lists {entries:,} removed ids"
    return (f"{where} {found}, but the tree's stats say {removal_list_ids:,} ids were removed: the log was deleted "
            "or cut by hand, and the ids it no longer lists would be stored again; put the tree's whole "
            f"{REMOVALS_NAME} back (from a copy of the tree), or re-run bucketed with the --removal-list the tree "
            "was written with, which records its ids again")


def log_ids(url: str) -> Iterator[str]:
    """The ids of the audit log at ``url``, as they come (one a line: an id logged twice comes twice), strictly."""
    return (doc_id for _, doc_id in open_log(iter_log_lines(url), where=url)[1])


def iter_log_lines(url: str) -> Iterator[str]:
    """The audit log's lines decoded as read_log_lines decodes them, one at a time."""
    return _iter_lines(url, "removal log")


def _iter_lines(url: str, what: str) -> Iterator[str]:
    try:
        _refuse_pipe(url, what)  # before it is opened: opening a pipe no one writes to would wait forever
        with storage.reaching(url), fsspec.open(url, "rt", encoding="utf-8-sig", compression="infer",
                                                newline=None) as f:
            for line in f:  # universal newlines: \r\n and \r arrive as \n
                yield line.rstrip("\n")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {url}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {url} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (io.UnsupportedOperation, OSError) as e:
        # A terminal, or a pipe the check below missed: a list is read more than once (its ids
        # counted, then matched), and a second reading of a pipe would find nothing.
        if isinstance(e, io.UnsupportedOperation) or e.errno == errno.ESPIPE:
            raise ValueError(_pipe_message(url, what)) from None
        raise


def _refuse_pipe(url: str, what: str) -> None:
    """A ValueError for a local path that is a pipe (a FIFO, /dev/stdin fed by one) or a socket."""
    fs, path = storage.filesystem(url)
    if not storage.renames_atomically(fs):
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # opening it says what is wrong
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise ValueError(_pipe_message(url, what))


def _pipe_message(url: str, what: str) -> str:
    return (f"{what} {url} is a pipe or a terminal, which can be read only once: write the ids to a file and "
            "give its path")


def _read_lines(url: str, what: str) -> list[str]:
    return list(_iter_lines(url, what))


def log_url_of(tree_url: str) -> str:
    return storage.join(tree_url, REMOVALS_NAME)


def read_log_lines(url: str) -> list[str]:
    """The lines of the audit log at ``url``, decoded the one way every reader of it uses (UTF-8,
    a BOM dropped, universal newlines), not yet parsed."""
    return _read_lines(url, "removal log")


def read_log(url: str) -> RemovalLog:
    """The audit log at ``url`` (a tree's removals.txt), strictly; ValueError naming the file and line."""
    return parse_removal_log(read_log_lines(url), where=url)


def read_removal_log(url: str) -> list[str]:
    """The ids an output tree's own removals.txt records as removed; a ValueError if it is not an audit log."""
    return list(read_log(url).ids)


def is_tree_source(url: str) -> bool:
    """Whether a --removal-list names a directory (an output tree: its removals.txt is the list)."""
    fs, path = storage.filesystem(url)
    with storage.reaching(url):
        return fs.isdir(path)


# A removal's journal (written by transforms/tools/surgery.py, read here without Beam): in the
# tree's journal directory (shards.tree.Tree.journal_url), plan.json, its commit point, and the
# rows of each affected file in files/NNNNNN.json, in the order plan.json lists the files.
JOURNAL_PLAN_NAME = "plan.json"
JOURNAL_FILES_DIR = "files"


def pending_removal(tree_url: str) -> tuple[list[str], str | None] | None:
    """The ids an accepted but unfinished removal in the tree at ``tree_url`` takes out (its
    journal: plan.json written), and the id field of the tree's stats before it; None when the
    tree has no pending removal. Read as JSON only; a ValueError naming the file if it is damaged."""
    journal = tree.Tree(tree_url).journal_url()
    plan_url = storage.join(journal, JOURNAL_PLAN_NAME)
    fs, path = storage.filesystem(plan_url)
    with storage.reaching(plan_url):
        if not fs.exists(path):
            return None
        try:
            plan = json.loads(storage.read_bytes(fs, path).decode("utf-8"))
            listed = [str(f["rel_path"]) for f in plan["files"]]
            stats_before = plan["stats_before"]
            ids = []
            for k, rel in enumerate(listed):
                rows_url = storage.join(journal, JOURNAL_FILES_DIR, f"{k:06d}.json")
                rows_fs, rows_path = storage.filesystem(rows_url)
                rows = json.loads(storage.read_bytes(rows_fs, rows_path).decode("utf-8"))
                if rows["rel_path"] != rel:
                    raise ValueError(f"{rows_url} holds the rows of {rows['rel_path']!r}, not of {rel!r}")
                ids += [str(doc_id) for doc_id, _, removed in rows["rows"] if removed]
        except FileNotFoundError as e:
            if not fs.exists(path):  # the removal finished meanwhile: its ids are in the log, read after this
                return None
            raise ValueError(f"the removal journal {plan_url} is incomplete ({e}); run pretokenize remove on "
                             f"{tree_url} to finish it") from None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{plan_url} is not a removal journal ({type(e).__name__}: {e}); run pretokenize "
                             "verify") from None
    return ids, tree_id_field(stats_before if isinstance(stats_before, str) else None)


def read_removal_source(url: str) -> tuple[list[str], str | None]:
    """The ids of a --removal-list, and the id field they are values of when it says (a tree's log);
    a file is a list, a directory an output tree whose removals.txt is read as its log, together
    with the ids of a removal it accepted and has not finished (its journal): a request is never
    lost because the tree it was made to is given as a list before the removal is done. The
    journal is read first: a removal that finishes meanwhile has its ids in the log read after."""
    if is_tree_source(url):
        pending = pending_removal(url)
        if pending is not None and not _log_exists(url):
            return pending
        log = read_log(log_url_of(url))
        ids = list(log.ids)
        if pending is not None:
            logged = set(ids)
            ids += [i for i in pending[0] if i not in logged]
            if log.id_field is not None and pending[1] is not None and pending[1] != log.id_field:
                raise ValueError(f"{url}: its {REMOVALS_NAME} lists ids of the field {log.id_field!r}, its unfinished "
                                 f"removal ids of {pending[1]!r}; run pretokenize verify")
        return ids, log.id_field or (pending[1] if pending is not None else None)
    return parse_removal_list(_read_lines(url, "removal list"), where=url), None


def removal_source(url: str) -> tuple[Callable[[], Iterator[str]], str | None]:
    """A --removal-list read as it comes, for a reader that holds no more of it than it must: a
    callable giving its ids afresh each time (in order, repeats allowed; the same ids as
    read_removal_source, which holds them) and the id field they are values of when it says. A
    tree's log is read through once here, strictly, before anything else; its pending removal's ids
    (its journal, read first as read_removal_source does) are held: they are one removal's rows."""
    if not is_tree_source(url):
        return (lambda: iter_removal_list(_iter_lines(url, "removal list"), where=url)), None
    pending = pending_removal(url)
    if pending is not None and not _log_exists(url):
        return (lambda: iter(pending[0])), pending[1]
    log_url = log_url_of(url)
    head = scan_log(log_url)
    if pending is None:
        return (lambda: log_ids(log_url)), head.id_field
    if head.id_field is not None and pending[1] is not None and pending[1] != head.id_field:
        raise ValueError(f"{url}: its {REMOVALS_NAME} lists ids of the field {head.id_field!r}, its unfinished "
                         f"removal ids of {pending[1]!r}; run pretokenize verify")
    return (lambda: itertools.chain(log_ids(log_url), pending[0])), head.id_field or pending[1]


def _log_exists(tree_url: str) -> bool:
    url = log_url_of(tree_url)
    fs, path = storage.filesystem(url)
    with storage.reaching(url):
        return fs.exists(path)


def read_removal_list(url: str) -> list[str]:
    """The ids in the removal list at ``url`` (local path or fsspec URL), or in the log of the tree it names."""
    return read_removal_source(url)[0]


def check_id_field(log_id_field: str | None, where: str, id_field: str, flag: str = "--id-field") -> None:
    """Refuse a run whose ids are values of another field than those a removal log lists."""
    if log_id_field is not None and log_id_field != id_field:
        raise ValueError(
            f"{where} lists removed ids that are values of the input field {log_id_field!r}, but this run reads "
            f"ids from {flag} {id_field!r}: the removed documents would come back under their other ids; run "
            f"with {flag} {log_id_field} (or write to a new output)"
        )


def format_removal_line(utc_time: str, run: str, doc_id: str, rel_path: str, tokens: int) -> str:
    return f"{utc_time} | {run} | {doc_id} | {rel_path} | {tokens}\n"


def parse_removal_line(line: str) -> tuple[str, str, str, str, int]:
    parts = line.rstrip("\n").split(" | ")
    if len(parts) != 5:
        raise ValueError(f"removals.txt line does not have 5 ' | '-separated fields: {line[:120]!r}")
    try:
        tokens = int(parts[4])
    except ValueError:
        raise ValueError(f"removals.txt line's token count is not a number: {line[:120]!r}") from None
    if not parts[2].strip():
        raise ValueError(f"removals.txt line has no id: {line[:120]!r}")
    return parts[0], parts[1], parts[2], parts[3], tokens


def tree_id_field(stats_text: str | None) -> str | None:
    """The --id-field a bucketed tree's stats (or a removal journal's stats before) record; None without stats."""
    if stats_text is None:
        return None

    try:
        return DatasetStats.from_text(stats_text).field_settings.get("id_field", DEFAULT_ID_FIELD)
    except (ValueError, KeyError):
        return None


