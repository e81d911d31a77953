"""WriteShards: tokenized documents to rolling shard files, deterministic and with bounded memory.

Only small per-document references are shuffled, never the tokens themselves:

    SpillTokens       each bundle appends its documents' tokens to one spill file of its own on the
                      output filesystem, one stretch per (partition, bucket) and flush, and emits
                      ((partition, bucket), RefPointer): the partition and the sort key are hashes
                      of the id
    GroupByPartition  the pointers grouped by partition: a few dozen bytes per stretch. Every copy
                      of an id lands in one partition, whatever its length, so duplicates meet here
    PlanShardGroups   per partition: keep one copy of each id (the first by input file and row;
                      the others are dropped as "duplicate_id"); a PlannedGroup per (bucket,
                      partition) that holds documents: its pointers and the copies it leaves out
    WriteShardFiles   per (bucket, partition), spread over the workers: sort the refs by the seeded
                      id hash and stream each document's tokens from the spill files (on an object
                      store fetched first in a few large reads) into the group's rolling shard files

A retried bundle writes a new spill file (its name is unique per attempt) and the runner keeps
only the DocRefs of the attempt that committed, so a retry cannot duplicate or lose a document.
Shard files are written under the run's staging directory; PublishOutput moves them into place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import posixpath
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import NamedTuple

import apache_beam as beam
import numpy as np

from shards import index as reader_index
from shards import layout, manifest, storage
from transforms.core.batches import RefBatch, Refs, TokenBatch, first_copies, stream_order
from transforms.core.drops import DUPLICATE_ID, Drops
from transforms.core.progress import Progress
from transforms.core.publish import RunPaths
from transforms.core.records import DROPPED
from transforms.core.spill import (
    DEFAULT_CONNECTIONS,
    AtomicFile,
    RefPointer,
    SpillReader,
    emit_at_finish,
    load_refs,
    roll,
)
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
    # The saved work this run spills to and resumes from (transforms.run.resume); None: its own
    # run directory.
    work_dir: str | None = None
    # Range requests a writer keeps in flight when it reads spill files on an object store.
    read_connections: int = DEFAULT_CONNECTIONS

    def __post_init__(self):
        if not 1 <= self.read_connections <= 1024:
            raise ValueError(f"read_connections must be within 1..1024, got {self.read_connections}")
        if not 1 <= self.partitions <= 100_000:
            raise ValueError(f"partitions must be within 1..100000, got {self.partitions}")
        if self.dtype not in layout.DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.max_shard_bytes < layout.DTYPES[self.dtype].itemsize:
            raise ValueError(f"max_shard_bytes must hold at least one token, got {self.max_shard_bytes}")
        if not 0 <= self.seed < layout.SEED_LIMIT:
            raise ValueError(f"seed must be within 0..{layout.SEED_LIMIT - 1}, got {self.seed}")


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


def bucketed_keys(batch: TokenBatch, config: ShardConfig) -> tuple[np.ndarray, np.ndarray]:
    """Each document's group (its partition: every copy of an id lands in one, so duplicates meet)
    and its sort key in its bucket (the seeded shuffle key), as int64 arrays: each id encoded once."""
    raw = list(map(str.encode, batch.ids))
    return layout.partitions_of(raw, config.partitions), layout.shuffle_keys(raw, config.seed)


def write_group(bucket: str, partition: int, refs: Refs, order: np.ndarray, config: ShardConfig,
                fs=None) -> ShardGroup:
    """Write one (bucket, partition): rolling shard files and the group's manifest rows, documents in
    ``order``. A file takes documents until the next would pass max_shard_bytes; a document larger
    than that gets a file of its own, never a split."""
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    _, staged = storage.filesystem(config.staged_url)
    dtype = layout.DTYPES[config.dtype]
    reader = SpillReader(fs, dtype, connections=config.read_connections)
    files: list[ShardFile] = []
    rows: list[str] = []
    try:
        reader.stage(refs, order)  # on an object store: the group's documents in a few large reads
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
            rows.extend(manifest.row_text(rel_path, doc_id, n)
                        for doc_id, n in zip(refs.ids[index].tolist(), lengths.tolist(), strict=True))
            files.append(ShardFile(rel_path, len(index), int(lengths.sum()), out.sha256))
    finally:
        reader.close()
    width = layout.partition_digits(config.partitions)
    manifest_path = posixpath.join(staged, "manifest", bucket, f"p{partition:0{width}d}.txt")
    # The group's part of the reader index first (shards.index.encode_part): publish builds the
    # index from the parts, so its serial work is per group, not per document.
    part = AtomicFile(fs, index_part_url(manifest_path))
    part.write(reader_index.encode_part(refs.ids[order].tolist(), refs.lengths[order]))
    part.commit()
    manifest_file = AtomicFile(fs, manifest_path)
    manifest_file.write("".join(rows).encode("utf-8"))
    manifest_file.commit()
    return ShardGroup(bucket, partition, tuple(files), storage.unstrip(fs, manifest_file.path, config.output))


def index_part_url(manifest_url: str) -> str:
    """Where the reader index part of the group whose manifest rows are at ``manifest_url`` is."""
    return manifest_url.removesuffix(".txt") + ".idx"


def bucket_indexes(lengths: np.ndarray) -> np.ndarray:
    """The index in layout.BUCKET_NAMES of each length's bucket."""
    return np.searchsorted(np.asarray(layout.BUCKET_BOUNDS, np.int64), lengths, side="left")


