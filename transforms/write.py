"""WriteShards: tokenized documents to rolling shard files, deterministic and with bounded memory.

Only small per-document references are shuffled, never the tokens themselves:

    SpillTokens      each bundle appends its documents' tokens to one spill file of its own on the
                     output filesystem and emits ((bucket, partition), DocRef): the bucket from
                     the length, the partition and sort key from hashes of the id
    GroupByShard     DocRefs grouped by (bucket, partition): tens of bytes a document
    WriteShardFiles  per group: sort the refs by the seeded id hash, then stream each document's
                     tokens from its spill file into the group's rolling shard files

A retried bundle writes a new spill file (its name is unique per attempt) and the runner keeps
only the DocRefs of the attempt that committed, so a retry cannot duplicate or lose a document.
Shard files are written under the run's staging directory; PublishOutput moves them into place.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import posixpath
import uuid
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam

from shards import layout, manifest, storage
from transforms.progress import Progress
from transforms.records import DocRef, TokenizedDocument

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """Where and how shards are written. ``output`` is a local path or an fsspec URL."""

    output: str
    run_id: str
    partitions: int = layout.DEFAULT_PARTITIONS
    max_shard_bytes: int = layout.DEFAULT_MAX_SHARD_BYTES
    seed: int = layout.DEFAULT_SEED
    dtype: str = layout.DEFAULT_DTYPE

    def __post_init__(self):
        if not 1 <= self.partitions <= 100_000:
            raise ValueError(f"partitions must be within 1..100000, got {self.partitions}")
        if self.dtype not in layout.DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.max_shard_bytes < layout.DTYPES[self.dtype].itemsize:
            raise ValueError(f"max_shard_bytes must hold at least one token, got {self.max_shard_bytes}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def run_url(self) -> str:
        return storage.join(self.output, layout.TEMP_DIR_NAME, self.run_id)

    @property
    def spill_url(self) -> str:
        return storage.join(self.run_url, "spill")

    @property
    def staged_url(self) -> str:
        return storage.join(self.run_url, "staged")


class ShardFile(NamedTuple):
    rel_path: str
    documents: int
    tokens: int


class ShardGroup(NamedTuple):
    """What WriteShardFiles wrote for one (bucket, partition): its files and its manifest rows."""

    bucket: str
    partition: int
    files: tuple[ShardFile, ...]
    manifest_url: str


def shard_key(doc: TokenizedDocument, config: ShardConfig) -> tuple[str, int]:
    return layout.bucket_name(len(doc.tokens)), layout.partition_of(doc.id, config.partitions)


class SpillTokensFn(beam.DoFn):
    """Appends each document's tokens to this bundle's spill file; emits ((bucket, partition), DocRef)."""

    def __init__(self, config: ShardConfig):
        self._config = config

    def setup(self):
        self._fs, self._spill_dir = storage.filesystem(self._config.spill_url)
        self._fs.makedirs(self._spill_dir, exist_ok=True)

    def start_bundle(self):
        self._file = None
        self._path = None
        self._offset = 0

    def process(self, doc: TokenizedDocument):
        if self._file is None:
            # A new name for every bundle attempt: a retry never appends to a failed attempt's file.
            self._path = posixpath.join(self._spill_dir, f"{uuid.uuid4().hex}.bin")
            self._file = self._fs.open(self._path, "wb")
            self._offset = 0
        data = doc.tokens.data
        self._file.write(data)
        ref = DocRef(
            sort_key=layout.shuffle_key(doc.id, self._config.seed),
            id=doc.id,
            length=len(doc.tokens),
            spill_path=self._path,
            offset=self._offset,
            source=doc.source,
            row=doc.row,
        )
        self._offset += data.nbytes
        yield shard_key(doc, self._config), ref

    def finish_bundle(self):
        if self._file is not None:
            # A failure to close fails the bundle, so no DocRef pointing into this file survives.
            self._file.close()
            self._file = None


class _SpillReader:
    """Reads documents back from spill files, keeping a few of them open."""

    def __init__(self, fs, itemsize: int, max_open: int = 32):
        self._fs = fs
        self._itemsize = itemsize
        self._max_open = max_open
        self._open: collections.OrderedDict = collections.OrderedDict()

    def read(self, ref: DocRef) -> bytes:
        f = self._open.pop(ref.spill_path, None)
        if f is None:
            if len(self._open) >= self._max_open:
                _, oldest = self._open.popitem(last=False)
                oldest.close()
            f = self._fs.open(ref.spill_path, "rb")
        self._open[ref.spill_path] = f
        f.seek(ref.offset)
        nbytes = ref.length * self._itemsize
        data = f.read(nbytes)
        if len(data) != nbytes:
            raise OSError(
                f"spill file {ref.spill_path} is short: document {ref.id!r} needs bytes "
                f"{ref.offset}..{ref.offset + nbytes}, read {len(data)}"
            )
        return data

    def close(self):
        for f in self._open.values():
            f.close()
        self._open.clear()


def _write_then_rename(fs, path: str):
    """A file object that is written under a unique temporary name and renamed on success."""
    return _AtomicWriter(fs, path)


class _AtomicWriter:
    def __init__(self, fs, path: str):
        self._fs, self._path = fs, path
        self._tmp = f"{path}.partial-{uuid.uuid4().hex[:12]}"
        self._file = None

    def __enter__(self):
        self._fs.makedirs(posixpath.dirname(self._path), exist_ok=True)
        self._file = self._fs.open(self._tmp, "wb")
        return self._file

    def __exit__(self, exc_type, exc, tb):
        try:
            self._file.close()
        finally:
            if exc_type is not None:
                self._fs.rm(self._tmp)
        if exc_type is None:
            self._fs.mv(self._tmp, self._path)
        return False


def write_group(
    bucket: str, partition: int, refs: Iterable[DocRef], config: ShardConfig, fs=None
) -> ShardGroup:
    """Write one (bucket, partition): rolling shard files and the group's manifest rows, in order."""
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    _, staged = storage.filesystem(config.staged_url)
    itemsize = layout.DTYPES[config.dtype].itemsize
    ordered = sorted(refs, key=lambda r: (r.sort_key, r.id, r.source, r.row))
    reader = _SpillReader(fs, itemsize)
    files: list[ShardFile] = []
    rows: list[str] = []
    i = 0
    try:
        while i < len(ordered):
            rel_path = layout.shard_rel_path(bucket, partition, len(files), config.partitions)
            nbytes = docs = tokens = 0
            with _write_then_rename(fs, posixpath.join(staged, rel_path)) as out:
                # A file takes documents until the next would pass max_shard_bytes; a document
                # larger than that gets a file of its own, never a split.
                while i < len(ordered):
                    ref = ordered[i]
                    size = ref.length * itemsize
                    if docs and nbytes + size > config.max_shard_bytes:
                        break
                    out.write(reader.read(ref))
                    rows.append(manifest.format_row(rel_path, ref.id, ref.length))
                    nbytes += size
                    docs += 1
                    tokens += ref.length
                    i += 1
            files.append(ShardFile(rel_path, docs, tokens))
    finally:
        reader.close()
    width = layout.partition_digits(config.partitions)
    manifest_path = posixpath.join(staged, "manifest", bucket, f"p{partition:0{width}d}.txt")
    with _write_then_rename(fs, manifest_path) as out:
        out.write("".join(rows).encode("utf-8"))
    manifest_url = storage.unstrip(fs, manifest_path, config.output)
    return ShardGroup(bucket, partition, tuple(files), manifest_url)


