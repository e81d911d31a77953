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
from transforms.core.batches import DocBatch, TokenBatch
from transforms.core.encoders import Encoder, load_encoder
from transforms.core.progress import Progress


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    spec: str = "jet-nemotron"
    dtype: str = DEFAULT_DTYPE
    eos_token: str | None = None
    batch_docs: int = 64

    def __post_init__(self):
        if self.batch_docs < 1:
            raise ValueError("batch_docs must be at least 1")

    def load(self) -> Encoder:
        """The encoder, checked against the dtype: the launcher calls this once to fail early."""
        encoder = load_encoder(self.spec, self.eos_token)
        check_dtype(self.dtype, encoder.max_token_id)
        return encoder


def encode_batch(encoder: Encoder, batch: DocBatch, dtype: np.dtype, batch_docs: int) -> TokenBatch:
    """A DocBatch's documents tokenized, one EOS after each, end to end in one array of ``dtype``.
    The tokenizer is called on ``batch_docs`` documents at a time (a Rust tokenizer's batch call
    runs without the GIL)."""
    texts = batch.column("text")
    arrays: list[np.ndarray] = []
    for start in range(0, len(texts), batch_docs):
        arrays.extend(encoder.encode_arrays(texts[start:start + batch_docs]))
    eos = np.asarray([encoder.eos_id], dtype=dtype)
    parts = []
    for ids in arrays:
        parts.append(ids)
        parts.append(eos)
    tokens = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    lengths = np.fromiter((len(a) + 1 for a in arrays), dtype=np.int64, count=len(arrays))
    rows = batch.table.column("row").to_numpy()
    return TokenBatch(batch.source, batch.column("id"), rows, lengths, tokens)


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
