"""WriteShards: tokenized documents to rolling shard files, deterministic and with bounded memory.

Only small per-document references are shuffled, never the tokens themselves:

    SpillTokens      each bundle appends its documents' tokens to one spill file of its own on the
                     output filesystem and emits (partition, DocRef): the partition and the sort
                     key are hashes of the id
    GroupByShard     DocRefs grouped by partition: tens of bytes a document. Every copy of an id
                     lands in one partition, whatever its length, so duplicates meet here
    WriteShardFiles  per partition: keep one copy of each id (the first by input file and row;
                     the others are dropped as "duplicate_id"), then per bucket sort the refs by
                     the seeded id hash and stream each document's tokens from its spill file
                     into the (bucket, partition)'s rolling shard files

A retried bundle writes a new spill file (its name is unique per attempt) and the runner keeps
only the DocRefs of the attempt that committed, so a retry cannot duplicate or lose a document.
Shard files are written under the run's staging directory; PublishOutput moves them into place.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
from fsspec.implementations.local import LocalFileSystem

from shards import layout, manifest, storage
from transforms.progress import Progress
from transforms.records import DROPPED, DocRef, TokenizedDocument

log = logging.getLogger(__name__)


# Failures injected so far in this process, by step (tests only).
_INJECTED: collections.Counter = collections.Counter()


class RunPaths:
    """What a job's writer config shares: where its run's temporary files go, and the test-only
    failure injection. Needs ``output``, ``run_id`` and ``test_fail_first_attempts``."""

    @property
    def run_url(self) -> str:
        return storage.join(self.output, layout.TEMP_DIR_NAME, self.run_id)

    @property
    def spill_url(self) -> str:
        return storage.join(self.run_url, "spill")

    @property
    def staged_url(self) -> str:
        return storage.join(self.run_url, "staged")

    def inject_failure(self, where: str) -> None:
        if self.test_fail_first_attempts and _INJECTED[where] < self.test_fail_first_attempts:
            _INJECTED[where] += 1
            raise RuntimeError(f"injected failure #{_INJECTED[where]} in {where} (--test-fail-first-attempts)")


@dataclasses.dataclass(frozen=True)
class ShardConfig(RunPaths):
    """Where and how shards are written. ``output`` is a local path or an fsspec URL."""

    output: str
    run_id: str
    partitions: int = layout.DEFAULT_PARTITIONS
    max_shard_bytes: int = layout.DEFAULT_MAX_SHARD_BYTES
    seed: int = layout.DEFAULT_SEED
    dtype: str = layout.DEFAULT_DTYPE
    # The run id of a removal journalled in this output before the run began (and not finished):
    # its documents are kept out of this run, and publishing writes its audit lines.
    pending_removal: str | None = None
    # The --removal-list this run honours: publishing records its ids in removals.txt, so that a
    # later run without the flag keeps them out too.
    removal_list: str | None = None
    # Tests only: the first N spill and write steps in this process fail once, as a crashing
    # worker would, so that a runner retrying bundles can be shown to lose and duplicate nothing.
    test_fail_first_attempts: int = 0
    # Tests only: seconds to wait after each shard moved into place, so a test can kill the job
    # in the middle of publishing.
    test_publish_delay: float = 0.0

    def __post_init__(self):
        if not 1 <= self.partitions <= 100_000:
            raise ValueError(f"partitions must be within 1..100000, got {self.partitions}")
        if self.dtype not in layout.DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.max_shard_bytes < layout.DTYPES[self.dtype].itemsize:
            raise ValueError(f"max_shard_bytes must hold at least one token, got {self.max_shard_bytes}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")




class ShardFile(NamedTuple):
    rel_path: str
    documents: int
    tokens: int
    sha256: str = ""


class ShardGroup(NamedTuple):
    """What WriteShardFiles wrote for one (bucket, partition): its files and its manifest rows."""

    bucket: str
    partition: int
    files: tuple[ShardFile, ...]
    manifest_url: str


def shard_key(doc: TokenizedDocument, config: ShardConfig) -> tuple[str, int]:
    return layout.bucket_name(len(doc.tokens)), layout.partition_of(doc.id, config.partitions)


def bucketed_spill_key(doc: TokenizedDocument, config: ShardConfig) -> tuple[int, int]:
    """The group a spilled document joins (its partition) and its sort key in its bucket."""
    config.inject_failure("spill")
    return layout.partition_of(doc.id, config.partitions), layout.shuffle_key(doc.id, config.seed)


def ref_order(ref: DocRef) -> tuple:
    """The order of documents in a group: the seeded shuffle key, ties broken by id and origin."""
    return ref.sort_key, ref.id, ref.source, ref.row


class SpillTokensFn(beam.DoFn):
    """Appends each document's tokens to this bundle's spill file; emits (group key, DocRef).

    ``key_fn(doc, config) -> (group key, sort key)`` says where a document goes; the default is
    the bucketed layout's ((bucket, partition), seeded shuffle key). ``config`` needs ``spill_url``
    (and whatever ``key_fn`` reads). Documents need ``id``, ``tokens``, ``source`` and ``row``.
    """

    def __init__(self, config: ShardConfig, key_fn: Callable | None = None):
        self._config = config
        self._key_fn = key_fn or bucketed_spill_key

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
        key, sort_key = self._key_fn(doc, self._config)
        ref = DocRef(
            sort_key=sort_key,
            id=doc.id,
            length=len(doc.tokens),
            spill_path=self._path,
            offset=self._offset,
            source=doc.source,
            row=doc.row,
        )
        self._offset += data.nbytes
        yield key, ref

    def finish_bundle(self):
        if self._file is not None:
            # A failure to close fails the bundle, so no DocRef pointing into this file survives.
            self._file.close()
            self._file = None


class _SpillReader:
    """Reads spilled documents back, in the order asked, a batch of up to ``batch_bytes`` at a time.

    Local spill files are read through a few open handles; on object stores a batch is one
    ``cat_ranges`` call, which async filesystems (gcsfs, s3fs) serve with concurrent range requests.
    """

    def __init__(self, fs, itemsize: int, batch_bytes: int = 64 << 20, max_open: int = 32):
        self._fs = fs
        self._itemsize = itemsize
        self._batch_bytes = batch_bytes
        self._max_open = max_open
        self._open: collections.OrderedDict = collections.OrderedDict()
        self._local = isinstance(fs, LocalFileSystem)

    def _read_local(self, ref: DocRef) -> bytes:
        f = self._open.pop(ref.spill_path, None)
        if f is None:
            if len(self._open) >= self._max_open:
                _, oldest = self._open.popitem(last=False)
                oldest.close()
            f = self._fs.open(ref.spill_path, "rb")
        self._open[ref.spill_path] = f
        f.seek(ref.offset)
        return f.read(ref.length * self._itemsize)

    def _read_batch(self, refs: list[DocRef]) -> list[bytes]:
        if self._local:
            return [self._read_local(r) for r in refs]
        starts = [r.offset for r in refs]
        ends = [r.offset + r.length * self._itemsize for r in refs]
        return self._fs.cat_ranges([r.spill_path for r in refs], starts, ends, on_error="raise")

    def stream(self, refs: list[DocRef]) -> Iterator[tuple[DocRef, bytes]]:
        i = 0
        while i < len(refs):
            batch, size = [], 0
            while i < len(refs) and (not batch or size + refs[i].length * self._itemsize <= self._batch_bytes):
                batch.append(refs[i])
                size += refs[i].length * self._itemsize
                i += 1
            for ref, data in zip(batch, self._read_batch(batch), strict=True):
                if len(data) != ref.length * self._itemsize:
                    raise OSError(
                        f"spill file {ref.spill_path} is short: document {ref.id!r} needs "
                        f"{ref.length * self._itemsize} bytes at offset {ref.offset}, read {len(data)}"
                    )
                yield ref, data

    def close(self):
        for f in self._open.values():
            f.close()
        self._open.clear()


class _AtomicFile:
    """A file that appears at ``path`` whole or not at all.

    On a local disk it is written under a unique temporary name and renamed on commit. On an
    object store the upload itself is all-or-nothing (the object exists once the upload
    completes), so it is written in place and an abort discards the upload.
    """

    def __init__(self, fs, path: str):
        self._fs, self.path = fs, path
        local = storage.renames_atomically(fs)
        self._tmp = f"{path}.partial-{uuid.uuid4().hex[:12]}" if local else path
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.file = fs.open(self._tmp, "wb")

    def commit(self) -> None:
        self.file.close()
        if self._tmp != self.path:
            self._fs.mv(self._tmp, self.path)

    def abort(self) -> None:
        discard = getattr(self.file, "discard", None)
        try:
            # close() would complete an object store's upload with what was written so far.
            discard() if discard is not None and self._tmp == self.path else self.file.close()
        finally:
            if self._fs.exists(self._tmp):
                self._fs.rm(self._tmp)


def write_group(bucket: str, partition: int, refs: Iterable[DocRef], config: ShardConfig, fs=None) -> ShardGroup:
    """Write one (bucket, partition): rolling shard files and the group's manifest rows, in order.

    A file takes documents until the next would pass max_shard_bytes; a document larger than
    that gets a file of its own, never a split.
    """
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    _, staged = storage.filesystem(config.staged_url)
    ordered = sorted(refs, key=ref_order)
    reader = _SpillReader(fs, layout.DTYPES[config.dtype].itemsize)
    files: list[ShardFile] = []
    rows: list[str] = []
    current: _AtomicFile | None = None
    digest = hashlib.sha256()
    rel_path = ""
    nbytes = docs = tokens = 0
    try:
        for ref, data in reader.stream(ordered):
            if current is not None and nbytes + len(data) > config.max_shard_bytes:
                current.commit()
                files.append(ShardFile(rel_path, docs, tokens, digest.hexdigest()))
                current = None
            if current is None:
                rel_path = layout.shard_rel_path(bucket, partition, len(files), config.partitions)
                current = _AtomicFile(fs, posixpath.join(staged, rel_path))
                digest = hashlib.sha256()
                nbytes = docs = tokens = 0
            current.file.write(data)
            digest.update(data)
            rows.append(manifest.format_row(rel_path, ref.id, ref.length))
            nbytes += len(data)
            docs += 1
            tokens += ref.length
        if current is not None:
            current.commit()
            files.append(ShardFile(rel_path, docs, tokens, digest.hexdigest()))
            current = None
    finally:
        reader.close()
        if current is not None:
            current.abort()
    width = layout.partition_digits(config.partitions)
    manifest_file = _AtomicFile(fs, posixpath.join(staged, "manifest", bucket, f"p{partition:0{width}d}.txt"))
    manifest_file.file.write("".join(rows).encode("utf-8"))
    manifest_file.commit()
    return ShardGroup(bucket, partition, tuple(files), storage.unstrip(fs, manifest_file.path, config.output))


DUPLICATE_ID = "duplicate_id"


def drop_duplicates(refs: Iterable[DocRef]) -> tuple[list[DocRef], int]:
    """One ref per id, the first by (input file, row); and how many copies were dropped."""
    best: dict[str, DocRef] = {}
    seen = 0
    for ref in refs:
        seen += 1
        kept = best.get(ref.id)
        if kept is None or (ref.source, ref.row) < (kept.source, kept.row):
            best[ref.id] = ref
    return list(best.values()), seen - len(best)


def write_partition(
    partition: int, refs: Iterable[DocRef], config: ShardConfig, fs=None
) -> tuple[list[ShardGroup], int]:
    """All buckets of one partition, duplicates dropped; the staged groups and the duplicate count."""
    kept, duplicates = drop_duplicates(refs)
    by_bucket: dict[str, list[DocRef]] = {}
    for ref in kept:
        by_bucket.setdefault(layout.bucket_name(ref.length), []).append(ref)
    groups = []
    for bucket in layout.BUCKET_NAMES:
        if bucket in by_bucket:
            groups.append(write_group(bucket, partition, by_bucket.pop(bucket), config, fs))
            config.inject_failure("write")
    return groups, duplicates


class WriteShardFilesFn(beam.DoFn):
    def __init__(self, config: ShardConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_written")
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_written")
        self._files = beam.metrics.Metrics.counter("pretokenize", "files_written")

    def setup(self):
        self._fs, _ = storage.filesystem(self._config.output)
        self._progress = Progress("write")

    def process(self, element: tuple[int, Iterable[DocRef]]):
        partition, refs = element
        groups, duplicates = write_partition(partition, refs, self._config, self._fs)
        for group in groups:
            docs = sum(f.documents for f in group.files)
            tokens = sum(f.tokens for f in group.files)
            self._docs.inc(docs)
            self._tokens.inc(tokens)
            self._files.inc(len(group.files))
            self._progress.add(files=len(group.files), documents=docs, tokens=tokens)
            yield group
        if duplicates:
            log.warning("partition %d: %d documents dropped as copies of an id already kept", partition, duplicates)
        for _ in range(duplicates):
            yield beam.pvalue.TaggedOutput(DROPPED, DUPLICATE_ID)


class WriteShards(beam.PTransform):
    """TokenizedDocuments in; outputs ``groups`` (a ShardGroup per non-empty (bucket, partition),
    its files staged) and ``dropped`` (one "duplicate_id" per copy of an id left out).

    Example::

        written = tokenized | "WriteShards" >> WriteShards(ShardConfig("out/", run_id="r1"))
        groups, duplicates = written.groups, written.dropped
    """

    def __init__(self, config: ShardConfig):
        super().__init__()
        self._config = config

    def expand(self, docs):
        return (
            docs
            | "SpillTokens" >> beam.ParDo(SpillTokensFn(self._config)).with_output_types(tuple[int, DocRef])
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(WriteShardFilesFn(self._config)).with_outputs(DROPPED, main="groups")
        )
