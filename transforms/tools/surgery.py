"""Surgical removal: take flagged documents out of the shards that hold them, and nothing else.

The manifest says which files hold a flagged id; only those files are rewritten, streaming, with
the flagged documents left out; every other file keeps its bytes. A removal is journalled so that
a crash at any point can be finished by running the same command again:

    plan      the launcher streams the manifest and writes, under OUTPUT/.pretokenize-tmp/removal/,
              each affected file's rows (which to drop) to files/NNNNNN.json as soon as they are
              read, then plan.json: the run id, the stats before, each affected file's counts
              before and after (its commit point; the plan is never held whole, nor carried in
              the job graph: the job gets the files' numbers, workers read the rows); then it
              deletes the saved work of interrupted runs and dataset_stats.txt, so the tree
              reads as unfinished until the removal is done
    rewrite   each affected file's new copy is written in the journal's directory and renamed
              over the old one (or the file is deleted when nothing is left); a file whose size
              already equals its "after" count was done by an earlier attempt and is skipped
    finish    the manifest without the removed rows replaces the old one (streamed: one affected
              file's rows read from the plan at a time, as the manifest reaches it); the ownership record
              drops the files left empty; removals.txt gets one line per removed document
              (once per run id); dataset_stats.json and the README.md card are rewritten from
              the new counts; dataset_stats.txt is written, the commit point; the journal
              (with any partial rewrite, which lives there, never beside a shard) is deleted

A bucketed re-run into a tree with a pending journal keeps the journal's documents out and
writes its audit lines when it publishes (transforms/core/publish.py): a request is never dropped.

A run that finds a journal resumes it before anything else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator

import apache_beam as beam

from shards import idmatch, layout, manifest, storage, tree
from shards import index as reader_index
from shards import removal as removal_names
from shards.card import CARD_NAME, description_files
from shards.index import INDEX_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME, Provenance, bucketed_document, read_document
from shards.removal import (
    DEFAULT_ID_FIELD,
    REMOVALS_NAME,
    format_removal_line,
    iter_log_lines,
    log_ids,
    scan_log,
    tree_id_field,
)
from transforms.core.progress import Progress
from transforms.core.publish import PUBLISHING_NAME, write_description

log = logging.getLogger(__name__)

JOURNAL_DIR = tree.Tree.JOURNAL_DIR
PLAN_NAME = removal_names.JOURNAL_PLAN_NAME
FILES_DIR = removal_names.JOURNAL_FILES_DIR  # in the plan's directory: one file's rows each
COPY_CHUNK = 16 << 20
COUNT_DIR = "distinct"  # in the journal's directory: the partition files counting a long log's ids
MATCH_DIR = tree.Tree.MATCH_DIR  # in the plan's directory: the partition files of a long list's match


@dataclasses.dataclass(frozen=True)
class FilePlan:
    """One affected file: its rows in file order and which of them go (one file of the plan's directory)."""

    rel_path: str
    rows: tuple[tuple[str, int, bool], ...]  # (original_id, token_count, removed)

    @property
    def tokens_before(self) -> int:
        return sum(n for _, n, _ in self.rows)

    @property
    def tokens_after(self) -> int:
        return sum(n for _, n, removed in self.rows if not removed)

    def summary(self) -> FileSummary:
        removed = sum(1 for _, _, r in self.rows if r)
        return FileSummary(self.rel_path, self.tokens_before, self.tokens_after, removed)

    def to_json(self) -> str:
        return json.dumps({"rel_path": self.rel_path, "rows": [list(r) for r in self.rows]})

    @classmethod
    def from_json(cls, text: str) -> FilePlan:
        d = json.loads(text)
        return cls(d["rel_path"], tuple((str(i), int(n), bool(r)) for i, n, r in d["rows"]))


@dataclasses.dataclass(frozen=True)
class FileSummary:
    """What the plan keeps in memory of an affected file: its counts (its rows stay on disk)."""

    rel_path: str
    tokens_before: int
    tokens_after: int
    removed: int  # documents


@dataclasses.dataclass(frozen=True)
class RemovalPlan:
    """A removal: its run, the stats before, and a summary per affected file; each file's rows are
    in ``plan_url`` (FILES_DIR/NNNNNN.json, in the order of ``files``), read one file at a time,
    so that no process holds more than one file's rows whatever the tree's size."""

    run: str
    utc_time: str
    stats_before: str
    files: tuple[FileSummary, ...]
    plan_url: str = ""
    resumed: bool = False  # read from a journal an interrupted run left (not written)
    # What matching the list found, for the report (not written: a resumed plan has none). Counts
    # and the first ids not found, never the list: it may be far longer than the tree.
    matches: idmatch.Matches | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "run": self.run,
                "utc_time": self.utc_time,
                "stats_before": self.stats_before,
                "files": [dataclasses.asdict(f) for f in self.files],
            }
        )

    @classmethod
    def from_json(cls, text: str, plan_url: str) -> RemovalPlan:
        d = json.loads(text)
        files = tuple(FileSummary(str(f["rel_path"]), int(f["tokens_before"]), int(f["tokens_after"]),
                                  int(f["removed"])) for f in d["files"])
        return cls(d["run"], d["utc_time"], d["stats_before"], files, plan_url)  # an older journal's not_found: unused

    def file_plan(self, k: int) -> FilePlan:
        """The rows of the plan's k-th file, read from its directory."""
        url = storage.join(self.plan_url, FILES_DIR, f"{k:06d}.json")
        text = read_journal_file(url)
        try:
            plan = FilePlan.from_json(text)
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ValueError(f"{url} is not a removal plan's file ({e}): the journal is damaged; run pretokenize "
                             "verify") from None
        if plan.summary() != self.files[k]:
            raise ValueError(f"{url} holds the rows of {plan.rel_path} ({plan.summary()}), not those the journal "
                             f"lists for file {k} ({self.files[k]}): the journal is damaged; run pretokenize verify")
        return plan

    def iter_removed_rows(self) -> Iterator[tuple[str, str, int]]:
        """(rel_path, original_id, tokens) of every document this removal takes out, one file at a time."""
        for k in range(len(self.files)):
            f = self.file_plan(k)
            yield from ((f.rel_path, i, n) for i, n, removed in f.rows if removed)

    @property
    def removed_rows(self) -> list[tuple[str, str, int]]:
        return list(self.iter_removed_rows())

    @property
    def removed_documents(self) -> int:
        return sum(f.removed for f in self.files)

    @property
    def removed_tokens(self) -> int:
        return sum(f.tokens_before - f.tokens_after for f in self.files)