def shard_group_keys(batch: TokenBatch, config: ShardConfig) -> tuple[np.ndarray, np.ndarray]:
    """What SpillTokens keys documents by: (partition, bucket index), one row per document, so
    that each (bucket, partition) group's documents of a flush are one stretch of the spill file
    and its references one RefBatch; and the sort keys of bucketed_keys."""
    partitions, sort_keys = bucketed_keys(batch, config)
    return np.stack([partitions, bucket_indexes(batch.lengths)], axis=1), sort_keys


class PlannedGroup(NamedTuple):
    """One (bucket, partition) group to write: the RefBatches holding its documents (sorted), and
    the positions (in those RefBatches end to end) of the copies of ids it leaves out."""

    bucket: str
    partition: int
    pointers: tuple[RefPointer, ...]
    dropped: tuple[int, ...]


def plan_partition(partition: int, keyed: Iterable[tuple[int, RefPointer]], fs) -> tuple[list[PlannedGroup], int]:
    """A partition's groups, from its (bucket index, RefPointer)s: every copy of an id is in this
    partition, whatever its bucket, so copies are found here (the first by input file and row is
    kept); the groups that hold documents, and how many copies were dropped."""
    keyed = sorted(keyed, key=lambda kv: kv[1])
    batches = load_refs(fs, [pointer for _, pointer in keyed])
    refs = Refs.concat(batches)
    kept = np.zeros(refs.size, dtype=bool)
    kept[first_copies(refs, refs.id_ranks())] = True
    ends = np.cumsum([b.size for b in batches], dtype=np.int64)
    by_bucket: dict[int, list[int]] = {}
    for n, (bucket, _) in enumerate(keyed):
        by_bucket.setdefault(bucket, []).append(n)
    groups = []
    for bucket in sorted(by_bucket):
        members = by_bucket[bucket]
        positions = np.concatenate([np.arange(ends[n] - batches[n].size, ends[n]) for n in members])
        keep = kept[positions]
        if keep.any():
            groups.append(PlannedGroup(layout.BUCKET_NAMES[bucket], partition, tuple(keyed[n][1] for n in members),
                                       tuple(np.flatnonzero(~keep).tolist())))
    return groups, int(refs.size - kept.sum())


def write_planned(group: PlannedGroup, config: ShardConfig, fs=None,
                  scratch: ScratchBudget | None = None) -> ShardGroup:
    """Write a planned group: its references read back, the copies it leaves out dropped. With
    ``scratch``, its tokens' bytes are held from that budget while it is written (its writer's
    scratch file holds them on an object store)."""
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    refs = Refs.concat(load_refs(fs, group.pointers))
    keep = np.ones(refs.size, dtype=bool)
    keep[np.asarray(group.dropped, np.int64)] = False
    refs = refs.take(np.flatnonzero(keep))
    if scratch is None:
        return write_bucket(group.bucket, group.partition, refs, config, fs)
    with scratch.hold(int(refs.lengths.sum()) * layout.DTYPES[config.dtype].itemsize):
        return write_bucket(group.bucket, group.partition, refs, config, fs)


class ScratchBudget:
    """Bytes of local scratch the groups written at once may hold between them. A group takes its
    bytes (all of the budget at most) before it is written and gives them back after, so the
    scratch in use is at most the budget, or one group larger than it written alone, as when
    groups were written one at a time."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        size = min(max(size, 0), self.limit)
        with self._changed:
            self._changed.wait_for(lambda: self.used + size <= self.limit)
            self.used += size
        try:
            yield
        finally:
            with self._changed:
                self.used -= size
                self._changed.notify_all()


def write_bucket(bucket: str, partition: int, refs: Refs, config: ShardConfig, fs=None) -> ShardGroup:
    """Write one (bucket, partition) group's documents (one copy of each id) in their seeded order."""
    return write_group(bucket, partition, refs, stream_order(refs, refs.id_ranks()), config, fs)


def write_partition(
    partition: int, batches: Iterable[RefBatch], config: ShardConfig, fs=None
) -> tuple[list[ShardGroup], int]:
    """All buckets of one partition, from its RefBatches, copies of an id dropped (the first by
    input file and row is kept); the staged groups and how many copies were dropped. The steps of
    the job (plan_partition, write_planned) in one call, for references at hand."""
    refs = Refs.concat(list(batches))
    keep = first_copies(refs, refs.id_ranks())
    duplicates = refs.size - len(keep)
    refs = refs.take(keep)
    buckets = bucket_indexes(refs.lengths)
    groups = []
    for b, name in enumerate(layout.BUCKET_NAMES):
        in_bucket = np.flatnonzero(buckets == b)
        if len(in_bucket):
            groups.append(write_bucket(name, partition, refs.take(in_bucket), config, fs))
    return groups, duplicates


