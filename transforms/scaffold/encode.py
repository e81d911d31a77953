"""EncodeScaffold: documents to countdown ("scaffold") token sequences, each ending with EOT.

A document becomes words, one of two ways:

    annotated   ``content-ff`` text ``<ff_N> word <ff_N-1> word ... <ff_0> .``: a word is the text
                between one marker and the next, surrounding whitespace removed. Markers are exactly
                ``<ff_`` ASCII digits ``>``; any other ``<`` or ``>`` is text and stays in its word.
                Non-blank text before the first marker is a word of its own; a marker with no word
                after it is skipped. The countdown is recomputed from the words; a document whose
                markers say otherwise is written with the recomputed one and counted as a mismatch.
    --annotate  plain text split by ANNOTATE_RULE (below): runs of letters and digits are words,
                every other visible character (punctuation, symbols) is a word of its own.

Each word then becomes its countdown token ``50257 + N`` (N = words after it) followed by the
GPT-2 BPE ids of the word encoded on its own, without a leading space (``encode("econômicas")``,
not ``encode(" econômicas")``), as the published scaffold model was trained. EOT 50256 ends the
document. <|endoftext|> inside a word is text, never the EOT id.

Documents with more than 1,000 words cannot be counted down with ids 50257..51256: ``skip`` drops
them (reason ``too_many_words``), ``chunk`` cuts them into documents of 1,000 words (the last one
shorter), each with its own countdown. Every dropped document is counted with its reason.

The split (train or val) is a stable hash of the source document's id, so all chunks of a
document land in the same split.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import regex

from shards import llmc
from transforms.core.batches import DocBatch, TokenBatch
from transforms.core.drops import Drops
from transforms.core.progress import Progress
from transforms.core.records import Document
from transforms.scaffold.defaults import DEFAULT_MAX_WORD_CHARS, LONG_DOC_POLICIES
from transforms.tokenizers.encoder import Encoder
from transforms.tokenizers.load import check_unchanged, load_encoder

DROPPED = "dropped"
COUNTS = "counts"
DROP_REASONS = ("no_words", "too_many_words", "word_too_long")

# Markers are exactly <ff_N> with N in ASCII digits (re's \d would take other scripts' digits too).
_MARKER = re.compile(r"<ff_([0-9]+)>")

# The --annotate rule, one of:
#   a run of letters, marks and digits (\p{L}\p{M}\p{N}), which may continue across one joiner
#   between two such characters: an apostrophe ' or ’, a hyphen - ‐ ‑, or . , : / between two digits
#   (so d'água, Estados‐Membros, 1.948, 3,5, 10:30 and 10/12/1948 are one word each);
#   or any other single character that is not whitespace (punctuation and symbols are words).
ANNOTATE_RULE = regex.compile(
    r"[\p{L}\p{M}\p{N}]+(?:(?:['’\-\u2010\u2011]|(?<=\p{N})[.,:/](?=\p{N}))[\p{L}\p{M}\p{N}]+)*|\S"
)


class ParsedWords(NamedTuple):
    words: list[str]
    mismatch: bool  # the input's countdown differs from the recomputed one


def annotate(text: str, limit: int | None = None) -> list[str]:
    """The words of plain text by ANNOTATE_RULE; whitespace only separates.

    With ``limit``, at most that many: the scan stops there, whatever the length of the text.
    """
    if limit is None:
        return ANNOTATE_RULE.findall(text)
    return [m.group() for m in itertools.islice(ANNOTATE_RULE.finditer(text), limit)]


def _marker_segments(text: str) -> Iterator[tuple[str | None, str]]:
    """(declared countdown, text up to the next marker): first (None, the text before any marker).

    The countdown is kept as its digits, leading zeros removed: a marker with thousands of digits
    is only text to compare, never a number Python refuses to convert.
    """
    declared, start = None, 0
    for m in _MARKER.finditer(text):
        yield declared, text[start:m.start()]
        declared, start = m.group(1).lstrip("0") or "0", m.end()
    yield declared, text[start:]


def parse_annotated(text: str, limit: int | None = None) -> ParsedWords:
    """The words of ``content-ff`` text, and whether its markers' countdown was right.

    With ``limit``, at most that many words (the scan stops there) and ``mismatch`` is not computed.
    """
    words: list[str] = []
    declared: list[str | None] = []
    mismatch = False
    for number, segment in _marker_segments(text):
        word = segment.strip()
        if word:
            words.append(word)
            declared.append(number)
            if limit is not None and len(words) >= limit:
                return ParsedWords(words, False)
        elif number is not None:
            mismatch = True  # a marker with no word: the countdown after it is off by one
    n = len(words)
    # Text before the first marker declares no countdown (None): a mismatch too.
    mismatch = mismatch or any(d != str(n - 1 - i) for i, d in enumerate(declared))
    return ParsedWords(words, mismatch)


def format_annotated(words: Sequence[str]) -> str:
    """``<ff_N> word ... <ff_0> word``: content-ff text of words (any number of them)."""
    n = len(words)
    return " ".join(f"<ff_{n - 1 - i}> {w}" for i, w in enumerate(words))


def plan_sequences(words: list[str], policy: str, max_words: int = llmc.MAX_WORDS) -> list[list[str]] | None:
    """The word lists to write for one document: itself, its chunks, or None to drop it."""
    if len(words) <= max_words:
        return [words]
    if policy == "skip":
        return None
    if policy == "chunk":
        return [words[i:i + max_words] for i in range(0, len(words), max_words)]
    raise ValueError(f"unknown long-document policy {policy!r}; choose one of {LONG_DOC_POLICIES}")


def countdown_tokens(word_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """``ff(n-1) ids(word 0) ff(n-2) ids(word 1) ... ff(0) ids(word n-1) EOT`` as little-endian uint16.

    Every word must have at least one id, and there are at most 1,000 words.
    """
    n = len(word_ids)
    if not 1 <= n <= llmc.MAX_WORDS:
        raise ValueError(f"a scaffold document has 1..{llmc.MAX_WORDS} words, got {n}")
    lengths = np.fromiter((len(ids) for ids in word_ids), dtype=np.int64, count=n)
    if lengths.min() < 1:
        raise ValueError("every word needs at least one BPE id")
    total = int(lengths.sum()) + n + 1
    out = np.empty(total, dtype=llmc.TOKEN_DTYPE)
    ff_pos = np.concatenate(([0], np.cumsum(lengths + 1)[:-1]))
    is_bpe = np.ones(total, dtype=bool)
    is_bpe[ff_pos] = False
    is_bpe[-1] = False
    out[ff_pos] = llmc.FF_BASE + np.arange(n - 1, -1, -1)
    out[is_bpe] = np.fromiter((i for ids in word_ids for i in ids), dtype=np.int64, count=int(lengths.sum()))
    out[-1] = llmc.GPT2_EOT
    return out


def check_gpt2_vocabulary(encoder: Encoder) -> None:
    """The countdown ids start right after GPT-2's EOT: the tokenizer must be GPT-2's vocabulary."""
    if encoder.eos_id != llmc.GPT2_EOT or encoder.max_token_id != llmc.GPT2_EOT:
        raise ValueError(
            f"the scaffold format needs GPT-2's vocabulary (ids 0..50255, EOT 50256), but {encoder.spec!r} has "
            f"EOS {encoder.eos_id} and ids up to {encoder.max_token_id}; use --tokenizer gpt2 or tiktoken:PATH"
        )


class ScaffoldTokens(NamedTuple):
    """One sequence to store: its tokens (countdown, BPE ids, EOT), and the split it goes to.

    ``id`` is the source id, or ``{id}#{k}`` for chunk k of a document cut by --long-docs chunk;
    ``doc_id`` is always the source id. ``words`` counts this sequence's words and ``mismatch``
    (0 or 1) is its source document's flag: what a writer dropping a copy of the document takes
    back from the counts.
    """

    id: str
    tokens: np.ndarray
    source: str
    row: int
    split: str
    doc_id: str
    words: int
    mismatch: int


class DocumentCounts(NamedTuple):
    """What one kept source document added to its split."""

    documents: int
    sequences: int
    words: int
    tokens: int
    countdown_mismatches: int


def sum_counts(values) -> DocumentCounts:
    """Element-wise sum of DocumentCounts (a CombinePerKey function: associative, any order)."""
    total = [0, 0, 0, 0, 0]
    for v in values:
        for i, x in enumerate(v):
            total[i] += x
    return DocumentCounts(*total)


@dataclasses.dataclass(frozen=True)
class ScaffoldConfig:
    """How documents become scaffold sequences. ``tokenizer`` is a spec of shards/tokenizer_spec.py."""

    tokenizer: str = "gpt2"
    annotate: bool = False
    long_docs: str = "skip"
    val_fraction: float = llmc.DEFAULT_VAL_FRACTION
    max_word_chars: int = DEFAULT_MAX_WORD_CHARS
    word_cache_size: int = 200_000
    tokenizer_files: tuple[tuple[str, str], ...] = ()  # the launch's (``pinned``): each worker's load checks them

    def __post_init__(self):
        if self.long_docs not in LONG_DOC_POLICIES:
            raise ValueError(f"--long-docs must be one of {LONG_DOC_POLICIES}, got {self.long_docs!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction must be within [0, 1), got {self.val_fraction}")
        if self.max_word_chars < 0:
            raise ValueError(f"--max-word-chars must be >= 0 (0: no limit), got {self.max_word_chars}")
        if self.word_cache_size < 0:
            raise ValueError("word_cache_size must be >= 0")

    def load(self) -> Encoder:
        """The encoder, checked to be GPT-2's vocabulary: the launcher calls this once to fail early,
        each worker in setup() (then its files must be the launch's: transforms.tokenizers.load.check_unchanged)."""
        encoder = check_unchanged(self.tokenizer, self.tokenizer_files, lambda: load_encoder(self.tokenizer))
        check_gpt2_vocabulary(encoder)
        return encoder

    def pinned(self, encoder: Encoder) -> ScaffoldConfig:
        """This config, its workers held to the files ``encoder`` (the launch's) was built from."""
        return dataclasses.replace(self, tokenizer_files=encoder.files)


class Encoded(NamedTuple):
    """What encode_document gives: the sequences, or the drop reason; and the counts."""

    sequences: list[ScaffoldTokens]
    drop_reason: str | None
    counts: DocumentCounts | None


class WordEncoder:
    """GPT-2 ids of words, each encoded on its own; a bounded cache serves the frequent ones."""

    def __init__(self, encoder: Encoder, cache_size: int):
        self._encoder = encoder
        self._cache: dict[str, list[int]] = {}
        self._cache_size = cache_size

    def encode(self, words: Sequence[str]) -> list[list[int]]:
        missing = list(dict.fromkeys(w for w in words if w not in self._cache))
        fresh = dict(zip(missing, self._encoder.encode_batch(missing), strict=True)) if missing else {}
        out = [self._cache[w] if w in self._cache else fresh[w] for w in words]
        if self._cache_size:
            if len(self._cache) + len(fresh) > self._cache_size:
                self._cache.clear()
            if len(fresh) <= self._cache_size:
                self._cache.update(fresh)
        return out


def words_of(doc: Document, annotate_plain: bool, limit: int | None = None) -> ParsedWords:
    """The document's words (at most ``limit``, see annotate and parse_annotated)."""
    if annotate_plain:
        return ParsedWords(annotate(doc.text, limit), False)
    return parse_annotated(doc.text, limit)


class Planned(NamedTuple):
    """A kept document's words and how they are cut into sequences, before any word is encoded."""

    doc: Document
    words: list[str]
    plan: list[list[str]]
    mismatch: bool


def plan_document(doc: Document, config: ScaffoldConfig) -> Planned | str:
    """The document's words and sequences, or the reason it is dropped. Plain function: no Beam.

    The reasons, checked in this order: ``no_words``; ``too_many_words`` (under ``skip``: the
    words are only read up to the 1,001st, so a 50 MB document costs no more than a short one);
    ``word_too_long``.
    """
    skip = config.long_docs == "skip"
    parsed = words_of(doc, config.annotate, llmc.MAX_WORDS + 1 if skip else None)
    words = parsed.words
    if not words:
        return "no_words"
    if skip and len(words) > llmc.MAX_WORDS:
        return "too_many_words"
    if config.max_word_chars and max(len(w) for w in words) > config.max_word_chars:
        return "word_too_long"
    return Planned(doc, words, plan_sequences(words, config.long_docs), parsed.mismatch)


def build_sequences(planned: Planned, ids: Sequence[Sequence[int]], config: ScaffoldConfig) -> Encoded:
    """A planned document's sequences from the ids of its words (``ids[i]`` is word i's)."""
    doc = planned.doc
    split = llmc.split_of(doc.id, config.val_fraction)
    sequences, start = [], 0
    for k, chunk in enumerate(planned.plan):
        tokens = countdown_tokens(ids[start:start + len(chunk)])
        start += len(chunk)
        seq_id = doc.id if len(planned.plan) == 1 else f"{doc.id}#{k}"
        sequences.append(ScaffoldTokens(seq_id, tokens, doc.source, doc.row, split, doc.id, len(chunk),
                                        int(planned.mismatch)))
    counts = DocumentCounts(1, len(sequences), len(planned.words), sum(len(s.tokens) for s in sequences),
                            int(planned.mismatch))
    return Encoded(sequences, None, counts)


def encode_document(doc: Document, config: ScaffoldConfig, words_encoder: WordEncoder) -> Encoded:
    """One source document to its sequences (or a drop reason, see plan_document)."""
    planned = plan_document(doc, config)
    if isinstance(planned, str):
        return Encoded([], planned, None)
    return build_sequences(planned, words_encoder.encode(planned.words), config)


def encode_documents(docs: Sequence[Document], config: ScaffoldConfig, words_encoder: WordEncoder) -> list[Encoded]:
    """Documents to their sequences, as encode_document gives them one by one, with the words of all
    the kept documents encoded in one batch call."""
    planned = [plan_document(doc, config) for doc in docs]
    kept = [p for p in planned if not isinstance(p, str)]
    ids = words_encoder.encode([w for p in kept for w in p.words])
    out, start = [], 0
    for p in planned:
        if isinstance(p, str):
            out.append(Encoded([], p, None))
            continue
        out.append(build_sequences(p, ids[start:start + len(p.words)], config))
        start += len(p.words)
    return out


SPLIT_CODES = {name: code for code, name in enumerate(llmc.SPLITS)}


def sequences_batch(source: str, sequences: Sequence[ScaffoldTokens]) -> TokenBatch:
    """A batch's sequences as one TokenBatch: tokens end to end, and per sequence its split (as an
    index of llmc.SPLITS), words, countdown-mismatch flag and source document id."""
    tokens = [s.tokens for s in sequences]
    return TokenBatch(
        source=source,
        ids=[s.id for s in sequences],
        rows=np.fromiter((s.row for s in sequences), np.int64, len(sequences)),
        lengths=np.fromiter((len(t) for t in tokens), np.int64, len(sequences)),
        tokens=np.concatenate(tokens).astype(llmc.TOKEN_DTYPE, copy=False),
        extra={
            "split": np.fromiter((SPLIT_CODES[s.split] for s in sequences), np.int8, len(sequences)),
            "words": np.fromiter((s.words for s in sequences), np.int64, len(sequences)),
            "mismatch": np.fromiter((s.mismatch for s in sequences), np.int8, len(sequences)),
            "doc_id": np.array([s.doc_id for s in sequences], dtype=object),
        },
    )


class EncodeScaffoldFn(beam.DoFn):
    def __init__(self, config: ScaffoldConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_encoded")
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_encoded")
        self._mismatch = beam.metrics.Metrics.counter("pretokenize", "countdown_mismatch")

    def setup(self):
        self._words = WordEncoder(self._config.load(), self._config.word_cache_size)
        self._progress = Progress("scaffold")
        self._drops = Drops()

    def process(self, batch: DocBatch) -> Iterator:
        sequences: list[ScaffoldTokens] = []
        dropped: dict[str, int] = {}
        counts: dict[str, list[DocumentCounts]] = {}
        rows = batch.table.column("row").to_pylist()
        docs = [Document(doc_id, text, batch.source, row)
                for doc_id, text, row in zip(batch.column("id"), batch.column("text"), rows, strict=True)]
        for result in encode_documents(docs, self._config, self._words):
            if result.drop_reason is not None:
                dropped[result.drop_reason] = dropped.get(result.drop_reason, 0) + 1
                continue
            sequences.extend(result.sequences)
            counts.setdefault(result.sequences[0].split, []).append(result.counts)
        for reason, n in sorted(dropped.items()):
            yield self._drops(reason, n)
        for split, per_doc in sorted(counts.items()):
            total = sum_counts(per_doc)
            self._docs.inc(total.documents)
            self._tokens.inc(total.tokens)
            self._mismatch.inc(total.countdown_mismatches)
            self._progress.add(documents=total.documents, words=total.words, tokens=total.tokens)
            yield beam.pvalue.TaggedOutput(COUNTS, (split, total))
        if sequences:
            yield sequences_batch(batch.source, sequences)


class EncodeScaffold(beam.PTransform):
    """DocBatches in; TokenBatches of sequences (main), ``(reason, n)`` drops (``dropped``) and
    per-split ``(split, DocumentCounts)`` of the kept documents (``counts``) out.

    Example::

        encoded = batches | "EncodeScaffold" >> EncodeScaffold(ScaffoldConfig("gpt2", annotate=True))
        sequences, drops, counts = encoded.sequences, encoded.dropped, encoded.counts
    """

    def __init__(self, config: ScaffoldConfig):
        super().__init__()
        self._config = config

    def expand(self, batches):
        return batches | "EncodeWords" >> beam.ParDo(EncodeScaffoldFn(self._config)).with_outputs(
            DROPPED, COUNTS, main="sequences"
        )