class WriteShardFilesFn(beam.DoFn):
    def __init__(self, config: ShardConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_written")
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_written")
        self._files = beam.metrics.Metrics.counter("pretokenize", "files_written")

    def setup(self):
        self._fs, _ = storage.filesystem(self._config.output)
        self._progress = Progress("write")

    def process(self, element: tuple[tuple[str, int], Iterable[DocRef]]) -> Iterator[ShardGroup]:
        (bucket, partition), refs = element
        group = write_group(bucket, partition, refs, self._config, self._fs)
        docs = sum(f.documents for f in group.files)
        tokens = sum(f.tokens for f in group.files)
        self._docs.inc(docs)
        self._tokens.inc(tokens)
        self._files.inc(len(group.files))
        self._progress.add(files=len(group.files), documents=docs, tokens=tokens)
        log.debug("staged %s/p%02d: %d files, %d docs, %d tokens", bucket, partition, len(group.files), docs, tokens)
        yield group


class WriteShards(beam.PTransform):
    """TokenizedDocuments in, one ShardGroup per non-empty (bucket, partition) out, files staged.

    Example::

        groups = tokenized | "WriteShards" >> WriteShards(ShardConfig("out/", run_id="r1"))
    """

    def __init__(self, config: ShardConfig):
        super().__init__()
        self._config = config

    def expand(self, docs):
        return (
            docs
            | "SpillTokens" >> beam.ParDo(SpillTokensFn(self._config)).with_output_types(tuple[tuple[str, int], DocRef])
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(WriteShardFilesFn(self._config))
        )
