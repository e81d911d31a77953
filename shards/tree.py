"""What in an output directory belongs to this tool, and the only way it deletes anything there.

An output directory is the tool's own when it holds the ownership record, ``.pretokenize-tree.json``,
written by the first run into it when it was empty (or did not exist):

    {"tool": "beam-pretokenize", "kind": "bucketed", "files": [...], "derived": [...]}

``files`` are the data files the jobs wrote there (shards, relative paths), ``derived`` the files
other tools wrote from them (``export megatron``, ``stats``) and the tree's description that the
jobs and ``remove`` write (``dataset_stats.json``, ``README.md``). Besides what the record lists, the
tool owns, in its own tree only, the fixed names of its kind (``dataset_stats.txt``, the manifest,
``checksums.sha256``, ``removals.txt``, the record itself), its temporary directory
``.pretokenize-tmp/`` and the lock of the command writing it, ``.pretokenize-lock`` (shards.lock).

The rules that follow from it, for every job and tool:

    1. a run into a directory that is neither empty nor the tool's tree is refused, naming a file
       that is not the tool's; so is a run into the other job's tree
    2. the tool deletes only what the record lists (and its temporary directory); a path is never
       a pattern, so no other file, however it is named, is ever touched
    3. before the tool writes a file it will later want to delete, the record lists it: a crash
       can leave a recorded file that does not exist (deleting it is then a no-op), never an
       unrecorded file of ours

Names become paths here and only here (``Tree``): a record entry, a manifest row, a temporary
entry or a removal-journal entry is checked before use (relative, no ``..``, no empty part; on a
local disk, where it resolves, links followed, inside where the root resolves), and the tool never
follows a symbolic link inside a tree to write or delete: it refuses, naming the link, or removes
the link itself, never what it points to. The layout of the temporary directory is ``Tree``'s
alone. Every create, rename and delete in a tree goes through it.

What a tree is, once written, is answered here too, once: ``OutputTree.open(url)`` says which
kind of tree it is, whether it is finished (its ``dataset_stats.txt``, written last, is the commit
point) and what its stats say; ``verify``, ``remove``, the reader (so ``export``, ``stats`` and
training) and the llm.c checks all ask it.

Nothing here imports Beam: jobs, ``remove``, ``export`` and ``stats`` all use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import uuid

from shards import kinds, layout, lock, manifest, storage
from shards.layout import RECORD_NAME
from shards.llmc import ScaffoldStats

TOOL = "beam-pretokenize"


class NotOurTreeError(ValueError):
    """The directory holds something this tool did not write; it refuses to touch it."""


class IncompleteTreeError(FileNotFoundError):
    """The directory is not a finished output tree: its commit marker, dataset_stats.txt, is missing."""

    # The same, as a line of a verifier's report.
    problem = f"{layout.STATS_NAME}: missing: the tree is not finished (a job died or is still publishing)"


class UnreadableStatsError(ValueError):
    """A finished tree whose dataset_stats.txt cannot be parsed as its kind's stats."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"{storage.join(url, layout.STATS_NAME)} is unreadable: {reason}")
        self.problem = f"{layout.STATS_NAME}: unreadable: {reason}"


@dataclasses.dataclass
class TreeRecord:
    kind: str
    files: list[str] = dataclasses.field(default_factory=list)
    derived: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {"tool": TOOL, "kind": self.kind, "files": sorted(set(self.files)), "derived": sorted(set(self.derived))},
            indent=1,
        ) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> TreeRecord:
        try:
            d = json.loads(text)
            if d.get("tool") != TOOL or d.get("kind") not in kinds.REGISTRY:
                raise ValueError("not this tool's record")
            files, derived = list(d.get("files", [])), list(d.get("derived", []))
            if not all(isinstance(p, str) and _is_relative(p) for p in files + derived):
                raise ValueError("a listed path is not relative to the tree")
        except (ValueError, AttributeError, TypeError) as e:
            raise NotOurTreeError(f"{where} is damaged ({e}); the tool will not write into this directory") from None
        for what, names in (("files", files), ("derived", derived)):
            for name in names:
                problem = entry_problem(d["kind"], what, name)
                if problem is not None:
                    raise NotOurTreeError(f"{where} is damaged: its {what} entry {name!r} {problem}; the tool will "
                                          "not write into this directory") from None
        return cls(d["kind"], files, derived)


