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

What a tree is, once written, is answered here too, once: ``OutputTree.open(url)`` says which
kind of tree it is, whether it is finished (its ``dataset_stats.txt``, written last, is the commit
point) and what its stats say; ``verify``, ``remove``, the reader (so ``export``, ``stats`` and
training) and the llm.c checks all ask it.

Nothing here imports Beam: jobs, ``remove``, ``export`` and ``stats`` all use it.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import TYPE_CHECKING

from shards import layout, lock, manifest, storage

if TYPE_CHECKING:
    from shards.llmc import ScaffoldStats  # shards.llmc imports this module

RECORD_NAME = ".pretokenize-tree.json"
TOOL = "beam-pretokenize"
KINDS = ("bucketed", "scaffold", "tokenizer")  # tokenizer: train-bpe's output


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
            if d.get("tool") != TOOL or d.get("kind") not in KINDS:
                raise ValueError("not this tool's record")
            files, derived = list(d.get("files", [])), list(d.get("derived", []))
            if not all(isinstance(p, str) and _is_relative(p) for p in files + derived):
                raise ValueError("a listed path is not relative to the tree")
        except (ValueError, AttributeError, TypeError) as e:
            raise NotOurTreeError(f"{where} is damaged ({e}); the tool will not write into this directory") from None
        return cls(d["kind"], files, derived)


def _is_relative(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "" not in parts and "://" not in path


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
        text = fs.cat_file(path).decode("utf-8", "replace")
    return TreeRecord.from_json(text, storage.join(url, RECORD_NAME))


def write_record(url: str, record: TreeRecord) -> None:
    write_file(url, RECORD_NAME, record.to_json().encode())


def temp_url(url: str) -> str:
    return storage.join(url, layout.TEMP_DIR_NAME)


def claim(url: str, kind: str, write: bool = True) -> TreeRecord:
    """Make ``url`` this tool's tree of ``kind``, or refuse: the check every writing job does at launch.

    An empty or missing directory is claimed (the record is written before anything else); the
    tool's own tree of the same kind is reused; anything else raises NotOurTreeError. Without
    ``write`` (a dry run) the same checks, and nothing is written.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown tree kind {kind!r}")
    with storage.reaching(url):
        fs, root = _root(url)
        if fs.exists(root) and not fs.isdir(root):
            raise NotOurTreeError(f"--output {url} is a file, not a directory")
        record = read_record(url)
        if record is None:
            entries = [e for e in _entries(fs, root) if not lock.is_lock_name(e)]
            if entries:
                raise NotOurTreeError(
                    f"--output {url} is not empty and was not written by pretokenize (it holds {entries[0]!r}, "
                    f"and no {RECORD_NAME}); write to a new or empty directory"
                )
            record = TreeRecord(kind)
            if write:
                fs.makedirs(root, exist_ok=True)
                write_record(url, record)
            return record
        if record.kind != kind:
            raise NotOurTreeError(
                f"--output {url} holds the {record.kind} job's output, not the {kind} job's; "
                "write to another directory"
            )
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
    leave empty, up to the tree's root. Never a pattern, never a directory's content. Returns
    the files deleted."""
    fs, root = _root(url)
    deleted, parents = [], set()
    for rel in sorted(set(rel_paths)):
        if not _is_relative(rel):
            raise ValueError(f"refusing to delete {rel!r}: not a path inside the tree")
        path = posixpath.join(root, rel)
        if fs.lexists(path) if hasattr(fs, "lexists") else fs.exists(path):
            if fs.isdir(path) and not _is_link(fs, path):
                raise ValueError(f"refusing to delete {rel!r}: the record names a file, this is a directory")
            fs.rm_file(path)
            deleted.append(rel)
        parent = posixpath.dirname(rel)
        while parent:
            parents.add(parent)
            parent = posixpath.dirname(parent)
    for rel in sorted(parents, key=lambda p: -p.count("/")):
        path = posixpath.join(root, rel)
        if storage.renames_atomically(fs) and fs.isdir(path) and not fs.ls(path, detail=False):
            fs.rmdir(path)
    return deleted


def _is_link(fs, path: str) -> bool:
    import os

    return storage.renames_atomically(fs) and os.path.islink(path)


def record_files(url: str, record: TreeRecord, add=(), drop=(), add_derived=(), drop_derived=()) -> TreeRecord:
    """Update the record on disk and return it: files and derived files added and dropped."""
    record.files = sorted((set(record.files) | set(add)) - set(drop))
    record.derived = sorted((set(record.derived) | set(add_derived)) - set(drop_derived))
    write_record(url, record)
    return record


def write_file(url: str, rel: str, data: bytes) -> None:
    """Write one of the tree's own files atomically; its temporary copy lives in the tree's
    temporary directory, so a crash never leaves a stray file beside it."""
    storage.write_atomic(storage.join(url, rel), data, scratch=temp_url(url))


def inside(path_url: str, tree_url: str) -> bool:
    """Whether the path ``path_url`` names lies in (or is) the directory ``tree_url``."""
    a, b = storage.normalize(path_url).rstrip("/"), storage.normalize(tree_url).rstrip("/")
    return a == b or a.startswith(b + "/")


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
        from shards import llmc

        url = storage.normalize(url)
        with storage.reaching(url):
            fs, root = _root(url)
            if not fs.isdir(root):
                raise FileNotFoundError(f"{url} is not a directory")
            record = read_record(url)
            stats_path = posixpath.join(root, layout.STATS_NAME)
            # Bytes that are not UTF-8 are kept (as surrogates), so that stats() can say so.
            stats_text = fs.cat_file(stats_path).decode("utf-8", "surrogateescape") if fs.exists(stats_path) else None
            if record is not None:
                kind = record.kind
            elif stats_text is not None and llmc.is_scaffold_stats(stats_text):
                kind = "scaffold"
            elif fs.exists(posixpath.join(root, layout.MANIFEST_NAME)):
                kind = "bucketed"
            elif any(fs.isdir(posixpath.join(root, split)) for split in llmc.SPLITS):
                kind = "scaffold"
            else:
                kind = None
        return cls(url, record, kind, stats_text)

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
        ``llmc.ScaffoldStats`` (scaffold). IncompleteTreeError when it is not finished,
        UnreadableStatsError (naming the file) when they do not parse."""
        from shards import llmc

        self.require_finished()
        parse = llmc.ScaffoldStats.from_text if self.kind == "scaffold" else manifest.DatasetStats.from_text
        try:
            self.stats_text.encode("utf-8")
            return parse(self.stats_text)
        except UnicodeEncodeError:
            raise UnreadableStatsError(self.url, "it is not UTF-8 text") from None
        except (ValueError, KeyError) as e:
            raise UnreadableStatsError(self.url, str(e)) from None
