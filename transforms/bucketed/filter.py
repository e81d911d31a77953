"""FilterLanguage: keep confident documents in one language, and say why each other one went.

All conditions are required, checked in this order (the first that fails is the reason counted):

    language == L                      else "language"
    page_average_lid == L              else "page_average_lid"
    page_average_lid_score >= T        else "lid_score"       (a null score fails too)
    token_count >= min_token_count     else "token_count"     (a null count fails too)
    text is not empty                  else "empty_text"      (it would be a lone EOS)

The score is compared as ReadDocuments read it: a number within [0, 1] (any other, NaN included,
is a bad record there, ``bad_lid_score``), and a float32 score as the decimal it was written as.
So a float32 column's 0.9 passes T = 0.9, and the float32 just below it (0.8999999) does not.
"""

from __future__ import annotations

import dataclasses
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.core.batches import DocBatch
from transforms.core.drops import Drops
from transforms.core.records import DROPPED, Document

DROP_REASONS = ("language", "page_average_lid", "lid_score", "token_count", "empty_text")


@dataclasses.dataclass(frozen=True)
class LidFilterConfig:
    language: str = "eng_Latn"
    threshold: float = 0.90
    min_token_count: int = 1

    def __post_init__(self):
        if not self.language:
            raise ValueError("language must not be empty")
        if not (0.0 <= self.threshold <= 1.0) or math.isnan(self.threshold):
            raise ValueError(f"the LID threshold must be within [0, 1], got {self.threshold}")
        if self.min_token_count < 0:
            raise ValueError(f"min_token_count must be >= 0, got {self.min_token_count}")


def drop_reason(doc: Document, config: LidFilterConfig) -> str | None:
    """Why ``doc`` is dropped, or None if it is kept."""
    if doc.language != config.language:
        return "language"
    if doc.page_average_lid != config.language:
        return "page_average_lid"
    score = doc.page_average_lid_score
    if score is None or math.isnan(score) or score < config.threshold:
        return "lid_score"
    if doc.token_count is None or doc.token_count < config.min_token_count:
        return "token_count"
    if not doc.text:
        return "empty_text"
    return None


def drop_masks(table: pa.RecordBatch, config: LidFilterConfig) -> dict[str, np.ndarray]:
    """For each reason, the documents of a batch dropped for it (the first condition each fails),
    computed on the batch's Arrow columns at once; drop_reason is the same rule for one document."""
    def failing(condition) -> np.ndarray:  # a null compares as failing
        return ~pc.fill_null(condition, False).to_numpy(zero_copy_only=False)

    alive = np.ones(table.num_rows, dtype=bool)
    masks = {}
    checks = (
        ("language", lambda: pc.equal(table.column("language"), config.language)),
        ("page_average_lid", lambda: pc.equal(table.column("page_average_lid"), config.language)),
        ("lid_score", lambda: pc.greater_equal(table.column("page_average_lid_score"), config.threshold)),
        ("token_count", lambda: pc.greater_equal(table.column("token_count"), config.min_token_count)),
        ("empty_text", lambda: pc.greater(pc.binary_length(table.column("text")), 0)),
    )
    for reason, condition in checks:
        masks[reason] = failing(condition()) & alive
        alive &= ~masks[reason]
    return masks


class FilterLanguageFn(beam.DoFn):
    def __init__(self, config: LidFilterConfig):
        self._config = config
        self._kept = beam.metrics.Metrics.counter("pretokenize", "documents_kept_by_filter")

    def setup(self):
        self._drops = Drops()

    def process(self, batch: DocBatch):
        masks = drop_masks(batch.table, self._config)
        dropped = np.zeros(batch.size, dtype=bool)
        for reason in DROP_REASONS:
            n = int(masks[reason].sum())
            if n:
                dropped |= masks[reason]
                yield self._drops(reason, n)
        kept = batch.size - int(dropped.sum())
        self._kept.inc(kept)
        if kept:
            yield batch.filter(pa.array(~dropped)) if kept < batch.size else batch


class FilterLanguage(beam.PTransform):
    """Splits DocBatches into the kept documents (main output, DocBatches) and ``(reason, n)``
    drops (output ``dropped``).

    Example::

        result = batches | "FilterLanguage" >> FilterLanguage(LidFilterConfig("eng_Latn", 0.9))
        kept, drops = result.kept, result.dropped
    """

    def __init__(self, config: LidFilterConfig):
        super().__init__()
        self._config = config

    def expand(self, batches):
        return batches | "CheckLanguage" >> beam.ParDo(FilterLanguageFn(self._config)).with_outputs(
            DROPPED, main="kept"
        )
