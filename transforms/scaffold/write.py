"""WriteLlmcShards and PublishLlmcOutput: scaffold sequences to llm.c shards, filled exactly.

A split's documents form one token stream in a seeded shuffle order (the order of the seeded id
hash, ties broken by id and origin); the stream is cut into shards of exactly ``shard_tokens``
tokens, the last holding the rest, so a document may continue in the next shard (as llm.c's own
data files do). Tokens are never shuffled through Beam; only small references are:

    SpillTokens       each bundle appends its sequences' tokens to a spill file of its own (the
                      bucketed job's SpillTokensFn) and emits ((split, range), SequenceRef). The
                      range is the top bits of the 63-bit sort key, so ranges are contiguous
                      stretches of the stream order and about equally full.
    GroupByRange      a range's SequenceRefs. Every copy of an id has the id's split and sort key,
    DropDuplicateIds  so copies meet here: the first by (input file, row) is kept, as in the
                      bucketed job (transforms.core.batches.first_copies), each other copy is counted
                      as ``duplicate_id`` and its counts are taken back
    RangeTokens       tokens per deduplicated range; from these, each range's first position in
    RangeOffsets      its split's stream (one small dict, a side input)
    PlaceDocuments    a range's refs, sorted, get their stream positions, and each is cut where it
                      crosses a shard boundary: ((split, shard), (position in shard, DocRef of
                      the piece)) out
    GroupByShardFile  one shard's pieces: sorted by position, checked to tile the shard exactly,
    WriteShardFiles   streamed from the spill files behind a header into the staged shard file
    PublishLlmcOutput once every shard is staged: accounts for every document, moves the shards to
                      train/shard_NNN.bin and val/shard_NNN.bin, writes dataset_stats.txt last

With ``chunked_documents`` (--long-docs chunk) a document may be several sequences ``{id}#k``,
each with its own sort key and so its own range: copies of a document would not all meet in one
range, nor would copies that were cut differently (same id, other text). There the spilled refs
are first grouped by (split, source id) (``GroupCopiesById``, ``KeepFirstCopies``): every
sequence of the first copy is kept, every sequence of the others dropped, and the copy counted
once; the refs then go on to GroupByRange, which has no copies left to drop.

The bytes depend only on the documents and the options, never on bundles, workers or the number
of ranges. A worker holds at most one range's refs (about documents / ranges of them) or one
shard's (at most its documents + 1), plus a read buffer of 64 MB.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam
import numpy as np

from shards import layout, llmc, storage
from shards.card import description_files
from shards.llmc import ScaffoldStats, SplitStats
from shards.provenance import Provenance, scaffold_document
from transforms.core.batches import Refs, TokenBatch, stream_order
from transforms.core.drops import DUPLICATE_ID, Drops
from transforms.core.progress import Progress
from transforms.core.publish import PublishOutput, RunPaths, UnaccountedDocumentsError
from transforms.core.records import DROPPED
from transforms.core.spill import AtomicFile, SpillReader, SpillTokensFn, load_refs
from transforms.scaffold.defaults import DEFAULT_ORDER_RANGES
from transforms.scaffold.encode import COUNTS, DocumentCounts, sum_counts

log = logging.getLogger(__name__)

ITEMSIZE = llmc.TOKEN_DTYPE.itemsize


@dataclasses.dataclass(frozen=True)
class LlmcShardConfig(RunPaths):
    """Where and how llm.c shards are written. ``output`` is a local path or an fsspec URL.

    ``order_ranges`` (a power of two) is how many pieces each split's ordering is cut into: more
    ranges, fewer references per worker; the output bytes are the same for every value.
    ``chunked_documents``: a source document may be several sequences (--long-docs chunk), so
    copies of an id are found by grouping by id before the ranges (one more shuffle of refs).
    """

    output: str
    run_id: str
    shard_tokens: int = llmc.DEFAULT_SHARD_TOKENS
    seed: int = layout.DEFAULT_SEED
    order_ranges: int = DEFAULT_ORDER_RANGES
    chunked_documents: bool = False
    # The saved work this run spills to and resumes from (transforms.run.resume); None: its own
    # run directory.
    work_dir: str | None = None

    def __post_init__(self):
        if not 1 <= self.shard_tokens <= llmc.MAX_SHARD_TOKENS:
            raise ValueError(f"--shard-tokens must be within 1..{llmc.MAX_SHARD_TOKENS}, got {self.shard_tokens}")
        if not 0 <= self.seed < layout.SEED_LIMIT:
            raise ValueError(f"--seed must be within 0..{layout.SEED_LIMIT - 1}, got {self.seed}")
        r = self.order_ranges
        if r < 1 or r > 1 << 20 or r & (r - 1):
            raise ValueError(f"order_ranges must be a power of two within 1..{1 << 20}, got {r}")

    @property
    def range_shift(self) -> int:
        return 63 - (self.order_ranges.bit_length() - 1)




def llmc_keys(batch: TokenBatch, config: LlmcShardConfig) -> tuple[list, np.ndarray]:
    """Each sequence's group and sort key (a seeded hash of its id, as in the bucketed job).

    The group is (split, range): the range is the top bits of the sort key, so ranges are
    contiguous stretches of the stream order. With chunked_documents a document may be several
    sequences, each with its own range, so copies of a source id are first brought together by a
    range of the source id's hash: (COPIES, split, range of the source id).
    """
    sort_keys = np.fromiter((layout.shuffle_key(i, config.seed) for i in batch.ids), np.int64, len(batch.ids))
    splits = [llmc.SPLITS[c] for c in batch.extra["split"].tolist()]
    if config.chunked_documents:
        keys = [(COPIES, split, layout.shuffle_key(doc_id, config.seed) >> config.range_shift)
                for split, doc_id in zip(splits, batch.extra["doc_id"].tolist(), strict=True)]
    else:
        keys = [(split, k >> config.range_shift) for split, k in zip(splits, sort_keys.tolist(), strict=True)]
    return keys, sort_keys


COPIES = "copies"


def copies_counts(refs: Refs, copy: np.ndarray) -> list[DocumentCounts]:
    """What each copy (a distinct value of ``copy``) added to its split's counts."""
    out = []
    for c in np.unique(copy).tolist():
        members = copy == c
        out.append(DocumentCounts(1, int(members.sum()), int(refs.extra["words"][members].sum()),
                                  int(refs.lengths[members].sum()), int(refs.extra["mismatch"][members][0])))
    return out


