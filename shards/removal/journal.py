"""A removal's journal: its plan (the affected files, their counts before and after, each file's
rows in a file of its own), read back and checked, and the files written through the journal's
directory (a partial copy, a streamed rewrite), so that a crash leaves nothing beside a shard.

plan.json is the removal's commit point: once it is written, the request survives every crash
and every later command (shards/removal/__init__.py says in which order the steps run).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Iterable, Iterator

from shards import storage, tree
from shards.removal import idmatch
from shards.removal.lists import JOURNAL_FILES_DIR, JOURNAL_PLAN_NAME

JOURNAL_DIR = tree.Tree.JOURNAL_DIR
PLAN_NAME = JOURNAL_PLAN_NAME
FILES_DIR = JOURNAL_FILES_DIR  # in the plan's directory: one file's rows each


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
    fs, path = storage.filesystem(storage.join(plan_url, PLAN_NAME))
    with fs.open(path, "r", encoding="utf-8") as f:
        return RemovalPlan.from_json(f.read(), plan_url)


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
