"""Tokens out of the shuffle: spill files, the references to them, and reading them back in order.

    SpillTokens   each bundle appends its TokenBatches' tokens to one spill file of its own on the
                  output filesystem (a new name per bundle attempt), held until ~32 MB of tokens
                  and written one stretch per group a job's ``key_fn`` puts documents in, with one
                  RefBatch (ids, lengths, offsets, sort keys) per stretch in a references file
                  beside it; only a pointer to that RefBatch is emitted
    SpillReader   reads documents back from the spill files in the order a writer asks for, a
                  bounded chunk at a time: read (preadv) from the spill files on a local disk;
                  on an object store fetched first, a stretch per range request, into a local
                  scratch file
    AtomicFile    a file that appears whole or not at all

A retried bundle writes a new spill file, and the runner keeps only the references of the attempt
that committed, so a retry can neither lose nor duplicate a document.

A references file is data, never code: each RefBatch is one record of fixed-width numpy columns
and UTF-8 strings under a JSON header (encode_refs), read back only through decode_refs, which
checks its columns, their types and ranges, and refuses (a BadInputError naming the file) anything
else. Its spill file is not read from it: it is the
references file's own twin (same name, ``.bin``), so a references file cannot point elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue
from fsspec.asyn import AsyncFileSystem

from shards import lock, storage
from transforms.core.batches import RefBatch, Refs, TokenBatch
from transforms.core.records import BadInputError

# A SpillTokensFn holds batches until they pass this many token bytes, then writes them as one
# stretch per group: the fewer and longer the stretches, the fewer requests a writer makes.
SPILL_FLUSH_BYTES = 32 << 20
# How a SpillReader fetches from an object store: requests in flight (the client's pool is sized
# to match, storage.filesystem(connections=...)), the most one request asks for, the most held
# in memory at once.
DEFAULT_CONNECTIONS = storage.DEFAULT_CONNECTIONS
DEFAULT_READ_BYTES = 8 << 20
DEFAULT_ROUND_BYTES = 64 << 20

# key_fn(batch, config) -> (a group key per document, a 63-bit sort key per document). The group
# keys are a list of hashable keys, or an int64 array: one int per document, or one row of ints
# (a tuple key) per document, grouped without a Python step per document.
KeyFn = Callable[[TokenBatch, object], tuple["list | np.ndarray", np.ndarray]]


class RefPointer(NamedTuple):
    """Where one RefBatch is: a byte range of a bundle's references file. This is all that goes
    through the shuffle, so a runner that keeps a shuffle's input in memory holds a few dozen bytes
    per (batch, group), however many documents there are."""

    path: str
    offset: int
    size: int
    documents: int


class SpillTokensFn(beam.DoFn):
    """TokenBatches in; (group key, RefPointer) out.

    Each bundle appends its documents' tokens to a spill file of its own, and the references (a
    RefBatch: ids, lengths, offsets, sort keys) of each stretch to a references file of its own; what
    is emitted is where those references are. Batches are held until they pass ``flush_bytes`` of
    tokens (or the bundle ends), then each group's documents of one input file are written as one
    stretch: a writer makes a request per stretch on an object store, so a stretch per (flush,
    group) rather than per (batch, group) divides its requests by the batches a flush holds.
    ``config`` needs ``spill_url``; ``key_fn`` says which group each document joins and where it
    sorts there (bucketed: its (partition, bucket); scaffold: its split's range).
    """

    def __init__(self, config, key_fn: KeyFn, flush_bytes: int = SPILL_FLUSH_BYTES):
        self._config = config
        self._key_fn = key_fn
        self._flush_bytes = flush_bytes

    def setup(self):
        self._fs, self._spill_dir = storage.filesystem(self._config.spill_url)
        self._fs.makedirs(self._spill_dir, exist_ok=True)

    def start_bundle(self):
        self._file = self._refs = None
        self._path = self._refs_path = None
        self._offset = self._refs_offset = 0
        self._written: list[str] = []
        self._pending: list = []
        self._pending_bytes = 0

    def _open(self):
        # New names for every bundle attempt: a retry never appends to a failed attempt's files.
        name = uuid.uuid4().hex
        self._path = posixpath.join(self._spill_dir, f"{name}.bin")
        self._refs_path = posixpath.join(self._spill_dir, f"{name}.refs")
        self._file = self._fs.open(self._path, "wb")
        self._refs = self._fs.open(self._refs_path, "wb")
        self._offset = self._refs_offset = 0
        self._written += [self._path, self._refs_path]

    def process(self, batch: TokenBatch):
        if not batch.size:
            return
        self._pending.append(batch)
        self._pending_bytes += batch.tokens.nbytes
        if self._pending_bytes >= self._flush_bytes:
            yield from self._flush()

    def _flush(self) -> list:
        """The batches held so far, written: per group and input file, one stretch of the spill file
        and one RefBatch. Stretches go in the order of their keys' repr, so that keys that begin
        alike (bucketed: (partition, bucket)) are neighbours, in the spill file and in the
        references file: a reader of a whole partition reads one range. The (group key,
        RefPointer)s, for what was written."""
        lock.guard(self._config.output)  # a command whose lock was taken writes nothing more there
        batches, self._pending, self._pending_bytes = self._pending, [], 0
        if not batches:
            return []
        if self._file is None:
            self._open()
        held = _Held(batches, [self._key_fn(batch, self._config) for batch in batches])
        out = []
        for (key, source), members in sorted(held.stretches.items(), key=lambda kv: (repr(kv[0][0]), kv[0][1])):
            ref, tokens = held.stretch(members, self._path, source, self._offset)
            self._file.write(memoryview(tokens).cast("B"))
            self._offset += tokens.nbytes
            out.append((key, self._write_ref(ref)))
        return out

    def _write_ref(self, ref: RefBatch) -> RefPointer:
        data = encode_refs(ref)
        self._refs.write(data)
        pointer = RefPointer(self._refs_path, self._refs_offset, len(data), ref.size)
        self._refs_offset += len(data)
        return pointer

    def finish_bundle(self):
        # What is still held is written first; a failure to write or close fails the bundle, so no
        # pointer into these files survives. The pointers leave only once both files are closed.
        out = self._flush()
        for f in (self._file, self._refs):
            if f is not None:
                f.close()
        self._file = self._refs = None
        return [emit_at_finish(o) for o in out]

    def written_files(self) -> list[str]:
        """The spill and references files of the bundle (the paths its pointers name), once
        finish_bundle has closed them."""
        return list(self._written)


class _Held:
    """The batches a flush writes, as columns over all their documents end to end (a document's
    index there: its place in its batch, counted on from the batches before it), and the documents
    of each stretch, keyed by (group key, input file), in the order they came."""

    def __init__(self, batches: list[TokenBatch], keyed: list[tuple[list, np.ndarray]]):
        self.batches = batches
        sizes = [batch.size for batch in batches]
        self.batch_of = np.repeat(np.arange(len(batches), dtype=np.int64), sizes)
        if all(isinstance(keys, np.ndarray) for keys, _ in keyed):
            self.stretches = _array_stretches(batches, [keys for keys, _ in keyed], self.batch_of)
        else:
            self.stretches = _listed_stretches(batches, [keys for keys, _ in keyed])
        self.ids = np.array([doc_id for batch in batches for doc_id in batch.ids], dtype=object)
        self.lengths = np.concatenate([batch.lengths for batch in batches])
        self.starts = np.concatenate([np.cumsum(batch.lengths) - batch.lengths for batch in batches])
        self.sort_keys = np.concatenate([np.asarray(sort_keys, np.int64) for _, sort_keys in keyed])
        self.rows = np.concatenate([batch.rows for batch in batches])
        self.extra = {name: np.concatenate([batch.extra[name] for batch in batches]) for name in batches[0].extra}

    def stretch(self, index: np.ndarray, spill_path: str, source: str, offset: int) -> tuple[RefBatch, np.ndarray]:
        """One stretch's documents (``index``, ascending): their tokens end to end, in the order
        they came, and their RefBatch, with offsets counted from ``offset`` bytes into the spill file."""
        lengths = self.lengths[index]
        which = self.batch_of[index]
        if which[0] == which[-1]:  # all from one batch
            pieces = [index]
        else:
            pieces = np.split(index, np.flatnonzero(np.diff(which)) + 1)
        parts = [gather_ranges(self.batches[int(self.batch_of[piece[0]])].tokens, self.starts[piece],
                               self.lengths[piece]) for piece in pieces]
        tokens = parts[0] if len(parts) == 1 else np.concatenate(parts)
        offsets = offset + (np.cumsum(lengths) - lengths) * tokens.dtype.itemsize
        ref = RefBatch(spill_path, source, self.ids[index].tolist(), self.sort_keys[index], lengths,
                       offsets, self.rows[index], {name: values[index] for name, values in self.extra.items()})
        return ref, tokens


def _listed_stretches(batches: list[TokenBatch], keys: list) -> dict:
    """The documents (indexes end to end over ``batches``, in the order they came) of each
    (group key, input file), from a list of keys per batch."""
    stretches: dict = {}
    base = 0
    for batch, batch_keys in zip(batches, keys, strict=True):
        for i, key in enumerate(batch_keys, base):
            stretches.setdefault((key, batch.source), []).append(i)
        base += batch.size
    return {k: np.asarray(v, np.int64) for k, v in stretches.items()}


def _array_stretches(batches: list[TokenBatch], keys: list[np.ndarray], batch_of: np.ndarray) -> dict:
    """As _listed_stretches, from int64 arrays of keys (a key per document, or a row of ints per
    document: the key is then the row as a tuple): grouped by numpy, the keys made Python ints."""
    sources = sorted({batch.source for batch in batches})
    source_of_batch = np.asarray([sources.index(batch.source) for batch in batches], np.int64)
    table = np.concatenate([np.asarray(k, np.int64).reshape(len(k), -1) for k in keys])
    columns = np.concatenate([table, source_of_batch[batch_of][:, None]], axis=1)
    codes = _row_codes(columns)
    order = np.argsort(codes, kind="stable")  # each stretch's documents in the order they came
    codes = codes[order]
    starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
    one = keys[0].ndim == 1
    firsts = columns[order[starts]].tolist()
    return {(row[0] if one else tuple(row[:-1]), sources[row[-1]]): members
            for row, members in zip(firsts, np.split(order, starts[1:]), strict=True)}


def _row_codes(columns: np.ndarray) -> np.ndarray:
    """One int64 per row of ``columns`` (ints), equal for equal rows and ordered as the rows are:
    each column's rank among its distinct values, combined in mixed radix (a sort of a few int
    columns, where numpy's unique over rows sorts them as opaque bytes, ten times slower)."""
    codes = np.zeros(len(columns), np.int64)
    span = 1
    for column in columns.T:
        distinct, rank = np.unique(column, return_inverse=True)
        span *= len(distinct)
        if span >= 1 << 62:  # too many combinations for one int64: the rows' own unique
            return np.unique(columns, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
        codes = codes * len(distinct) + rank.reshape(-1)
    return codes


def load_refs(fs, pointers, connections: int = DEFAULT_CONNECTIONS) -> list[RefBatch]:
    """The RefBatches the pointers name, sorted by where they are, read back from the references
    files (on an object store, pointers back to back are read with one range request)."""
    pointers = sorted(pointers)
    if not pointers:
        return []
    if storage.renames_atomically(fs):
        out = []
        fd, current = None, None
        try:
            for p in pointers:
                if p.path != current:
                    if fd is not None:
                        os.close(fd)
                    fd, current = None, p.path
                    fd = os.open(p.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
                out.append(decode_refs(os.pread(fd, p.size, p.offset), p))
        finally:
            if fd is not None:
                os.close(fd)
        return out
    return [decode_refs(d, p) for d, p in zip(_read_pointed(fs, pointers, connections), pointers, strict=True)]


def _read_pointed(fs, pointers: list[RefPointer], connections: int) -> list[bytes]:
    """The bytes of each pointer (sorted) from an object store: the pointers of one flush are back
    to back in their references file, so they are read as merged ranges, a few requests in all."""
    paths = sorted({p.path for p in pointers})
    file_of = {path: i for i, path in enumerate(paths)}
    spill = np.asarray([file_of[p.path] for p in pointers], np.int64)
    starts = np.asarray([p.offset for p in pointers], np.int64)
    ranges, member = coalesce(spill, starts, starts + np.asarray([p.size for p in pointers], np.int64))
    concurrency = {"batch_size": connections} if isinstance(fs, AsyncFileSystem) else {}
    data = fs.cat_ranges([paths[f] for f, _, _ in ranges], [a for _, a, _ in ranges], [b for _, _, b in ranges],
                         on_error="raise", **concurrency)
    out = []
    for p, r in zip(pointers, member.tolist(), strict=True):
        at = p.offset - ranges[r][1]
        out.append(data[r][at:at + p.size])
    return out


# A references file holds RefBatches back to back, each one record (encode_refs):
#
#     REFS_MAGIC | header length (uint32 LE) | header (JSON, padded to 8 bytes) | body
#
# The header: {"source": str, "documents": n, "numbers": [[column, dtype], ...],
# "strings": [[column, encoding, bytes], ...]}. The body: each number column's n values (raw,
# little-endian), then each string column's bytes: its values UTF-8, joined by NUL ("nul"), or,
# when a value holds a NUL, as a JSON array ("json"). Columns: sort_keys, lengths, offsets and rows
# (int64), ids (strings), and the job's extra columns as ``extra.<name>``.
REFS_MAGIC = b"PTREFS1\n"
REFS_NUMBERS = ("sort_keys", "lengths", "offsets", "rows")
EXTRA_PREFIX = "extra."
# The dtypes a number column may have: nothing read decides more than a fixed-size number's width.
NUMBER_DTYPES = {np.dtype(t).str: np.dtype(t) for t in
                 ("<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "<f4", "<f8", "?")}
# Upper bounds no real spill reaches, that keep the reader's offset arithmetic far from overflow.
MAX_LENGTH = 1 << 40
MAX_OFFSET = 1 << 56


def spill_path_of(refs_path: str) -> str:
    """The spill file a references file's RefBatches point into: its twin, ``<name>.bin``."""
    return (refs_path[:-len(".refs")] if refs_path.endswith(".refs") else refs_path) + ".bin"


def _encode_strings(values: list) -> tuple[str, bytes]:
    joined = "\0".join(values)
    if joined.count("\0") == max(len(values) - 1, 0):
        return "nul", joined.encode("utf-8")
    return "json", json.dumps(values, ensure_ascii=False).encode("utf-8")


def encode_refs(ref: RefBatch) -> bytes:
    """One RefBatch as one record of a references file (the layout above). Its spill path is not
    written: spill_path_of gives it back, so a references file cannot point at another file."""
    numbers = [(name, np.ascontiguousarray(getattr(ref, name), "<i8")) for name in REFS_NUMBERS]
    strings = [("ids", list(ref.ids))]
    for name, values in sorted(ref.extra.items()):
        if values.dtype == object:
            strings.append((EXTRA_PREFIX + name, values.tolist()))
        else:
            numbers.append((EXTRA_PREFIX + name, np.ascontiguousarray(values, values.dtype.newbyteorder("<"))))
    encoded = [(name, *_encode_strings(values)) for name, values in strings]
    header = json.dumps({
        "source": ref.source, "documents": len(ref.ids),
        "numbers": [[name, values.dtype.str] for name, values in numbers],
        "strings": [[name, kind, len(data)] for name, kind, data in encoded],
    }, ensure_ascii=False).encode("utf-8")
    header += b" " * (-(len(REFS_MAGIC) + 4 + len(header)) % 8)
    return b"".join([REFS_MAGIC, len(header).to_bytes(4, "little"), header,
                     *(values.tobytes() for _, values in numbers), *(data for _, _, data in encoded)])


class _BadRefs(ValueError):
    pass


def parse_refs(data: bytes, pointer: RefPointer) -> tuple[str, dict[str, np.ndarray], dict[str, list]]:
    """(source, number columns, string columns) of one record, checked: the layout above, the columns
    encode_refs writes with their dtypes, ``pointer.documents`` values each, lengths in 1..MAX_LENGTH,
    offsets in 0..MAX_OFFSET, rows and sort keys >= 0. Anything else is a BadInputError naming the
    references file: it is refused, never trusted."""
    if len(data) != pointer.size:
        raise OSError(f"references file {pointer.path} is short: needed {pointer.size} bytes at {pointer.offset}")
    try:
        return _parse_refs(data, pointer.documents)
    except (_BadRefs, ValueError, TypeError, KeyError) as e:
        raise BadInputError(f"{pointer.path} at byte {pointer.offset}",
                            f"not a references file this tool wrote ({e})") from None


def _parse_refs(data: bytes, documents: int):
    start = len(REFS_MAGIC) + 4
    if data[:len(REFS_MAGIC)] != REFS_MAGIC or len(data) < start:
        raise _BadRefs("no references header")
    end = start + int.from_bytes(data[len(REFS_MAGIC):start], "little")
    header = json.loads(data[start:end].decode("utf-8"))
    if not isinstance(header, dict) or set(header) != {"source", "documents", "numbers", "strings"}:
        raise _BadRefs("an unknown header")
    source, n = header["source"], header["documents"]
    if not isinstance(source, str) or type(n) is not int or n != documents:
        raise _BadRefs(f"{n!r} documents, its pointer says {documents}")
    numbers, strings = {}, {}
    at = end
    for name, dtype in _entries(header["numbers"], 2):
        dtype = NUMBER_DTYPES.get(dtype) if isinstance(dtype, str) else None
        if dtype is None or at + n * dtype.itemsize > len(data):
            raise _BadRefs(f"column {name}: a bad type or short")
        numbers[name] = np.frombuffer(data, dtype, n, at)
        at += n * dtype.itemsize
    for name, kind, size in _entries(header["strings"], 3):
        if type(size) is not int or not 0 <= size <= len(data) - at or kind not in ("nul", "json"):
            raise _BadRefs(f"column {name}: a bad encoding or size")
        text = data[at:at + size].decode("utf-8")
        if kind == "nul":
            values = text.split("\0") if n else []  # strings, whatever the bytes were
        else:
            values = json.loads(text)
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise _BadRefs(f"column {name}: not strings")
        if len(values) != n or (n == 0 and size):
            raise _BadRefs(f"column {name}: not {n} strings")
        strings[name] = values
        at += size
    if at != len(data):
        raise _BadRefs(f"{len(data) - at} bytes after its columns")
    _check_columns(numbers, strings, n)
    return source, numbers, strings


def refs_file_strings(data: bytes) -> Iterator[str]:
    """Every string of a whole references file, record by record (each record checked as parse_refs
    checks one): its source, its extra columns' names, and the values of its string columns, the ids
    among them. A _BadRefs (a ValueError) for bytes that are not such a file."""
    at = 0
    while at < len(data):
        start = at + len(REFS_MAGIC) + 4
        if data[at:at + len(REFS_MAGIC)] != REFS_MAGIC or start > len(data):
            raise _BadRefs("no references header")
        end = start + int.from_bytes(data[at + len(REFS_MAGIC):start], "little")
        header = json.loads(data[start:end].decode("utf-8"))
        if not isinstance(header, dict) or type(header.get("documents")) is not int or header["documents"] < 0:
            raise _BadRefs("an unknown header")
        n = header["documents"]
        size = end - at
        for _, dtype in _entries(header.get("numbers"), 2):
            if dtype not in NUMBER_DTYPES:
                raise _BadRefs("a bad type")
            size += n * NUMBER_DTYPES[dtype].itemsize
        for _, _, nbytes in _entries(header.get("strings"), 3):
            if type(nbytes) is not int or nbytes < 0:
                raise _BadRefs("a bad size")
            size += nbytes
        source, numbers, strings = _parse_refs(data[at:at + size], n)
        yield source
        for name in [*numbers, *strings]:
            if name.startswith(EXTRA_PREFIX):
                yield name[len(EXTRA_PREFIX):]
        for values in strings.values():
            yield from values
        at += size


def _check_columns(numbers: dict[str, np.ndarray], strings: dict[str, list], n: int) -> None:
    """The columns a record must have (ids, the int64 REFS_NUMBERS; others only as extras), and
    its numbers in range."""
    if set(numbers) & set(strings) or "ids" not in strings or "ids" in numbers:
        raise _BadRefs("no ids")
    for name in REFS_NUMBERS:
        if name not in numbers or numbers[name].dtype != np.dtype("<i8"):
            raise _BadRefs(f"no int64 column {name}")
    if any(not name.startswith(EXTRA_PREFIX) for name in [*numbers, *strings] if name not in (*REFS_NUMBERS, "ids")):
        raise _BadRefs("an unknown column")
    if n:
        lengths, offsets = _low_high(numbers["lengths"]), _low_high(numbers["offsets"])
        if not (1 <= lengths[0] and lengths[1] <= MAX_LENGTH):
            raise _BadRefs("a length out of range")
        if not (0 <= offsets[0] and offsets[1] <= MAX_OFFSET):
            raise _BadRefs("an offset out of range")
        if _low_high(numbers["rows"])[0] < 0 or _low_high(numbers["sort_keys"])[0] < 0:
            raise _BadRefs("a negative row or sort key")


def _low_high(values: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty int64 column: through Python for a few values (most RefBatches
    hold a document or two, where a numpy reduction costs ten times as much), numpy for many."""
    if len(values) <= 64:
        listed = values.tolist()
        return min(listed), max(listed)
    return int(values.min()), int(values.max())


def _entries(value, width: int) -> list:
    """A header's list of column entries: lists of ``width`` items, a column name first, each once."""
    if not isinstance(value, list) or not all(isinstance(e, list) and len(e) == width for e in value):
        raise _BadRefs("a bad column list")
    names = [e[0] for e in value]
    if not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
        raise _BadRefs("a bad column name")
    return value


def check_refs(fs, pointers) -> str:
    """What keeps the pointers' references from being read back ("" when nothing): a resumed
    unit's are checked at launch, so that one that does not parse is redone, not trusted."""
    try:
        load_refs(fs, pointers)
    except (BadInputError, OSError) as e:
        return str(e)
    return ""


def decode_refs(data: bytes, pointer: RefPointer) -> RefBatch:
    """The RefBatch ``pointer`` names, from the bytes read at its range (checked by parse_refs)."""
    source, numbers, strings = parse_refs(data, pointer)
    extra = {name[len(EXTRA_PREFIX):]: values for name, values in numbers.items() if name.startswith(EXTRA_PREFIX)}
    for name, values in strings.items():
        if name.startswith(EXTRA_PREFIX):
            column = np.empty(len(values), dtype=object)
            column[:] = values
            extra[name[len(EXTRA_PREFIX):]] = column
    return RefBatch(spill_path_of(pointer.path), source, strings["ids"], numbers["sort_keys"], numbers["lengths"],
                    numbers["offsets"], numbers["rows"], dict(sorted(extra.items())))


def gather_ranges(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``source[starts[i]:starts[i] + lengths[i]]`` for each i, end to end: slices joined in one
    copy for long documents, one fancy-indexed copy for many short ones."""
    if not len(lengths):
        return source[:0].copy()
    if len(lengths) <= 64 or int(lengths.sum()) > 64 * len(lengths):
        return np.concatenate([source[a:a + n] for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)])
    total = int(lengths.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return source[np.repeat(starts, lengths) + within]


def emit_at_finish(value) -> WindowedValue:
    """A value yielded from finish_bundle needs its window said."""
    return WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])


class SpillReader:
    """Documents' tokens back from the spill files, in the order given, ``chunk_tokens`` at a time.

    On a local disk each chunk is read from the spill files (os.preadv: a stretch of documents back
    to back in a file is one call, scattered into the chunk's buffer). On an object store
    a range request per document would cost a request (and a millisecond of client CPU) per
    document, so the documents a writer needs are first fetched into a local scratch file
    (``stage``): sorted by where they are, neighbours merged into ranges (each (flush, group)
    stretch of a spill file is one), a range cut at ``read_bytes``, ``connections`` requests in
    flight and at most ``round_bytes`` in memory at a time. Chunks are then gathered from the
    scratch file as from a local spill file. The scratch file has no name (it is unlinked when
    made) and goes with the reader.
    """

    def __init__(self, fs, dtype: np.dtype, chunk_tokens: int = 4 << 20, connections: int = DEFAULT_CONNECTIONS,
                 read_bytes: int = DEFAULT_READ_BYTES, round_bytes: int = DEFAULT_ROUND_BYTES):
        if connections < 1 or read_bytes < 1 or round_bytes < 1:
            raise ValueError("connections, read_bytes and round_bytes must be >= 1")
        self._fs = fs
        self._dtype = np.dtype(dtype)
        self._chunk = chunk_tokens
        self._local = storage.renames_atomically(fs)
        self._connections, self._read_bytes, self._round_bytes = connections, read_bytes, round_bytes
        self._scratch = None  # the scratch file (remote spill files only)
        self._staged_refs: Refs | None = None
        self._staged_at = np.zeros(0, np.int64)  # per document of _staged_refs: byte offset in scratch, or -1
        self.requests = 0  # range requests made

    def chunks(self, refs: Refs, order: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """(first, end, tokens): the documents ``order[first:end]`` end to end, chunk by chunk."""
        lengths = refs.lengths[order]
        ends = np.cumsum(lengths)
        first = 0
        while first < len(order):
            base = int(ends[first - 1]) if first else 0
            end = max(int(np.searchsorted(ends, base + self._chunk, side="right")), first + 1)
            yield first, end, self._gather(refs, order[first:end], lengths[first:end])
            first = end

    def stage(self, refs: Refs, order: np.ndarray) -> None:
        """Fetch the documents ``order`` names (those not fetched yet) into the scratch file, in few
        large requests. Only for spill files on an object store; chunks() stages what it is asked
        for when it was not staged."""
        if self._local:
            return
        if self._staged_refs is not refs:
            # Other documents: what was fetched for the last ones is dropped, so the scratch file
            # holds one writer's group (or a chunk's documents) at most.
            self._staged_refs, self._staged_at = refs, np.full(refs.size, -1, np.int64)
            if self._scratch is not None:
                self._scratch.truncate(0)
        index = np.unique(order)
        index = index[self._staged_at[index] < 0]
        if not len(index):
            return
        itemsize = self._dtype.itemsize
        spill, starts = refs.spill[index], refs.offsets[index]
        at = np.lexsort((starts, spill))
        index, spill, starts = index[at], spill[at], starts[at]
        ranges, member = coalesce(spill, starts, starts + refs.lengths[index] * itemsize)
        if self._scratch is None:
            self._scratch = tempfile.TemporaryFile(prefix="pretokenize-gather-")
        self._scratch.seek(0, 2)
        base = np.zeros(len(ranges), np.int64)
        pieces = [(r, p, min(p + self._read_bytes, stop))
                  for r, (_, start, stop) in enumerate(ranges) for p in range(start, stop, self._read_bytes)]
        for part in _rounds(pieces, self._round_bytes):
            paths = [refs.spill_paths[ranges[r][0]] for r, _, _ in part]
            for (r, p, stop), path, data in zip(part, paths, self._cat_ranges(paths, part), strict=True):
                if len(data) != stop - p:
                    raise OSError(f"spill file {path} is short: needed {stop - p} bytes at {p}, read {len(data)}")
                if p == ranges[r][1]:
                    base[r] = self._scratch.tell()
                self._scratch.write(data)
        self._scratch.flush()
        range_start = np.asarray([start for _, start, _ in ranges], np.int64)
        self._staged_at[index] = base[member] + starts - range_start[member]

    def _cat_ranges(self, paths: list[str], part: list[tuple[int, int, int]]) -> list[bytes]:
        """One round of range requests, ``connections`` of them in flight."""
        concurrency = {"batch_size": self._connections} if isinstance(self._fs, AsyncFileSystem) else {}
        self.requests += len(part)
        return self._fs.cat_ranges(paths, [p for _, p, _ in part], [stop for _, _, stop in part],
                                   on_error="raise", **concurrency)

    def _gather(self, refs: Refs, index: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        # Read with preadv into the chunk's buffer, not mapped: nothing of a spill file stays in
        # this process's memory after the chunk, so memory is bounded by the chunk, not by the
        # spill files' size (and a read costs no map and unmap per spill file and chunk).
        itemsize = self._dtype.itemsize
        out = np.empty(int(lengths.sum()), dtype=self._dtype)
        dst = (np.cumsum(lengths) - lengths) * itemsize
        if not self._local:
            self.stage(refs, index)
            _read_ranges(self._scratch.fileno(), "scratch file", out, dst, self._staged_at[index], lengths * itemsize)
            return out
        spill = refs.spill[index]
        src = refs.offsets[index]
        for s in np.unique(spill).tolist():
            sel = np.flatnonzero(spill == s)
            path = refs.spill_paths[s]
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            try:
                _read_ranges(fd, f"spill file {path}", out, dst[sel], src[sel], lengths[sel] * itemsize)
            finally:
                os.close(fd)
        return out

    def close(self):
        """The scratch file goes (it has no name: closing it frees its space)."""
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None
        self._staged_refs, self._staged_at = None, np.zeros(0, np.int64)


def _rounds(pieces: list[tuple[int, int, int]], budget: int) -> Iterator[list[tuple[int, int, int]]]:
    """``(range, start, stop)`` pieces in rounds of at most ``budget`` bytes (a larger piece alone)."""
    part, size = [], 0
    for piece in pieces:
        n = piece[2] - piece[1]
        if part and size + n > budget:
            yield part
            part, size = [], 0
        part.append(piece)
        size += n
    if part:
        yield part


def coalesce(spill: np.ndarray, starts: np.ndarray, stops: np.ndarray,
             max_gap: int = 0) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """Byte ranges sorted by (spill file, start) merged where one ends within ``max_gap`` bytes of
    where the next begins in the same file: the merged ranges as (spill file, start, stop), and
    for each input range the index of the merged range that holds it."""
    if not len(starts):
        return [], np.zeros(0, np.int64)
    # Each file's bytes counted from its own 2**40 (a spill file is far smaller), so that one
    # running maximum gives, range by range, the furthest end in its file so far.
    lift = spill.astype(np.int64) << 40
    reach = np.maximum.accumulate(stops + lift)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] + lift[1:] > reach[:-1] + max_gap
    member = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:], len(starts)) - 1
    ranges = [(int(spill[f]), int(starts[f]), int(reach[last] - lift[last]))
              for f, last in zip(firsts.tolist(), lasts.tolist(), strict=True)]
    return ranges, member


# The most buffers one preadv call takes (POSIX's IOV_MAX; Linux: 1024).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 16


def _read_ranges(fd: int, what: str, out: np.ndarray, dst: np.ndarray, src: np.ndarray, nbytes: np.ndarray) -> None:
    """``out``'s bytes ``dst[i]:dst[i] + nbytes[i]`` = the file's bytes ``src[i]:src[i] + nbytes[i]``
    for each i: ranges back to back in the file are read by one preadv call, scattered into ``out``
    (a stretch of a spill file is one call, whatever order its documents go out in)."""
    if not len(nbytes):
        return
    at = np.argsort(src, kind="stable")
    dst, src, nbytes = dst[at].tolist(), src[at].tolist(), nbytes[at].tolist()
    view = memoryview(out).cast("B")
    start, buffers, expect = src[0], [], 0
    for a, b, n in zip(dst, src, nbytes, strict=True):
        if b != start + expect or len(buffers) == IOV_MAX:
            _preadv(fd, what, buffers, start, expect)
            start, buffers, expect = b, [], 0
        buffers.append(view[a:a + n])
        expect += n
    _preadv(fd, what, buffers, start, expect)


def _preadv(fd: int, what: str, buffers: list[memoryview], offset: int, expect: int) -> None:
    """Fill ``buffers`` from the file's bytes at ``offset`` on; an OSError when the file ends first."""
    got = os.preadv(fd, buffers, offset) if hasattr(os, "preadv") else 0
    while got < expect:  # a short read (or no preadv): the rest, buffer by buffer
        skip = got
        for buf in buffers:
            if skip >= len(buf):
                skip -= len(buf)
                continue
            n = os.pread(fd, len(buf) - skip, offset + got)
            if not n:
                size = os.fstat(fd).st_size
                raise OSError(f"{what} is short: needed {expect} bytes at {offset}, it holds {size}")
            buf[skip:skip + len(n)] = n
            got += len(n)
            break


class AtomicFile:
    """A file that appears at ``path`` whole or not at all, hashed (sha256) as it is written.

    On a local disk it is written under a unique temporary name and renamed on commit. On an
    object store the upload itself is all-or-nothing (the object exists once the upload
    completes), so it is written in place and an abort discards the upload.
    """

    def __init__(self, fs, path: str):
        self._fs, self.path = fs, path
        local = storage.renames_atomically(fs)
        self._tmp = f"{path}.partial-{uuid.uuid4().hex[:12]}" if local else path
        if local:
            # The OS's own file, not fsspec's wrapper of it: the path is a local one already.
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            self.file = open(self._tmp, "wb")  # closed by commit or abort
        else:
            if storage.has_directories(fs):
                fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.file = fs.open(self._tmp, "wb")
        self._digest = hashlib.sha256()

    def write(self, data) -> None:
        self.file.write(data)
        self._digest.update(data)

    def write_documents(self, reader: SpillReader, refs: Refs, order: np.ndarray) -> None:
        """The documents ``order`` names, streamed from the spill files in that order."""
        for _, _, tokens in reader.chunks(refs, order):
            self.write(memoryview(tokens).cast("B"))

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def commit(self) -> None:
        self.file.close()
        if self._tmp != self.path:
            os.replace(self._tmp, self.path)  # local: an atomic rename

    def abort(self) -> None:
        discard = getattr(self.file, "discard", None)
        try:
            # close() would complete an object store's upload with what was written so far.
            discard() if discard is not None and self._tmp == self.path else self.file.close()
        finally:
            if self._fs.exists(self._tmp):
                self._fs.rm(self._tmp)


def roll(sizes: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Cut documents of ``sizes`` bytes, in order, into files: a file takes documents until the next
    would pass ``limit``; a document larger than ``limit`` gets a file of its own."""
    ends = np.cumsum(sizes)
    out, first = [], 0
    while first < len(sizes):
        base = int(ends[first - 1]) if first else 0
        end = max(int(np.searchsorted(ends, base + limit, side="right")), first + 1)
        out.append((first, end))
        first = end
    return out
