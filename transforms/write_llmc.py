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
                      bucketed job (transforms.write.drop_duplicates), each other copy is counted
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
import hashlib
import logging
import posixpath
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import apache_beam as beam

from shards import layout, llmc, storage, tree
from shards.llmc import ScaffoldStats, SplitStats
from shards.manifest import format_checksums
from transforms.progress import Progress
from transforms.publish import UnaccountedDocumentsError, commit, mark_publishing, replace_files
from transforms.records import DROPPED, DocRef
from transforms.scaffold import COUNTS, DocumentCounts, ScaffoldTokens, sum_counts
from transforms.write import (  # noqa: F401 - _INJECTED: tests read the injected failures here too
    _INJECTED,
    DUPLICATE_ID,
    RunPaths,
    SpillTokensFn,
    _AtomicFile,
    _SpillReader,
    drop_duplicates,
    ref_order,
)

log = logging.getLogger(__name__)

DEFAULT_ORDER_RANGES = 1024
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
    # Tests only: the first N spill, dedupe and write steps in this process fail once, after doing
    # part of their work, as a crashing worker would; a runner that retries bundles must then lose
    # and duplicate nothing (see transforms.write.ShardConfig, the bucketed job's twin).
    test_fail_first_attempts: int = 0
    # Tests only: seconds to wait after each shard moved into place, so a test can kill the job in
    # the middle of publishing.
    test_publish_delay: float = 0.0

    def __post_init__(self):
        if not 1 <= self.shard_tokens <= llmc.MAX_SHARD_TOKENS:
            raise ValueError(f"--shard-tokens must be within 1..{llmc.MAX_SHARD_TOKENS}, got {self.shard_tokens}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        r = self.order_ranges
        if r < 1 or r > 1 << 20 or r & (r - 1):
            raise ValueError(f"order_ranges must be a power of two within 1..{1 << 20}, got {r}")
        if self.test_fail_first_attempts < 0:
            raise ValueError("test_fail_first_attempts must be >= 0")

    @property
    def range_shift(self) -> int:
        return 63 - (self.order_ranges.bit_length() - 1)




class SequenceRef(NamedTuple):
    """A DocRef (where a spilled sequence's tokens are, where it sorts) and what its copy added to
    the counts: its words, and its source document's countdown-mismatch flag (0 or 1)."""

    sort_key: int
    id: str
    length: int
    spill_path: str
    offset: int
    source: str
    row: int
    words: int
    mismatch: int


beam.coders.registry.register_coder(SequenceRef, beam.coders.RowCoder)


def llmc_spill_key(seq: ScaffoldTokens, config: LlmcShardConfig) -> tuple[tuple[str, int | str], int]:
    """The group a spilled sequence joins and its sort key, a seeded hash of its id (as in the
    bucketed job). The group is (split, range), or (split, source id) with chunked_documents."""
    config.inject_failure("spill")
    sort_key = layout.shuffle_key(seq.id, config.seed)
    if config.chunked_documents:
        return (seq.split, seq.doc_id), sort_key
    return range_key(seq.split, sort_key, config), sort_key


def range_key(split: str, sort_key: int, config: LlmcShardConfig) -> tuple[str, int]:
    return split, sort_key >> config.range_shift


class SpillSequencesFn(SpillTokensFn):
    """The bucketed job's SpillTokensFn, each DocRef completed into a SequenceRef."""

    def process(self, seq: ScaffoldTokens):
        for key, ref in super().process(seq):
            yield key, SequenceRef(*ref, seq.words, seq.mismatch)


def copy_counts(refs: list[SequenceRef]) -> DocumentCounts:
    """What the sequences of one copy of a document added to its split's counts."""
    return DocumentCounts(1, len(refs), sum(r.words for r in refs), sum(r.length for r in refs), refs[0].mismatch)


class Deduplicated(NamedTuple):
    kept: list[SequenceRef]
    dropped_copies: list[DocumentCounts]  # one per copy left out


def drop_duplicate_sequences(refs: Iterable[SequenceRef]) -> Deduplicated:
    """Refs of whole documents (one sequence each): one per id, the first by (input file, row)."""
    refs = list(refs)
    kept, _ = drop_duplicates(refs)
    keep = {id(r) for r in kept}
    return Deduplicated(kept, [copy_counts([r]) for r in refs if id(r) not in keep])


def keep_first_copy(doc_id: str, refs: Iterable[SequenceRef]) -> Deduplicated:
    """Refs of the sequences of every copy of one source id: every sequence of the first copy by
    (input file, row), the rule of transforms.write.drop_duplicates, and the others' counts."""
    copies: dict[tuple[str, int], list[SequenceRef]] = {}
    for ref in refs:
        copies.setdefault((ref.source, ref.row), []).append(ref)
    if len(copies) == 1:
        return Deduplicated(next(iter(copies.values())), [])
    # One stand-in per copy under the source id, so that the bucketed job's rule picks the copy.
    [first], _ = drop_duplicates(seqs[0]._replace(id=doc_id) for seqs in copies.values())
    winner = (first.source, first.row)
    return Deduplicated(copies[winner], [copy_counts(seqs) for origin, seqs in copies.items() if origin != winner])


class _DropCopiesFn(beam.DoFn):
    """Counts the copies a deduplicating step leaves out: a ``duplicate_id`` drop each, and the
    negative of its counts, so that the split's totals are those of the documents kept."""

    def __init__(self, config: LlmcShardConfig):
        self._config = config
        self._duplicates = beam.metrics.Metrics.counter("pretokenize", f"dropped_{DUPLICATE_ID}")

    def setup(self):
        self._reported = 0

    def _dropped(self, split: str, result: Deduplicated, where: str) -> Iterator:
        if not result.dropped_copies:
            return
        self._duplicates.inc(len(result.dropped_copies))
        if self._reported < 20:
            self._reported += 1
            log.warning("%s: %d documents dropped as copies of an id already kept", where, len(result.dropped_copies))
        for c in result.dropped_copies:
            yield beam.pvalue.TaggedOutput(DROPPED, DUPLICATE_ID)
            yield beam.pvalue.TaggedOutput(COUNTS, (split, DocumentCounts(*(-x for x in c))))


class KeepFirstCopiesFn(_DropCopiesFn):
    """((split, source id), refs of every copy) in; ((split, range), ref) of the first copy out."""

    def process(self, element):
        (split, doc_id), refs = element
        result = keep_first_copy(doc_id, refs)
        self._config.inject_failure("dedupe")
        for ref in result.kept:
            yield range_key(split, ref.sort_key, self._config), ref
        yield from self._dropped(split, result, f"{split} id {doc_id!r}")


class DropDuplicateIdsFn(_DropCopiesFn):
    """((split, range), refs) in; ((split, range), the refs kept) out. Without
    chunked_documents, copies of an id are dropped here; with it, KeepFirstCopies did that."""

    def process(self, element):
        (split, rng), refs = element
        if self._config.chunked_documents:
            result = Deduplicated(list(refs), [])
        else:
            result = drop_duplicate_sequences(refs)
        self._config.inject_failure("dedupe")
        yield (split, rng), result.kept
        yield from self._dropped(split, result, f"{split} range {rng}")


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
    split: str, rng: int, refs: Iterable[DocRef], placement: Placement, shard_tokens: int
) -> Iterator[tuple[tuple[str, int], tuple[int, DocRef]]]:
    """Each sequence of one range, cut at shard boundaries: ((split, shard), (position, piece))."""
    position = placement.starts[(split, rng)]
    for ref in sorted(refs, key=ref_order):
        end = position + ref.length
        for shard in range(position // shard_tokens, (end - 1) // shard_tokens + 1):
            shard_start = shard * shard_tokens
            lo, hi = max(position, shard_start), min(end, shard_start + shard_tokens)
            piece = DocRef(ref.sort_key, ref.id, hi - lo, ref.spill_path, ref.offset + (lo - position) * ITEMSIZE,
                           ref.source, ref.row)
            yield (split, shard), (lo - shard_start, piece)
        position = end


class StagedShard(NamedTuple):
    split: str
    index: int
    tokens: int
    rel_path: str
    sha256: str = ""  # of the whole file, header included, computed as it was written


def write_shard(
    split: str, index: int, pieces: Iterable[tuple[int, DocRef]], placement: Placement, config: LlmcShardConfig,
    fs=None,
) -> StagedShard:
    """One shard: header, then its pieces in position order streamed from the spill files (hashed
    on the way, for checksums.sha256)."""
    if fs is None:
        fs, _ = storage.filesystem(config.output)
    lengths = placement.shard_lengths(split, config.shard_tokens)
    expected = lengths[index]
    ordered = sorted(pieces, key=lambda p: p[0])
    position = 0
    for start, piece in ordered:
        if start != position:
            raise AssertionError(f"{split} shard {index}: a piece starts at {start}, expected {position}")
        position += piece.length
    if position != expected:
        raise AssertionError(f"{split} shard {index}: pieces hold {position} tokens, expected {expected}")
    rel_path = llmc.shard_rel_path(split, index, llmc.shard_digits(len(lengths)))
    _, staged = storage.filesystem(config.staged_url)
    reader = _SpillReader(fs, ITEMSIZE)
    out = _AtomicFile(fs, posixpath.join(staged, rel_path))
    digest = hashlib.sha256()
    try:
        header = llmc.make_header(expected)
        out.file.write(header)
        digest.update(header)
        for _, data in reader.stream([piece for _, piece in ordered]):
            out.file.write(data)
            digest.update(data)
        out.commit()
    except BaseException:
        out.abort()
        raise
    finally:
        reader.close()
    return StagedShard(split, index, expected, rel_path, digest.hexdigest())


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
        (split, index), pieces = element
        staged = write_shard(split, index, pieces, placement, self._config, self._fs)
        self._config.inject_failure("write")
        self._tokens.inc(staged.tokens)
        self._files.inc()
        self._progress.add(files=1, tokens=staged.tokens)
        yield staged


class WrittenLlmcShards(NamedTuple):
    """What WriteLlmcShards gives: a StagedShard per shard, a ``duplicate_id`` per copy of an id
    left out, and a (split, negative DocumentCounts) per such copy, to add to the encoded counts."""

    staged: beam.PCollection
    dropped: beam.PCollection
    counts: beam.PCollection


class WriteLlmcShards(beam.PTransform):
    """ScaffoldTokens in; WrittenLlmcShards out, files staged (PublishLlmcOutput publishes).

    Example::

        written = sequences | "WriteLlmcShards" >> WriteLlmcShards(LlmcShardConfig("out/", run_id="r1"))
        staged, duplicates, taken_back = written.staged, written.dropped, written.counts
    """

    def __init__(self, config: LlmcShardConfig):
        super().__init__()
        self._config = config

    def expand(self, sequences):
        group = tuple[str, str] if self._config.chunked_documents else tuple[str, int]
        refs = sequences | "SpillTokens" >> beam.ParDo(
            SpillSequencesFn(self._config, llmc_spill_key)).with_output_types(tuple[group, SequenceRef])
        drops, counts = [], []
        if self._config.chunked_documents:
            firsts = (
                refs
                | "GroupCopiesById" >> beam.GroupByKey()
                | "KeepFirstCopies" >> beam.ParDo(KeepFirstCopiesFn(self._config))
                .with_output_types(tuple[tuple[str, int], SequenceRef])
                .with_outputs(DROPPED, COUNTS, main="refs")
            )
            refs = firsts.refs
            drops.append(firsts[DROPPED])
            counts.append(firsts[COUNTS])
        ranges = (
            refs
            | "GroupByRange" >> beam.GroupByKey()
            | "DropDuplicateIds" >> beam.ParDo(DropDuplicateIdsFn(self._config))
            .with_output_types(tuple[tuple[str, int], list[SequenceRef]])
            .with_outputs(DROPPED, COUNTS, main="ranges")
        )
        drops.append(ranges[DROPPED])
        counts.append(ranges[COUNTS])
        # Positions come from the ranges as deduplicated: a dropped copy takes no room in the stream.
        placement = (
            ranges.ranges
            | "RangeTokens" >> beam.MapTuple(lambda key, kept: (key, sum(r.length for r in kept)))
            | "CollectRangeTokens" >> beam.combiners.ToList()
            | "RangeOffsets" >> beam.Map(make_placement)
        )
        side = beam.pvalue.AsSingleton(placement)
        staged = (
            ranges.ranges
            | "PlaceDocuments"
            >> beam.ParDo(PlaceDocumentsFn(self._config), side).with_output_types(
                tuple[tuple[str, int], tuple[int, DocRef]]
            )
            | "GroupByShardFile" >> beam.GroupByKey()
            | "WriteShardFiles" >> beam.ParDo(WriteShardFileFn(self._config), side)
        )
        return WrittenLlmcShards(
            staged,
            tuple(drops) | "CollectDuplicates" >> beam.Flatten(),
            tuple(counts) | "CollectTakenBack" >> beam.Flatten(),
        )


@dataclasses.dataclass(frozen=True)
class LlmcSettings:
    """The job settings dataset_stats.txt records beside the counts."""

    tokenizer: str
    annotate: bool
    long_docs: str
    max_word_chars: int
    val_fraction: float


def compute_stats(
    staged: list[StagedShard],
    raw_documents: int,
    drops: dict[str, int],
    counts: dict[str, DocumentCounts],
    settings: LlmcSettings,
    config: LlmcShardConfig,
) -> ScaffoldStats:
    """The stats of a run, after checking that every document and token is accounted for."""
    splits = {name: SplitStats() for name in llmc.SPLITS}
    counts = {name: DocumentCounts(*c) for name, c in counts.items()}
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
        if indices != list(range(len(llmc.shard_lengths(written[name], config.shard_tokens)))):
            raise UnaccountedDocumentsError(f"{name}: staged shards {indices} are not 0..n-1; refusing to publish")
    stats = ScaffoldStats(
        raw_documents=raw_documents,
        tokenizer=settings.tokenizer,
        annotate=settings.annotate,
        long_docs=settings.long_docs,
        max_word_chars=settings.max_word_chars,
        val_fraction=settings.val_fraction,
        seed=config.seed,
        shard_tokens=config.shard_tokens,
        countdown_mismatches=sum(c.countdown_mismatches for c in counts.values()),
        splits=splits,
        drops=dict(sorted(drops.items())),
    )
    if stats.kept_documents + stats.dropped_documents != raw_documents:
        raise UnaccountedDocumentsError(
            f"{raw_documents} documents were read, but {stats.kept_documents} written + "
            f"{stats.dropped_documents} dropped = {stats.kept_documents + stats.dropped_documents}; "
            "refusing to publish an output that lost or duplicated documents"
        )
    return stats


def publish(
    staged: list[StagedShard],
    raw_documents: int,
    drops: dict[str, int],
    counts: dict[str, DocumentCounts],
    settings: LlmcSettings,
    config: LlmcShardConfig,
) -> ScaffoldStats:
    """Move a run's staged shards into place; dataset_stats.txt last, as the commit point.

    Every step can be repeated, so a retried publish finishes the job: (1) check and compute the
    stats, (2) remove the old dataset_stats.txt, (3) delete the files the tree's ownership record
    lists that this run does not write (shards/tree.py: nothing else is ever touched), (4) move
    the staged shards to their names, (5) write checksums.sha256, then dataset_stats.txt, (6)
    remove the run's temporary directory (spill files, staging).
    """
    stats = compute_stats(staged, raw_documents, drops, counts, settings, config)
    fs, root = storage.filesystem(config.output)
    mark_publishing(config)
    final_stats = posixpath.join(root, layout.STATS_NAME)
    if fs.exists(final_stats):
        fs.rm(final_stats)
    replace_files(config, "scaffold", {s.rel_path for s in staged})
    sums = format_checksums({s.rel_path: s.sha256 for s in staged})
    tree.write_file(config.output, layout.CHECKSUMS_NAME, sums.encode())
    commit(config, stats.to_text())
    log.info("published %d files, %d documents to %s", stats.total_files, stats.kept_documents, config.output)
    return stats


class PublishFn(beam.DoFn):
    def __init__(self, config: LlmcShardConfig, settings: LlmcSettings):
        self._config = config
        self._settings = settings

    def process(self, staged, raw_documents: int, drops: dict[str, int], counts: dict[str, DocumentCounts]):
        yield publish(staged, raw_documents, drops, counts, self._settings, self._config)


class PublishLlmcOutput(beam.PTransform):
    """StagedShards in; publishes once all are staged and yields the ScaffoldStats.

    ``raw_documents`` is a PCollection of one count, ``drop_reasons`` one reason string per dropped
    document, ``counts`` one (split, DocumentCounts) per encoded document and one negative per
    copy of an id WriteLlmcShards left out (their sums are the documents kept).
    """

    def __init__(self, config: LlmcShardConfig, settings: LlmcSettings, raw_documents, drop_reasons, counts):
        super().__init__()
        self._config = config
        self._settings = settings
        self._raw = raw_documents
        self._drops = drop_reasons
        self._counts = counts

    def expand(self, staged):
        drop_counts = self._drops | "CountDropReasons" >> beam.combiners.Count.PerElement()
        split_counts = self._counts | "SumSplitCounts" >> beam.CombinePerKey(sum_counts)
        return (
            staged
            | "CollectStagedShards" >> beam.combiners.ToList()
            | "PublishFiles"
            >> beam.ParDo(
                PublishFn(self._config, self._settings),
                raw_documents=beam.pvalue.AsSingleton(self._raw),
                drops=beam.pvalue.AsDict(drop_counts),
                counts=beam.pvalue.AsDict(split_counts),
            )
        )
