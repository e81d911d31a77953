"""CountWords: the words of the documents, counted on Beam, written as count shards for the launcher.

    batches | "CountWords" >> CountWords(CountConfig("qwen2", run_url, min_count=2, max_words=5_000_000))

1. Each DocBatch's texts are cut into words (transforms.bpe.pretokenize) and counted in the worker,
   batch by batch; the batch's table goes out as ``shards`` partial tables, a word's shard being a
   CRC-32 of its UTF-8 bytes, so a word lands in the same shard on every worker.
2. ``CombinePerKey(SumWordCounts())`` adds the partial tables of each shard. The runner combines
   before the shuffle (on the worker that counted) and after it, so each shard's table is summed in
   pieces, on as many workers as there are shards.
3. Each shard's exact table is pruned (below) and written to ``counts-SSSSS.json`` in the run's
   directory; the launcher reads them all.

The pruning rule, applied to exact corpus-wide counts so the table is the same for any worker count:

    - a word seen fewer than ``min_count`` times is left out;
    - of the rest, when more than ``max_words`` remain (0: no limit), the ``max_words`` most frequent
      are kept, ties going to the word whose UTF-8 bytes sort first.

Each shard writes only its own first ``max_words`` by that order; the corpus's first ``max_words``
are all among them, so the launcher picks exactly those while reading at most ``shards *
max_words`` words. ``max_words`` bounds the launcher's memory (the learner holds every kept word);
``min_count`` drops the long tail of words seen once or twice, which is most of the distinct words
of a large corpus. Counting memory is one batch's table in a worker and one shard's table where a
shard is summed: raise ``shards`` for a corpus with more distinct words.

The step also sums, over the documents it sees, ``documents``, ``characters`` and ``pre_tokens``:
output ``stats``, ``(name, n)`` pairs.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import zlib
from collections import Counter

import apache_beam as beam

from shards import storage
from transforms.bpe import pretokenize
from transforms.core.batches import DocBatch

STATS = "stats"


@dataclasses.dataclass(frozen=True)
class CountConfig:
    pattern: str
    run_url: str  # the run's temporary directory: the count shards go there
    shards: int = 16
    min_count: int = 1
    max_words: int = 0  # 0: no limit

    def __post_init__(self):
        pretokenize.compiled(self.pattern)
        if self.shards < 1:
            raise ValueError(f"--count-shards must be at least 1, got {self.shards}")
        if self.min_count < 1:
            raise ValueError(f"--min-count must be at least 1, got {self.min_count}")
        if self.max_words < 0:
            raise ValueError(f"--max-words must be 0 (no limit) or more, got {self.max_words}")

    def shard_url(self, shard: int) -> str:
        return storage.join(self.run_url, f"counts-{shard:05d}.json")


def word_key(word: str) -> bytes:
    """A word's UTF-8 bytes: what the shards and the pruning order words by."""
    return word.encode("utf-8", "surrogatepass")


def shard_of(word: str, shards: int) -> int:
    return zlib.crc32(word_key(word)) % shards


def prune(counts: dict[str, int], min_count: int, max_words: int) -> list[tuple[str, int]]:
    """The kept (word, count) pairs of ``counts`` by the pruning rule, sorted by the word's bytes."""
    kept = [(w, n) for w, n in counts.items() if n >= min_count]
    if max_words and len(kept) > max_words:
        kept = heapq.nsmallest(max_words, kept, key=lambda item: (-item[1], word_key(item[0])))
    kept.sort(key=lambda item: word_key(item[0]))
    return kept