def fixed_names() -> frozenset[str]:
    """The names the tool owns in a tree without listing them (its fixed files): a record entry
    naming one would have a re-run delete it (the audit log, the commit point, the lock)."""
    return frozenset({layout.REMOVALS_NAME, layout.MANIFEST_NAME, layout.STATS_NAME, layout.CHECKSUMS_NAME, RECORD_NAME,
                      lock.LOCK_NAME})


def entry_problem(kind: str, what: str, name: str) -> str | None:
    """Why ``name`` cannot be an entry of a record's ``what`` ("files" or "derived") in a tree of
    ``kind``, or None. ``files`` are the data files the kind's job writes; ``derived`` what the
    tools write from them (export's ``megatron/...``, stats' table and picture wherever inside the
    tree they were asked for, the description files, the reader index), never a fixed name."""
    top = name.split("/", 1)[0]
    if top == layout.TEMP_DIR_NAME:
        return f"is inside {layout.TEMP_DIR_NAME}, the tool's temporary directory"
    if lock.is_lock_name(top) or name in fixed_names():
        return "is one of the tree's fixed files, never listed"
    of = kinds.get(kind)
    if what == "files":
        return None if of.is_data_file(name) else f"is not a data file of a {kind} tree"
    if not of.derives:
        return f"is listed as derived, and no tool derives a file from a {kind}"
    if of.is_data_file(name):
        return f"is a data file of a {kind} tree, listed as derived"
    return None


