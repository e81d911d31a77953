"""The reader index: the manifest of a bucketed tree as columns a reader memory-maps.

``processed_spec.txt`` stays the source of truth and the format the dataset card documents; this
file, ``processed_spec.idx``, says the same in a form that opens in constant time and memory: a
reader maps it and touches only the pages of the documents it asks for, where parsing the text
costs ~1 s and ~100 bytes a document in every process (every DataLoader worker, every rank).

Layout (little-endian), written at publish from the staged manifest and listed in the tree's
record as derived (so the next publish replaces it, and only the tool deletes it):

    header      256 bytes: MAGIC, version, documents n, files f, the manifest's size in bytes,
                then (offset, size) of each section below, in that order
    files       int64[f + 1] offsets into the names blob, the names (UTF-8), int64[f] tokens a file
    documents   int64[n] first token in the stream of the files end to end (layout order),
                int64[n] length (EOS included), int32[n] file, int8[n] bucket, int32[n] partition
    ids         int64[n + 1] offsets into the ids blob, the ids (UTF-8)
    lookup      uint64[n] id hashes sorted, int64[n] the document of each (``id_hash``)
    trailer     the manifest's sha256 (of its bytes, as the index was built from them), then the
                sha256 of every byte of the index before it (version 2; version 1 had no trailer)

Documents are in storage order (files in layout order: bucket, partition, rolling index; a file's
documents in its order), which is the order of a published manifest. Publish builds the index from
the groups' parts (``encode_part``: each writer's lengths, ids and id hashes, staged beside its
manifest rows), a group at a time with numpy, so its serial work is per group and per file, not per
document; ``verify`` and the removal tools build it in one pass over the manifest. Either way the
columns are spooled to local scratch files and the lookup table sorted a slice of the hash range at
a time, so building it holds a few tens of MB, whatever the tree's size.

A reader uses the index only when the record lists it and it proves it describes this manifest
and these shards: its manifest size and sha256 are the manifest's, its own sha256 holds, its
columns are in order and within bounds (``column_problem``), its rows written out as a manifest
hash to the manifest's sha256 (``rows_sha256``: the digests alone anyone could recompute), every
file it names is a shard name of the layout, and its file token counts are the shards' sizes.
Hashing a large manifest costs seconds, so a reader does it once per machine and version: a mark
in the cache directory, named by the exact identity of the manifest and the index (device, inode,
size, modification and change times, or an object's version), says it was done (``mark``).
Otherwise, or for an index of version 1, it parses the manifest. ``verify`` rebuilds the index from the manifest and
compares the bytes. The proof covers the ids, not their hashes (hashing every id would cost seconds
a million): a lookup the table cannot answer reads the ids before it says an id is absent.
"""

from __future__ import annotations

import bisect
import fcntl
import hashlib
import io
import mmap
import os
import posixpath
import re
import shutil
import stat
import struct
import tempfile
import time
from typing import BinaryIO, NamedTuple

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from shards import layout, manifest, storage

INDEX_NAME = "processed_spec.idx"
MAGIC = b"PTKIDX\x00\x00"
VERSION = 2
OLD_VERSIONS = (1,)  # written before the trailer: never trusted, the manifest is parsed
HEADER_BYTES = 256
SECTIONS = ("file_offsets", "file_names", "file_tokens", "start", "length", "file", "bucket", "partition",
            "id_offsets", "id_blob", "hashes", "hash_rows")
DTYPES = {"file_offsets": "<i8", "file_tokens": "<i8", "start": "<i8", "length": "<i8", "file": "<i4",
          "bucket": "i1", "partition": "<i4", "id_offsets": "<i8", "hashes": "<u8", "hash_rows": "<i8"}
_HEAD = struct.Struct("<8sIIQQQ")  # magic, version, reserved, documents, files, manifest bytes
_SPAN = struct.Struct("<QQ")
TRAILER = struct.Struct("<32s32s")  # the manifest's sha256, the sha256 of every byte before it
_ROWS_PER_FLUSH = 1 << 18
_LOOKUP_SLICE = 1 << 19  # documents per slice of the hash range when sorting the lookup table (~20 MB)


class NotIndexable(ValueError):
    """A manifest whose rows are not in storage order (files in layout order, each file's rows
    together): the jobs never write one, and no index is made for it."""


def id_hash(doc_id: bytes) -> int:
    """The lookup key of an id: BLAKE2b-64 of its UTF-8 bytes, personalised for this index."""
    return int.from_bytes(hashlib.blake2b(doc_id, digest_size=8, person=b"ptk-index").digest(), "little")


def _layout_key(rel: str) -> tuple[int, int, int]:
    name = layout.parse_shard_rel_path(rel)
    return layout.BUCKET_NAMES.index(name.bucket), name.partition, name.index


