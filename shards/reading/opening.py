"""Opening a tree: ``open_tree`` asks shards.tree.OutputTree the tree's kind and whether it is
finished, then the kind's opener (its ``opener`` in shards/kinds.py) reads it: a bucketed tree
through its reader index (mapped, shards.index) or else its text manifest (parsed into columns), an
llm.c tree of the scaffold job by scanning its shards for EOT. ``open_llmc`` opens loose llm.c shard
files. Every file read is checked against what describes it (the manifest's rows, an llm.c header) and
resolves inside the tree.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import stat
from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shards import index as reader_index
from shards import kinds, layout, llmc, manifest, storage
from shards.reading.shard_tree import ShardTree
from shards.reading.store import Documents, IndexedDocuments, TokenStore, TreeChangedError, local_version
from shards.tree import RECORD_NAME, OutputTree, Tree, is_ours

log = logging.getLogger("shards.reader")  # the public module's name, as a logging configuration names it

# Rows parsed into one numpy chunk of ids at a time, so parsing a large manifest stays compact.
_ID_CHUNK = 1 << 18
# Tokens scanned for EOT at a time when finding llm.c document boundaries.
_SCAN_TOKENS = 1 << 24


def _listing(fs, root: str, dirs: Iterable[str]) -> dict[str, tuple[int, tuple]]:
    """Size and version of every file in the given subdirectories, by path relative to root: a
    local file's local_version (links followed: each name is checked inside the tree before it is
    read), an object's (file_version, size)."""
    found = {}
    local = isinstance(fs, LocalFileSystem)
    for d in dirs:
        full = posixpath.join(root, d)
        if not fs.isdir(full):
            continue
        if local:
            with os.scandir(full) as entries:
                for entry in entries:
                    try:
                        st = entry.stat()
                    except OSError:  # a dangling link: a named shard there "does not exist"
                        continue
                    if stat.S_ISREG(st.st_mode):
                        found[f"{d}/{entry.name}"] = (st.st_size, local_version(st))
            continue
        for entry in fs.ls(full, detail=True):
            if entry["type"] == "file":
                size = int(entry["size"])
                found[f"{d}/{posixpath.basename(entry['name'].rstrip('/'))}"] = (size, (storage.file_version(entry),
                                                                                       size))
    return found


def _stats_version(fs, root: str) -> tuple | None:
    """The version of the tree's commit point, dataset_stats.txt (None when it is missing)."""
    path = posixpath.join(root, layout.STATS_NAME)
    try:
        if isinstance(fs, LocalFileSystem):
            return reader_index.identity(os.stat(path))
        fs.invalidate_cache(path)
        info = fs.info(path)
        return storage.file_version(info), int(info["size"])
    except FileNotFoundError:
        return None


def open_tree(url: str) -> ShardTree:
    """Open a finished output tree of the bucketed or the scaffold (llm.c) job, local or fsspec.

    Which kind it is, and whether it is finished, is shards.tree.OutputTree's answer; the kind's
    opener (its ``opener`` in shards/kinds.py) reads it.
    """
    fs, _ = storage.filesystem(url)
    if not isinstance(fs, LocalFileSystem):
        # An object store's client caches listings per process: a tree rewritten since an earlier
        # open here (a removal applied elsewhere) would be read through the old sizes and index.
        fs.invalidate_cache()
    fs, root = storage.filesystem(storage.normalize(url))
    names_in = Tree(url)  # what says the tree's kind, dtype and EOS id is read inside it (no link out)
    for name, what in ((layout.STATS_NAME, "stats"), (RECORD_NAME, "ownership record")):
        names_in.path(name, what)
    committed = _stats_version(fs, root)
    out = OutputTree.open(url).require_finished()
    fs, root = storage.filesystem(out.url)
    opener = kinds.get(out.kind).part("opener") if out.kind in kinds.REGISTRY else None
    opened = opener(out, fs, root.rstrip("/") or "/") if opener is not None else None
    if opened is None:
        raise ValueError(f"{out.url} has neither {layout.MANIFEST_NAME} nor train/ or val/ llm.c shards")
    if _stats_version(fs, root) != committed:
        # Every writer deletes the commit point before it changes a file and writes it last: one that
        # stayed as it was is one version, read whole.
        raise TreeChangedError(f"{out.url}: {layout.STATS_NAME} changed while the tree was being opened (a removal "
                               "or a re-run is writing it); open it again once that command has finished")
    return opened


