"""The rules on whole groups of references: which copy of an id is kept (first_copies) and the order
of a group's documents (stream_order), each the same as the plain rule written out per document."""

from __future__ import annotations

import numpy as np
import pytest

from transforms.core.batches import RefBatch, Refs, first_copies, stream_order

# Ids that tie on the sort key, repeat, and sort differently as bytes, code points and numbers.
IDS = ["d1", "d10", "d2", "D", "a b", "é", "z", "ü", "東", "d1 "]
SOURCES = ["b.parquet", "a.jsonl", "c/x.parquet", "a.jsonl.gz"]
# Few sort keys, so that ties are common; large ones too (the keys are 63-bit hashes).
SORT_KEYS = [0, 1, 2, 2**62, 2**63 - 1]


def random_refs(rng: np.random.Generator, n: int) -> Refs:
    """``n`` references in RefBatches of random input files (several batches a file), each
    (file, row) once, ids and sort keys drawn with repeats."""
    rows = {s: iter(rng.permutation(10 * n + 1).tolist()) for s in SOURCES}
    batches = []
    left = n
    while left:
        size = int(rng.integers(1, min(left, 7) + 1))
        source = SOURCES[int(rng.integers(len(SOURCES)))]
        batches.append(RefBatch(
            spill_path=f"spill-{len(batches) % 3}.bin", source=source,
            ids=[IDS[i] for i in rng.integers(0, len(IDS), size)],
            sort_keys=np.array([SORT_KEYS[i] for i in rng.integers(0, len(SORT_KEYS), size)], np.int64),
            lengths=rng.integers(1, 100, size), offsets=rng.integers(0, 1000, size),
            rows=np.array([next(rows[source]) for _ in range(size)], np.int64),
        ))
        left -= size
    return Refs.concat(batches)


def columns(refs: Refs) -> list[tuple[int, str, str, int]]:
    """Each reference as (sort key, id, input file, row), in Python values."""
    return [(k, i, refs.sources[s], r) for k, i, s, r in zip(
        refs.sort_keys.tolist(), refs.ids.tolist(), refs.source.tolist(), refs.rows.tolist(), strict=True)]


def first_copies_by_hand(refs: Refs) -> list[int]:
    """For each id, the reference first by (input file, row)."""
    rows = columns(refs)
    best: dict[str, int] = {}
    for index, (_, doc_id, source, row) in enumerate(rows):
        kept = best.get(doc_id)
        if kept is None or (source, row) < rows[kept][2:]:
            best[doc_id] = index
    return sorted(best.values())


@pytest.mark.parametrize("seed", range(40))
def test_first_copies_and_stream_order_are_the_rules_written_out(seed):
    rng = np.random.default_rng(seed)
    refs = random_refs(rng, int(rng.integers(1, 120)))
    id_rank = refs.id_ranks()
    keep = first_copies(refs, id_rank)
    assert keep.tolist() == first_copies_by_hand(refs)
    order = stream_order(refs, id_rank)
    assert sorted(order.tolist()) == list(range(refs.size))
    rows = columns(refs)
    assert [rows[i] for i in order] == sorted(rows)
    # On the kept references, as the writers use them.
    kept = refs.take(keep)
    assert [columns(kept)[i] for i in stream_order(kept, id_rank[keep])] == sorted(rows[i] for i in keep)


def test_the_data_has_repeats_and_ties():
    refs = random_refs(np.random.default_rng(0), 100)
    rows = columns(refs)
    assert len({r[1] for r in rows}) < len(rows), "ids repeat"
    assert len({r[0] for r in rows}) < len({r[1] for r in rows}), "sort keys tie between ids"
    assert len({r[2] for r in rows}) > 1


def test_an_empty_group():
    refs = Refs.concat([])
    assert first_copies(refs, refs.id_ranks()).tolist() == [] and stream_order(refs, refs.id_ranks()).tolist() == []


def test_id_ranks_are_python_string_order_among_distinct_ids():
    """Arrow ranks the ids' UTF-8 bytes: the same order as Python's over the strings, whatever the
    characters (accents, a NUL, astral planes, a prefix of another id), copies sharing a rank."""
    ids = ["b", "a", "é", "a\0b", "a", "𝔘x", "\uffff", "ab", "", "b"]
    n = len(ids)
    refs = Refs.concat([RefBatch("/s.bin", "/in.parquet", ids, np.zeros(n, np.int64), np.ones(n, np.int64),
                                 np.zeros(n, np.int64), np.arange(n, dtype=np.int64))])
    distinct = sorted(set(ids))
    assert refs.id_ranks().tolist() == [distinct.index(i) for i in refs.ids.tolist()]
