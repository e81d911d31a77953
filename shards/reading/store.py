"""What an opened tree holds: its token files laid end to end (``TokenStore``), and its document
table as numpy columns (``Documents``; ``IndexedDocuments`` when the columns are views of a mapped
reader index, shards.index). Pickled compactly for DataLoader workers: memory maps and mapped
indexes are opened again in the receiving process.

Both keep the version of each file they were opened with (a local file's device, inode, size and
modification time; an object's ETag or generation and size) and serve bytes of that version only:
a local file is mapped once, through a descriptor whose identity is checked first, and keeps its
bytes for as long as the map lives whatever is renamed over its name; an object is read with a
conditional request (shards.storage.read_range). Anything else is a TreeChangedError naming the
tree and the file."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Sequence

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shards import index as reader_index
from shards import storage
from shards.reading.hashes import validation_key


class TreeChangedError(RuntimeError):
    """The tree was changed (a removal, a re-run) after this reader opened it: a file it reads is no
    longer the one it opened, and the reader refuses rather than serve another version's bytes."""

    @classmethod
    def of_file(cls, url: str, name: str) -> TreeChangedError:
        return cls(f"{url}: {name} is not the file this reader opened: the tree was changed since (a removal or a "
                   "re-run); open the tree again")


def local_version(st: os.stat_result) -> tuple[int, int, int, int]:
    """What a local token file's version is to a reader: device, inode, size, modification time."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class TokenStore:
    """The token files of a tree laid end to end: global token position -> (file, offset).

    Local files are memory-mapped lazily; files on other filesystems are read by byte range.
    """

    def __init__(self, fs, root: str, rel_paths: Sequence[str], counts: Sequence[int], dtype: np.dtype,
                 header_bytes: int = 0, versions: Sequence[tuple] | None = None, url: str = ""):
        # versions: each file's as the tree was opened (local_version, or (file_version, size) of an
        # object); None reads whatever the names hold now (loose files).
        self.versions = None if versions is None else list(versions)
        self.url = url or root
        self.fs = fs
        self.root = root
        self.rel_paths = list(rel_paths)
        self.dtype = np.dtype(dtype)
        self.header_bytes = header_bytes
        self.starts = np.zeros(len(self.rel_paths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(counts, dtype=np.int64), out=self.starts[1:])
        self.local = isinstance(fs, LocalFileSystem)
        self._maps: list[np.ndarray | None] = [None] * len(self.rel_paths)

    def __getstate__(self):
        # Memory maps are reopened in the receiving process (a DataLoader worker), never pickled.
        state = self.__dict__.copy()
        state["_maps"] = [None] * len(self.rel_paths)
        return state

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def path(self, i: int) -> str:
        return posixpath.join(self.root, self.rel_paths[i])

    def count(self, i: int) -> int:
        return int(self.starts[i + 1] - self.starts[i])

    def _map(self, i: int) -> np.ndarray:
        m = self._maps[i]
        if m is None:
            try:
                with storage.open_read(self.fs, self.path(i)) as f:  # a regular file, or NotRegularFileError
                    if self.versions is not None and local_version(os.fstat(f.fileno())) != self.versions[i]:
                        raise TreeChangedError.of_file(self.url, self.rel_paths[i])
                    mapped = np.memmap(f, dtype=self.dtype, mode="r", offset=self.header_bytes,
                                       shape=(self.count(i),))
            except FileNotFoundError:
                if self.versions is None:
                    raise
                raise TreeChangedError.of_file(self.url, self.rel_paths[i]) from None
            # A plain ndarray over the map: slicing np.memmap itself costs ten times as much.
            m = self._maps[i] = mapped.view(np.ndarray)
        return m

    def _slice(self, i: int, a: int, b: int) -> np.ndarray:
        if self.local:
            return self._map(i)[a:b]
        size = self.dtype.itemsize
        start, end = self.header_bytes + a * size, self.header_bytes + b * size
        if self.versions is None:
            return np.frombuffer(self.fs.cat_file(self.path(i), start=start, end=end), dtype=self.dtype)
        try:
            data = storage.read_range(self.fs, self.path(i), start, end, *self.versions[i])
        except (storage.ChangedError, FileNotFoundError):
            raise TreeChangedError.of_file(self.url, self.rel_paths[i]) from None
        return np.frombuffer(data, dtype=self.dtype)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream; a view into the memory map when they lie in one local file."""
        if not 0 <= start <= stop <= self.total:
            raise IndexError(f"token range [{start}, {stop}) is outside the stream of {self.total} tokens")
        if start == stop:
            return np.empty(0, dtype=self.dtype)
        i = int(self.starts.searchsorted(start, "right")) - 1
        if stop <= self.starts[i + 1]:  # one file, the common case
            base = int(self.starts[i])
            return self._slice(i, start - base, stop - base)
        pieces = []
        while start < stop:
            end = min(stop, int(self.starts[i + 1]))
            if end > start:
                base = int(self.starts[i])
                pieces.append(self._slice(i, start - base, end - base))
            start = end
            i += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class Documents:
    """Every document of a tree in storage order, as numpy columns (compact, and shared rather than
    copied by forked DataLoader workers)."""

    def __init__(self, ids: np.ndarray, start: np.ndarray, length: np.ndarray, file: np.ndarray,
                 bucket: np.ndarray, partition: np.ndarray, split: np.ndarray):
        self.ids = ids  # UTF-8 bytes ('S' dtype)
        self.start = start  # int64, global position of the first token in the TokenStore
        self.length = length  # int64, EOS included
        self.file = file  # int32, file of the first token
        self.bucket = bucket  # int8 index into layout.BUCKET_NAMES, by length
        self.partition = partition  # int32, -1 when the format has none
        self.split = split  # int8: 0 train, 1 val, -1 when the tree has no split of its own
        self._by_id: np.ndarray | None = None
        self._val_keys: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.length)

    def id(self, i: int) -> str:
        return self.ids[i].decode("utf-8")

    def index_of(self, doc_id: str) -> int:
        """The row of ``doc_id``; KeyError when the tree does not hold it."""
        key = doc_id.encode("utf-8")
        if self._by_id is None:
            self._by_id = np.argsort(self.ids, kind="stable")
        if len(key) <= self.ids.itemsize and len(self):
            pos = int(np.searchsorted(self.ids, np.bytes_(key), sorter=self._by_id))
            if pos < len(self) and self.ids[self._by_id[pos]] == key:
                return int(self._by_id[pos])
        raise KeyError(f"no document with id {doc_id!r} in this tree")

    def validation_keys(self) -> np.ndarray:
        """validation_key of every document, computed once."""
        if self._val_keys is None:
            self._val_keys = np.fromiter((validation_key(i.decode("utf-8")) for i in self.ids), dtype=np.float64,
                                         count=len(self))
        return self._val_keys