def _is_relative(path: str) -> bool:
    return name_problem(path) is None


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a path inside a tree (absolute, ``..``, an empty or ``.`` part, a URL, a
    backslash, a NUL); None when it is one."""
    if not isinstance(name, str) or not name:
        return "it is empty"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "it is absolute"
    if "://" in name:
        return "it is a URL"
    if "\\" in name or "\0" in name:
        return "it holds a backslash or a NUL"
    parts = name.split("/")
    if ".." in parts:
        return "it climbs out with '..'"
    if "" in parts or "." in parts:
        return "it has an empty or '.' part"
    return None


class UnsafePathError(ValueError):
    """A name that would lead out of the tree, or a symbolic link in the tree the tool would have to
    follow to write or delete. Said in one line naming it; nothing was changed because of it."""


class Tree:
    """One output tree or tokenizer directory: the only code that turns a name into a path in it,
    and the only code that creates, renames or deletes there.

        t = Tree("out/finepdfs")
        t.path("1024/p00_00000.npy")      # to read: the name checked, and where it resolves
        t.writable("1024/p00_00000.npy")  # to write or delete: besides, no link on the way
        t.write("checksums.sha256", data) # atomically, its temporary copy in the temporary directory
        t.remove_files(["1024/p00_00000.npy"]); t.remove_dir(t.temp_name("run-x"))

    A name is relative, has no ``..`` and no empty part (``name_problem``); on a local disk it
    must also resolve (links followed) inside where the root resolves, and to write or delete, no
    directory on its way from the root may be a link: a link there is refused, naming it
    (UnsafePathError), and a link that is the name itself is replaced or removed as a link, never
    followed. Object stores have no links: the name rules hold there.

    The temporary directory's layout (``TEMP_DIR`` and what is under it) is known here only.
    """

    TEMP_DIR = layout.TEMP_DIR_NAME  # work in progress, on the tree's own filesystem
    JOURNAL_DIR = "removal"  # a pending removal's journal (shards/removal/journal.py)
    STAGED_DIR = "staged"  # a run's files before they are published
    SPILL_DIR = "spill"  # a run's (or its saved work's) token spill files
    REWRITE_DIR = "rewrite"  # a removal's partial rewrites, inside its journal
    MATCH_DIR = "match"  # inside the journal: the partition files of a long list's id match (shards/removal/idmatch.py)
    WORK_PREFIX = "work-"  # saved work a re-run resumes from: work-<key> (transforms/run/resume.py)
    PUBLISHING_MARK = "publishing"  # in a run's directory once it began publishing
    PENDING_REMOVAL_LIST = "pending-removal.txt"  # in a run's directory: a pending removal's ids

    def __init__(self, url: str):
        self.url = storage.normalize(url)
        self.fs, self.root = _root(self.url)
        self.local = storage.renames_atomically(self.fs)
        self._real_root = os.path.realpath(self.root) if self.local else None
        self._checked_dirs: set[str] = set()
        self._real_dirs: dict[str, str] = {}

    # -- names to paths ------------------------------------------------------------------------

    def check_name(self, name: str, what: str = "name") -> str:
        problem = name_problem(name)
        if problem is not None:
            raise UnsafePathError(f"{self.url}: {what} {name!r} is not a path inside the tree: {problem}")
        return name

    def path(self, name: str, what: str = "name") -> str:
        """The path of ``name`` for reading: its name checked and, on a local disk, where it
        resolves inside the tree."""
        self.check_name(name, what)
        path = posixpath.join(self.root, name)
        if self.local:
            # Where the directory resolves is asked once per directory; the name itself, once per name.
            parent, base = posixpath.split(name)
            real_parent = self._real_dirs.get(parent)
            if real_parent is None:
                real_parent = self._real_dirs[parent] = os.path.realpath(posixpath.join(self.root, parent))
            real = posixpath.join(real_parent, base)
            if os.path.islink(real):
                real = os.path.realpath(real)
            if not (real == self._real_root or real.startswith(self._real_root.rstrip("/") + "/")):
                raise UnsafePathError(
                    f"{storage.join(self.url, name)}: {what} resolves to {real}, outside the tree "
                    f"({self._real_root}); pretokenize never follows a link out of its tree"
                )
        return path

    def lexists(self, name: str, what: str = "name") -> bool:
        """Whether something (a file, a directory, a link, wherever it points) has this name."""
        path = posixpath.join(self.root, self.check_name(name, what))
        return os.path.lexists(path) if self.local else self.fs.exists(path)

    def url_of(self, name: str, what: str = "name") -> str:
        """``name`` as a URL (a local path for a local tree), checked as ``path`` does."""
        path = self.path(name, what)
        return path if self.local else storage.unstrip(self.fs, path, self.url)

    def writable(self, name: str, what: str = "name") -> str:
        """The path of ``name`` to write or delete: ``path``'s checks, and no link among the
        directories on its way (a link that is ``name`` itself is allowed: a rename replaces it,
        a delete removes it, neither follows it). Asked before every write: a command whose lock
        on the tree was taken stops here (shards.lock.guard)."""
        lock.guard(self.url)
        path = self.path(name, what)
        if self.local:
            parts = name.split("/")
            for i in range(1, len(parts)):
                sub = "/".join(parts[:i])
                if sub in self._checked_dirs:
                    continue
                here = posixpath.join(self.root, sub)
                if os.path.islink(here):
                    raise self._link_refusal(sub)
                if not os.path.lexists(here):
                    break  # nothing below exists yet: it will be made, as directories
                self._checked_dirs.add(sub)
        return path

    def _link_refusal(self, name: str) -> UnsafePathError:
        path = posixpath.join(self.root, name)
        return UnsafePathError(
            f"{storage.join(self.url, name)} is a symbolic link (to {os.readlink(path)}); pretokenize never follows "
            "a link in its tree to write or delete: replace the link with a directory"
        )

    def check_data_dirs(self, kind: str) -> None:
        """None of the directories a job of ``kind`` writes its files into (bucket or split
        directories) is a link: checked at launch, before any file in them is named."""
        for name in kinds.get(kind).data_dirs:
            if self.local and os.path.islink(self.writable(name, "directory")):
                raise self._link_refusal(name)

    def check_writable(self, names, what: str = "name") -> None:
        """``writable`` for each of ``names``: the launch-time check of a command that will write or
        delete them, before it changes anything."""
        for name in names:
            self.writable(name, what)

    def check_ours(self, names, record: TreeRecord, what: str = "file") -> None:
        """Before a tool writes ``names``: each is writable, and none that exists is a user's (a
        file of that name the record does not list is never overwritten: NotOurTreeError naming it)."""
        for name in sorted(set(names)):
            self.writable(name, what)
            if name not in record.derived and name not in record.files and self.lexists(name):
                raise NotOurTreeError(
                    f"{storage.join(self.url, name)} exists and is not the tool's (the tree's {RECORD_NAME} does not "
                    "list it): pretokenize never overwrites a file it did not write; move it away first"
                )

    def check_no_links(self, name: str, what: str = "directory") -> None:
        """A directory of the tool's own (saved work it resumes from) holds no link anywhere:
        nothing the tool reads back or deletes there is reached through one."""
        top = self.writable(name, what)
        if not self.local or not os.path.lexists(top):
            return
        if os.path.islink(top):
            raise UnsafePathError(f"{storage.join(self.url, name)} is a symbolic link (to {os.readlink(top)}); "
                                  "pretokenize made it a directory and will not follow it")
        for here, dirs, files in os.walk(top):
            for entry in dirs + files:
                if os.path.islink(os.path.join(here, entry)):
                    link = os.path.join(here, entry)
                    raise UnsafePathError(f"{link} is a symbolic link (to {os.readlink(link)}) inside the tool's "
                                          f"{what}; pretokenize will not follow it: delete {top}")

    # -- the temporary layout --------------------------------------------------------------------

    @classmethod
    def temp_name(cls, *parts: str) -> str:
        """The name, relative to the root, of ``parts`` under the temporary directory (no I/O: a
        worker builds its names with it; what they lead to was checked at launch)."""
        return posixpath.join(cls.TEMP_DIR, *parts)

    def temp_url(self, *parts: str) -> str:
        """The URL of ``parts`` under the temporary directory, which is checked: never a link."""
        name = self.temp_name(*parts)
        self.writable(name, "temporary entry")
        self._refuse_temp_link()
        return self.url_of(name, "temporary entry")

    def _refuse_temp_link(self) -> None:
        if self.local:
            path = posixpath.join(self.root, self.TEMP_DIR)
            if os.path.islink(path):
                raise UnsafePathError(
                    f"{path} is a symbolic link (to {os.readlink(path)}); pretokenize never follows a link in its "
                    "tree to write or delete: remove the link (the tool makes its own temporary directory there)"
                )

    def run_url(self, run_id: str) -> str:
        return self.temp_url(run_id)

    def work_url(self, dir_name: str) -> str:
        return self.temp_url(dir_name)

    def journal_url(self) -> str:
        """The removal journal's directory, which is never a link (UnsafePathError naming it)."""
        url = self.temp_url(self.JOURNAL_DIR)
        name = self.temp_name(self.JOURNAL_DIR)
        if self.local and os.path.islink(posixpath.join(self.root, name)):
            raise self._link_refusal(name)
        return url

    def temp_entries(self) -> list[str]:
        """The names directly under the temporary directory (empty when it does not exist)."""
        self._refuse_temp_link()
        return _entries(self.fs, posixpath.join(self.root, self.TEMP_DIR))

    def match_files(self) -> int:
        """How many files an id match left (``MATCH_DIR``): they exist only while a ``remove`` plans,
        under the tree's lock, so any found by another command are a killed one's."""
        name = self.temp_name(self.JOURNAL_DIR, self.MATCH_DIR)
        path = posixpath.join(self.root, name)
        if self.local:
            on_the_way = [posixpath.join(self.root, self.temp_name(*parts)) for parts in ((), (self.JOURNAL_DIR,))]
            if any(os.path.islink(p) for p in on_the_way):
                return 0  # never followed out of the tree (the writing commands refuse such a link)
            if not os.path.isdir(path) or os.path.islink(path):
                return int(os.path.lexists(path))
            return sum(len(files) + len(dirs) for _, dirs, files in os.walk(path))
        return len(self.fs.find(path)) if self.fs.isdir(path) else 0

    def clear_unused_match(self) -> None:
        """Delete what a killed removal's id match left (the ids of its list, encoded): run by every
        writing command once it holds the lock, when no command can be using it."""
        name = self.temp_name(self.JOURNAL_DIR, self.MATCH_DIR)
        if self.local and os.path.islink(posixpath.join(self.root, self.TEMP_DIR)):
            return  # never followed: the commands that use the temporary directory refuse it
        if self.lexists(self.TEMP_DIR) and self.lexists(name):
            self.remove_dir(name, "removal's id match")
            self.remove_empty_dir(self.temp_name(self.JOURNAL_DIR))  # nothing else was begun there
            self.remove_temp_if_empty()

    def remove_temp_if_empty(self) -> None:
        self._refuse_temp_link()
        self.remove_empty_dir(self.TEMP_DIR)

    # -- changes ---------------------------------------------------------------------------------

    def makedirs(self, name: str, what: str = "directory") -> str:
        path = self.writable(name, what)
        self.fs.makedirs(path, exist_ok=True)
        return path

    def write(self, name: str, data: bytes, what: str = "file") -> None:
        """Write ``name`` atomically: a reader sees the old bytes or the new. Locally the new copy is
        written in the temporary directory and renamed over ``name`` (over a link, the link is
        replaced, never followed); on an object store one upload is all-or-nothing."""
        path = self.writable(name, what)
        if not self.local:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, data)
            return
        if os.path.isdir(path):  # a move onto a directory (or a link to one) would go into it
            raise UnsafePathError(f"{storage.join(self.url, name)} is a directory; the tool writes a file of that name")
        scratch = self.makedirs(self.TEMP_DIR, "temporary directory")
        self._refuse_temp_link()
        tmp = posixpath.join(scratch, f"{posixpath.basename(name)}.partial-{uuid.uuid4().hex[:12]}")
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        try:
            with open(tmp, "xb") as f:
                f.write(data)
            self.fs.mv(tmp, path)  # a rename: over a link, the link is replaced
        except BaseException:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise

    def link(self, name: str, target: str) -> None:
        """Make ``name`` a symbolic link to ``target`` (relative to the link's directory, resolving
        inside the tree), replacing an older link, never a file or a directory."""
        path = self.writable(name, "link")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        self.check_name(resolved, "link target")
        if os.path.lexists(path):
            if not os.path.islink(path):
                raise FileExistsError(f"{path} exists and is not a link; the tool only replaces links it made")
            if os.readlink(path) == target:
                return
        scratch = self.makedirs(self.TEMP_DIR, "temporary directory")
        self._refuse_temp_link()
        tmp = posixpath.join(scratch, f"{posixpath.basename(name)}.partial-{uuid.uuid4().hex[:12]}")
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        os.symlink(target, tmp)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.remove(tmp)
            raise

    def rename(self, src: str, dst: str) -> None:
        """Move the file ``src`` to ``dst``, both names in the tree (locally an atomic rename that
        replaces ``dst`` itself, never what a link there points to)."""
        src_path, dst_path = self.writable(src, "file"), self.writable(dst, "file")
        if self.local:
            if os.path.isdir(dst_path):  # a move onto a directory would go into it
                raise UnsafePathError(f"{storage.join(self.url, dst)} is a directory; the tool moves a file there")
            os.makedirs(posixpath.dirname(dst_path), exist_ok=True)
        self.fs.mv(src_path, dst_path)  # locally a rename: it replaces a link at dst, never follows it

    def remove_file(self, name: str, what: str = "file") -> bool:
        """Delete the file ``name`` (a link: the link itself); whether there was one."""
        path = self.writable(name, what)
        if self.local:
            if not os.path.lexists(path):
                return False
            if os.path.isdir(path) and not os.path.islink(path):
                raise UnsafePathError(f"refusing to delete {name!r}: the tool names a file, this is a directory")
            os.remove(path)
            return True
        if not self.fs.exists(path):
            return False
        self.fs.rm_file(path)
        return True

    def remove_dir(self, name: str, what: str = "directory") -> None:
        """Delete the directory ``name`` and what is in it (a link inside is removed as a link;
        ``name`` itself a link: the link alone goes)."""
        path = self.writable(name, what)
        if self.local:
            if os.path.islink(path):
                os.remove(path)
            elif os.path.isdir(path):
                self.fs.rm(path, recursive=True)  # shutil.rmtree: links inside are unlinked, not followed
            elif os.path.lexists(path):
                os.remove(path)
        elif self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def remove_empty_dir(self, name: str) -> None:
        """Delete the directory ``name`` if it is empty (and not a link)."""
        path = self.writable(name, "directory")
        if self.local:
            if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
                os.rmdir(path)
        elif self.fs.isdir(path) and not self.fs.ls(path, detail=False):
            self.fs.rmdir(path)

    def remove_files(self, names) -> list[str]:
        """Delete the files ``names`` lists (missing ones are skipped), then any directory they
        leave empty, up to the root. Never a pattern, never a directory's content; every name
        checked before anything goes. Returns the files deleted."""
        names = sorted(set(names))
        for name in names:
            self.writable(name, "recorded file")
        deleted, parents = [], set()
        for name in names:
            if self.remove_file(name, "recorded file"):
                deleted.append(name)
            parent = posixpath.dirname(name)
            while parent:
                parents.add(parent)
                parent = posixpath.dirname(parent)
        for rel in sorted(parents, key=lambda p: -p.count("/")):
            if self.local:  # object stores have no directories to leave behind
                self.remove_empty_dir(rel)
        return deleted