class _Spool:
    """A column written to a scratch file a block at a time."""

    def __init__(self, directory: str, name: str, dtype: str | None):
        self.path = os.path.join(directory, name)
        self.file = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self.dtype = dtype
        self.pending: list = []

    def add(self, value) -> None:
        self.pending.append(value)
        if len(self.pending) >= _ROWS_PER_FLUSH:
            self.flush()

    def extend(self, data) -> None:
        """A block of values at once (an array of the column's dtype, or bytes for the blob)."""
        self.flush()
        self.file.write(data if isinstance(data, bytes) else np.ascontiguousarray(data, self.dtype).tobytes())

    def flush(self) -> None:
        if self.pending:
            data = b"".join(self.pending) if self.dtype is None else np.asarray(self.pending, self.dtype).tobytes()
            self.file.write(data)
            self.pending = []

    def close(self) -> int:
        self.flush()
        self.file.close()
        return os.path.getsize(self.path)


class _Hashed:
    """A writer that hashes what it passes on (the index's own sha256, for its trailer)."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.digest = hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.out.write(data)


def write_index(rows, manifest_bytes: int, out: BinaryIO, manifest_sha256=None) -> int:
    """Write the index of the manifest ``rows`` ((rel_path, id, tokens), as manifest.read_rows gives
    them) to ``out``; the number of documents. ``manifest_sha256``: the manifest's digest (bytes),
    or a function giving it once the rows are read (they are read as the manifest is hashed).
    NotIndexable when the rows are not in storage order."""
    return _write_spooled(lambda spools: _spool_rows(rows, spools), manifest_bytes, out, manifest_sha256)


def write_index_from_parts(groups, manifest_bytes: int, out: BinaryIO, manifest_sha256: bytes) -> int:
    """Write the index of a manifest assembled from groups' rows to ``out``, from the groups' index
    parts (``encode_part``) rather than from the manifest's text: no step per document here, so a
    publish's serial work is per group and per file. ``groups``: (files, part) per group in the
    manifest's order, ``files`` its (rel_path, documents, tokens) in its order, ``part`` the bytes.

    The index says what building it from the manifest says (the same bytes): the parts are the
    writers' columns of the same rows, checked here (storage order, every file's documents and
    tokens, ids within their blob), and the rows they describe must add up to ``manifest_bytes``
    exactly. NotIndexable when the files are not in storage order; ValueError when a part does not
    describe its files or the manifest."""
    sized: list[int] = []

    def spool(spools):
        files, file_tokens, n, row_bytes = _spool_parts(groups, spools)
        sized.append(row_bytes)
        return files, file_tokens, n

    def digest():
        expected = len(manifest.MANIFEST_HEADER) + 1 + sized[0]
        if expected != manifest_bytes:
            raise ValueError(f"the index parts describe a manifest of {expected} bytes, not the {manifest_bytes} "
                             "bytes assembled from the groups' rows")
        return manifest_sha256

    return _write_spooled(spool, manifest_bytes, out, digest)


def _write_spooled(spool, manifest_bytes: int, out: BinaryIO, manifest_sha256) -> int:
    """The index, its columns spooled by ``spool(spools) -> (files, file_tokens, n)``."""
    hashed = _Hashed(out)
    with tempfile.TemporaryDirectory(prefix="pretokenize-index-") as scratch:
        spools = {name: _Spool(scratch, name, DTYPES.get(name)) for name in
                  ("start", "length", "file", "bucket", "partition", "id_offsets", "id_blob", "hashes")}
        files, file_tokens, n = spool(spools)
        sizes = {name: spool.close() for name, spool in spools.items()}
        names = [f.encode("utf-8") for f in files]
        small = {
            "file_offsets": np.concatenate([[0], np.cumsum([len(x) for x in names], dtype=np.int64)]).astype("<i8"),
            "file_names": b"".join(names),
            "file_tokens": np.asarray(file_tokens, "<i8"),
        }
        spans = []
        at = HEADER_BYTES
        for name in SECTIONS:
            size = (len(small[name]) if isinstance(small.get(name), bytes) else
                    small[name].nbytes if name in small else n * 8 if name == "hash_rows" else sizes[name])
            spans.append((at, size))
            at += size + (-size) % 8
        header = _HEAD.pack(MAGIC, VERSION, 0, n, len(files), manifest_bytes)
        header += b"".join(_SPAN.pack(*s) for s in spans)
        hashed.write(header.ljust(HEADER_BYTES, b"\0"))
        _write_sections(hashed, scratch, small, spans, n)
    digest = manifest_sha256() if callable(manifest_sha256) else manifest_sha256
    hashed.write(digest if digest is not None else bytes(32))
    out.write(hashed.digest.digest())
    return n


def _spool_rows(rows, spools: dict[str, _Spool]) -> tuple[list[str], list[int], int]:
    """Each row's columns to their spools, checked in storage order; the files, their token
    counts and the number of rows."""
    files: list[str] = []
    file_tokens: list[int] = []
    last_key = None
    total = id_bytes = n = 0
    spools["id_offsets"].add(0)
    for rel, doc_id, tokens in rows:
        if not files or rel != files[-1]:
            key = _layout_key(rel)
            if last_key is not None and key <= last_key:
                raise NotIndexable(f"{rel}: rows not in storage order (files in layout order, each one together)")
            files.append(rel)
            file_tokens.append(0)
            last_key = key
        if tokens < 1:
            raise ValueError(f"manifest row of {doc_id!r} has token count {tokens}")
        raw = doc_id.encode("utf-8")
        spools["start"].add(total)
        spools["length"].add(tokens)
        spools["file"].add(len(files) - 1)
        spools["bucket"].add(bisect.bisect_left(layout.BUCKET_BOUNDS, tokens))  # by length, as the reader
        spools["partition"].add(last_key[1])
        id_bytes += len(raw)
        spools["id_offsets"].add(id_bytes)
        spools["id_blob"].add(raw)
        spools["hashes"].add(id_hash(raw))
        total += tokens
        file_tokens[-1] += tokens
        n += 1
    return files, file_tokens, n


# An index part: what a writer knows of its group's rows, for write_index_from_parts. Header: magic,
# documents n, id blob bytes; then int64[n] lengths, int64[n + 1] id offsets, uint64[n] id hashes,
# the ids (UTF-8) end to end.
PART_MAGIC = b"PTKPART1"
_PART_HEAD = struct.Struct("<8sQQ")


def encode_part(ids: list[str], lengths: np.ndarray) -> bytes:
    """The index part of a group's rows (its documents' ids and token counts in manifest order)."""
    raw = list(map(str.encode, ids))
    offsets = np.zeros(len(raw) + 1, dtype="<i8")
    np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)), out=offsets[1:])
    blob = b"".join(raw)
    hashes = layout.hashes64(raw, b"ptk-index")
    return b"".join([_PART_HEAD.pack(PART_MAGIC, len(raw), len(blob)), np.asarray(lengths, "<i8").tobytes(),
                     offsets.tobytes(), hashes.astype("<u8").tobytes(), blob])


def decode_part(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    """An index part's lengths, id offsets, hashes and id blob; ValueError when it is not one whole."""
    if len(data) < _PART_HEAD.size:
        raise ValueError("too short for an index part")
    magic, n, blob_bytes = _PART_HEAD.unpack_from(data)
    at = _PART_HEAD.size
    if magic != PART_MAGIC or len(data) != at + 8 * (3 * n + 1) + blob_bytes:
        raise ValueError("not an index part, or not a whole one")
    lengths = np.frombuffer(data, "<i8", n, at)
    offsets = np.frombuffer(data, "<i8", n + 1, at + 8 * n)
    hashes = np.frombuffer(data, "<u8", n, at + 8 * (2 * n + 1))
    if offsets[0] != 0 or offsets[-1] != blob_bytes or np.any(np.diff(offsets) < 0):
        raise ValueError("its id offsets are out of order or bounds")
    return lengths, offsets, hashes, data[at + 8 * (3 * n + 1):]


