"""FilterLanguage: keep confident documents in one language, and say why each other one went.

All conditions are required, checked in this order (the first that fails is the reason counted):

    language == L                      else "language"
    page_average_lid == L              else "page_average_lid"
    page_average_lid_score >= T        else "lid_score"       (a null score fails too)
    token_count >= min_token_count     else "token_count"     (a null count fails too)
    text is not empty                  else "empty_text"      (it would be a lone EOS)

Those are the FinePDFs schema's fields, the defaults. Each is configurable (LidFilterConfig): the
language fields (each must equal L; a field's drop reason is its name), the score's field, the
count's field. A language of None checks no language field and no score (--language none), a
count field of None no count (--token-count-field none); the empty text check always runs.
FineWeb: language_fields=("language",), score_field="language_score", threshold 0.65.

The score is compared as ReadDocuments read it: a number within [0, 1] (any other, NaN included,
is a bad record there, ``bad_lid_score``), and a float32 score as the decimal it was written as.
So a float32 column's 0.9 passes T = 0.9, and the float32 just below it (0.8999999) does not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.core.batches import DocBatch
from transforms.core.drops import Drops
from transforms.core.records import (
    DEFAULT_LANGUAGE,
    DEFAULT_LANGUAGE_FIELDS,
    DEFAULT_LID_THRESHOLD,
    DEFAULT_TOKEN_COUNT,
    DROPPED,
    LID_SCORE,
    Document,
)

DROP_REASONS = ("language", "page_average_lid", "lid_score", "token_count", "empty_text")
# The reasons that are not a language field's name.
FIXED_REASONS = ("lid_score", "token_count", "empty_text")


class Check(NamedTuple):
    """One condition: the reason counted when it fails, the column it reads, and how it compares
    ("equals" the language, at "least" the threshold or count, "nonempty" text)."""

    reason: str
    column: str
    test: str
    value: object = None


@dataclasses.dataclass(frozen=True)
class LidFilterConfig:
    language: str | None = DEFAULT_LANGUAGE  # None: no language field and no score is checked
    threshold: float = DEFAULT_LID_THRESHOLD
    min_token_count: int = 1
    language_fields: tuple[str, ...] = DEFAULT_LANGUAGE_FIELDS
    score_field: str | None = LID_SCORE  # None: no score check
    token_count_field: str | None = DEFAULT_TOKEN_COUNT  # None: no count check

    def __post_init__(self):
        if self.language == "":
            raise ValueError("language must not be empty")
        if not (0.0 <= self.threshold <= 1.0) or math.isnan(self.threshold):
            raise ValueError(f"the LID threshold must be within [0, 1], got {self.threshold}")
        if self.min_token_count < 0:
            raise ValueError(f"min_token_count must be >= 0, got {self.min_token_count}")
        object.__setattr__(self, "language_fields", tuple(self.language_fields))
        if self.language is not None and not self.language_fields:
            raise ValueError(f"no field to check the language {self.language} in")
        names = list(self.checked_language_fields)
        for name in names:
            # A language field's name is a drop reason: a line of dataset_stats.txt's table.
            if name in FIXED_REASONS or names.count(name) > 1:
                raise ValueError(f"the language field {name!r} is named twice, or as another drop reason")
            if not name or name != name.strip() or any(c in name for c in "|\n\r"):
                raise ValueError(f"the language field {name!r} cannot name a drop reason (no '|', line break or "
                                 "space at either end)")

    @property
    def checked_language_fields(self) -> tuple[str, ...]:
        return self.language_fields if self.language is not None else ()

    def checks(self) -> list[Check]:
        """The conditions, in the order they are checked."""
        out = [Check(name, name, "equals", self.language) for name in self.checked_language_fields]
        if self.language is not None and self.score_field:
            out.append(Check("lid_score", self.score_field, "least", self.threshold))
        if self.token_count_field:
            out.append(Check("token_count", self.token_count_field, "least", self.min_token_count))
        out.append(Check("empty_text", "text", "nonempty"))
        return out

    def reasons(self) -> tuple[str, ...]:
        """Every drop reason this filter can count."""
        return tuple(c.reason for c in self.checks())


def drop_reason(doc: Document | Mapping, config: LidFilterConfig) -> str | None:
    """Why ``doc`` is dropped, or None if it is kept. ``doc`` is a Document (the FinePDFs fields) or
    a mapping of field name to value, holding ``text`` and each field the config checks."""
    values = doc._asdict() if isinstance(doc, Document) else doc
    for check in config.checks():
        value = values.get(check.column)
        if check.test == "equals":
            failed = value != check.value
        elif check.test == "least":
            failed = value is None or math.isnan(value) or value < check.value
        else:
            failed = not value
        if failed:
            return check.reason
    return None


def drop_masks(table: pa.RecordBatch, config: LidFilterConfig) -> dict[str, np.ndarray]:
    """For each reason, the documents of a batch dropped for it (the first condition each fails),
    computed on the batch's Arrow columns at once; drop_reason is the same rule for one document."""
    def failing(condition) -> np.ndarray:  # a null compares as failing
        return ~pc.fill_null(condition, False).to_numpy(zero_copy_only=False)

    def condition(check: Check):
        column = table.column(check.column)
        if check.test == "equals":
            return pc.equal(column, check.value)
        if check.test == "least":
            return pc.greater_equal(column, check.value)
        return pc.greater(pc.binary_length(column), 0)

    alive = np.ones(table.num_rows, dtype=bool)
    masks = {}
    for check in config.checks():
        reason = check.reason
        masks[reason] = failing(condition(check)) & alive
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
        for reason in self._config.reasons():
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
