"""A removal's plan, made and checked before any byte changes: the affected files found by one
streaming pass over the manifest (the ids matched in bounded memory, shards/removal/idmatch.py),
every file the removal reads or rewrites checked to be the tool's and inside the tree; and, once
the plan is journalled, what the removal makes stale goes (saved work, derived exports)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Iterator

from shards import layout, manifest, storage, tree
from shards.card import CARD_NAME
from shards.index import INDEX_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from shards.removal import audit, idmatch
from shards.removal.journal import (
    FILES_DIR,
    JOURNAL_DIR,
    FilePlan,
    FileSummary,
    RemovalPlan,
    clear_unplanned_journal,
    delete_journal,
    journal_name,
    journal_url,
    shard_path,
)
from shards.removal.lists import REMOVALS_NAME, log_ids

MATCH_DIR = tree.Tree.MATCH_DIR  # in the plan's directory: the partition files of a long list's match


def tree_files_read_or_rewritten() -> tuple[str, ...]:
    """The tree's own files a removal reads or rewrites besides the shards: each is checked
    (``check_tree_files``) before it changes a byte."""
    return (tree.RECORD_NAME, layout.MANIFEST_NAME, layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME,
            layout.CHECKSUMS_NAME, INDEX_NAME, REMOVALS_NAME)


def check_tree_files(output: str) -> None:
    """Every file of ``tree_files_read_or_rewritten`` that exists resolves inside the tree, reached
    through no linked directory (links included: a link out of the tree is refused), before a
    removal reads one, rewrites a shard or deletes anything: UnsafePathError naming it otherwise.
    The shards it rewrites are checked as its plan names them (``shard_path``)."""
    out = tree.Tree(output)
    for name in tree_files_read_or_rewritten():
        if out.lexists(name):
            out.writable(name, "file remove reads or rewrites")


def check_checksums(output: str) -> None:
    """A removal ends by rewriting checksums.sha256: one that cannot be read stops it before it
    begins (a ValueError naming the file and the line), not after the shards have changed."""
    try:
        manifest.read_checksums(output)
    except storage.NotRegularFileError:
        raise
    except ValueError as e:
        raise ValueError(f"{e}: the tree's checksums are damaged; a bucketed re-run writes them again "
                         "(pretokenize verify says what else is wrong)") from None


def _manifest_files(lines: Iterable[str]) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """(rel_path, [(id, count), ...]) per file, checking that a file's rows are contiguous."""
    seen: set[str] = set()
    current, rows = None, []
    for rel, doc_id, n in manifest.read_rows(lines):
        if rel != current:
            if current is not None:
                yield current, rows
            if rel in seen:
                raise ValueError(f"manifest rows of {rel} are not contiguous; run pretokenize verify")
            seen.add(rel)
            current, rows = rel, []
        rows.append((doc_id, n))
    if current is not None:
        yield current, rows


def make_plan(output: str, removal_ids: Iterable[str] | Callable[[], Iterable[str]], run: str, utc_time: str,
              plan_url: str | None = None) -> RemovalPlan:
    """Find the files that hold a flagged id, streaming the manifest; each affected file's rows go
    to ``plan_url`` (the journal's directory unless given: a dry run's is a scratch directory) as
    soon as its rows are read, so only one file's rows are ever held. ``removal_ids`` (or a
    callable giving them afresh: a list longer than the bound is read more than once) are matched
    through shards.idmatch, in memory bounded whatever their number; its partition files, if any,
    live beside the plan and are gone before this returns. The tree must be a finished bucketed one
    whose stats parse (IncompleteTreeError, UnreadableStatsError otherwise): they are rewritten
    when the removal finishes."""
    out = tree.OutputTree.open(output)
    if out.tree_kind is None or not out.tree_kind.removes_in_place:
        raise ValueError(f"{output} is a {out.kind} tree; documents are removed from bucketed trees only")
    out.stats()  # finished, and its stats parse: the removal rewrites them when it finishes
    recorded = set(tree.owned(output, "bucketed").files)
    in_journal = plan_url is None
    if in_journal:  # no plan.json (load_journal found none): a plan begun by a run that died; nothing started
        plan_url = journal_url(output)  # cleared before anything is written there (the scratch's prepare)
        scratch = idmatch.Scratch(output, journal_name(MATCH_DIR), prepare=lambda: clear_unplanned_journal(output))
    else:
        scratch = idmatch.Scratch(None, os.path.join(plan_url, MATCH_DIR))
    listed = removal_ids if callable(removal_ids) else (lambda ids=list(removal_ids): iter(ids))
    try:
        matcher = idmatch.match_ids(listed, lambda: _logged_ids(output), lambda: _manifest_ids(output), scratch)
        scratch.ready()  # a list held in memory was read whole, and the log: now the plan's rows are written
        files = _plan_files(output, recorded, matcher, plan_url)
        matches = matcher.result()
        if in_journal and not files and scratch.wrote:  # only the match's files were written: no trace left
            delete_journal(output)
    except BaseException:
        scratch.clear()
        if in_journal and scratch.was_ready:  # the rows written so far go (no plan.json yet): the tree is as it was
            delete_journal(output)
        raise
    return RemovalPlan(run, utc_time, out.stats_text, tuple(files), plan_url, matches=matches)