def _clear_unused_match(url: str) -> None:
    fs, root = _root(url)
    if fs.isdir(root):
        Tree(url).clear_unused_match()


lock.when_taken(_clear_unused_match)


def _root(url: str) -> tuple:
    fs, root = storage.filesystem(url)
    return fs, root.rstrip("/") or "/"


def _entries(fs, root: str) -> list[str]:
    """The names directly under ``root`` (empty when it does not exist)."""
    try:
        if not fs.isdir(root):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
    except FileNotFoundError:
        return []


def read_record(url: str) -> TreeRecord | None:
    """The tree's ownership record, or None when the directory has none."""
    fs, root = _root(url)
    path = posixpath.join(root, RECORD_NAME)
    with storage.reaching(url):
        if not fs.exists(path):
            return None
        text = storage.read_bytes(fs, path).decode("utf-8", "replace")
    return TreeRecord.from_json(text, storage.join(url, RECORD_NAME))


def write_record(url: str, record: TreeRecord) -> None:
    write_file(url, RECORD_NAME, record.to_json().encode())


def temp_url(url: str) -> str:
    """The tree's temporary directory (checked by Tree: never a link)."""
    return Tree(url).temp_url()


@dataclasses.dataclass(frozen=True)
class Found:
    """What a writing job would find at its ``--output`` (``find``): nothing is changed to know it.

    ``state`` is one of ``STATES``: "missing" and "empty" are claimed, "ours" (this tool's tree of
    the same kind) is reused, the rest are refused; ``record`` the tree's record when it has one;
    ``entry`` a name in the directory that is not the tool's (state "foreign")."""

    state: str
    record: TreeRecord | None = None
    entry: str | None = None

    STATES = ("missing", "empty", "ours", "file", "foreign", "other kind")

    @property
    def claimable(self) -> bool:
        return self.state in ("missing", "empty", "ours")


