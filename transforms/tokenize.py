"""TokenizeDocuments: token ids of each document, with exactly one EOS appended.

The tokenizer is built once per worker in ``setup()``; documents are buffered and encoded in
batches (a Rust tokenizer's batch call runs without the GIL).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from shards.layout import DEFAULT_DTYPE, check_dtype
from transforms.encoders import Encoder, load_encoder
from transforms.progress import Progress
from transforms.records import Document, TokenizedDocument


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    spec: str = "jet-nemotron"
    dtype: str = DEFAULT_DTYPE
    eos_token: str | None = None
    batch_docs: int = 64
    batch_chars: int = 4_000_000

    def __post_init__(self):
        if self.batch_docs < 1 or self.batch_chars < 1:
            raise ValueError("batch sizes must be at least 1")

    def load(self) -> Encoder:
        """The encoder, checked against the dtype: the launcher calls this once to fail early."""
        encoder = load_encoder(self.spec, self.eos_token)
        check_dtype(self.dtype, encoder.max_token_id)
        return encoder


def encode_documents(encoder: Encoder, docs: Sequence[Document], dtype: np.dtype) -> list[TokenizedDocument]:
    """Each document's ids plus one EOS, as an array of ``dtype``."""
    out = []
    for doc, ids in zip(docs, encoder.encode_arrays([d.text for d in docs]), strict=True):
        tokens = np.empty(len(ids) + 1, dtype=dtype)
        tokens[:-1] = ids
        tokens[-1] = encoder.eos_id
        out.append(TokenizedDocument(doc.id, tokens, doc.source, doc.row))
    return out


class TokenizeFn(beam.DoFn):
    def __init__(self, config: TokenizerConfig):
        self._config = config
        self._docs = beam.metrics.Metrics.counter("pretokenize", "documents_tokenized")
        self._tokens = beam.metrics.Metrics.counter("pretokenize", "tokens_tokenized")

    def setup(self):
        self._encoder = self._config.load()
        self._dtype = check_dtype(self._config.dtype, self._encoder.max_token_id)
        self._progress = Progress("tokenize")

    def start_bundle(self):
        self._buffer: list[Document] = []
        self._chars = 0

    def _flush(self) -> Iterator[TokenizedDocument]:
        if not self._buffer:
            return
        encoded = encode_documents(self._encoder, self._buffer, self._dtype)
        n_tokens = sum(len(t.tokens) for t in encoded)
        self._docs.inc(len(encoded))
        self._tokens.inc(n_tokens)
        self._progress.add(documents=len(encoded), tokens=n_tokens, chars=self._chars)
        self._buffer, self._chars = [], 0
        yield from encoded

    def process(self, doc: Document) -> Iterator[TokenizedDocument]:
        self._buffer.append(doc)
        self._chars += len(doc.text)
        if len(self._buffer) >= self._config.batch_docs or self._chars >= self._config.batch_chars:
            yield from self._flush()

    def finish_bundle(self):
        for tokenized in self._flush():
            yield WindowedValue(tokenized, MIN_TIMESTAMP, [GlobalWindow()])


class TokenizeDocuments(beam.PTransform):
    """Documents in, TokenizedDocuments out (EOS appended, ``config.dtype``).

    Example::

        tokenized = kept | "TokenizeDocuments" >> TokenizeDocuments(TokenizerConfig("gpt2"))
    """

    def __init__(self, config: TokenizerConfig):
        super().__init__()
        self._config = config

    def expand(self, docs):
        return docs | "EncodeBatches" >> beam.ParDo(TokenizeFn(self._config))