def keep_first_copies(refs: Refs, by_source_id: bool) -> tuple[np.ndarray, list[DocumentCounts]]:
    """The references to keep, and the counts of each copy left out.

    A copy is one (input file, row) of a document. Whole documents (``by_source_id`` False) are
    one sequence each: one per id is kept, the first by (input file, row), as in the bucketed job.
    With ``by_source_id``, every sequence of a source id's first copy is kept, all of the others'.
    """
    if not refs.size:
        return np.zeros(0, np.int64), []
    key = refs.extra["doc_id"] if by_source_id else refs.ids
    ranks = np.unique(key, return_inverse=True)[1].astype(np.int64)
    order = np.lexsort((refs.rows, refs.source, ranks))
    first = np.ones(len(order), dtype=bool)
    first[1:] = ranks[order][1:] != ranks[order][:-1]
    winner_source = np.empty(ranks.max() + 1, np.int64)
    winner_row = np.empty(ranks.max() + 1, np.int64)
    winner_source[ranks[order][first]] = refs.source[order][first]
    winner_row[ranks[order][first]] = refs.rows[order][first]
    keep = (refs.source == winner_source[ranks]) & (refs.rows == winner_row[ranks])
    if by_source_id:
        left = np.flatnonzero(~keep)
        # a copy: (source id, input file, row)
        copy = np.unique(np.stack([ranks[left], refs.source[left], refs.rows[left]]), axis=1, return_inverse=True)[1]
        dropped = copies_counts(refs.take(left), np.asarray(copy).reshape(-1))
    else:
        # two copies of an id from the same (file, row) cannot exist: one per id is kept
        keep = np.zeros(refs.size, dtype=bool)
        keep[order[first]] = True
        left = np.flatnonzero(~keep)
        dropped = copies_counts(refs.take(left), np.arange(len(left)))
    return np.flatnonzero(keep), dropped