def _plan_files(output: str, recorded: set[str], matcher, plan_url: str) -> list[FileSummary]:
    """The manifest streamed once, asking ``matcher`` of each row; each affected file's rows written
    to ``plan_url`` as it is read. The summaries of the affected files."""
    fs, root = storage.filesystem(output)
    files = []
    ordinal = 0
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as f:
        for rel, rows in _manifest_files(f):
            hits = matcher.hits(ordinal, [doc_id for doc_id, _ in rows])
            ordinal += len(rows)
            if any(hits):
                shard_path(output, rel)  # before anything changes: a row naming a file outside is refused
                check_recorded(output, recorded, rel)  # and one naming a file the tool did not write
                plan = FilePlan(rel, tuple((d, n, h) for (d, n), h in zip(rows, hits, strict=True)))
                url = storage.join(plan_url, FILES_DIR, f"{len(files):06d}.json")
                storage.write_atomic(url, plan.to_json().encode("utf-8"))
                files.append(plan.summary())
    return files


def _manifest_ids(output: str) -> Iterator[str]:
    """The manifest's ids in row order, read as _plan_files reads them (the same checks)."""
    fs, root = storage.filesystem(output)
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as f:
        for _, rows in _manifest_files(f):
            yield from (doc_id for doc_id, _ in rows)


def _logged_ids(output: str) -> Iterator[str]:
    """The ids the tree's removals.txt lists (none without one), as they come."""
    if not audit.tree_log_exists(output):  # a log that is a link out of the tree is refused
        return iter(())
    return log_ids(storage.join(output, REMOVALS_NAME))


def check_recorded(output: str, recorded: set[str], rel: str) -> None:
    """A file a removal would rewrite or delete is one the tree's record lists: a manifest row (or
    a journal entry) naming any other file is refused, naming it, before anything changes."""
    if rel not in recorded:
        raise tree.NotOurTreeError(
            f"{storage.join(output, rel)}: the manifest names it, but the tree's {tree.RECORD_NAME} does not list it "
            "as the tool's; pretokenize never rewrites or deletes a file it did not write (run pretokenize verify)"
        )


def publishing_runs(output: str) -> list[str]:
    """The runs whose directory under the tree's temporary directory says they began publishing
    and did not finish (a killed bucketed re-run): until one finishes, the tree is theirs."""
    fs, root = storage.filesystem(output)
    temp_root = posixpath.join(root, layout.TEMP_DIR_NAME)
    if not fs.isdir(temp_root):
        return []
    runs = []
    for entry in sorted(fs.ls(temp_root, detail=False)):
        name = posixpath.basename(entry.rstrip("/"))
        if name != JOURNAL_DIR and fs.exists(posixpath.join(entry, tree.Tree.PUBLISHING_MARK)):
            runs.append(name)
    return runs


def check_plan(output: str, plan: RemovalPlan) -> None:
    """Every check a removal can make before it changes a byte: each affected file is a shard
    whose size is its count before (or after, done by an earlier attempt; or gone when nothing
    is left of it), and no bucketed run is half published over the tree. A ValueError in one line
    otherwise, saying which command finishes the tree."""
    running = publishing_runs(output)
    if running:
        raise ValueError(
            f"a bucketed re-run into {output} took over the unfinished removal {plan.run} and stopped while "
            f"publishing ({storage.join(output, layout.TEMP_DIR_NAME, running[0])}): run that bucketed command "
            "again; it finishes the removal too"
        )
    check_checksums(output)
    stats = DatasetStats.from_text(plan.stats_before)
    itemsize = layout.DTYPES[stats.dtype].itemsize
    fs, root = storage.filesystem(output)
    recorded = set(tree.owned(output, "bucketed").files)
    for f in plan.files:
        bucket = layout.parse_shard_rel_path(f.rel_path).bucket  # ValueError for a name that is no shard's
        if bucket not in stats.buckets:
            raise ValueError(f"{f.rel_path}: bucket {bucket} is not in the tree's stats (run pretokenize verify)")
        path = shard_path(output, f.rel_path)
        before, after = f.tokens_before * itemsize, f.tokens_after * itemsize
        size = fs.size(path) if fs.exists(path) else None
        if size is None and after == 0:
            continue  # deleted by an earlier attempt (which may have dropped it from the record)
        check_recorded(output, recorded, f.rel_path)
        if size not in (before, after):
            raise ValueError(
                f"{storage.join(output, f.rel_path)} holds {'no file' if size is None else f'{size} bytes'}; the "
                f"removal {plan.run} expects {before} (before) or {after} (after): the file does not match its "
                "manifest rows and nothing was changed (run pretokenize verify)"
            )


def purge_saved_work(output: str) -> list[str]:
    """Delete every entry of the tree's temporary directory but the removal's journal: the saved
    work of interrupted runs (spill files, references, markers) and their run directories may hold
    the removed documents' tokens and ids, and would go wherever the tree is copied. All saved work
    goes, not only what holds a removed document: the next bucketed run starts afresh. Through the
    tree layer (shards.tree.Tree): a symlink there is removed itself, never followed, and a
    temporary directory that is a link is refused. Returns the names deleted."""
    out = tree.Tree(output)
    deleted = []
    for name in out.temp_entries():
        if name == JOURNAL_DIR:
            continue
        out.remove_dir(out.temp_name(name), "saved work")
        deleted.append(name)
    return deleted


def drop_derived_exports(output: str) -> list[str]:
    """Delete the files other tools derived from the shards (``export megatron``, ``stats``: names
    under layout.DERIVED_NAMES that the record lists as derived), as a re-run deletes them: the
    removal makes them stale. Recorded files only, never a pattern; a user's file there stays.
    Returns the files deleted."""
    record = tree.owned(output, "bucketed")
    stale = sorted(rel for rel in record.derived if rel.split("/")[0] in layout.DERIVED_NAMES)
    if not stale:
        return []
    deleted = tree.delete_listed(output, stale)
    tree.record_files(output, record, drop_derived=stale)
    return deleted
