"""FilterDocuments: each operator and literal over Arrow batches, the default list's drop reasons,
nulls, the length in tokens, and the counts."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import fnapi_pipeline
from doc_batches import doc_batches, documents_of, token_batch

from shards import conditions
from shards.conditions import TOKENS, parse
from transforms.bucketed.filter import (
    FilterDocuments,
    FilterDocumentsFn,
    batch_masks,
    column_conditions,
    drop_masks,
    holds,
)
from transforms.core.batches import DocBatch
from transforms.core.records import Document
from transforms.inputs.arrow import arrow_batch
from transforms.inputs.fields import ReadConfig, condition_fields

# One column of each kind, with a null in each.
COLUMNS = pa.RecordBatch.from_pydict({
    "score": pa.array([0.5, 0.8, 1.0, None], pa.float64()),
    "flag": pa.array([True, False, True, None]),
    "dump": pa.array(["CC-1", "CC-2", "CC-3", None]),
})


@pytest.mark.parametrize(
    "text, kept",
    [
        # each operator, on numbers
        ("score == 0.8", [False, True, False, False]),
        ("score != 0.8", [True, False, True, False]),
        ("score >= 0.8", [False, True, True, False]),
        ("score > 0.8", [False, False, True, False]),
        ("score <= 0.8", [True, True, False, False]),
        ("score < 0.8", [True, False, False, False]),
        ("score in [0.5, 1]", [True, False, True, False]),
        ("score >= 1", [False, False, True, False]),  # an integer literal against a float column
        # booleans
        ("flag == true", [True, False, True, False]),
        ("flag != true", [False, True, False, False]),
        ("flag in [false]", [False, True, False, False]),
        # strings
        ("dump == 'CC-2'", [False, True, False, False]),
        ('dump != "CC-2"', [True, False, True, False]),
        ("dump >= 'CC-2'", [False, True, True, False]),
        ("dump in ['CC-1', 'CC-3']", [True, False, True, False]),
        # null: fails every comparison but those that ask for it
        ("dump == null", [False, False, False, True]),
        ("flag != null", [True, True, True, False]),
        ("score in [0.5, null]", [True, False, False, True]),
    ],
)
def test_each_operator_and_literal_over_an_arrow_batch(text, kept):
    condition = parse(text)
    assert holds(condition, COLUMNS.column(condition.column)).tolist() == kept
    masks = drop_masks(COLUMNS.column, [condition], COLUMNS.num_rows)
    assert masks[condition.name].tolist() == [not k for k in kept]


def test_a_dictionary_column_is_compared_by_its_values():
    column = pa.array(["a", "b", "a", None]).dictionary_encode()
    assert holds(parse("x in ['a']"), column).tolist() == [True, False, True, False]


def test_each_document_is_dropped_for_the_first_condition_it_fails():
    conds = [parse("score >= 0.8"), parse("flag == true"), parse("dump != 'CC-3'")]
    masks = drop_masks(COLUMNS.column, conds, COLUMNS.num_rows)
    assert {name: m.tolist() for name, m in masks.items()} == {
        "score >= 0.8": [True, False, False, True],
        "flag == true": [False, True, False, False],
        'dump != "CC-3"': [False, False, True, False],
    }


def doc(doc_id="d", text="some text", language="eng_Latn", lid="eng_Latn", score=0.95, count=5):
    fields = {"language": language, "page_average_lid": lid, "page_average_lid_score": score, "token_count": count}
    return Document(doc_id, text, "f.parquet", 0, fields)


DEFAULT = conditions.conditions({})


def reason(document: Document, conds=DEFAULT) -> str | None:
    """Why the default list drops one document, or None."""
    [batch] = doc_batches([document])
    masks = batch_masks(batch, conds)
    return next((name for name, mask in masks.items() if mask[0]), None)


@pytest.mark.parametrize(
    "document, why",
    [
        (doc(), None),
        (doc(score=0.90), None),  # the threshold itself is kept
        (doc(count=1), None),
        (doc(language="fra_Latn"), "language"),
        (doc(language=None), "language"),
        (doc(lid="fra_Latn"), "page_average_lid"),
        (doc(score=0.8999), "lid_score"),
        (doc(score=None), "lid_score"),
        (doc(count=0), "token_count"),
        (doc(count=None), "token_count"),
        (doc(text=""), "empty_text"),
        (doc(language="fra_Latn", score=0.1, count=0), "language"),  # the first failing check counts
    ],
)
def test_the_default_list_keeps_its_drop_reasons(document, why):
    assert reason(document) == why


def test_the_shorthands_change_the_values_compared():
    conds = conditions.conditions({"language": "por_Latn", "lid_threshold": 0.5, "min_token_count": 10})
    assert reason(doc(language="por_Latn", lid="por_Latn", score=0.5, count=10), conds) is None
    assert reason(doc(), conds) == "language"
    assert reason(doc(language="por_Latn", lid="por_Latn", count=9), conds) == "token_count"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("kind", ["probability", "number"])
def test_a_value_at_the_threshold_is_kept_in_its_columns_precision(dtype, kind):
    # float32(0.9) is 0.89999998 in float64: compared as such, the threshold itself would be dropped.
    at = dtype(0.9)
    scores = np.array([np.nextafter(at, dtype(0)), at, np.nextafter(at, dtype(1))])
    rows = pa.RecordBatch.from_pydict({"id": ["below", "at", "above"], "text": ["t"] * 3, "s": pa.array(scores)})
    condition = parse("s >= 0.9")._replace(kind=kind)
    table = arrow_batch(rows, ReadConfig("unused", columns=condition_fields([condition])), first_row=0)
    assert drop_masks(table.column, [condition], 3)[condition.name].tolist() == [True, False, False]


def test_the_length_in_tokens_is_judged_on_token_batches_only():
    conds = conditions.conditions({"keep": [f"{TOKENS} >= 3", "flag == true"]})
    assert [c.column for c in column_conditions(conds)][-1] == "flag"
    tokens = token_batch("f", [("a", np.array([1, 2, 9])), ("b", np.array([9])), ("c", np.array([1, 1, 1, 9]))])
    assert {n: m.tolist() for n, m in batch_masks(tokens, conds).items()} == {f"{TOKENS} >= 3": [False, True, False]}
    fn = FilterDocumentsFn(conds, tokenized=True)
    fn.setup()
    out = list(fn.process(tokens))
    kept = [o for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]
    assert kept[0].ids == ["a", "c"] and kept[0].tokens.tolist() == [1, 2, 9, 1, 1, 1, 9]
    assert kept[0].lengths.tolist() == [3, 4] and kept[0].rows.tolist() == [0, 2]


def test_transform_splits_kept_and_counted_drops():
    # Batches of 3: one with kept and dropped documents, one whose documents all go, one all kept.
    docs = [doc("k1"), doc("k2", score=0.91), doc("x3", score=0.3),
            doc("x1", language="deu_Latn"), doc("x2", score=0.2), doc("x4", count=0),
            doc("k3")]
    with fnapi_pipeline() as p:
        result = p | beam.Create(doc_batches(docs, per_batch=3)) | FilterDocuments(DEFAULT)
        assert_that(result.kept | beam.FlatMap(lambda b: [d.id for d in documents_of(b)]),
                    equal_to(["k1", "k2", "k3"]), label="Kept")
        counts = result.dropped | beam.CombinePerKey(sum)
        assert_that(counts, equal_to([("language", 1), ("lid_score", 2), ("token_count", 1)]), label="Drops")


def test_a_keep_condition_is_counted_under_its_own_text():
    table = pa.RecordBatch.from_pydict({"row": [0, 1, 2], "id": ["a", "b", "c"], "text": ["x", "y", "z"],
                                        "is_truncated": [False, True, False]})
    with fnapi_pipeline() as p:
        conds = [parse("is_truncated == false")]
        result = p | beam.Create([DocBatch("f", table)]) | FilterDocuments(conds)
        assert_that(result.kept | beam.FlatMap(lambda b: b.column("id")), equal_to(["a", "c"]), label="Kept")
        assert_that(result.dropped, equal_to([("is_truncated == false", 1)]), label="Drops")