def journal_url(output: str) -> str:
    return tree.Tree(output).journal_url()


def _journal_name(*parts: str) -> str:
    return tree.Tree.temp_name(JOURNAL_DIR, *parts)


def check_journal(output: str) -> None:
    """The journal's directory holds no link anywhere (nor is one): what remove reads back, writes
    or deletes there is never reached through a link; UnsafePathError naming it otherwise."""
    tree.Tree(output).check_no_links(_journal_name(), "removal journal")


def clear_unplanned_journal(output: str) -> None:
    """A journal directory without its plan.json (a plan begun by a run that died before its commit
    point: nothing started) goes whole, links in it removed as links, never followed."""
    out = tree.Tree(output)
    out.journal_url()  # refuses a journal directory that is itself a link
    if out.lexists(_journal_name(PLAN_NAME), "removal journal"):
        raise ValueError(f"{storage.join(out.url, _journal_name(PLAN_NAME))} exists: a removal is pending; "
                         "run pretokenize remove again to finish it")
    out.remove_dir(_journal_name(), "removal journal")


def open_partial(output: str, name: str):
    """A new file under the journal's directory, for a partial copy of ``name``: a fresh random name,
    created exclusively (locally O_CREAT|O_EXCL|O_NOFOLLOW), so no link planted there is followed.
    Returns (path, binary file open for writing)."""
    out = tree.Tree(output)
    rel = _journal_name(posixpath.dirname(name), f"{posixpath.basename(name)}.{uuid.uuid4().hex}.partial")
    rel = posixpath.normpath(rel)
    out.journal_url()
    path = out.writable(rel, "partial file")  # no link among the directories on its way
    out.makedirs(posixpath.dirname(rel), "removal journal")
    if not out.local:
        return path, out.fs.open(path, "wb")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return path, os.fdopen(fd, "wb")