def find(url: str, kind: str) -> Found:
    """The claim rule, read only: what ``claim(url, kind)`` would find (a dry run's plan says it)."""
    kinds.get(kind)  # ValueError for a kind no job writes
    with storage.reaching(url):
        fs, root = _root(url)
        if not fs.exists(root):
            return Found("missing")
        if not fs.isdir(root):
            return Found("file")
        record = read_record(url)
        if record is None:
            # The lock of a command writing here is the tool's only by its exact name, and only when
            # it is a holder record: a user's ``.pretokenize-lock.notes`` (or a lock-named file that
            # is not a lock) makes the directory not ours.
            entries = [e for e in _entries(fs, root) if not (e == lock.LOCK_NAME and lock.is_tools_lock(url))]
            return Found("foreign", entry=entries[0]) if entries else Found("empty")
        return Found("ours" if record.kind == kind else "other kind", record)


def claim(url: str, kind: str, write: bool = True) -> TreeRecord:
    """Make ``url`` this tool's tree of ``kind``, or refuse: the check every writing job does at launch.

    An empty or missing directory is claimed (the record is written before anything else); the
    tool's own tree of the same kind is reused; anything else raises NotOurTreeError. Without
    ``write`` (a dry run) the same checks, and nothing is written.
    """
    found = find(url, kind)
    if found.state == "file":
        raise NotOurTreeError(f"--output {url} is a file, not a directory")
    if found.state == "foreign":
        raise NotOurTreeError(
            f"--output {url} is not empty and was not written by pretokenize (it holds {found.entry!r}, "
            f"and no {RECORD_NAME}); write to a new or empty directory"
        )
    if found.state == "other kind":
        raise NotOurTreeError(
            f"--output {url} holds the {found.record.kind} job's output, not the {kind} job's; "
            "write to another directory"
        )
    if found.record is not None:
        return found.record
    record = TreeRecord(kind)
    if write:
        with storage.reaching(url):
            fs, root = _root(url)
            fs.makedirs(root, exist_ok=True)
            write_record(url, record)
    return record


