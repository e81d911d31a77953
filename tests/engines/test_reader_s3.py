"""Issue 35 case 4 on S3 (moto's server on 127.0.0.1): a reader open across a `remove` serves the
version it opened or refuses in one line; its pickled copy (a spawned DataLoader worker's) too, and
another reader opening the new version does not prune the index copy the first one still uses."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from conftest import finepdfs_row
from test_object_storage import s3, s3_endpoint  # noqa: F401 - the fixtures
from test_reader_versions import _ids_in_two_shards, read_or_refused, remove, truth

from shards import index as reader_index
from shards import reader
from shards.reading.store import IndexedDocuments

ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a document read on S3 while it changes. " * (2 + i % 11))
        for i in range(40)]


def test_4_a_reader_on_s3_open_across_a_remove_serves_its_version_or_refuses(s3, bucketed_tree, tmp_path,  # noqa: F811
                                                                             monkeypatch):
    fs, bucket = s3
    monkeypatch.setenv(reader_index.CACHE_ENV, str(tmp_path / "cache"))
    fs.put(f"{bucketed_tree}/", f"{bucket}/tree/", recursive=True)
    url = f"s3://{bucket}/tree"
    before = truth(bucketed_tree)
    early, late = _ids_in_two_shards(bucketed_tree)
    first = reader.open_tree(url)
    assert isinstance(first.documents, IndexedDocuments)
    np.testing.assert_array_equal(first.document(early), before[early])
    worker = pickle.dumps(first)
    remove(url, [early, late], tmp_path)
    second = reader.open_tree(url)  # the new version: its own copy of the index, the first's kept
    with pytest.raises(KeyError):
        second.document(late)
    spawned = pickle.loads(worker)  # noqa: S301 - our own object, pickled above
    for opened in (first, spawned):
        for doc_id, tokens in before.items():
            got = read_or_refused(opened, doc_id)
            assert got is None or np.array_equal(got, tokens), doc_id
        assert read_or_refused(opened, late) is None
        assert read_or_refused(opened, early) is None
