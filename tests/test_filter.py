"""FilterLanguage: each condition, its drop reason, and the counts."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import fnapi_pipeline

from transforms.bucketed.filter import FilterLanguage, LidFilterConfig, drop_reason
from transforms.core.read import column_values
from transforms.core.records import Document


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
    docs = [doc("k1"), doc("k2", score=0.91), doc("x1", language="deu_Latn"), doc("x2", score=0.2),
            doc("x3", score=0.3), doc("x4", count=0)]
    with fnapi_pipeline() as p:
        result = p | beam.Create(docs) | FilterLanguage(CONFIG)
        assert_that(result.kept | beam.Map(lambda d: d.id), equal_to(["k1", "k2"]), label="Kept")
        counts = result.dropped | beam.combiners.Count.PerElement()
        assert_that(counts, equal_to([("language", 1), ("lid_score", 2), ("token_count", 1)]), label="Drops")