class CountWordsFn(beam.DoFn):
    """DocBatches in; ``(shard, {word: count})`` partial tables out, and ``(name, n)`` stats."""

    def __init__(self, config: CountConfig):
        self._config = config

    def setup(self):
        self._findall = pretokenize.compiled(self._config.pattern).findall

    def process(self, batch: DocBatch):
        counts: Counter = Counter()
        characters = 0
        for text in batch.column("text"):
            characters += len(text)
            counts.update(self._findall(text))
        parts: list[dict[str, int]] = [{} for _ in range(self._config.shards)]
        shards = self._config.shards
        for word, n in counts.items():
            parts[zlib.crc32(word_key(word)) % shards][word] = n
        for shard, part in enumerate(parts):
            if part:
                yield shard, part
        yield beam.pvalue.TaggedOutput(STATS, ("documents", batch.size))
        yield beam.pvalue.TaggedOutput(STATS, ("characters", characters))
        yield beam.pvalue.TaggedOutput(STATS, ("pre_tokens", sum(counts.values())))


class SumWordCounts(beam.CombineFn):
    """Adds word tables: the accumulator is a dict from word to count."""

    def create_accumulator(self) -> dict[str, int]:
        return {}

    def add_input(self, acc: dict[str, int], table: dict[str, int]) -> dict[str, int]:
        get = acc.get
        for word, n in table.items():
            acc[word] = get(word, 0) + n
        return acc

    def merge_accumulators(self, accs) -> dict[str, int]:
        accs = list(accs)
        largest = max(range(len(accs)), key=lambda i: len(accs[i]))
        out = accs[largest]
        for i, acc in enumerate(accs):
            if i != largest:
                self.add_input(out, acc)
        return out

    def extract_output(self, acc: dict[str, int]) -> dict[str, int]:
        return acc


class WriteCountShardFn(beam.DoFn):
    """``(shard, table)`` in: the pruned table written as JSON ``[[word, count], ...]`` (sorted by the
    word's bytes) to the shard's file; ``("distinct_words", n)`` out."""

    def __init__(self, config: CountConfig):
        self._config = config

    def process(self, item):
        shard, table = item
        kept = prune(table, self._config.min_count, self._config.max_words)
        data = json.dumps(kept, ensure_ascii=False).encode("utf-8", "surrogatepass")
        storage.write_atomic(self._config.shard_url(shard), data)
        yield "distinct_words", len(table)


def read_count_shards(config: CountConfig) -> list[tuple[str, int]]:
    """The launcher's side: every shard's kept words, pruned again across shards (``max_words``),
    sorted by the word's bytes."""
    fs, _ = storage.filesystem(config.run_url)
    merged: dict[str, int] = {}
    for shard in range(config.shards):
        url = config.shard_url(shard)
        fs_path = storage.filesystem(url)[1]
        if not fs.exists(fs_path):
            continue  # no document had a word in this shard
        for word, n in json.loads(fs.cat_file(fs_path).decode("utf-8", "surrogatepass")):
            merged[word] = n
    return prune(merged, config.min_count, config.max_words)


class CountWords(beam.PTransform):
    """DocBatches in; the count shards written. Outputs ``distinct`` (``("distinct_words", n)`` per
    shard) and ``stats`` (``(name, n)`` per batch)."""

    def __init__(self, config: CountConfig):
        super().__init__()
        self._config = config

    def expand(self, batches):
        counted = batches | "CountBatchWords" >> beam.ParDo(CountWordsFn(self._config)).with_outputs(
            STATS, main="tables"
        )
        return {"distinct": counted.tables | "WriteWordCounts" >> WriteWordCounts(self._config), STATS: counted[STATS]}


class WriteWordCounts(beam.PTransform):
    """CountWordsFn's ``(shard, {word: count})`` partial tables in; each shard's table summed,
    pruned and written (steps 2 and 3 above); ``("distinct_words", n)`` per shard out. The
    train-bpe job runs CountWordsFn among its units' steps (transforms.run.steps.RunUnits)."""

    def __init__(self, config: CountConfig):
        super().__init__()
        self._config = config

    def expand(self, tables):
        return (
            tables
            | "SumWordCounts" >> beam.CombinePerKey(SumWordCounts())
            | "WriteCountShards" >> beam.ParDo(WriteCountShardFn(self._config))
        )