class PlanShardGroupsFn(beam.DoFn):
    """(partition, (bucket index, RefPointer)s) in; a PlannedGroup per (bucket, partition) that
    holds documents out, and the copies of ids left out, counted."""

    def __init__(self, config: ShardConfig):
        self._config = config

    def setup(self):
        self._fs, _ = storage.filesystem(self._config.output, connections=self._config.read_connections)
        self._drops = Drops()

    def process(self, element: tuple[int, Iterable[tuple[int, RefPointer]]]):
        partition, keyed = element
        groups, duplicates = plan_partition(partition, keyed, self._fs)
        yield from groups
        if duplicates:
            log.warning("partition %d: %d documents dropped as copies of an id already kept", partition, duplicates)
            yield self._drops(DUPLICATE_ID, duplicates)  # a TaggedOutput of DROPPED


# Groups a worker writes at once on an object store, where each group waits on a few requests in
# turn (its references, its range reads, each file's upload): a bundle's groups overlap those waits
# instead of adding them up. On a local disk groups are written one after another.
GROUPS_IN_FLIGHT = 8
# The local scratch those groups hold at most between them (a larger group is written alone).
SCRATCH_BYTES_IN_FLIGHT = 2 << 30


class WriteShardFilesFn(beam.DoFn):
    """A PlannedGroup in; its ShardGroup (files staged, manifest rows) out.

    On an object store a bundle's groups are written GROUPS_IN_FLIGHT at a time, each by a thread
    of its own; their ShardGroups come out as they finish, the last ones at the bundle's end, so a
    bundle that fails (or is retried) fails whole: nothing of it is committed, and the groups'
    staged files are written again under the same names.
    """

    def __init__(self, config: ShardConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_written")
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_written")
        self._files = beam.metrics.Metrics.counter("pretokenize", "files_written")
        self._groups = beam.metrics.Metrics.counter("pretokenize", "groups_written")

    def setup(self):
        self._fs, _ = storage.filesystem(self._config.output, connections=self._config.read_connections)
        self._progress = Progress("write")
        self._pool = None if storage.renames_atomically(self._fs) else ThreadPoolExecutor(GROUPS_IN_FLIGHT)
        self._scratch = ScratchBudget(SCRATCH_BYTES_IN_FLIGHT)

    def start_bundle(self):
        self._pending: list[Future] = []

    def process(self, planned: PlannedGroup):
        if self._pool is None:
            yield self._written(write_planned(planned, self._config, self._fs))
            return
        self._pending.append(self._pool.submit(write_planned, planned, self._config, self._fs, self._scratch))
        if len(self._pending) > GROUPS_IN_FLIGHT:
            yield from map(self._written, self._results(1))

    def finish_bundle(self):
        for group in self._results(len(self._pending)):
            yield emit_at_finish(self._written(group))

    def _results(self, count: int) -> list[ShardGroup]:
        """The first ``count`` pending groups, once written. When one failed, the others are
        cancelled or waited for (no thread of a failed bundle writes on), and its error raised."""
        done, self._pending = self._pending[:count], self._pending[count:]
        try:
            return [f.result() for f in done]
        except BaseException:
            rest, self._pending = done + self._pending, []
            for f in rest:
                f.cancel()
            wait(rest)
            raise

    def teardown(self):
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _written(self, group: ShardGroup) -> ShardGroup:
        """Count a written group (in the bundle's thread, where Beam's counters are)."""
        docs = sum(f.documents for f in group.files)
        tokens = sum(f.tokens for f in group.files)
        self._docs.inc(docs)
        self._tokens.inc(tokens)
        self._files.inc(len(group.files))
        self._groups.inc()
        self._progress.add(files=len(group.files), documents=docs, tokens=tokens)
        return group


def spill_fn(config: ShardConfig) -> CoreSpillTokensFn:
    """The first step of WriteShards: TokenBatches in, ((partition, bucket index), RefPointer) out."""
    return CoreSpillTokensFn(config, shard_group_keys)


class WrittenShards(NamedTuple):
    """What WriteShards gives: ``groups`` (ShardGroups) and ``dropped`` (the copies of ids left
    out, as ``("duplicate_id", n)``), also as ``written[DROPPED]``."""

    groups: beam.PCollection
    dropped: beam.PCollection

    def __getitem__(self, key):
        return self.dropped if key == DROPPED else tuple.__getitem__(self, key)


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
        planned = (
            batches
            | "KeyByPartition" >> beam.MapTuple(lambda key, pointer: (key[0], (key[1], pointer)))
            | "GroupByPartition" >> beam.GroupByKey()
            | "PlanShardGroups" >> beam.ParDo(PlanShardGroupsFn(self._config)).with_outputs(DROPPED, main="groups")
        )
        groups = (
            planned.groups
            # One work item per (bucket, partition) group: 320 for the default layout, spread over
            # the workers rather than left where their partition was planned.
            | "SpreadShardGroups" >> beam.Reshuffle()
            | "WriteShardFiles" >> beam.ParDo(WriteShardFilesFn(self._config))
        )
        return WrittenShards(groups, planned[DROPPED])