def open_bucketed_tree(out: OutputTree, fs, root: str) -> ShardTree | None:
    """The bucketed kind's opener (shards/kinds.py): through its reader index when that proves to describe
    the manifest, else the manifest itself; None without a manifest."""
    if not fs.exists(posixpath.join(root, layout.MANIFEST_NAME)):
        return None
    Tree(out.url).path(layout.MANIFEST_NAME, "manifest")  # no link out of the tree
    stats = out.stats()
    indexed = _open_indexed(fs, root, out.url, stats, out.record)
    return indexed if indexed is not None else _open_bucketed(fs, root, out.url, stats)


def open_scaffold_tree(out: OutputTree, fs, root: str) -> ShardTree:
    """The scaffold kind's opener (shards/kinds.py): the llm.c shards of train/ and val/ that the tree's record owns."""
    url = out.url
    files = {}
    for split in llmc.SPLITS:
        d = posixpath.join(root, split)
        if fs.isdir(d):
            # Listed, not globbed: the tree's path is the user's and may hold '[' or '*'.
            names = sorted((n for n in (posixpath.basename(p.rstrip("/")) for p in fs.ls(d, detail=False))
                            if n.startswith("shard_") and n.endswith(".bin")
                            and is_ours(out.record, f"{split}/{n}")), key=_shard_number)
            files[split] = [f"{split}/{n}" for n in names]
    names_in = Tree(url)  # every file read resolves inside the tree (no link out of it)
    for rel in (r for rels in files.values() for r in rels):
        names_in.path(rel, "shard")
    return _open_llmc(fs, root, url, files)



def _shard_number(name: str) -> int:
    """``shard_012.bin`` -> 12: llm.c shards in stream order, whatever the width of their numbers."""
    digits = name[len("shard_"):-len(".bin")]
    if not digits.isdigit():
        raise ValueError(f"{name} is not an llm.c shard name (shard_NNN.bin)")
    return int(digits)


def _open_bucketed(fs, root: str, url: str, stats: manifest.DatasetStats) -> ShardTree:
    """The tree through its text manifest: parsed into columns, its files checked against it."""
    dtype = layout.DTYPES[stats.dtype]
    ids, length, manifest_file, file_of = _parse_manifest(fs, root, url)

    # Files in layout order: bucket, partition, rolling index.
    rel_paths = sorted(file_of, key=lambda r: (layout.BUCKET_NAMES.index((n := layout.parse_shard_rel_path(r)).bucket),
                                               n.partition, n.index))
    rank = np.empty(len(rel_paths), dtype=np.int64)
    for new, rel in enumerate(rel_paths):
        rank[file_of[rel]] = new
    file = rank[manifest_file] if len(manifest_file) else manifest_file
    counts = np.bincount(file, weights=length, minlength=len(rel_paths)).astype(np.int64)
    versions = _check_shards(fs, root, url, rel_paths, counts, dtype, stats.dtype)
    store = TokenStore(fs, root, rel_paths, counts, dtype, versions=versions, url=url)

    # Rows of a file are in that file's order, so a document's offset is the sum of the counts before
    # it; with the files laid end to end in layout order, its place in the store is the running sum.
    order = np.argsort(file, kind="stable")
    start = np.empty_like(length)
    start[order] = np.cumsum(length[order]) - length[order]
    # Storage order: the manifest's already for a published tree, so usually nothing moves.
    if len(start) > 1 and not np.all(start[1:] > start[:-1]):
        by_start = np.argsort(start, kind="stable")
        ids, start, length, file = ids[by_start], start[by_start], length[by_start], file[by_start]
    partition = np.array([layout.parse_shard_rel_path(r).partition for r in rel_paths], dtype=np.int32)
    documents = Documents(
        ids=ids,
        start=start,
        length=length,
        file=file.astype(np.int32),
        bucket=_bucket_indices(length),
        partition=partition[file] if len(file) else np.empty(0, dtype=np.int32),
        split=np.full(len(length), -1, dtype=np.int8),
    )
    return ShardTree(url, "bucketed", store, documents, stats.eos_id, stats)


