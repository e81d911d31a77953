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

from transforms.records import DROPPED, Document

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


class FilterLanguageFn(beam.DoFn):
    def __init__(self, config: LidFilterConfig):
        self._config = config
        self._kept = beam.metrics.Metrics.counter("pretokenize", "documents_kept_by_filter")
        self._dropped = {r: beam.metrics.Metrics.counter("pretokenize", f"dropped_{r}") for r in DROP_REASONS}

    def process(self, doc: Document):
        reason = drop_reason(doc, self._config)
        if reason is None:
            self._kept.inc()
            yield doc
        else:
            self._dropped[reason].inc()
            yield beam.pvalue.TaggedOutput(DROPPED, reason)


class FilterLanguage(beam.PTransform):
    """Splits documents into the kept ones (main output) and drop reasons (output ``dropped``).

    Example::

        result = docs | "FilterLanguage" >> FilterLanguage(LidFilterConfig("eng_Latn", 0.9))
        kept, reasons = result.kept, result.dropped
    """

    def __init__(self, config: LidFilterConfig):
        super().__init__()
        self._config = config

    def expand(self, docs):
        return docs | "CheckLanguage" >> beam.ParDo(FilterLanguageFn(self._config)).with_outputs(
            DROPPED, main="kept"
        )