def owned(url: str, kind: str | None = None) -> TreeRecord:
    """The record of a tree a tool is about to change (remove, export, stats); NotOurTreeError if
    there is none (or it is of another kind)."""
    record = read_record(url)
    if record is None:
        raise NotOurTreeError(f"{url} has no {RECORD_NAME}: it was not written by this version of pretokenize")
    if kind is not None and record.kind != kind:
        raise NotOurTreeError(f"{url} is a {record.kind} tree, not a {kind} tree")
    return record


def is_ours(record: TreeRecord | None, rel: str) -> bool:
    """Whether a data file (a shard) is the tool's: the record lists it. In a tree without a record
    (written before records existed) every file is taken as the tool's, as it was then."""
    return record is None or rel in record.files


def delete_listed(url: str, rel_paths) -> list[str]:
    """Delete the files ``rel_paths`` names (missing ones are skipped), then any directory they
    leave empty, up to the tree's root. Never a pattern, never a directory's content (Tree.remove_files).
    Returns the files deleted."""
    return Tree(url).remove_files(rel_paths)


def record_files(url: str, record: TreeRecord, add=(), drop=(), add_derived=(), drop_derived=()) -> TreeRecord:
    """Update the record on disk and return it: files and derived files added and dropped."""
    record.files = sorted((set(record.files) | set(add)) - set(drop))
    record.derived = sorted((set(record.derived) | set(add_derived)) - set(drop_derived))
    write_record(url, record)
    return record