def _split_totals(split: str, dropped: list[DocumentCounts]) -> tuple[str, DocumentCounts]:
    return split, DocumentCounts(*(-x for x in sum_counts(dropped)))


class _DropCopiesFn(beam.DoFn):
    """What the two steps that leave copies of an id out share: the references' filesystem, and
    reporting the copies left out (``("duplicate_id", n)`` and their negative counts)."""

    def __init__(self, config: LlmcShardConfig):
        self._config = config

    def setup(self):
        self._drops = Drops()
        self._fs, _ = storage.filesystem(self._config.output)

    def _dropped(self, split: str, dropped: list[DocumentCounts]):
        if dropped:
            yield self._drops(DUPLICATE_ID, len(dropped))
            yield beam.pvalue.TaggedOutput(COUNTS, _split_totals(split, dropped))


class KeepFirstCopiesFn(_DropCopiesFn):
    """((COPIES, split, range), RefPointers) in; ((split, range), RefBatch) of the first copies out,
    and the copies left out."""

    def process(self, element):
        (_, split, _), pointers = element
        refs = Refs.concat(load_refs(self._fs, pointers))
        keep, dropped = keep_first_copies(refs, by_source_id=True)
        kept = refs.take(keep)
        ranges = kept.sort_keys >> self._config.range_shift
        for rng in np.unique(ranges).tolist():
            yield (split, rng), kept.take(np.flatnonzero(ranges == rng))
        yield from self._dropped(split, dropped)


class DropDuplicateIdsFn(_DropCopiesFn):
    """((split, range), RefPointers, or Refs from KeepFirstCopies) in; ((split, range), the
    references kept, as Refs) out. Without chunked_documents, copies of an id are dropped here;
    with it, KeepFirstCopies did that."""

    def process(self, element):
        (split, rng), parts = element
        parts = list(parts)
        if self._config.chunked_documents:  # Refs from KeepFirstCopies, already one copy each
            refs = _concat_refs(parts)
            yield (split, rng), refs
            return
        refs = Refs.concat(load_refs(self._fs, parts))
        keep, dropped = keep_first_copies(refs, by_source_id=False)
        yield (split, rng), refs.take(keep)
        yield from self._dropped(split, dropped)


def _concat_refs(parts: list[Refs]) -> Refs:
    """Refs of several groups as one (their spill and source indexes remapped)."""
    parts = [p for p in parts if p.size]
    if not parts:
        return Refs.concat([])
    paths = sorted({p for r in parts for p in r.spill_paths})
    sources = sorted({s for r in parts for s in r.sources})
    path_index = {p: i for i, p in enumerate(paths)}
    source_index = {s: i for i, s in enumerate(sources)}

    def remap(r: Refs) -> Refs:
        spill = np.asarray([path_index[p] for p in r.spill_paths], np.int32)[r.spill]
        source = np.asarray([source_index[s] for s in r.sources], np.int32)[r.source]
        return r._replace(spill=spill, source=source)

    parts = [remap(r) for r in parts]
    return Refs(
        ids=np.concatenate([r.ids for r in parts]),
        sort_keys=np.concatenate([r.sort_keys for r in parts]),
        lengths=np.concatenate([r.lengths for r in parts]),
        offsets=np.concatenate([r.offsets for r in parts]),
        rows=np.concatenate([r.rows for r in parts]),
        spill=np.concatenate([r.spill for r in parts]),
        source=np.concatenate([r.source for r in parts]),
        spill_paths=paths,
        sources=sources,
        extra={k: np.concatenate([r.extra[k] for r in parts]) for k in parts[0].extra},
    )