def _spool_parts(groups, spools: dict[str, _Spool]) -> tuple[list[str], list[int], int, int]:
    """Each group's part to the spools (write_index_from_parts), checked; the files, their token
    counts, the number of rows and the bytes of the rows in a manifest."""
    files: list[str] = []
    file_tokens: list[int] = []
    last_key = None
    total = id_bytes = n = row_bytes = 0
    spools["id_offsets"].add(0)
    for group_files, part in groups:
        lengths, offsets, hashes, blob = decode_part(part)
        counts = np.asarray([docs for _, docs, _ in group_files], np.int64)
        if int(counts.sum()) != len(lengths) or (len(lengths) and lengths.min() < 1):
            raise ValueError(f"an index part does not hold the {int(counts.sum())} documents of its files "
                             "(or a token count is below 1)")
        ends = np.cumsum(counts)
        sums = np.add.reduceat(lengths, ends - counts) if len(lengths) else np.zeros(0, np.int64)
        for k, (rel, docs, tokens) in enumerate(group_files):
            key = _layout_key(rel)
            if last_key is not None and key <= last_key:
                raise NotIndexable(f"{rel}: rows not in storage order (files in layout order, each one together)")
            if not docs or int(sums[k]) != tokens:
                raise ValueError(f"{rel}: its index part's documents do not hold its {tokens} tokens")
            files.append(rel)
            file_tokens.append(tokens)
            last_key = key
            row_bytes += docs * (len(rel.encode("utf-8")) + 2 * len(manifest.SEP) + 1)
        first_file = len(files) - len(group_files)
        partitions = np.asarray([_layout_key(rel)[1] for rel, _, _ in group_files], np.int32)
        spools["start"].extend(total + np.cumsum(lengths) - lengths)
        spools["length"].extend(lengths)
        spools["file"].extend(np.repeat(np.arange(first_file, len(files), dtype=np.int32), counts))
        spools["bucket"].extend(np.searchsorted(np.asarray(layout.BUCKET_BOUNDS, np.int64), lengths, side="left"))
        spools["partition"].extend(np.repeat(partitions, counts))
        spools["id_offsets"].extend(id_bytes + offsets[1:])
        spools["id_blob"].extend(blob)
        spools["hashes"].extend(hashes)
        row_bytes += len(blob) + int(_decimal_digits(lengths).sum())
        total += int(lengths.sum())
        id_bytes += len(blob)
        n += len(lengths)
    return files, file_tokens, n, row_bytes


def _decimal_digits(values: np.ndarray) -> np.ndarray:
    """The digits of each positive value written in decimal."""
    powers = 10 ** np.arange(1, 19, dtype=np.int64)
    return 1 + np.searchsorted(powers, values, side="right")


