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

import dataclasses
import logging
import posixpath
from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam
import numpy as np

from shards import layout, storage
from transforms.core.batches import RefBatch, Refs, TokenBatch, first_copies, stream_order
from transforms.core.drops import DUPLICATE_ID, Drops
from transforms.core.progress import Progress
from transforms.core.publish import RunPaths
from transforms.core.records import DROPPED
from transforms.core.spill import AtomicFile, RefPointer, SpillReader, load_refs, roll
from transforms.core.spill import SpillTokensFn as CoreSpillTokensFn

log = logging.getLogger(__name__)


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
    # The saved work this run spills to and resumes from (transforms.core.resume); None: its own
    # run directory.
    work_dir: str | None = None

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


def bucketed_keys(batch: TokenBatch, config: ShardConfig) -> tuple[list[int], np.ndarray]:
    """Each document's group (its partition: every copy of an id lands in one, so duplicates meet)
    and its sort key in its bucket (the seeded shuffle key)."""
    partitions = [layout.partition_of(i, config.partitions) for i in batch.ids]
    sort_keys = np.fromiter((layout.shuffle_key(i, config.seed) for i in batch.ids), np.int64, len(batch.ids))
    return partitions, sort_keys


def write_group(bucket: str, partition: int, refs: Refs, order: np.ndarray, config: ShardConfig,
                fs=None) -> ShardGroup:
    """Write one (bucket, partition): rolling shard files and the group's manifest rows, documents in
    ``order``. A file takes documents until the next would pass max_shard_bytes; a document larger
    than that gets a file of its own, never a split."""
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    _, staged = storage.filesystem(config.staged_url)
    dtype = layout.DTYPES[config.dtype]
    reader = SpillReader(fs, dtype)
    files: list[ShardFile] = []
    rows: list[str] = []
    try:
        for first, end in roll(refs.lengths[order] * dtype.itemsize, config.max_shard_bytes):
            index = order[first:end]
            rel_path = layout.shard_rel_path(bucket, partition, len(files), config.partitions)
            out = AtomicFile(fs, posixpath.join(staged, rel_path))
            try:
                out.write_documents(reader, refs, index)
                out.commit()
            except BaseException:
                out.abort()
                raise
            lengths = refs.lengths[index]
            # Ids were checked when read (manifest.id_problem): no row is checked again here.
            rows.extend(f"{rel_path} | {doc_id} | {n}\n"
                        for doc_id, n in zip(refs.ids[index].tolist(), lengths.tolist(), strict=True))
            files.append(ShardFile(rel_path, len(index), int(lengths.sum()), out.sha256))
    finally:
        reader.close()
    width = layout.partition_digits(config.partitions)
    manifest_file = AtomicFile(fs, posixpath.join(staged, "manifest", bucket, f"p{partition:0{width}d}.txt"))
    manifest_file.write("".join(rows).encode("utf-8"))
    manifest_file.commit()
    return ShardGroup(bucket, partition, tuple(files), storage.unstrip(fs, manifest_file.path, config.output))


def write_partition(
    partition: int, batches: Iterable[RefBatch], config: ShardConfig, fs=None
) -> tuple[list[ShardGroup], int]:
    """All buckets of one partition, copies of an id dropped (the first by input file and row is
    kept); the staged groups and how many copies were dropped."""
    refs = Refs.concat(list(batches))
    id_rank = refs.id_ranks()
    keep = first_copies(refs, id_rank)
    duplicates = refs.size - len(keep)
    refs, id_rank = refs.take(keep), id_rank[keep]
    buckets = np.searchsorted(np.asarray(layout.BUCKET_BOUNDS, np.int64), refs.lengths, side="left")
    order = stream_order(refs, id_rank)
    groups = []
    for b, name in enumerate(layout.BUCKET_NAMES):
        in_bucket = order[buckets[order] == b]
        if len(in_bucket):
            groups.append(write_group(name, partition, refs, in_bucket, config, fs))
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
        self._drops = Drops()

    def process(self, element: tuple[int, Iterable[RefPointer]]):
        partition, pointers = element
        groups, duplicates = write_partition(partition, load_refs(self._fs, pointers), self._config, self._fs)
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
            yield self._drops(DUPLICATE_ID, duplicates)


def spill_fn(config: ShardConfig) -> CoreSpillTokensFn:
    """The first step of WriteShards: TokenBatches in, (partition, RefPointer) out."""
    return CoreSpillTokensFn(config, bucketed_keys)


class WriteShards(beam.PTransform):
    """TokenBatches in (with ``spilled``: what spill_fn made of them, as ProcessUnits gives);
    outputs ``groups`` (a ShardGroup per non-empty (bucket, partition), its
    files staged) and ``dropped`` (``("duplicate_id", n)`` for the copies of ids left out).

    Example::

        written = tokenized | "WriteShards" >> WriteShards(ShardConfig("out/", run_id="r1"))
        groups, duplicates = written.groups, written.dropped
    """

    def __init__(self, config: ShardConfig, spilled: bool = False):
        super().__init__()
        self._config = config
        self._spilled = spilled

    def expand(self, batches):
        if not self._spilled:
            batches = batches | "SpillTokens" >> beam.ParDo(spill_fn(self._config))
        return (
            batches
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(WriteShardFilesFn(self._config)).with_outputs(DROPPED, main="groups")
        )