class Placement(NamedTuple):
    """Where each range starts in its split's stream, and each split's length in tokens."""

    starts: dict[tuple[str, int], int]
    totals: dict[str, int]

    def shard_lengths(self, split: str, shard_tokens: int) -> list[int]:
        return llmc.shard_lengths(self.totals.get(split, 0), shard_tokens)


def make_placement(range_tokens: Iterable[tuple[tuple[str, int], int]]) -> Placement:
    starts: dict[tuple[str, int], int] = {}
    totals: dict[str, int] = {}
    for (split, rng), tokens in sorted(range_tokens):
        starts[(split, rng)] = totals.get(split, 0)
        totals[split] = totals.get(split, 0) + tokens
    return Placement(starts, totals)


def place_range(
    split: str, rng: int, refs: Refs, placement: Placement, shard_tokens: int
) -> Iterator[tuple[tuple[str, int], tuple[int, Refs]]]:
    """A range's sequences in stream order, cut at shard boundaries: for each shard the range
    reaches, ((split, shard), (position in the shard, the pieces as Refs)). A range is one
    stretch of the stream, so its pieces in a shard are contiguous."""
    if not refs.size:
        return
    order = stream_order(refs, refs.id_ranks())
    refs = refs.take(order)
    ends = placement.starts[(split, rng)] + np.cumsum(refs.lengths)
    starts = ends - refs.lengths
    first_shard, last_shard = int(starts[0]) // shard_tokens, (int(ends[-1]) - 1) // shard_tokens
    for shard in range(first_shard, last_shard + 1):
        lo_pos, hi_pos = shard * shard_tokens, (shard + 1) * shard_tokens
        inside = np.flatnonzero((ends > lo_pos) & (starts < hi_pos))
        pieces = refs.take(inside)
        lo = np.maximum(starts[inside], lo_pos)
        hi = np.minimum(ends[inside], hi_pos)
        pieces = pieces._replace(offsets=pieces.offsets + (lo - starts[inside]) * ITEMSIZE, lengths=hi - lo)
        yield (split, shard), (int(lo[0]) - lo_pos, pieces)


class StagedShard(NamedTuple):
    split: str
    index: int
    tokens: int
    rel_path: str
    sha256: str = ""  # of the whole file, header included, computed as it was written


def write_shard(
    split: str, index: int, stretches: Iterable[tuple[int, Refs]], placement: Placement, config: LlmcShardConfig,
    fs=None,
) -> StagedShard:
    """One shard: header, then its stretches in position order streamed from the spill files (hashed
    on the way, for checksums.sha256)."""
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    lengths = placement.shard_lengths(split, config.shard_tokens)
    expected = lengths[index]
    ordered = sorted(stretches, key=lambda p: p[0])
    position = 0
    for start, pieces in ordered:
        if start != position:
            raise AssertionError(f"{split} shard {index}: a stretch starts at {start}, expected {position}")
        position += int(pieces.lengths.sum())
    if position != expected:
        raise AssertionError(f"{split} shard {index}: pieces hold {position} tokens, expected {expected}")
    rel_path = llmc.shard_rel_path(split, index, llmc.shard_digits(len(lengths)))
    _, staged = storage.filesystem(config.staged_url)
    reader = SpillReader(fs, llmc.TOKEN_DTYPE)
    out = AtomicFile(fs, posixpath.join(staged, rel_path))
    try:
        out.write(llmc.make_header(expected))
        for _, pieces in ordered:
            out.write_documents(reader, pieces, np.arange(pieces.size))
        out.commit()
    except BaseException:
        out.abort()
        raise
    finally:
        reader.close()
    return StagedShard(split, index, expected, rel_path, out.sha256)


