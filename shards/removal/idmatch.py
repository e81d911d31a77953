"""Matching rows' ids against a removal list in memory bounded whatever the list's length.

A list (and the audit log beside it) of at most ID_BOUND ids is held in memory, as a set: the
common case, one pass, no file written. A longer one is hash-partitioned, and so are the rows: each
id goes to partition ``crc32(utf-8 bytes) % K``, K chosen so that one partition's ids are about half
the bound; then one partition at a time, the list's ids (a dict: exact string equality, the first
place each is listed) are matched against that partition's rows. What the join finds is written back
in the order it was read (the rows' ordinals, the list's), so merging the partitions' results
(heapq.merge, K files open, one line each held) gives it in file order: the caller streams its rows
again and asks, a run of rows at a time, which are hits. Memory: one partition's ids, whatever the lengths.

The partition files live in a Scratch: a directory under the tree's temporary directory, reached
through the tree layer (shards.tree.Tree: no link on the way, each file created exclusively, never
through a link planted at its name), or a local directory of the caller's (a dry run writes nothing
into the tree). They are deleted when the match is done, and on any error; a kill leaves them in a
directory the owning command clears before it writes there again. A record is an id (its UTF-8
bytes, whatever they hold), after its ordinal when the order matters, in bytes that hold no text
(_line): verify's search for a removed id's text never finds one there.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import os
import posixpath
import zlib
from collections.abc import Callable, Iterable, Iterator

from shards import tree

ID_BOUND_ENV = "PRETOKENIZE_ID_BOUND"
# The ids held in memory at once (a list's and the log's, or one partition's of a longer one): about
# 100 bytes each in a Python set or dict, so 500,000 is some 50 MiB.
ID_BOUND = 500_000
# Partition files open at once (well under 1,024, the usual limit of open files): past ID_BOUND * 128
# ids (64M) a partition holds more than half the bound.
MAX_PARTITIONS = 256
SAMPLE = 20  # the ids not found a report names
# Each partition file open has a buffer this size: K of them are open at once (writing, merging).
BUFFER = 64 << 10


def id_bound() -> int:
    """ID_BOUND, or the PRETOKENIZE_ID_BOUND environment variable (tests set it small)."""
    given = os.environ.get(ID_BOUND_ENV)
    return max(1, int(given)) if given else ID_BOUND


class Scratch:
    """A directory for partition files: ``name`` in the tree at ``output`` (through the tree layer),
    or, without ``output``, the local directory ``name`` (a dry run's). ``prepare``, when given,
    runs once before the first file is written (the owner readies its directory): a match that
    needs no file changes nothing."""

    def __init__(self, output: str | None, name: str, prepare: Callable[[], None] | None = None):
        self._tree = tree.Tree(output) if output is not None else None
        self._name = name
        self._prepare = prepare
        self._ready = False
        self.wrote = False  # whether a file was created (the directory, and its parents, were made)

    def ready(self) -> None:
        """The owner's ``prepare``, once."""
        if not self._ready:
            self._ready = True
            if self._prepare is not None:
                self._prepare()

    @property
    def was_ready(self) -> bool:
        return self._ready

    def reset(self) -> None:
        """Ready, and empty of what a killed attempt left."""
        self.ready()
        self.clear()

    def _path(self, part: str) -> str:
        if self._tree is None:
            return os.path.join(self._name, part)
        return self._tree.writable(posixpath.join(self._name, part), "partition file")

    def create(self, part: str):
        """A new file, created exclusively (locally O_EXCL|O_NOFOLLOW: a link planted there is refused)."""
        self.ready()
        self.wrote = True
        if self._tree is not None:
            self._tree.makedirs(self._name, "partition directory")
        else:
            os.makedirs(self._name, exist_ok=True)
        path = self._path(part)
        if self._tree is not None and not self._tree.local:
            return self._tree.fs.open(path, "wb")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        return os.fdopen(fd, "wb", buffering=BUFFER)

    def open(self, part: str):
        path = self._path(part)
        if self._tree is not None and not self._tree.local:
            return self._tree.fs.open(path, "rb")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        return os.fdopen(fd, "rb", buffering=BUFFER)

    def clear(self) -> None:
        """The directory goes, links in it removed as links, never followed (once ready: nothing was written before)."""
        if not self._ready:
            return
        if self._tree is not None:
            self._tree.remove_dir(self._name, "partition directory")
        elif os.path.isdir(self._name) and not os.path.islink(self._name):
            for entry in os.listdir(self._name):
                os.remove(os.path.join(self._name, entry))


def partition_of(doc_id: str, k: int) -> int:
    return zlib.crc32(doc_id.encode("utf-8")) % k


def partitions_for(ids: int) -> int:
    """K: about half the bound in each partition (room for an uneven spread), at least 2."""
    return min(MAX_PARTITIONS, max(2, math.ceil(2 * ids / id_bound())))


# A partition file's bytes are all in 0xE0-0xFF: each hex digit of a field as one of 0xE0-0xEF, 0xFE
# between fields, 0xFF after a record. No UTF-8 text but the empty string is found in such bytes (an
# ASCII byte or a continuation byte 0x80-0xBF would be needed), so verify, which flags any file under
# the tree holding a removed id's text, never finds one in them: a kill leaves no id readable there.
_TO_FILE = bytes.maketrans(b"0123456789abcdef", bytes(range(0xE0, 0xF0)))
_FROM_FILE = bytes.maketrans(bytes(range(0xE0, 0xF0)), b"0123456789abcdef")
_FIELD, _END = b"\xfe", b"\xff"


def _line(doc_id: str, ordinal: int | None = None) -> bytes:
    """One record: the id's UTF-8 bytes (exactly: any id, any character), after its ordinal when given."""
    encoded = doc_id.encode("utf-8").hex().encode("ascii").translate(_TO_FILE)
    if ordinal is None:
        return encoded + _END
    return format(ordinal, "x").encode("ascii").translate(_TO_FILE) + _FIELD + encoded + _END


def _records(f) -> Iterator[bytes]:
    rest = b""
    while chunk := f.read(BUFFER):
        *whole, rest = (rest + chunk).split(_END)
        yield from whole
    if rest:
        raise ValueError("a partition file ends inside a record")


def _id_of(field: bytes) -> str:
    return bytes.fromhex(field.translate(_FROM_FILE).decode("ascii")).decode("utf-8")


def write_partitions(scratch: Scratch, prefix: str, k: int, ids: Iterable[str], numbered: bool = True) -> int:
    """Each id to its partition's file ``prefix``-NNNN (with its ordinal when ``numbered``); how many."""
    files = [scratch.create(f"{prefix}-{p:04d}") for p in range(k)]
    n = 0
    try:
        for n, doc_id in enumerate(ids, 1):
            files[partition_of(doc_id, k)].write(_line(doc_id, n - 1 if numbered else None))
    finally:
        for f in files:
            f.close()
    return n


def read_numbered(scratch: Scratch, part: str) -> Iterator[tuple[int, str]]:
    with scratch.open(part) as f:
        for record in _records(f):
            ordinal, _, doc_id = record.partition(_FIELD)
            yield int(ordinal.translate(_FROM_FILE), 16), _id_of(doc_id)


def read_plain(scratch: Scratch, part: str) -> Iterator[str]:
    with scratch.open(part) as f:
        for record in _records(f):
            yield _id_of(record)


def count_distinct(ids: Callable[[], Iterable[str]], scratch: Scratch) -> int:
    """How many distinct ids ``ids()`` yields: a set when they fit the bound, else one partition at
    a time (``ids`` is called again: it must yield the same ids)."""
    bound = id_bound()
    seen: set[str] = set()
    for doc_id in ids():
        seen.add(doc_id)
        if len(seen) > bound:
            break
    else:
        return len(seen)
    seen.clear()
    scratch.reset()
    try:
        k = partitions_for(sum(1 for _ in ids()))
        write_partitions(scratch, "distinct", k, ids(), numbered=False)
        return sum(len(set(read_plain(scratch, f"distinct-{p:04d}"))) for p in range(k))
    finally:
        scratch.clear()


@dataclasses.dataclass
class Matches:
    """What matching a list against rows found: the list's distinct ids, how many were found, how
    many of those not found the log lists (already removed), and the first SAMPLE of the others in
    list order, with their count."""

    listed: int = 0
    found: int = 0
    gone: int = 0
    missing: int = 0
    sample: list[str] = dataclasses.field(default_factory=list)


class InMemory:
    """The list and the log fit the bound: a set, and one pass over the rows (the caller's)."""

    def __init__(self, ids: list[str], already: set[str]):
        self._ids, self._already = ids, already
        self._wanted = set(ids)
        self._found: set[str] = set()

    def hits(self, first: int, ids: list[str]) -> list[bool]:
        """Whether each of the rows ``first``, ``first + 1``, ... (their ids ``ids``) holds a listed
        id: asked of every row once, in the rows' order, a run of rows at a time."""
        marks = [doc_id in self._wanted for doc_id in ids]
        if True in marks:
            self._found.update(doc_id for doc_id, mark in zip(ids, marks, strict=True) if mark)
        return marks

    def result(self) -> Matches:
        """Once every row was asked about."""
        not_found = [i for i in self._ids if i not in self._found]
        missing = [i for i in not_found if i not in self._already]
        return Matches(len(self._ids), len(self._found), len(not_found) - len(missing), len(missing),
                       missing[:SAMPLE])


class Partitioned:
    """The join done, one partition at a time: the rows' hits come back merged in row order."""

    def __init__(self, matches: Matches, hits: Iterator[tuple[int, str]], scratch: Scratch):
        self._matches, self._hits, self._scratch = matches, hits, scratch
        self._next = next(hits, None)

    def hits(self, first: int, ids: list[str]) -> list[bool]:
        marks = [False] * len(ids)
        while self._next is not None and self._next[0] < first + len(ids):
            marks[self._next[0] - first] = True
            self._next = next(self._hits, None)
        return marks

    def result(self) -> Matches:
        self._scratch.clear()
        return self._matches


def _held(source: Iterable[str], room: int) -> list[str] | None:
    """The ids of ``source``, or None when there are more than ``room``."""
    held = []
    for doc_id in source:
        if len(held) == room:
            return None
        held.append(doc_id)
    return held


def match_ids(listed: Callable[[], Iterable[str]], logged: Callable[[], Iterable[str]],
              rows: Callable[[], Iterable[str]], scratch: Scratch) -> InMemory | Partitioned:
    """A matcher of the ids ``listed()`` yields (in list order, repeats allowed) against the ids of
    the rows ``rows()`` yields; ``logged()`` yields the ids the audit log lists. In memory when list
    and log fit the bound together (``rows`` is not called: the caller's one pass asks ``hits``);
    else partitioned (each callable called again, yielding the same ids; ``rows`` read before this
    returns). The caller then reads its rows, asking ``hits`` of each run of them in order, then ``result()``;
    on an error it calls scratch.clear()."""
    bound = id_bound()
    ids = _held(listed(), bound)
    log_ids = _held(logged(), bound - len(ids)) if ids is not None else None
    if log_ids is not None:
        return InMemory(list(dict.fromkeys(ids)), set(log_ids))
    scratch.reset()
    try:
        return _partitioned(listed, logged, rows, scratch)
    except BaseException:
        scratch.clear()
        raise


def _partitioned(listed, logged, rows, scratch: Scratch) -> Partitioned:
    k = partitions_for(sum(1 for _ in listed()) + sum(1 for _ in logged()))
    write_partitions(scratch, "list", k, listed())
    write_partitions(scratch, "log", k, logged(), numbered=False)
    write_partitions(scratch, "rows", k, rows())
    matches = Matches()
    for p in range(k):
        _join_partition(scratch, p, matches)
    missing = heapq.merge(*(read_numbered(scratch, f"missing-{p:04d}") for p in range(k)))
    matches.sample = [doc_id for _, doc_id in itertools.islice(missing, SAMPLE)]
    missing.close()
    hits = heapq.merge(*(read_numbered(scratch, f"hits-{p:04d}") for p in range(k)))
    return Partitioned(matches, hits, scratch)


def _join_partition(scratch: Scratch, p: int, matches: Matches) -> None:
    """Partition p: its listed ids against its rows; the rows that hold one to hits-p, in row
    order; the listed ids not found and not in the log to missing-p, in list order."""
    wanted: dict[str, int] = {}
    for ordinal, doc_id in read_numbered(scratch, f"list-{p:04d}"):
        wanted.setdefault(doc_id, ordinal)
    found: set[str] = set()
    with scratch.create(f"hits-{p:04d}") as hits:
        for ordinal, doc_id in read_numbered(scratch, f"rows-{p:04d}"):
            if doc_id in wanted:
                hits.write(_line("", ordinal))
                found.add(doc_id)
    already = {i for i in read_plain(scratch, f"log-{p:04d}") if i in wanted and i not in found}
    matches.listed += len(wanted)
    matches.found += len(found)
    with scratch.create(f"missing-{p:04d}") as missing:
        for doc_id, ordinal in wanted.items():
            if doc_id in found:
                continue
            if doc_id in already:
                matches.gone += 1
            else:
                matches.missing += 1
                missing.write(_line(doc_id, ordinal))
