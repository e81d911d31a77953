"""FilterDocuments: keep the documents for which every condition holds, and say why each other one went.

The conditions are data (shards/conditions.py: what one is, the default list, null semantics);
this module only evaluates them, on a whole Arrow batch at a time with pyarrow.compute, never a
row at a time in Python. A dropped document is counted under the name of the first condition it
fails, in the list's order. The conditions on an input column are checked before tokenizing
(on DocBatches); those on ``@tokens`` after it (on TokenBatches), by a second step that is only
there when such a condition is.

Each column was read as its condition's kind (transforms/inputs/arrow.py): a float32 score as the
decimal it was written as, so a float32 column's 0.9 passes ``>= 0.9`` and the float32 just below
it (0.8999999) does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shards.conditions import OPERATORS, TOKENS, Condition
from transforms.core.batches import DocBatch, TokenBatch
from transforms.core.drops import Drops
from transforms.core.records import DROPPED


def holds(condition: Condition, column: pa.Array) -> np.ndarray:
    """Where ``condition`` holds over ``column`` (its values, read as its kind); a null holds only
    for ``== null``, ``!= null``'s opposite, and ``in`` a list holding null."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if condition.kind == "number":  # an integer column (@tokens) against 0.5 too
        column = column.cast(pa.float64())
    op, value = condition.op, condition.value
    if value is None:
        result = pc.is_null(column) if op == "==" else pc.is_valid(column)
    elif op == "in":
        values = [v for v in value if v is not None]
        result = pc.is_in(column, value_set=pa.array(values, column.type)) if values else pc.is_null(column)
        if None in value:
            result = pc.or_(result, pc.is_null(column))
    else:
        result = getattr(pc, OPERATORS[op][0])(column, pa.scalar(value, column.type))
    return pc.fill_null(result, False).to_numpy(zero_copy_only=False)


def drop_masks(column: Callable[[str], pa.Array], conditions: Sequence[Condition], size: int) -> dict[str, np.ndarray]:
    """For each condition's name, the documents dropped for it (the first condition each fails);
    ``column(name)`` gives a column of the ``size`` documents."""
    alive = np.ones(size, dtype=bool)
    masks = {}
    for condition in conditions:
        masks[condition.name] = ~holds(condition, column(condition.column)) & alive
        alive &= ~masks[condition.name]
    return masks


def batch_masks(batch: DocBatch | TokenBatch, conditions: Sequence[Condition]) -> dict[str, np.ndarray]:
    """drop_masks of the conditions a batch can be judged by: a DocBatch's on its columns, a
    TokenBatch's on ``@tokens`` (its lengths, EOS included)."""
    if isinstance(batch, TokenBatch):
        return drop_masks(lambda _: pa.array(batch.lengths, pa.int64()), token_conditions(conditions), batch.size)
    return drop_masks(batch.table.column, column_conditions(conditions), batch.size)


def column_conditions(conditions: Sequence[Condition]) -> list[Condition]:
    """The conditions on input columns, checked before tokenizing."""
    return [c for c in conditions if c.column != TOKENS]


def token_conditions(conditions: Sequence[Condition]) -> list[Condition]:
    """The conditions on the length in tokens, checked once tokenized."""
    return [c for c in conditions if c.column == TOKENS]


def keep_tokens(batch: TokenBatch, keep: np.ndarray) -> TokenBatch:
    """The documents of a TokenBatch where ``keep`` is true."""
    return TokenBatch(batch.source, [i for i, k in zip(batch.ids, keep.tolist(), strict=True) if k],
                      batch.rows[keep], batch.lengths[keep], batch.tokens[np.repeat(keep, batch.lengths)],
                      {name: values[keep] for name, values in batch.extra.items()})


class FilterDocumentsFn(beam.DoFn):
    """Keeps the documents of each DocBatch (or, ``tokenized``, TokenBatch) that pass the
    conditions it can judge; drops the others as ``(name, n)`` on output ``dropped``."""

    def __init__(self, conditions: Sequence[Condition], tokenized: bool = False):
        self._conditions = tuple(conditions)
        self._tokenized = tokenized
        self._kept = beam.metrics.Metrics.counter("pretokenize", "documents_kept_by_filter")

    def setup(self):
        self._drops = Drops()

    def process(self, batch: DocBatch | TokenBatch):
        masks = batch_masks(batch, self._conditions)
        dropped = np.zeros(batch.size, dtype=bool)
        for name, mask in masks.items():
            n = int(mask.sum())
            if n:
                dropped |= mask
                yield self._drops(name, n)
        kept = batch.size - int(dropped.sum())
        if not self._tokenized:
            self._kept.inc(kept)
        if kept == batch.size:
            yield batch
        elif kept:
            yield keep_tokens(batch, ~dropped) if self._tokenized else batch.filter(pa.array(~dropped))


def filter_steps(conditions: Sequence[Condition], tokenize: beam.DoFn) -> list[beam.DoFn]:
    """The filter before ``tokenize``, the tokenizer, and the filter on ``@tokens`` after it when
    a condition needs it."""
    after = [FilterDocumentsFn(conditions, tokenized=True)] if token_conditions(conditions) else []
    return [FilterDocumentsFn(conditions), tokenize, *after]


class FilterDocuments(beam.PTransform):
    """Splits DocBatches into the kept documents (main output, DocBatches) and ``(name, n)``
    drops (output ``dropped``), by the conditions on input columns.

    Example::

        conditions = shards.conditions.conditions({"keep": ["is_truncated == false"]})
        result = batches | "FilterDocuments" >> FilterDocuments(conditions)
        kept, drops = result.kept, result.dropped
    """

    def __init__(self, conditions: Sequence[Condition]):
        super().__init__()
        self._conditions = tuple(conditions)

    def expand(self, batches):
        return batches | "CheckConditions" >> beam.ParDo(FilterDocumentsFn(self._conditions)).with_outputs(
            DROPPED, main="kept"
        )
