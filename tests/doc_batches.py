"""Literal fixtures in and out of the batches the jobs' steps pass: tests write Documents and
(id, tokens) pairs; steps take and give DocBatches and TokenBatches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transforms.core.batches import DocBatch, TokenBatch
from transforms.core.records import Document
from transforms.inputs.arrow import documents_batch


def doc_batches(docs: Sequence[Document], per_batch: int = 0, with_lid: bool = True) -> list[DocBatch]:
    """Documents as DocBatches, as ReadDocuments gives them: one source a batch, in input order,
    at most ``per_batch`` documents each (0: no limit)."""
    out: list[DocBatch] = []
    run: list[Document] = []
    for d in docs:
        if run and (d.source != run[0].source or len(run) == per_batch):
            out.append(documents_batch(run[0].source, run, with_lid))
            run = []
        run.append(d)
    if run:
        out.append(documents_batch(run[0].source, run, with_lid))
    return out


def documents_of(batch: DocBatch) -> list[Document]:
    """A DocBatch's documents, with the fields it holds (the LID fields only when it has them)."""
    columns = {name: batch.column(name) for name in batch.table.schema.names}
    named = [name for name in columns if name not in ("id", "text", "row")]
    return [
        Document(columns["id"][i], columns["text"][i], batch.source, columns["row"][i],
                 {name: columns[name][i] for name in named})
        for i in range(batch.size)
    ]


def token_batch(source: str, docs: Sequence[tuple[str, np.ndarray]], rows: Sequence[int] | None = None,
                extra: dict[str, np.ndarray] | None = None) -> TokenBatch:
    """(id, tokens) pairs of one source as a TokenBatch, rows 0, 1, ... unless given."""
    rows = range(len(docs)) if rows is None else rows
    return TokenBatch(
        source=source,
        ids=[i for i, _ in docs],
        rows=np.asarray(rows, dtype=np.int64),
        lengths=np.asarray([len(t) for _, t in docs], dtype=np.int64),
        tokens=np.concatenate([t for _, t in docs]),
        extra=extra or {},
    )


def sequences_of(batch: TokenBatch) -> list[tuple[str, np.ndarray, dict]]:
    """A TokenBatch's documents: (id, tokens, {extra column: value})."""
    ends = np.cumsum(batch.lengths)
    return [
        (doc_id, batch.tokens[end - n:end], {k: v[i] for k, v in batch.extra.items()})
        for i, (doc_id, n, end) in enumerate(zip(batch.ids, batch.lengths.tolist(), ends.tolist(), strict=True))
    ]