class IndexedIds:
    """The ids column of a reader index: ``ids[i]`` is document i's id (UTF-8 bytes)."""

    def __init__(self, index):
        self._index = index

    def __len__(self) -> int:
        return self._index.documents

    def __getitem__(self, i: int) -> bytes:
        return self._index.id(int(i))

    def __iter__(self) -> Iterator[bytes]:
        return (self._index.id(i) for i in range(self._index.documents))


class IndexedDocuments(Documents):
    """Documents whose columns are views of a mapped reader index; pickled as the index's path and
    version (a DataLoader worker maps it again, once it checked it is the same file), and found by
    id through the index's hash table. A local copy of a remote tree's index is held (shards.index.hold)
    for as long as a process uses it, so no other reader's cache pruning removes it."""

    def __init__(self, path: str, index=None, *, version: tuple | None = None, url: str = "", held: bool = False):
        self._path, self._url, self._held = path, url or path, held
        self._fd = None
        if index is None:
            index = self._open_again(version)
        self._version = version
        self._index = index
        n = index.documents
        # Plain arrays over the map (slicing np.memmap itself costs ten times as much).
        columns = (np.asarray(c) for c in (index.start, index.length, index.file, index.bucket, index.partition))
        super().__init__(IndexedIds(index), *columns,
                         np.broadcast_to(np.int8(-1), (n,)))

    def hold(self, fd: int) -> None:
        """Keep ``fd`` (open on the local copy) open, holding the copy, while this object lives."""
        reader_index.hold(self._path, fd)
        self._fd = fd

    def _open_again(self, version: tuple | None):
        """The index mapped again in a receiving process, only if it is the file the reader opened."""
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise TreeChangedError.of_file(self._url, reader_index.INDEX_NAME) from None
        try:
            if version is not None and local_version(os.fstat(fd)) != version:
                raise TreeChangedError.of_file(self._url, reader_index.INDEX_NAME)
            index = reader_index.open_index(self._path, fd)
            if self._held:
                self.hold(fd)
                fd = None
            return index
        finally:
            if fd is not None:
                os.close(fd)

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None

    def __getstate__(self):
        return {"path": self._path, "version": self._version, "url": self._url, "held": self._held}

    def __setstate__(self, state):
        self.__init__(state["path"], version=state["version"], url=state["url"], held=state["held"])

    def index_of(self, doc_id: str) -> int:
        row = self._index.find(doc_id.encode("utf-8"))
        if row is None:
            raise KeyError(f"no document with id {doc_id!r} in this tree")
        return row
