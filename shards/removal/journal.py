"""A removal's journal: its plan made by one streaming pass over the manifest (the ids matched in
bounded memory, idmatch.py), each affected file's rows in a file of its own, then plan.json, the
commit point; read back and checked before any byte changes; and the files written through the
journal's directory (a partial copy, a streamed rewrite), so that a crash leaves nothing beside a
shard. The order of a removal's steps: shards/removal/__init__.py."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator

from shards import layout, manifest, storage, tree
from shards.card import CARD_NAME
from shards.index import INDEX_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from shards.removal import idmatch
from shards.removal.lists import JOURNAL_FILES_DIR, JOURNAL_PLAN_NAME, REMOVALS_NAME, log_ids, tree_log_exists

JOURNAL_DIR = tree.Tree.JOURNAL_DIR
PLAN_NAME = JOURNAL_PLAN_NAME
FILES_DIR = JOURNAL_FILES_DIR  # in the plan's directory: one file's rows each
MATCH_DIR = tree.Tree.MATCH_DIR  # in the plan's directory: the partition files of a long list's match
# The tree's own files a removal reads or rewrites besides the shards: each checked before a byte changes.
TREE_FILES = (tree.RECORD_NAME, layout.MANIFEST_NAME, layout.STATS_NAME, STATS_JSON_NAME, CARD_NAME,
              layout.CHECKSUMS_NAME, INDEX_NAME, REMOVALS_NAME)


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
    def removed_documents(self) -> int:
        return sum(f.removed for f in self.files)

    @property
    def removed_tokens(self) -> int:
        return sum(f.tokens_before - f.tokens_after for f in self.files)


def journal_url(output: str) -> str:
    return tree.Tree(output).journal_url()


def journal_name(*parts: str) -> str:
    return tree.Tree.temp_name(JOURNAL_DIR, *parts)


def check_journal(output: str) -> None:
    """The journal's directory holds no link anywhere (nor is one): what remove reads back, writes
    or deletes there is never reached through a link; UnsafePathError naming it otherwise."""
    tree.Tree(output).check_no_links(journal_name(), "removal journal")


def clear_unplanned_journal(output: str) -> None:
    """A journal directory without its plan.json (a plan begun by a run that died before its commit
    point: nothing started) goes whole, links in it removed as links, never followed."""
    out = tree.Tree(output)
    out.journal_url()  # refuses a journal directory that is itself a link
    if out.lexists(journal_name(PLAN_NAME), "removal journal"):
        raise ValueError(f"{storage.join(out.url, journal_name(PLAN_NAME))} exists: a removal is pending; "
                         "run pretokenize remove again to finish it")
    out.remove_dir(journal_name(), "removal journal")


def open_partial(output: str, name: str):
    """A new file under the journal's directory, for a partial copy of ``name``: a fresh random name,
    created exclusively (locally O_CREAT|O_EXCL|O_NOFOLLOW), so no link planted there is followed.
    Returns (path, binary file open for writing)."""
    out = tree.Tree(output)
    rel = journal_name(posixpath.dirname(name), f"{posixpath.basename(name)}.{uuid.uuid4().hex}.partial")
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


def write_journal(output: str, plan: RemovalPlan) -> None:
    """plan.json in the plan's directory (after its files' rows): the removal's commit point."""
    storage.write_atomic(storage.join(plan.plan_url or journal_url(output), PLAN_NAME), plan.to_json().encode("utf-8"))


def read_plan(plan_url: str) -> RemovalPlan:
    """The plan in ``plan_url`` as a worker reads it (the launcher checked it before the job began)."""
    return RemovalPlan.from_json(read_journal_file(storage.join(plan_url, PLAN_NAME)), plan_url)


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


def delete_journal(output: str) -> None:
    """The journal's directory goes (plan and any partial rewrite), then the temporary directory
    when nothing else is in it."""
    out = tree.Tree(output)
    out.remove_dir(out.temp_name(out.JOURNAL_DIR), "removal journal")
    out.remove_temp_if_empty()


def check_tree_files(output: str) -> None:
    """Every file of ``TREE_FILES`` that exists resolves inside the tree, reached
    through no linked directory (links included: a link out of the tree is refused), before a
    removal reads one, rewrites a shard or deletes anything: UnsafePathError naming it otherwise.
    The shards it rewrites are checked as its plan names them (``shard_path``)."""
    out = tree.Tree(output)
    for name in TREE_FILES:
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


def _manifest_files(output: str) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """(rel_path, [(id, count), ...]) per file of the tree's manifest, streamed, checking that a
    file's rows are contiguous."""
    seen: set[str] = set()
    current, rows = None, []
    fs, root = storage.filesystem(output)
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as f:
        for rel, doc_id, n in manifest.read_rows(f):
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
    through idmatch.py, in memory bounded whatever their number; its partition files, if any,
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
    files = []
    ordinal = 0
    for rel, rows in _manifest_files(output):
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
    return (doc_id for _, rows in _manifest_files(output) for doc_id, _ in rows)


def _logged_ids(output: str) -> Iterator[str]:
    """The ids the tree's removals.txt lists (none without one), as they come."""
    if not tree_log_exists(output):  # a log that is a link out of the tree is refused
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