def shard_path(output: str, rel: str) -> str:
    """The path of the file a manifest row or a journal entry names: the one place remove turns
    such a name into a path. shards.tree.Tree checks it (inside the tree, reached through no
    link); UnsafePathError, naming it, otherwise."""
    return tree.Tree(output).writable(rel, "manifest row")


def read_journal_file(url: str) -> str:
    """A journal file's text; a ValueError for one that is not a regular file (a directory, a FIFO,
    which opened would wait for a writer forever) or not UTF-8: the journal is damaged."""
    fs, path = storage.filesystem(url)
    if storage.renames_atomically(fs):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise ValueError(f"{url} is missing: the journal is damaged") from None
        if not stat.S_ISREG(mode):
            raise ValueError(f"{url} is not a regular file: the journal is damaged")
    try:
        with fs.open(path, "r", encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{url} is not UTF-8 text ({e.reason} at byte {e.start}): the journal is damaged") from None


def load_journal(output: str) -> RemovalPlan | None:
    url = journal_url(output)
    fs, path = storage.filesystem(storage.join(url, PLAN_NAME))
    with storage.reaching(output):
        if not fs.exists(path):
            return None
        check_journal(output)  # a resumed journal is read, written and deleted through no link
        text = read_journal_file(storage.join(url, PLAN_NAME))
    try:
        plan = RemovalPlan.from_json(text, url)
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise ValueError(f"{storage.join(url, PLAN_NAME)} is not a removal journal ({e}); run pretokenize "
                         "verify") from None
    for k, f in enumerate(plan.files):
        shard_path(output, f.rel_path)  # a journal entry naming a file outside the tree is refused
        plan.file_plan(k)  # every file's rows read and checked before anything is changed, one at a time
    return plan


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
        scratch = idmatch.Scratch(output, _journal_name(MATCH_DIR), prepare=lambda: clear_unplanned_journal(output))
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
    fs, root = storage.filesystem(output)
    with storage.reaching(output):
        if not fs.exists(posixpath.join(root, REMOVALS_NAME)):
            return iter(())
    tree.Tree(output).writable(REMOVALS_NAME, "removal log")  # a log that is a link out of the tree is refused
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
        if name != JOURNAL_DIR and fs.exists(posixpath.join(entry, PUBLISHING_NAME)):
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


def write_journal(output: str, plan: RemovalPlan) -> None:
    """plan.json in the plan's directory (after its files' rows): the removal's commit point."""
    storage.write_atomic(storage.join(plan.plan_url or journal_url(output), PLAN_NAME), plan.to_json().encode("utf-8"))


def _sha256_of(fs, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def rewrite_file(output: str, plan: FilePlan, itemsize: int) -> tuple[str, str | None]:
    """Rewrite one affected file without its removed documents.

    Returns what was done (for the log) and the new file's sha256 (None when it was deleted).
    """
    fs, _ = storage.filesystem(output)
    path = shard_path(output, plan.rel_path)
    before, after = plan.tokens_before * itemsize, plan.tokens_after * itemsize
    if not fs.exists(path):
        if after == 0:
            return "deleted earlier", None
        raise FileNotFoundError(f"{plan.rel_path} is missing, but {plan.tokens_after} of its tokens must stay")
    size = fs.size(path)
    if size == after and after != before:
        return "rewritten earlier", _sha256_of(fs, path)
    if size != before:
        raise ValueError(
            f"{plan.rel_path} holds {size} bytes; the manifest says {before} before removal and {after} after; "
            "the file does not match its manifest rows (run pretokenize verify)"
        )
    if after == 0:
        fs.rm(path)
        return "deleted", None
    # The new copy is written in the journal's directory, never beside the shard: a crash leaves
    # it where the finished removal deletes it.
    tmp, dst = open_partial(output, posixpath.join(tree.Tree.REWRITE_DIR, posixpath.basename(plan.rel_path)))
    digest = hashlib.sha256()
    try:
        with fs.open(path, "rb") as src, dst:
            for _, n, removed in plan.rows:
                remaining = n * itemsize
                if removed:
                    src.seek(remaining, 1)
                    continue
                while remaining:
                    chunk = src.read(min(remaining, COPY_CHUNK))
                    if not chunk:
                        raise OSError(f"{plan.rel_path} ended early while copying")
                    dst.write(chunk)
                    digest.update(chunk)
                    remaining -= len(chunk)
        # Asked again before the shard is replaced (shards.lock.guard): a copy is long, and a command
        # whose lock was taken meanwhile (stopped, then woken) must not put back what another removed.
        fs.mv(tmp, shard_path(output, plan.rel_path))
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise
    return "rewritten", digest.hexdigest()


def finish_removal(output: str, plan: RemovalPlan, sums: dict[str, str | None] | None = None) -> DatasetStats:
    """Manifest, checksums, audit log, stats, in that order; then the journal goes. Safe to repeat.

    ``sums`` holds the new sha256 of each rewritten file (None for a deleted one). Streamed: the
    manifest and the audit lines are written as they are read, and only one affected file's rows
    (read from the plan's directory) are held at a time, whatever the tree's size or the plan's.
    """
    rewrite_manifest(output, plan)
    rewrite_index(output)
    update_checksums(output, sums or {})
    drop_emptied(output, plan)
    append_audit_lines(output, plan)
    stats = stats_after(plan, logged_count(output))
    rewrite_description(output, stats)
    tree.write_file(output, layout.STATS_NAME, stats.to_text().encode("utf-8"))
    delete_journal(output)
    return stats


def write_streamed(output: str, name: str, chunks: Iterable[str], what: str) -> None:
    """Write the tree's file ``name`` from ``chunks`` as they come, atomically: the new copy is a
    fresh file in the journal's directory (open_partial), renamed over ``name`` once whole (over a
    link, the link is replaced, never followed); a failure leaves ``name`` as it was."""
    fs, _ = storage.filesystem(output)
    out = tree.Tree(output)
    path = out.writable(name, what)
    if out.local and os.path.isdir(path):  # a move onto a directory (or a link to one) would go into it
        raise tree.UnsafePathError(f"{storage.join(output, name)} is a directory; the tool writes a file of that name")
    tmp, raw = open_partial(output, name)
    with storage.moved_into_place(fs, tmp, path):
        with io.TextIOWrapper(raw, encoding="utf-8", newline="") as dst:
            for chunk in chunks:
                dst.write(chunk)
        # Asked again before the copy replaces ``name`` (shards.lock.guard): a command whose lock was
        # taken while it wrote must not put back a log or a manifest from before the other's changes.
        out.writable(name, what)


def kept_manifest_lines(rows: Iterable[tuple[str, str, int]], plan: RemovalPlan) -> Iterator[str]:
    """The manifest's lines without the plan's removed documents. A file's rows are contiguous
    (make_plan checked), so the removed ids of one affected file at a time are read from the plan's
    directory when its first row comes. Repeating it over its own output yields the same lines."""
    affected = {f.rel_path: k for k, f in enumerate(plan.files)}
    current, removed = None, frozenset()
    yield manifest.MANIFEST_HEADER + "\n"
    for rel, doc_id, n in rows:
        if rel != current:
            current = rel
            k = affected.get(rel)
            removed = frozenset() if k is None else frozenset(i for i, _, r in plan.file_plan(k).rows if r)
        if doc_id not in removed:
            yield manifest.format_row(rel, doc_id, n)


def rewrite_manifest(output: str, plan: RemovalPlan) -> None:
    """processed_spec.txt without the removed rows, streamed from the old one."""
    fs, root = storage.filesystem(output)
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as src:
        write_streamed(output, layout.MANIFEST_NAME, kept_manifest_lines(manifest.read_rows(src), plan), "manifest")


def update_checksums(output: str, sums: dict[str, str | None]) -> None:
    """checksums.sha256 with each rewritten file's new sum, a deleted file's line gone (when the
    tree has the file: a tree written before checksums existed gets none)."""
    table = read_checksums(output) if sums else None
    if table is None:
        return
    for rel, digest in sums.items():
        if digest is None:
            table.pop(rel, None)
        else:
            table[rel] = digest
    tree.write_file(output, layout.CHECKSUMS_NAME, manifest.format_checksums(table).encode())


def read_checksums(output: str) -> dict[str, str] | None:
    """The tree's checksums.sha256, parsed; None when it has none (a tree written before checksums
    existed). A ValueError naming the file and its line when a line is damaged."""
    fs, root = storage.filesystem(output)
    path = posixpath.join(root, layout.CHECKSUMS_NAME)
    if not fs.exists(path):
        return None
    where = storage.join(output, layout.CHECKSUMS_NAME)
    try:
        text = storage.read_bytes(fs, path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 ({e})") from None
    return manifest.parse_checksums(text, where)


def check_checksums(output: str) -> None:
    """A removal ends by rewriting checksums.sha256: one that cannot be read stops it before it
    begins (a ValueError naming the file and the line), not after the shards have changed."""
    try:
        read_checksums(output)
    except storage.NotRegularFileError:
        raise
    except ValueError as e:
        raise ValueError(f"{e}: the tree's checksums are damaged; a bucketed re-run writes them again "
                         "(pretokenize verify says what else is wrong)") from None


def drop_emptied(output: str, plan: RemovalPlan) -> None:
    """The files the removal left empty leave the ownership record, and a bucket whose every
    document went leaves no directory behind (only an empty one is removed)."""
    emptied = [f.rel_path for f in plan.files if f.tokens_after == 0]
    record = tree.read_record(output)
    if record is not None and emptied:
        tree.record_files(output, record, drop=emptied)
    out = tree.Tree(output)
    for directory in sorted({posixpath.dirname(rel) for rel in emptied} - {""}):
        out.remove_empty_dir(directory)


def stats_after(plan: RemovalPlan, logged_ids: int) -> DatasetStats:
    """The stats before the removal less what it took out (from the files' counts alone), and
    ``removal_list_ids`` the distinct ids removals.txt lists now (``logged_ids``): every command
    leaves it equal to the ids the tree's log records as removed (docs/removal.md). The ids this
    removal added were all found, so the count not found stays (0 for a tree built without a list)."""
    stats = DatasetStats.from_text(plan.stats_before)
    stats.removal_list_ids = logged_ids
    stats.removal_ids_not_found = stats.removal_ids_not_found or 0
    for f in plan.files:
        bucket = stats.buckets[layout.parse_shard_rel_path(f.rel_path).bucket]
        bucket.documents -= f.removed
        bucket.tokens -= f.tokens_before - f.tokens_after
        if f.tokens_after == 0:
            bucket.files -= 1
    stats.drops["removed"] = stats.drops.get("removed", 0) + plan.removed_documents
    stats.drops = dict(sorted(stats.drops.items()))
    return stats


def rewrite_index(output: str) -> None:
    """The reader index built again from the rewritten manifest, when the record lists one (until
    then a reader sees the manifest's new size and parses the manifest instead). Repeatable."""
    record = tree.read_record(output)
    if record is None or reader_index.INDEX_NAME not in record.derived:
        return
    fs, root = storage.filesystem(output)
    tmp, placeholder = open_partial(output, reader_index.INDEX_NAME)  # a fresh name, made here: no link
    placeholder.close()  # (on an object store the index is uploaded whole at its name; tmp is not used)
    reader_index.write_index_file(fs, root, posixpath.join(root, reader_index.INDEX_NAME), tmp)


def rewrite_description(output: str, stats: DatasetStats) -> None:
    """dataset_stats.json and the README.md card from the new stats and the provenance the old
    dataset_stats.json holds (a removal changes the counts, never what made the tree). Repeating it
    writes the same bytes. A tree written before dataset_stats.json existed gets neither."""
    try:
        doc = read_document(output)
        provenance = None if doc is None else Provenance.from_dict(doc)
    except ValueError as e:
        # Unreadable: the old description would contradict the new counts, and a removal must
        # finish, so both files go (the record lists them: they are the tool's).
        log.warning("%s; removing it and %s, which can no longer be written", e, CARD_NAME)
        tree.delete_listed(output, [STATS_JSON_NAME, CARD_NAME])
        return
    if provenance is not None:
        write_description(output, "bucketed", description_files(bucketed_document(provenance, stats)))


def scan_tree_log(output: str, repairing: str | None = None) -> removal_names.LogHead | None:
    """The tree's removals.txt, read through once strictly as its audit log, holding no id: its id
    field and runs (None when it has none); a ValueError naming the line that is not a log line,
    or saying that the log is missing or shorter than the stats' count of removed ids. That last
    is only a warning for a bucketed run given a removal list (``repairing``: the list), which
    records the list's ids again (a tree written before runs logged their lists has no log)."""
    url = storage.join(output, REMOVALS_NAME)
    head = scan_log(url) if _tree_log_exists(output) else None
    problem = removal_names.shortened_log_problem(url, head.entries if head else None, _stats_removal_ids(output))
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


def _tree_log_exists(output: str) -> bool:
    fs, root = storage.filesystem(output)
    with storage.reaching(output):
        exists = fs.exists(posixpath.join(root, REMOVALS_NAME))
    if exists:  # a log that is a link out of the tree is refused here, before any command changes a byte
        tree.Tree(output).writable(REMOVALS_NAME, "removal log")
    return exists


def logged_count(output: str) -> int:
    """The distinct ids the tree's removals.txt lists, streamed (shards.idmatch.count_distinct,
    its partitions in the journal's directory): the stats' removal_list_ids."""
    if not _tree_log_exists(output):
        return 0
    url = storage.join(output, REMOVALS_NAME)
    return idmatch.count_distinct(lambda: log_ids(url), idmatch.Scratch(output, _journal_name(COUNT_DIR)))


def _existing_log(output: str) -> Callable[[], Iterator[str]] | None:
    """The tree's removals.txt (None without one), checked strictly before any change, as its
    lines afresh for each call: decoded as the launch check (scan_tree_log) decodes them."""
    if not _tree_log_exists(output):
        return None
    url = storage.join(output, REMOVALS_NAME)
    scan_log(url)  # strictly, before any change
    return lambda: iter_log_lines(url)


def log_chunks(existing: Callable[[], Iterator[str]] | None, id_field: str, lines: Iterable[str]) -> Iterator[str]:
    """removals.txt with ``lines`` appended, piece by piece (the old lines and the new as they
    come): a new log gets its header and id field line; a log written before the id field was
    recorded gets the line now (every other line kept as it was, each ending in a line break)."""
    if existing is None:
        yield removal_names.REMOVALS_HEADER + "\n" + removal_names.id_field_line(id_field)
    else:
        old = existing()
        yield next(old) + "\n"  # the header (scan_log checked it)
        second = next(old, None)
        if second is None or not second.startswith(removal_names.ID_FIELD_PREFIX):
            yield removal_names.id_field_line(id_field)
        if second is not None:
            yield second + "\n"
        yield from (line + "\n" for line in old)
    yield from lines


def append_audit_lines(output: str, plan: RemovalPlan) -> None:
    """One removals.txt line per document the plan takes out, once per removal run; the old lines
    are copied and the new written as each affected file's rows are read, never gathered."""
    existing = _existing_log(output)
    runs = set() if existing is None else scan_log(storage.join(output, REMOVALS_NAME)).runs
    if plan.run not in runs:
        lines = (format_removal_line(plan.utc_time, plan.run, d, rel, n) for rel, d, n in plan.iter_removed_rows())
        id_field = tree_id_field(plan.stats_before) or DEFAULT_ID_FIELD
        write_streamed(output, REMOVALS_NAME, log_chunks(existing, id_field, lines), "removal log")


# The rel_path of an audit line for an id a --removal-list run kept out: it was never stored.
NOT_STORED = "-"


def record_removal_list(output: str, ids: list[str], run: str, utc_time: str, id_field: str) -> int:
    """Append to removals.txt every id of a --removal-list that it does not list yet (rel_path
    ``-``, tokens 0: left out before tokenizing), so that every later run keeps it out too; the
    ids are values of ``id_field``, the run's --id-field. Returns how many lines were added."""
    existing = _existing_log(output)
    known = set() if existing is None else set(log_ids(storage.join(output, REMOVALS_NAME)))
    new = [i for i in ids if i not in known]
    if new:
        lines = [format_removal_line(utc_time, run, i, NOT_STORED, 0) for i in new]
        tree.write_file(output, REMOVALS_NAME, "".join(log_chunks(existing, id_field, lines)).encode("utf-8"))
    return len(new)


def delete_journal(output: str) -> None:
    """The journal's directory goes (plan and any partial rewrite), then the temporary directory
    when nothing else is in it."""
    out = tree.Tree(output)
    out.remove_dir(out.temp_name(out.JOURNAL_DIR), "removal journal")
    out.remove_temp_if_empty()


class RewriteFileFn(beam.DoFn):
    """Rewrites the plan's k-th file; its rows are read from the plan's directory, on the output's
    filesystem, so the job graph holds no row."""

    def __init__(self, output: str, plan_url: str, itemsize: int):
        self._output = output
        self._plan_url = plan_url
        self._itemsize = itemsize
        self._rewritten = beam.metrics.Metrics.counter("pretokenize", "files_rewritten")

    def setup(self):
        with storage.reaching(self._output):
            self._plan = _read_plan(self._plan_url)
        self._progress = Progress("rewrite")

    def process(self, k: int):
        with storage.reaching(self._output):  # a store that fails: one line naming the tree
            plan = self._plan.file_plan(k)
            outcome, digest = rewrite_file(self._output, plan, self._itemsize)
        self._rewritten.inc()
        self._progress.add(files=1)
        log.info("%s: %s", plan.rel_path, outcome)
        yield plan.rel_path, digest


class FinishRemovalFn(beam.DoFn):
    def __init__(self, output: str, plan_url: str):
        self._output = output
        self._plan_url = plan_url

    def process(self, outcomes: list[tuple[str, str | None]]):
        with storage.reaching(self._output):  # a store that fails: one line naming the tree
            stats = finish_removal(self._output, _read_plan(self._plan_url), dict(outcomes))
        yield stats


def _read_plan(plan_url: str) -> RemovalPlan:
    fs, path = storage.filesystem(storage.join(plan_url, PLAN_NAME))
    with fs.open(path, "r", encoding="utf-8") as f:
        return RemovalPlan.from_json(f.read(), plan_url)


class RemoveDocuments(beam.PTransform):
    """Rewrites the plan's files in parallel, then finishes the removal once all are done. Only the
    files' numbers travel in the job; workers read each file's rows from the plan's directory.

    Example::

        plan = make_plan("out/", ids, run="r1", utc_time="2026-01-01T00:00:00Z")
        write_journal("out/", plan)
        pipeline | "RemoveDocuments" >> RemoveDocuments("out/", plan, itemsize=4)
    """

    def __init__(self, output: str, plan: RemovalPlan, itemsize: int):
        super().__init__()
        self._output, self._plan_url, self._itemsize = output, plan.plan_url, itemsize
        self._count = len(plan.files)

    def expand(self, pbegin):
        return (
            pbegin
            | "ListAffectedFiles" >> beam.Create(list(range(self._count)))
            | "SpreadFiles" >> beam.Reshuffle()
            | "RewriteFiles" >> beam.ParDo(RewriteFileFn(self._output, self._plan_url, self._itemsize))
            | "CollectOutcomes" >> beam.combiners.ToList()
            | "FinishRemoval" >> beam.ParDo(FinishRemovalFn(self._output, self._plan_url))
        )