def write_file(url: str, rel: str, data: bytes) -> None:
    """Write one of the tree's own files atomically; its temporary copy lives in the tree's
    temporary directory, so a crash never leaves a stray file beside it (Tree.write)."""
    Tree(url).write(rel, data)


def inside(path_url: str, tree_url: str) -> bool:
    """Whether the path ``path_url`` names lies in (or is) the directory ``tree_url``: as written,
    or once links are resolved (a local path only), so that the tree reached through a linked
    parent directory, or spelt ``file://``, is the same tree."""
    return name_in(path_url, tree_url) is not None


def name_in(path_url: str, tree_url: str) -> str | None:
    """The name (``.`` for the tree itself) that ``path_url`` has in the tree ``tree_url``, or None
    when it lies outside it: its place as written when that is inside the tree (a link on the way
    is then the tree's to refuse), else its place once both are resolved (a local path only)."""
    for a, b in ((storage.normalize(path_url), storage.normalize(tree_url)),
                 (storage.resolved(path_url), storage.resolved(tree_url))):
        a, prefix = a.rstrip("/"), b.rstrip("/") + "/"
        if a + "/" == prefix:
            return "."
        if a.startswith(prefix):
            return a[len(prefix):]
    return None


@dataclasses.dataclass(frozen=True)
class OutputTree:
    """What an output tree is: which kind, whether it is finished, what its stats say.

        out = OutputTree.open("out/finepdfs")
        out.kind          # "bucketed" or "scaffold" (None: neither the record, the stats nor the files say)
        out.finished      # dataset_stats.txt exists: the jobs write it last, as their commit point
        out.stats()       # manifest.DatasetStats or llmc.ScaffoldStats; IncompleteTreeError if unfinished

    The kind is the ownership record's; a tree written before records existed is told by its
    stats (the scaffold job's say ``format: llmc-scaffold``), else by its files (the bucketed
    manifest, or train/ and val/ directories). A damaged record raises NotOurTreeError: it, not
    the files, says which files are the tool's.
    """

    url: str
    record: TreeRecord | None
    kind: str | None
    stats_text: str | None  # dataset_stats.txt as read (None when the tree is not finished)

    @classmethod
    def open(cls, url: str) -> OutputTree:
        """Read what ``url`` is; FileNotFoundError when it is not a directory."""
        url = storage.normalize(url)
        with storage.reaching(url):
            fs, root = _root(url)
            if not fs.isdir(root):
                raise FileNotFoundError(f"{url} is not a directory")
            record = read_record(url)
            stats_path = posixpath.join(root, layout.STATS_NAME)
            # Bytes that are not UTF-8 are kept (as surrogates), so that stats() can say so.
            stats_text = (storage.read_bytes(fs, stats_path).decode("utf-8", "surrogateescape")
                          if fs.exists(stats_path) else None)
            if record is not None:
                kind = record.kind
            else:
                told = kinds.told_by(stats_text, fs, root)
                kind = told.name if told is not None else None
        return cls(url, record, kind, stats_text)

    @property
    def tree_kind(self) -> kinds.TreeKind | None:
        """The registry's entry of this tree's kind (shards.kinds); None when nothing says which."""
        return kinds.get(self.kind) if self.kind is not None else None

    def owns(self, rel: str) -> bool:
        """Whether the data file ``rel`` is the tool's (``is_ours`` with this tree's record)."""
        return is_ours(self.record, rel)

    @property
    def finished(self) -> bool:
        return self.stats_text is not None

    def require_finished(self) -> OutputTree:
        """This tree; IncompleteTreeError, naming it, when it is not finished."""
        if not self.finished:
            raise IncompleteTreeError(
                f"{self.url} has no {layout.STATS_NAME}, so it is not a finished output tree: the job writes that "
                "file last, as its commit point, and a tree without it may still be publishing, may have died "
                "midway, or may be in the middle of a removal. Finish or re-run the job that writes it first."
            )
        return self

    def stats(self) -> manifest.DatasetStats | ScaffoldStats:
        """The stats of a finished tree, parsed as its kind's: ``manifest.DatasetStats`` (bucketed) or
        ``llmc.ScaffoldStats`` (scaffold): the kind's ``stats_type``, the bucketed job's when nothing
        says which. IncompleteTreeError when it is not finished, UnreadableStatsError (naming the
        file) when they do not parse."""
        self.require_finished()
        try:
            self.stats_text.encode("utf-8")
            return (self.tree_kind or kinds.BUCKETED).parse_stats(self.stats_text)
        except UnicodeEncodeError:
            raise UnreadableStatsError(self.url, "it is not UTF-8 text") from None
        except (ValueError, KeyError) as e:
            raise UnreadableStatsError(self.url, str(e)) from None