def _write_sections(out: BinaryIO, scratch: str, small: dict, spans: list[tuple[int, int]], n: int) -> None:
    """The sections after the header, in SECTIONS order, each padded to 8 bytes: the small ones
    from memory, the spooled columns copied from their scratch files, the lookup sorted there."""
    for name, (_, size) in zip(SECTIONS, spans, strict=True):
        if name in small:
            data = small[name]
            out.write(data if isinstance(data, bytes) else data.tobytes())
        elif name == "hashes":
            _write_lookup(os.path.join(scratch, "hashes"), n, out)
            continue  # hash_rows is written with it
        elif name == "hash_rows":
            continue
        else:
            with open(os.path.join(scratch, name), "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
        out.write(b"\0" * ((-size) % 8))


def _write_lookup(hashes_path: str, n: int, out: BinaryIO) -> None:
    """The sorted hashes, then the document of each. One pass over the hashes, a block at a time,
    splits the (hash, row) pairs by the top bits of the hash into slice files (the hashes are
    uniform, so each holds about _LOOKUP_SLICE of them); each slice is then sorted alone. Rows
    ascend within a slice as they were split, so a stable sort by hash is the (hash, row) order,
    and the slices end to end are the whole table's: memory is a block and a slice, whatever n."""
    if not n:
        return
    bits = min(_LOOKUP_BITS, (-(-n // _LOOKUP_SLICE) - 1).bit_length())
    with tempfile.TemporaryDirectory(prefix="pretokenize-lookup-") as scratch:
        slices = [os.path.join(scratch, str(k)) for k in range(1 << bits)]
        _split_pairs(hashes_path, n, bits, slices)
        with tempfile.TemporaryFile() as rows_out:
            for path in slices:
                pairs = np.fromfile(path, _PAIR)
                order = np.argsort(pairs["hash"], kind="stable")
                out.write(pairs["hash"][order].tobytes())
                rows_out.write(pairs["row"][order].tobytes())
                del pairs, order
                os.unlink(path)
            out.write(b"\0" * ((-(n * 8)) % 8))
            rows_out.seek(0)
            shutil.copyfileobj(rows_out, out, 1 << 20)


_PAIR = np.dtype([("hash", "<u8"), ("row", "<i8")])
_LOOKUP_BLOCK = 1 << 18  # hashes read at a time when splitting them into slices
_LOOKUP_BITS = 8  # at most 256 slice files


def _split_pairs(hashes_path: str, n: int, bits: int, slices: list[str]) -> None:
    """Append each (hash, row) of the hashes file to the slice file of its hash's top ``bits``."""
    files = [open(path, "wb") for path in slices]  # noqa: SIM115 - closed below
    try:
        with open(hashes_path, "rb") as src:
            for first in range(0, n, _LOOKUP_BLOCK):
                block = np.fromfile(src, "<u8", min(_LOOKUP_BLOCK, n - first))
                pairs = np.empty(len(block), _PAIR)
                pairs["hash"], pairs["row"] = block, np.arange(first, first + len(block))
                if not bits:
                    files[0].write(pairs.tobytes())
                    continue
                key = (block >> np.uint64(64 - bits)).astype(np.int64)
                order = np.argsort(key, kind="stable")
                counts = np.bincount(key, minlength=len(files))
                ends = np.cumsum(counts)
                for k in np.flatnonzero(counts).tolist():
                    files[k].write(pairs[order[ends[k] - counts[k]:ends[k]]].tobytes())
    finally:
        for f in files:
            f.close()


class ReaderIndex(NamedTuple):
    """A mapped index: its columns as numpy arrays over the file (pages read when touched)."""

    documents: int
    files: list[str]
    file_tokens: np.ndarray
    manifest_bytes: int
    manifest_sha256: bytes
    start: np.ndarray
    length: np.ndarray
    file: np.ndarray
    bucket: np.ndarray
    partition: np.ndarray
    id_offsets: np.ndarray
    id_blob: np.ndarray
    hashes: np.ndarray
    hash_rows: np.ndarray

    def id(self, i: int) -> bytes:
        return self.id_blob[int(self.id_offsets[i]):int(self.id_offsets[i + 1])].tobytes()

    def find(self, doc_id: bytes) -> int | None:
        """The document of ``doc_id``, or None: a binary search of the hashes, then the id compared.
        Each page the search touches maps the page cache's folio around it whole (MBs on a kernel
        with large folios: 5 MiB a lookup at 1M documents, 14 MiB at 10M), so the index's pages are
        dropped from this process before and after (``release``): a lookup's never add to a window's."""
        key = np.uint64(id_hash(doc_id))
        release(self)
        try:
            pos = int(np.searchsorted(self.hashes, key, side="left"))
            while pos < self.documents and self.hashes[pos] == key:
                row = int(self.hash_rows[pos])
                if 0 <= row < self.documents and self.id(row) == doc_id:
                    return row
                pos += 1
        finally:
            release(self)
        return self.scan(doc_id)

    def scan(self, doc_id: bytes) -> int | None:
        """The row whose id is ``doc_id``, found by reading the ids (a slice of rows at a time,
        vectorised), or None. What ``find`` answers when its table has no entry: the ids are proven to
        be the manifest's, the table only sorts their hashes, so a table that lies (crafted, or
        damaged the way no check at open sees) finds the document slower, never hides it."""
        want = np.frombuffer(doc_id, dtype=np.uint8)
        try:
            for a in range(0, self.documents, _CHECK_ROWS):
                offsets = np.asarray(self.id_offsets[a:min(self.documents, a + _CHECK_ROWS) + 1])
                rows = np.flatnonzero(np.diff(offsets) == len(want))
                blob = np.asarray(self.id_blob[offsets[0]:offsets[-1]])
                starts = offsets[rows] - offsets[0]
                # A byte at a time over the rows of its length still alike: ids of one shape (every
                # FinePDFs id is <urn:uuid:...>) share most bytes, so no row is compared in Python.
                for k, byte in enumerate(want.tolist()):
                    if not len(starts):
                        break
                    alike = blob[starts + k] == byte
                    rows, starts = rows[alike], starts[alike]
                if len(rows):
                    return a + int(rows[0])
                release(self)  # the ids read so far: the scan holds a slice of them at a time
        finally:
            release(self)
        return None


class OldIndexError(ValueError):
    """An index of an earlier version: it carries no proof of the manifest it describes."""


def open_index(path: str, fd: int | None = None) -> ReaderIndex:
    """Map a local index file (through ``fd`` when given: the file already opened and checked);
    OldIndexError for an index of version 1, ValueError when it is not one this version reads.
    Its structure is checked here; its digests and columns by ``digest_problem`` and
    ``column_problem``."""
    with open(path if fd is None else os.dup(fd), "rb") as f:
        head = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
        if len(head) < HEADER_BYTES:
            raise ValueError(f"{path}: too short for a reader index")
        magic, version, _, n, f_count, manifest_bytes = _HEAD.unpack_from(head)
        if magic == MAGIC and version in OLD_VERSIONS:
            raise OldIndexError(f"{path}: a reader index of version {version}, which proves no manifest")
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{path}: not a reader index of version {VERSION}")
        spans = [_SPAN.unpack_from(head, _HEAD.size + k * _SPAN.size) for k in range(len(SECTIONS))]
        end = spans[-1][0] + spans[-1][1] + (-spans[-1][1]) % 8
        if any(at + length > size for at, length in spans) or end + TRAILER.size != size:
            raise ValueError(f"{path}: its sections and trailer do not fill the file")
        f.seek(end)
        manifest_sha256, _ = TRAILER.unpack(f.read(TRAILER.size))
        whole = np.memmap(f, dtype=np.uint8, mode="r", shape=(end,))
    cols = {}
    for name, (at, length) in zip(SECTIONS, spans, strict=True):
        raw = whole[at:at + length]
        cols[name] = raw.view(DTYPES[name]) if name in DTYPES else raw
    expected = {"file_offsets": f_count + 1, "file_tokens": f_count, "start": n, "length": n, "file": n, "bucket": n,
                "partition": n, "id_offsets": n + 1, "hashes": n, "hash_rows": n}
    if any(len(cols[k]) != v for k, v in expected.items()):
        raise ValueError(f"{path}: section sizes do not match its {n} documents and {f_count} files")
    names_blob = cols["file_names"].tobytes()
    offsets = cols["file_offsets"].tolist()
    if offsets[:1] != [0] or offsets != sorted(offsets) or offsets[-1] > len(names_blob):
        raise ValueError(f"{path}: its file names' offsets are out of order or bounds")
    try:
        files = [names_blob[a:b].decode("utf-8") for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    except UnicodeDecodeError:
        raise ValueError(f"{path}: a file name is not UTF-8") from None
    return ReaderIndex(n, files, np.asarray(cols["file_tokens"]), manifest_bytes, manifest_sha256, cols["start"],
                       cols["length"], cols["file"], cols["bucket"], cols["partition"], cols["id_offsets"],
                       cols["id_blob"], cols["hashes"], cols["hash_rows"])


def digest_problem(fd: int) -> str | None:
    """Why the index file open as ``fd`` is not the bytes its writer wrote (its own sha256, the
    trailer's last 32 bytes, does not hold), or None."""
    digest = hashlib.sha256()
    size = os.fstat(fd).st_size
    at, end = 0, size - 32
    while at < end:
        block = os.pread(fd, min(end - at, 8 << 20), at)
        if not block:
            break
        digest.update(block)
        at += len(block)
    if at != end or os.pread(fd, 32, end) != digest.digest():
        return "its own sha256 does not hold (the file was changed or damaged since it was written)"
    return None


# Rows checked at a time by column_problem: its arrays are a few MB at most, whatever the tree's size.
_CHECK_ROWS = 1 << 16


def column_problem(index: ReaderIndex) -> str | None:
    """Why the columns of ``index`` cannot describe a tree, or None: vectorised, a slice of rows at a
    time. Every file a shard name of the layout; lengths at least 1; starts the running sum of the
    lengths, and each document inside its file (files in order, their token counts the stream's);
    buckets by length, partitions by file; id offsets in order within the blob; the lookup sorted,
    and a permutation of the rows."""
    try:
        names = [layout.parse_shard_rel_path(rel) for rel in index.files]
    except ValueError as e:
        return str(e)
    if [_layout_key(r) for r in index.files] != sorted({_layout_key(r) for r in index.files}):
        return "its files are not in layout order"
    file_start = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum(index.file_tokens, out=file_start[1:])
    part_of_file = np.array([name.partition for name in names] or [0], dtype=np.int64)
    n = index.documents
    seen = np.zeros(n, dtype=bool)
    if int(index.id_offsets[0]) != 0 or int(index.id_offsets[n]) != len(index.id_blob) or \
            (n and int(file_start[-1]) != int(index.start[n - 1]) + int(index.length[n - 1])):
        return "its id offsets or its last document do not end where the blob and the files do"
    if not n and int(file_start[-1]) != 0:
        return "its files hold tokens but it has no document"
    for a in range(0, n, _CHECK_ROWS):
        problem = _rows_problem(index, a, min(n, a + _CHECK_ROWS), file_start, part_of_file, seen)
        if problem is not None:
            return problem
        if a % (4 * _CHECK_ROWS) == 0:  # what the pass holds mapped stays a few MB
            release(index)
    release(index)
    return None if seen.all() else "its lookup table is not a permutation of its rows"


def release(index: ReaderIndex) -> None:
    """Drop the pages of the index this process touched from its resident memory (a read pages them in
    again from the page cache): a pass over every column costs no more than a slice of it."""
    base = index.start
    while base is not None and not isinstance(getattr(base, "_mmap", None), mmap.mmap):
        base = getattr(base, "base", None)
    if base is not None and hasattr(mmap, "MADV_DONTNEED"):
        try:
            base._mmap.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass


def _rows_problem(index: ReaderIndex, a: int, b: int, file_start: np.ndarray, part_of_file: np.ndarray,
                  seen: np.ndarray) -> str | None:
    """column_problem's tests of rows [a, b)."""
    length = np.asarray(index.length[a:b])
    start = np.asarray(index.start[a:b])
    file = np.asarray(index.file[a:b]).astype(np.int64)
    expected_start = np.cumsum(length) - length + (int(index.start[a - 1]) + int(index.length[a - 1]) if a else 0)
    if length.min() < 1 or not np.array_equal(start, expected_start):
        return f"its start or length column is wrong at rows {a}..{b - 1}"
    if file.min() < 0 or file.max() >= len(file_start) - 1 or np.any(np.diff(file) < 0) or \
            (a and int(index.file[a - 1]) > file[0]):
        return f"its file column is out of order or bounds at rows {a}..{b - 1}"
    if np.any(start < file_start[file]) or np.any(start + length > file_start[file + 1]):
        return f"a document of rows {a}..{b - 1} is not inside its file"
    bounds = np.asarray(layout.BUCKET_BOUNDS, dtype=np.int64)
    if not np.array_equal(np.asarray(index.bucket[a:b]), np.searchsorted(bounds, length, side="left")) or \
            not np.array_equal(np.asarray(index.partition[a:b]), part_of_file[file]):
        return f"its bucket or partition column is wrong at rows {a}..{b - 1}"
    offsets = np.asarray(index.id_offsets[a:b + 1])
    if np.any(np.diff(offsets) < 0):
        return f"its id offsets are out of order at rows {a}..{b - 1}"
    hashes, rows = np.asarray(index.hashes[a:b]), np.asarray(index.hash_rows[a:b])
    if np.any(hashes[1:] < hashes[:-1]) or (a and index.hashes[a - 1] > hashes[0]) or \
            rows.min() < 0 or rows.max() >= len(seen):
        return f"its lookup table is out of order or bounds at rows {a}..{b - 1}"
    seen[rows] = True
    return None


# Where local copies of remote trees' indexes go (``PRETOKENIZE_INDEX_CACHE`` overrides it).
CACHE_ENV = "PRETOKENIZE_INDEX_CACHE"


def cache_dir() -> str:
    """The directory of local copies of remote indexes: $PRETOKENIZE_INDEX_CACHE, else the user's
    cache directory ($XDG_CACHE_HOME or ~/.cache) + beam-pretokenize/indexes."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "beam-pretokenize", "indexes")


class UntrustedCache(OSError):
    """The cache directory is not the user's alone: nothing in it is read or written."""


def trusted_cache() -> str:
    """The cache directory, made (mode 0700) if missing; UntrustedCache, naming it, when it is not a
    directory this user owns and others cannot write (a copy or a mark there could be anyone's)."""
    directory = cache_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    problem = ("it is not a directory" if not stat.S_ISDIR(st.st_mode) else
               f"it is owned by uid {st.st_uid}, not this user ({os.getuid()})" if st.st_uid != os.getuid() else
               f"others can write it (mode {st.st_mode & 0o777:o})" if st.st_mode & 0o022 else None)
    if problem is not None:
        raise UntrustedCache(f"index cache {directory} is not used: {problem}; set {CACHE_ENV} to a directory of "
                             "your own")
    return directory


def own_file(path: str) -> os.stat_result | None:
    """``path``'s lstat when it is a regular file of this user's that others cannot write; else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    ok = stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
    return st if ok else None


def identity(st: os.stat_result) -> tuple[int, ...]:
    """A local file's exact identity: device, inode, size, modification and change times. Any write
    changes the change time, which no user can set back, so an equal identity is the same bytes."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _mark_path(directory: str, facts: tuple) -> str:
    key = hashlib.blake2b(repr(facts).encode(), digest_size=16, person=b"ptk-mark").hexdigest()
    return os.path.join(directory, f"mark-{key}")


def is_marked(directory: str, facts: tuple) -> bool:
    """Whether this user's cache holds the mark of ``facts`` (something checked once: a copy is its
    source's bytes, an index describes a manifest), left by ``mark``."""
    return own_file(_mark_path(directory, facts)) is not None


def mark(directory: str, facts: tuple) -> None:
    """Leave the mark of ``facts`` (best effort: without it the check is made again next time)."""
    path = _mark_path(directory, facts)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        os.close(fd)
    except OSError:
        pass


def local_copy(fs, path: str, url: str) -> str:
    """A local file holding the remote index at ``path`` (on ``fs``; ``url`` names it), to map:
    copied once per version of the file (its size and ETag or generation name the copy, so a new
    index is a new copy) and reused by every process on the machine (DataLoader workers, ranks).

    Only this user's cache is used (``trusted_cache``). A copy is served only if a mark says it is
    the bytes downloaded from the source (checked then against a single-part ETag's MD5) and its
    identity (``identity``: change time included) is the same since; any other is copied again.
    The copy is written under a temporary name and renamed whole, so two processes copying at once
    both end with a complete file. The cache keeps one copy per remote index: a new version's copy
    replaces the copies of older ones no process still uses (prune_copies)."""
    info = fs.info(path)
    size, version = int(info["size"]), storage.file_version(info)
    tree_key = hashlib.blake2b(url.encode(), digest_size=8).hexdigest()
    key = hashlib.blake2b(f"{url}\n{size}\n{version}".encode(), digest_size=16).hexdigest()
    directory = trusted_cache()
    local = os.path.join(directory, f"{tree_key}-{key}.idx")
    seen = own_file(local)
    if seen is not None and is_marked(directory, ("copy", url, size, version, identity(seen))):
        return local
    fd, tmp = tempfile.mkstemp(prefix=f"{tree_key}-{key}.", suffix=PARTIAL_SUFFIX, dir=directory)
    try:
        md5 = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out, fs.open(path, "rb", block_size=8 << 20) as src:
            while block := src.read(8 << 20):
                md5.update(block)
                out.write(block)
        if os.path.getsize(tmp) != size:
            raise OSError(f"{url}: copied {os.path.getsize(tmp)} bytes of the index's {size}")
        etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
        if re.fullmatch(r"[0-9a-f]{32}", etag) and md5.hexdigest() != etag:
            raise OSError(f"{url}: the copy's MD5 is not the object's ETag {etag}: the download was damaged")
        os.replace(tmp, local)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    mark(directory, ("copy", url, size, version, identity(os.lstat(local))))
    prune_copies(directory, tree_key, keep=os.path.basename(local))
    return local


def hold(path: str, fd: int) -> None:
    """Say, while ``fd`` (open on the copy at ``path``) stays open, that a process uses the copy:
    a shared lock on it, which prune_copies respects."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        raise OSError(f"{path}: cannot hold the index copy for this reader: {e}") from None


def in_use(path: str) -> bool:
    """Whether a process holds the copy at ``path`` (``hold``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


PARTIAL_SUFFIX = ".partial"
# A partial copy this old was left by a process that died while copying (a live copy is renamed in
# long before: an index is ~85 bytes a document).
STALE_PARTIAL_SECONDS = 24 * 3600
# Marks are a few hundred bytes' worth of inode each, one per version of a tree proven here.
STALE_MARK_SECONDS = 30 * 24 * 3600


def prune_copies(directory: str, tree_key: str, keep: str, now: float | None = None) -> list[str]:
    """Remove from the cache ``directory`` what no lookup will use again; the names removed:

    - the copies of older versions of the index ``tree_key`` names (every ``TREEKEY-*.idx`` but ``keep``);
    - copies named as before the tree key was in the name (``KEY.idx``);
    - partial copies older than a day (a killed process's);
    - marks (``mark``) older than STALE_MARK_SECONDS: a proof still needed is made again, once.

    Only regular files with the names local_copy gives are touched (a link or a directory stays as it
    is), and never a copy a process holds open (``hold``: a reader of that version, whose DataLoader
    workers will map the copy again by its name). Best effort: an OSError leaves the file, which
    costs only space."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        kind = _cache_file_kind(name, tree_key, keep)
        path = os.path.join(directory, name)
        try:
            if kind is None or not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            if kind == "partial" and now - os.lstat(path).st_mtime < STALE_PARTIAL_SECONDS:
                continue  # another process may be copying it now
            if kind == "mark" and now - os.lstat(path).st_mtime < STALE_MARK_SECONDS:
                continue
            if kind == "old" and in_use(path):
                continue  # a reader maps it, and its DataLoader workers will map it again
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed


# The names local_copy gives: TREEKEY-KEY.idx, and TREEKEY-KEY.RANDOM.partial while it copies;
# KEY.idx were the copies before the tree key was in the name.
_COPY_NAME = re.compile(r"(?P<tree>[0-9a-f]{16})-[0-9a-f]{32}\.idx")
_PARTIAL_NAME = re.compile(r"[0-9a-f]{16}-[0-9a-f]{32}\.[a-z0-9_]+\.partial")
_UNKEYED_NAME = re.compile(r"[0-9a-f]{32}\.idx")
_MARK_NAME = re.compile(r"mark-[0-9a-f]{32}")


def _cache_file_kind(name: str, tree_key: str, keep: str) -> str | None:
    """"old" (a copy no lookup uses again), "partial" (a copy being made, or left by a killed
    process), "mark" (a proof's mark), or None (a file to leave: the copy to keep, another tree's, or
    not a name of ours)."""
    copy = _COPY_NAME.fullmatch(name)
    if copy is not None:
        return "old" if copy["tree"] == tree_key and name != keep else None
    if _UNKEYED_NAME.fullmatch(name):
        return "old"
    if _MARK_NAME.fullmatch(name):
        return "mark"
    return "partial" if _PARTIAL_NAME.fullmatch(name) else None


def build_from_manifest(fs, root: str, out: BinaryIO) -> int:
    """Write the index of the manifest at ``root`` (on ``fs``) to ``out``; its documents."""
    path = posixpath.join(root, layout.MANIFEST_NAME)
    size = fs.size(path)
    with storage.open_read(fs, path, "rb") as raw:
        hashing = HashingReader(raw)
        text = io.TextIOWrapper(io.BufferedReader(hashing), encoding="utf-8")
        return write_index(manifest.read_rows(text), size, out, hashing.finish)


class HashingReader(io.RawIOBase):
    """A binary file read through, its sha256 taken of every byte read (``finish``: the digest,
    once the file is read to its end)."""

    def __init__(self, raw: BinaryIO):
        self.raw = raw
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        self.digest.update(data)
        return len(data)

    def finish(self) -> bytes:
        while block := self.raw.read(1 << 20):  # anything after the last row is the manifest's too
            self.digest.update(block)
        return self.digest.digest()


def manifest_sha256(fs, path: str) -> bytes:
    """The sha256 of the manifest at ``path`` (on ``fs``), streamed."""
    digest = hashlib.sha256()
    with storage.open_read(fs, path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.digest()


def rows_sha256(index: ReaderIndex) -> bytes:
    """The sha256 of the manifest the rows of ``index`` write (its header, then each row as
    manifest.format_row writes it), a slice of rows at a time: equal to the manifest's own sha256
    only when the index holds the manifest's rows, files, ids and token counts, in its order."""
    digest = hashlib.sha256(f"{manifest.MANIFEST_HEADER}\n".encode())
    sep = manifest.SEP.encode()
    names = [rel.encode("utf-8") + sep for rel in index.files]
    for a in range(0, index.documents, _CHECK_ROWS):
        b = min(index.documents, a + _CHECK_ROWS)
        offsets = index.id_offsets[a:b + 1].tolist()
        blob = index.id_blob[offsets[0]:offsets[-1]].tobytes()
        at = [o - offsets[0] for o in offsets]
        digest.update(b"".join(names[f] + blob[at[k]:at[k + 1]] + sep + b"%d\n" % n for k, (f, n) in
                               enumerate(zip(index.file[a:b].tolist(), index.length[a:b].tolist(), strict=True))))
        if a % (16 * _CHECK_ROWS) == 0:
            release(index)
    release(index)
    return digest.digest()


def write_index_file(fs, manifest_root: str, dest: str, tmp: str, build=None) -> None:
    """Build the index of the manifest in ``manifest_root`` and put it at ``dest`` whole: built in a
    local scratch file, copied to ``tmp`` and renamed on a local disk (an upload is whole already
    on an object store, so there it is written at ``dest``). NotIndexable passes to the caller.

    ``build(out)``, when given, writes the index in place of a parse of the manifest (publish:
    ``write_index_from_parts``); its columns are then checked as a reader checks them
    (``column_problem``) before the file goes anywhere, a ValueError naming the problem."""
    with tempfile.TemporaryFile(prefix="pretokenize-index-") as local:
        if build is None:
            build_from_manifest(fs, manifest_root, local)
        else:
            build(local)
            local.flush()
            local.seek(0)  # open_index reads the header through a duplicate of the descriptor
            problem = column_problem(open_index(dest, local.fileno()))
            if problem is not None:
                raise ValueError(f"{dest}: the index built from the groups' parts is wrong: {problem}")
        local.seek(0)
        target = tmp if isinstance(fs, LocalFileSystem) else dest
        fs.makedirs(posixpath.dirname(target), exist_ok=True)
        try:
            with fs.open(target, "wb") as out:
                shutil.copyfileobj(local, out, 1 << 20)
            if target != dest:
                fs.mv(target, dest)
        except BaseException:
            if target != dest and fs.exists(target):
                fs.rm(target)
            raise