class PlaceDocumentsFn(beam.DoFn):
    def __init__(self, config: LlmcShardConfig):
        self._config = config

    def process(self, element, placement: Placement):
        (split, rng), refs = element
        yield from place_range(split, rng, refs, placement, self._config.shard_tokens)


class WriteShardFileFn(beam.DoFn):
    def __init__(self, config: LlmcShardConfig):
        self._config = config
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_written")
        self._files = beam.metrics.Metrics.counter("pretokenize", "files_written")

    def setup(self):
        self._fs, _ = storage.filesystem(self._config.output)
        self._progress = Progress("write")

    def process(self, element, placement: Placement) -> Iterator[StagedShard]:
        (split, index), stretches = element
        staged = write_shard(split, index, stretches, placement, self._config, self._fs)
        self._tokens.inc(staged.tokens)
        self._files.inc()
        self._progress.add(files=1, tokens=staged.tokens)
        yield staged


class WrittenLlmcShards(NamedTuple):
    """What WriteLlmcShards gives: a StagedShard per shard, ``("duplicate_id", n)`` drops for the
    copies of ids left out, and a (split, negative DocumentCounts) per group with such copies, to
    add to the encoded counts."""

    staged: beam.PCollection
    dropped: beam.PCollection
    counts: beam.PCollection


def spill_fn(config: LlmcShardConfig) -> SpillTokensFn:
    """The first step of WriteLlmcShards: TokenBatches of sequences in, ((split, range), RefPointer) out."""
    return SpillTokensFn(config, llmc_keys)


class WriteLlmcShards(beam.PTransform):
    """TokenBatches of sequences (with ``spilled``: what spill_fn made of them, as ProcessUnits
    gives) in; WrittenLlmcShards out, files staged (PublishLlmcOutput publishes).

    Example::

        written = sequences | "WriteLlmcShards" >> WriteLlmcShards(LlmcShardConfig("out/", run_id="r1"))
        staged, duplicates, taken_back = written.staged, written.dropped, written.counts
    """

    def __init__(self, config: LlmcShardConfig, spilled: bool = False):
        super().__init__()
        self._config = config
        self._spilled = spilled

    def expand(self, sequences):
        refs = sequences if self._spilled else sequences | "SpillTokens" >> beam.ParDo(spill_fn(self._config))
        drops, counts = [], []
        if self._config.chunked_documents:
            firsts = (
                refs
                | "GroupCopiesById" >> beam.GroupByKey()
                | "KeepFirstCopies" >> beam.ParDo(KeepFirstCopiesFn(self._config)).with_outputs(
                    DROPPED, COUNTS, main="refs")
            )
            refs = firsts.refs
            drops.append(firsts[DROPPED])
            counts.append(firsts[COUNTS])
        ranges = (
            refs
            | "GroupByRange" >> beam.GroupByKey()
            | "DropDuplicateIds" >> beam.ParDo(DropDuplicateIdsFn(self._config)).with_outputs(
                DROPPED, COUNTS, main="ranges")
        )
        drops.append(ranges[DROPPED])
        counts.append(ranges[COUNTS])
        # Positions come from the ranges as deduplicated: a dropped copy takes no room in the stream.
        placement = (
            ranges.ranges
            | "RangeTokens" >> beam.MapTuple(lambda key, kept: (key, int(kept.lengths.sum())))
            | "CollectRangeTokens" >> beam.combiners.ToList()
            | "RangeOffsets" >> beam.Map(make_placement)
        )
        side = beam.pvalue.AsSingleton(placement)
        staged = (
            ranges.ranges
            | "PlaceDocuments" >> beam.ParDo(PlaceDocumentsFn(self._config), side)
            | "GroupByShardFile" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(WriteShardFileFn(self._config), side)
        )
        return WrittenLlmcShards(
            staged,
            tuple(drops) | "CollectDuplicates" >> beam.Flatten(),
            tuple(counts) | "CollectTakenBack" >> beam.Flatten(),
        )