def _parse_manifest(fs, root: str, url: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """The manifest's ids ('S' bytes), lengths and file numbers (in order of first mention) by
    row, and those numbers by rel path; compact while parsing (8 bytes a number, ids in chunks)."""
    file_of: dict[str, int] = {}
    id_chunks, chunk = [], []
    file_col, len_col = array("q"), array("q")  # 8 bytes a row while parsing, not a Python int's ~36
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as f:
        for rel, doc_id, n in manifest.read_rows(f):
            fi = file_of.get(rel)
            if fi is None:
                layout.parse_shard_rel_path(rel)
                fi = file_of[rel] = len(file_of)
            if n < 1:
                raise ValueError(f"{url}: manifest row of {doc_id!r} has token count {n}")
            file_col.append(fi)
            len_col.append(n)
            chunk.append(doc_id.encode("utf-8"))
            if len(chunk) == _ID_CHUNK:
                id_chunks.append(np.array(chunk, dtype=np.bytes_))
                chunk = []
    if chunk or not id_chunks:
        id_chunks.append(np.array(chunk, dtype=np.bytes_) if chunk else np.empty(0, dtype="S1"))
    ids = np.concatenate(id_chunks) if len(id_chunks) > 1 else id_chunks[0]
    length = np.frombuffer(len_col, dtype=np.int64).copy()
    manifest_file = np.frombuffer(file_col, dtype=np.int64).copy()
    return ids, length, manifest_file, file_of


def _check_shards(fs, root: str, url: str, rel_paths: Sequence[str], counts: Sequence[int], dtype: np.dtype,
                  dtype_name: str) -> list[tuple]:
    """Every file the manifest (or a proven index) names is a shard of the layout inside the tree,
    exists, and holds its rows' tokens; the version of each, as the reader opens it."""
    names_in = Tree(url)  # every file read resolves inside the tree (no link out of it)
    for rel in rel_paths:
        layout.parse_shard_rel_path(rel)
        names_in.path(rel, "shard")
    listing = _listing(fs, root, sorted({r.split("/", 1)[0] for r in rel_paths}))
    versions = []
    for rel, count in zip(rel_paths, counts, strict=True):
        if rel not in listing:
            raise FileNotFoundError(f"{url}: the manifest names {rel}, which does not exist")
        size, version = listing[rel]
        if not isinstance(fs, LocalFileSystem) and not storage.conditional_reads(fs):
            version = (storage.file_version(fs.info(posixpath.join(root, rel))), size)  # as read_range asks it
        if size != count * dtype.itemsize:
            raise ValueError(
                f"{url}: {rel} holds {size} bytes, the manifest's rows sum to {count} tokens "
                f"({count * dtype.itemsize} bytes of {dtype_name}); the tree is damaged or being rewritten"
            )
        versions.append(version)
    return versions


def _open_indexed(fs, root: str, url: str, stats: manifest.DatasetStats, record) -> ShardTree | None:
    """The tree through its reader index (shards.index): mapped, not parsed, so opening costs the
    same for ten documents or ten million. A remote tree's index is copied to a local file first
    (once per machine and version of the index: shards.index.local_copy), then mapped alike. None
    (parse the manifest) when the record does not list an index, or, said in one warning, when the
    index does not prove it describes this manifest (``_proven_index``). Its shards are checked as
    the manifest's are: a link out of the tree is refused, whichever describes the tree."""
    if record is None or reader_index.INDEX_NAME not in record.derived:
        return None
    try:
        documents = _proven_index(fs, root, url)
    except ValueError as e:  # the index's problem, not the tree's: the manifest still opens it
        log.warning("%s: its reader index is not used (%s); reading its manifest instead", url, e)
        return None
    except OSError as e:  # gone, unreadable, or (remote) the local cache cannot hold a copy
        what = "is not used" if isinstance(fs, LocalFileSystem) else "has no local copy"
        log.warning("%s: its reader index %s (%s); reading its manifest instead", url, what, e)
        return None
    index = documents._index
    dtype = layout.DTYPES[stats.dtype]
    versions = _check_shards(fs, root, url, index.files, index.file_tokens.tolist(), dtype, stats.dtype)
    store = TokenStore(fs, root, index.files, index.file_tokens, dtype, versions=versions, url=url)
    return ShardTree(url, "bucketed", store, documents, stats.eos_id, stats)


def _proven_index(fs, root: str, url: str) -> IndexedDocuments:
    """The tree's index, mapped, once it proved it describes this manifest: the manifest's size and
    sha256 its trailer records, its own sha256, its columns (shards.index.column_problem). The proof
    costs a pass over both files, so it is made once per machine and version: a mark in this user's
    cache, named by both files' exact versions (shards.index.identity; a remote manifest's ETag or
    generation), says it was made. A ValueError or OSError says why the index is not used."""
    path = posixpath.join(root, reader_index.INDEX_NAME)
    local = isinstance(fs, LocalFileSystem)
    if local:
        Tree(url).path(reader_index.INDEX_NAME, "reader index")  # no link out of the tree
        if os.path.islink(path):
            raise ValueError(f"{reader_index.INDEX_NAME} is a symbolic link")
        mapped = path
    else:  # nothing in a remote tree is a link: the name rules hold
        mapped = reader_index.local_copy(fs, path, storage.join(url, reader_index.INDEX_NAME))
    fd = os.open(mapped, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO never waits
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{reader_index.INDEX_NAME} is not a regular file")
        index = reader_index.open_index(mapped, fd)
        _prove(fs, root, os.path.realpath(mapped) if local else url, index, fd)
        documents = IndexedDocuments(mapped, index, version=local_version(st), url=url, held=not local)
        if not local:
            documents.hold(fd)
            fd = None
    finally:
        if fd is not None:
            os.close(fd)
    return documents


# What a proof's mark vouches for; a new name when the proof checks more (its rows since 2026-12-02),
# so a mark an older, weaker proof left is not taken for this one.
_PROOF = "index+rows"


def _prove(fs, root: str, name: str, index, fd: int) -> None:
    """That ``index`` (mapped from ``fd``; ``name``: its real path, or a remote index's URL) describes
    the tree's manifest, by the mark of an earlier proof or by proving it now (and leaving the mark);
    a ValueError if not."""
    path = posixpath.join(root, layout.MANIFEST_NAME)
    directory = _cache_for_marks()
    index_identity = reader_index.identity(os.fstat(fd))
    if isinstance(fs, LocalFileSystem):
        with storage.open_read(fs, path) as f:
            manifest_id = reader_index.identity(os.fstat(f.fileno()))
            facts = (_PROOF, name, index_identity, manifest_id)
            if directory is not None and reader_index.is_marked(directory, facts):
                return
            _check_index(index, fd, manifest_id[2], lambda: _sha256_of(f))
    else:
        fs.invalidate_cache(path)
        info = fs.info(path)
        manifest_id = (storage.file_version(info), int(info["size"]))
        facts = (_PROOF, name, index_identity, manifest_id)
        if directory is not None and reader_index.is_marked(directory, facts):
            return
        _check_index(index, fd, manifest_id[1], lambda: reader_index.manifest_sha256(fs, path))
        fs.invalidate_cache(path)
        again = fs.info(path)
        if (storage.file_version(again), int(again["size"])) != manifest_id:
            raise ValueError(f"{layout.MANIFEST_NAME} changed while it was being compared")
    if directory is not None:
        reader_index.mark(directory, facts)


def _sha256_of(f) -> bytes:
    digest = hashlib.sha256()
    while block := f.read(8 << 20):
        digest.update(block)
    return digest.digest()


def _check_index(index, fd: int, manifest_bytes: int, manifest_sha256) -> None:
    """The proof itself: a ValueError naming what does not hold."""
    if index.manifest_bytes != manifest_bytes:
        raise ValueError(f"it describes a manifest of {index.manifest_bytes} bytes; {layout.MANIFEST_NAME} has "
                         f"{manifest_bytes}")
    problem = reader_index.digest_problem(fd) or reader_index.column_problem(index)
    if problem is None and manifest_sha256() != index.manifest_sha256:
        problem = f"it was built from another {layout.MANIFEST_NAME} (its sha256 differs)"
    # Its trailer's digests prove it is whole, not what it says: anyone can compute them. Its rows,
    # written out as a manifest, must be the manifest's bytes.
    if problem is None and reader_index.rows_sha256(index) != index.manifest_sha256:
        problem = f"its rows are not those of {layout.MANIFEST_NAME} (files, ids or token counts differ)"
    if problem is not None:
        raise ValueError(problem)


_WARNED_CACHES: set[str] = set()


def _cache_for_marks() -> str | None:
    """This user's cache directory, or None (said once a process) when it cannot be used: then an
    index is proven at every open."""
    try:
        return reader_index.trusted_cache()
    except OSError as e:
        if str(e) not in _WARNED_CACHES:
            _WARNED_CACHES.add(str(e))
            log.warning("%s; indexes are proven again at every open", e)
        return None


def _bucket_indices(lengths: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(layout.BUCKET_BOUNDS, dtype=np.int64), lengths, side="left").astype(np.int8)


def open_llmc(files: Mapping[str, Sequence[str]]) -> ShardTree:
    """Open loose llm.c shard files, ``{"train": [paths...], "val": [paths...]}``, in the order given.

    For files outside a finished tree (e.g. a downloaded copy of the published dataset); each
    file's header count must match its size.
    """
    unknown = [s for s in files if s not in llmc.SPLITS]
    if unknown:
        raise ValueError(f"splits must be among {llmc.SPLITS}, got {unknown}")
    urls = [storage.normalize(p) for s in llmc.SPLITS for p in files.get(s, ())]
    if not urls:
        raise ValueError("no llm.c shard files given")
    fs, _ = storage.filesystem(urls[0])
    rels = {s: [storage.filesystem(storage.normalize(p))[1] for p in files.get(s, ())] for s in llmc.SPLITS}
    return _open_llmc(fs, "", ",".join(urls), rels)


def _version_of(fs, path: str, f) -> tuple[int, tuple]:
    """Size and version (as TokenStore keeps it) of the file at ``path``, open as ``f`` on a local disk."""
    if isinstance(fs, LocalFileSystem):
        st = os.fstat(f.fileno())
        return st.st_size, local_version(st)
    info = fs.info(path)
    return int(info["size"]), (storage.file_version(info), int(info["size"]))


def _open_llmc(fs, root: str, url: str, files: Mapping[str, Sequence[str]]) -> ShardTree:
    rel_paths, counts, split_of_file, versions = [], [], [], []
    for split in llmc.SPLITS:
        for rel in files.get(split, ()):
            path = posixpath.join(root, rel) if root else rel
            with storage.open_read(fs, path) as f:
                count = llmc.parse_header(f.read(llmc.HEADER_BYTES), path)
                size, version = _version_of(fs, path, f)
            body = size - llmc.HEADER_BYTES
            if body != count * llmc.TOKEN_DTYPE.itemsize:
                raise ValueError(f"{path}: header says {count} tokens, the file holds {body} bytes of tokens")
            versions.append(version)
            rel_paths.append(rel)
            counts.append(count)
            split_of_file.append(llmc.SPLITS.index(split))
    if not rel_paths:
        raise ValueError(f"{url} holds no llm.c shard files (train/shard_NNN.bin, val/shard_NNN.bin)")
    store = TokenStore(fs, root, rel_paths, counts, llmc.TOKEN_DTYPE, header_bytes=llmc.HEADER_BYTES,
                       versions=versions, url=url)
    start, length, split = _llmc_documents(store, split_of_file, url)
    ids = np.concatenate([
        np.char.add(f"{llmc.SPLITS[s]}:".encode(), np.arange(np.count_nonzero(split == s)).astype(np.bytes_))
        for s in np.unique(split).tolist()
    ]) if len(split) else np.empty(0, dtype="S1")
    documents = Documents(
        ids=ids,
        start=start,
        length=length,
        file=(np.searchsorted(store.starts, start, side="right") - 1).astype(np.int32),
        bucket=_bucket_indices(length),
        partition=np.full(len(length), -1, dtype=np.int32),
        split=split,
    )
    return ShardTree(url, kinds.SCAFFOLD.name, store, documents, llmc.GPT2_EOT)


def _llmc_documents(store: TokenStore, split_of_file: Sequence[int], url: str) -> tuple[np.ndarray, ...]:
    """Start, length and split of every document of llm.c shards, found by scanning each split's
    stream for EOT (``_SCAN_TOKENS`` at a time); a ValueError when a split does not end with one."""
    starts, lengths, splits = [], [], []
    for split_index in range(len(llmc.SPLITS)):
        in_split = [i for i, s in enumerate(split_of_file) if s == split_index]
        if not in_split:
            continue
        lo, hi = int(store.starts[in_split[0]]), int(store.starts[in_split[-1] + 1])
        if lo == hi:
            continue
        ends = [np.flatnonzero(store.read(a, min(a + _SCAN_TOKENS, hi)) == llmc.GPT2_EOT) + a
                for a in range(lo, hi, _SCAN_TOKENS)]
        ends = np.concatenate(ends)
        if len(ends) == 0 or ends[-1] != hi - 1:
            raise ValueError(
                f"{url}: the {llmc.SPLITS[split_index]} split does not end with EOT {llmc.GPT2_EOT}; "
                "its last document is cut off"
            )
        doc_start = np.concatenate(([lo], ends[:-1] + 1))
        starts.append(doc_start)
        lengths.append(ends + 1 - doc_start)
        splits.append(np.full(len(ends), split_index, dtype=np.int8))
    # Splits and their files are laid out in order, so this is storage order already.
    return np.concatenate(starts), np.concatenate(lengths), np.concatenate(splits)
