"""TokenizeDocuments: token ids of each document, with exactly one EOS appended.

The tokenizer is built once per worker in ``setup()``; each element is a batch of documents (a
DocBatch), and its tokens come out end to end in one array (a TokenBatch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from shards.layout import DEFAULT_DTYPE, check_dtype
from shards.tokenizer_spec import parse_spec
from transforms.core.batches import DocBatch, TokenBatch
from transforms.core.progress import Progress
from transforms.tokenizers.encoder import Encoder
from transforms.tokenizers.load import check_options, check_unchanged, load_encoder


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """``backend``: auto, quicktok or tiktoken (see transforms.tokenizers.backends); ``threads``: the
    threads of quicktok's batch call (1 per worker; more only for a local run on a large machine);
    ``special_tokens``: text (an added-token string in a document is text) or tokenizer (its id, as
    the tokenizer's Hugging Face release gives it; then an EOS may appear inside a document);
    ``files``: the (name, sha256) of the tokenizer's files as the launch loaded them (``pinned``),
    which each worker's load checks (transforms.tokenizers.load.check_unchanged)."""

    spec: str = "jet-nemotron"
    dtype: str = DEFAULT_DTYPE
    eos_token: str | None = None
    batch_docs: int = 64
    backend: str = "auto"
    threads: int = 1
    special_tokens: str = "text"
    files: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.batch_docs < 1:
            raise ValueError("batch_docs must be at least 1")
        check_options(self.backend, self.threads, self.special_tokens)
        parse_spec(self.spec)  # an unknown spec is said before anything is planned or loaded

    def load(self) -> Encoder:
        """The encoder, checked against the dtype (and a quicktok one against tiktoken, by the probe):
        the launcher calls this once to fail early, each worker once in setup()."""
        encoder = check_unchanged(self.spec, self.files, lambda: load_encoder(
            self.spec, self.eos_token, backend=self.backend, threads=self.threads, special_tokens=self.special_tokens))
        check_dtype(self.dtype, encoder.max_token_id)
        return encoder

    def pinned(self, encoder: Encoder) -> TokenizerConfig:
        """This config, its workers held to the files ``encoder`` (the launch's) was built from."""
        return dataclasses.replace(self, files=encoder.files)


def encode_batch(encoder: Encoder, batch: DocBatch, dtype: np.dtype, batch_docs: int) -> TokenBatch:
    """A DocBatch's documents tokenized, one EOS after each, end to end in one array of ``dtype``.
    The tokenizer is called on ``batch_docs`` documents at a time; each call gives its ids end to
    end with offsets (quicktok's batch call does so natively), so no array is made per document."""
    texts = batch.column("text")
    parts = [encoder.encode_tokens(texts[start:start + batch_docs]) for start in range(0, len(texts), batch_docs)]
    lengths, tokens = join_with_eos(parts, encoder.eos_id, dtype)
    rows = batch.table.column("row").to_numpy()
    return TokenBatch(batch.source, batch.column("id"), rows, lengths, tokens)


# Documents longer than this on average are copied one slice each; shorter ones by one masked copy
# per call (a slice costs a microsecond of Python, the mask a few nanoseconds a token).
SLICE_COPY_TOKENS = 256


def join_with_eos(parts: list[tuple[np.ndarray, np.ndarray]], eos_id: int,
                  dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(each document's length with its EOS, all documents' ids end to end, an EOS after each, as
    ``dtype``) from the tokenizer calls' (ids end to end, offsets): one copy of each id into place."""
    lengths = np.concatenate([np.diff(offsets) for _, offsets in parts]) if parts else np.zeros(0, np.int64)
    out = np.empty(int(lengths.sum()) + len(lengths), dtype)
    ends = np.cumsum(lengths + 1) - 1
    out[ends] = eos_id
    base = 0  # where the call's first document starts in ``out``
    for tokens, offsets in parts:
        docs = len(offsets) - 1
        if not docs:
            continue
        if len(tokens) > SLICE_COPY_TOKENS * docs:
            for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)):
                out[base + a + i:base + b + i] = tokens[a:b]
        else:
            span = out[base:base + len(tokens) + docs]
            mask = np.ones(len(span), bool)
            mask[offsets[1:] + np.arange(docs)] = False
            span[mask] = tokens
        base += len(tokens) + docs
    return (lengths + 1).astype(np.int64), out


class TokenizeFn(beam.DoFn):
    def __init__(self, config: TokenizerConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_tokenized")
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_tokenized")

    def setup(self):
        self._encoder = self._config.load()
        self._dtype = check_dtype(self._config.dtype, self._encoder.max_token_id)
        self._progress = Progress("tokenize")

    def process(self, batch: DocBatch) -> Iterator[TokenBatch]:
        encoded = encode_batch(self._encoder, batch, self._dtype, self._config.batch_docs)
        self._docs.inc(encoded.size)
        self._tokens.inc(len(encoded.tokens))
        self._progress.add(documents=encoded.size, tokens=len(encoded.tokens))
        yield encoded


class TokenizeDocuments(beam.PTransform):
    """DocBatches in, TokenBatches out (EOS appended, ``config.dtype``).

    Example::

        tokenized = kept | "TokenizeDocuments" >> TokenizeDocuments(TokenizerConfig("gpt2"))
    """

    def __init__(self, config: TokenizerConfig):
        super().__init__()
        self._config = config

    def expand(self, batches):
        return batches | "EncodeBatches" >> beam.ParDo(TokenizeFn(self._config))
