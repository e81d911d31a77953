"""FilterLanguage: each condition, its drop reason, and the counts."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import fnapi_pipeline
from doc_batches import doc_batches, documents_of

from transforms.bucketed.filter import DROP_REASONS, FilterLanguage, LidFilterConfig, drop_masks, drop_reason
from transforms.core.records import Document
from transforms.inputs.arrow import arrow_batch, column_values
from transforms.inputs.fields import ReadConfig


def doc(doc_id="d", text="some text", language="eng_Latn", lid="eng_Latn", score=0.95, count=5):
    return Document(doc_id, text, "f.parquet", 0, language, lid, score, count)


CONFIG = LidFilterConfig()


@pytest.mark.parametrize(
    "document, reason",
    [
        (doc(), None),
        (doc(score=0.90), None),  # the threshold itself is kept
        (doc(count=1), None),
        (doc(language="fra_Latn"), "language"),
        (doc(language=None), "language"),
        (doc(lid="fra_Latn"), "page_average_lid"),
        (doc(score=0.8999), "lid_score"),
        (doc(score=None), "lid_score"),
        (doc(score=float("nan")), "lid_score"),
        (doc(count=0), "token_count"),
        (doc(count=None), "token_count"),
        (doc(text=""), "empty_text"),
        (doc(language="fra_Latn", score=0.1, count=0), "language"),  # the first failing check counts
    ],
)
def test_drop_reason(document, reason):
    assert drop_reason(document, CONFIG) == reason


def test_other_language_and_threshold():
    config = LidFilterConfig(language="por_Latn", threshold=0.5, min_token_count=10)
    assert drop_reason(doc(language="por_Latn", lid="por_Latn", score=0.5, count=10), config) is None
    assert drop_reason(doc(), config) == "language"
    assert drop_reason(doc(language="por_Latn", lid="por_Latn", count=9), config) == "token_count"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_a_score_at_the_threshold_is_kept_in_its_columns_precision(dtype):
    # float32(0.9) is 0.89999998 in float64: compared as such, the threshold itself would be dropped.
    at = dtype(0.9)
    scores = column_values(pa.array(np.array([np.nextafter(at, dtype(0)), at, np.nextafter(at, dtype(1))])))
    assert [drop_reason(doc(score=s), CONFIG) for s in scores] == ["lid_score", None, None]


@pytest.mark.parametrize("kwargs", [{"threshold": 1.5}, {"threshold": float("nan")}, {"language": ""},
                                    {"min_token_count": -1}])
def test_bad_settings_fail_when_configured(kwargs):
    with pytest.raises(ValueError):
        LidFilterConfig(**kwargs)


def test_transform_splits_kept_and_counted_drops():
    # Batches of 3: one with kept and dropped documents, one whose documents all go, one all kept.
    docs = [doc("k1"), doc("k2", score=0.91), doc("x3", score=0.3),
            doc("x1", language="deu_Latn"), doc("x2", score=0.2), doc("x4", count=0),
            doc("k3")]
    with fnapi_pipeline() as p:
        result = p | beam.Create(doc_batches(docs, per_batch=3)) | FilterLanguage(CONFIG)
        assert_that(result.kept | beam.FlatMap(lambda b: [d.id for d in documents_of(b)]),
                    equal_to(["k1", "k2", "k3"]), label="Kept")
        counts = result.dropped | beam.CombinePerKey(sum)
        assert_that(counts, equal_to([("language", 1), ("lid_score", 2), ("token_count", 1)]), label="Drops")


# Every condition failing alone, nulls in each nullable column, and several failing at once.
MASK_DOCS = [
    doc("keep"),
    doc("at-threshold", score=0.90),
    doc("one-token", count=1),
    doc("french", language="fra_Latn"),
    doc("no-language", language=None),
    doc("french-pages", lid="fra_Latn"),
    doc("no-page-lid", lid=None),
    doc("low", score=0.8999),
    doc("no-score", score=None),
    doc("nan-score", score=float("nan")),
    doc("zero-score", score=0.0),
    doc("no-tokens", count=0),
    doc("no-count", count=None),
    doc("empty", text=""),
    doc("all-null", language=None, lid=None, score=None, count=None, text=""),
    doc("many", language="fra_Latn", score=0.1, count=0),
    doc("por", language="por_Latn", lid="por_Latn", score=0.5, count=10),
    doc("por-unsure", language="por_Latn", lid="por_Latn", score=0.4, count=10),
    doc("por-short", language="por_Latn", lid="por_Latn", score=0.7, count=9),
    doc("por-empty", language="por_Latn", lid="por_Latn", score=1.0, count=10, text=""),
]


@pytest.mark.parametrize(
    "config",
    [CONFIG, LidFilterConfig(language="por_Latn", threshold=0.5, min_token_count=10),
     LidFilterConfig(threshold=0.0, min_token_count=0)],
    ids=["default", "por", "no-limits"],
)
def test_drop_masks_give_each_document_the_reason_drop_reason_gives(config):
    [batch] = doc_batches(MASK_DOCS)
    masks = drop_masks(batch.table, config)
    assert sorted(masks) == sorted(DROP_REASONS)
    stacked = np.stack([masks[r] for r in DROP_REASONS])
    assert stacked.sum(axis=0).max() <= 1, "a document is dropped for one reason, the first it fails"
    got = [DROP_REASONS[int(np.argmax(column))] if column.any() else None for column in stacked.T]
    expected = [drop_reason(d, config) for d in MASK_DOCS]
    assert got == expected
    assert {None, "language", "lid_score", "token_count", "empty_text"} <= set(expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_batch_path_keeps_a_score_at_the_threshold_in_its_columns_precision(dtype):
    at = dtype(0.9)
    scores = np.array([np.nextafter(at, dtype(0)), at, np.nextafter(at, dtype(1))])
    rows = pa.RecordBatch.from_pydict({
        "id": ["below", "at", "above"], "text": ["t"] * 3, "language": ["eng_Latn"] * 3,
        "page_average_lid": ["eng_Latn"] * 3, "page_average_lid_score": pa.array(scores), "token_count": [3] * 3,
    })
    assert rows.column("page_average_lid_score").type == pa.from_numpy_dtype(dtype)
    table = arrow_batch(rows, ReadConfig("unused"), first_row=0)
    assert drop_masks(table, CONFIG)["lid_score"].tolist() == [True, False, False]