@dataclasses.dataclass(frozen=True)
class ScaffoldFormat:
    """What llm.c shards add to the core's publish step: their stats, built from the job's settings
    and checked for tokens (tokens encoded = tokens in the shards, shards 0..n-1)."""

    settings: object  # transforms.scaffold.settings.ScaffoldSettings (which imports this module)
    config: LlmcShardConfig
    # What made the run, and the library that encoded (``tiktoken 0.x``): dataset_stats.json and
    # README.md are written from them and the stats; None writes neither.
    provenance: Provenance | None = None
    tokenizer_library: str | None = None

    kind = "scaffold"
    markers = ()

    def compute_stats(self, staged: list[StagedShard], raw_documents: int, drops: dict[str, int],
                      extras: dict) -> ScaffoldStats:
        """The stats of a run, after checking that every token is accounted for."""
        splits = {name: SplitStats() for name in llmc.SPLITS}
        counts = {name: DocumentCounts(*c) for name, c in extras["counts"].items()}
        for name, c in counts.items():
            s = splits[name]
            s.documents, s.sequences, s.words = c.documents, c.sequences, c.words
        written = {name: 0 for name in llmc.SPLITS}
        for shard in staged:
            written[shard.split] += shard.tokens
            splits[shard.split].files += 1
        for name, s in splits.items():
            s.tokens = written[name]
            encoded = counts[name].tokens if name in counts else 0
            if encoded != written[name]:
                raise UnaccountedDocumentsError(
                    f"{name}: {encoded} tokens were encoded but the shards hold {written[name]}; refusing to publish"
                )
            indices = sorted(sh.index for sh in staged if sh.split == name)
            if indices != list(range(len(llmc.shard_lengths(written[name], self.config.shard_tokens)))):
                raise UnaccountedDocumentsError(f"{name}: staged shards {indices} are not 0..n-1; refusing to publish")
        return ScaffoldStats(
            raw_documents=raw_documents,
            tokenizer=self.settings.tokenizer,
            annotate=self.settings.annotate,
            long_docs=self.settings.long_docs,
            max_word_chars=self.settings.max_word_chars,
            val_fraction=self.settings.val_fraction,
            seed=self.config.seed,
            shard_tokens=self.config.shard_tokens,
            countdown_mismatches=sum(c.countdown_mismatches for c in counts.values()),
            splits=splits,
            drops=drops,
        )

    def describe(self, stats: ScaffoldStats) -> dict[str, bytes]:
        """dataset_stats.json and the dataset card (README.md), by name."""
        if self.provenance is None:
            return {}
        return description_files(scaffold_document(self.provenance, stats, self.tokenizer_library))

    def files(self, staged: list[StagedShard]) -> dict[str, str]:
        return {s.rel_path: s.sha256 for s in staged}

    def prepare(self, staged: list[StagedShard], config: LlmcShardConfig) -> None:
        """llm.c shards need nothing staged besides themselves."""

    def finish(self, staged: list[StagedShard], config: LlmcShardConfig) -> None:
        """Nor any file of their own besides the checksums and the stats, which the core writes."""


class PublishLlmcOutput(beam.PTransform):
    """StagedShards in; publishes once all are staged (the core's PublishOutput with a ScaffoldFormat)
    and yields the ScaffoldStats.

    ``counts`` holds (split, DocumentCounts) of the encoded documents and negative ones for the
    copies of ids WriteLlmcShards left out: their sums are the documents kept.
    """

    def __init__(self, fmt: ScaffoldFormat, raw_documents, drop_reasons, counts):
        super().__init__()
        self._fmt = fmt
        self._raw = raw_documents
        self._drops = drop_reasons
        self._counts = counts

    def expand(self, staged):
        split_counts = self._counts | "SumSplitCounts" >> beam.CombinePerKey(sum_counts)
        return staged | "PublishOutput" >> PublishOutput(
            self._fmt, self._fmt.config, self._raw, self._drops, counts=beam.pvalue.AsDict(split_counts))
