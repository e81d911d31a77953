"""The reader index built at publish from the writers' parts (issue 38): the same bytes as the index
built by parsing the manifest, refused when a part does not describe its files or the manifest, and
the hashes behind it the same as the per-id functions'."""

from __future__ import annotations

import hashlib
import io
from itertools import groupby

import numpy as np
import pytest

from shards import index as reader_index
from shards import layout, manifest

ROWS = [("1024/p00_00000.npy", "a", 3), ("1024/p00_00000.npy", "é", 1), ("1024/p00_00001.npy", "x y:日本", 7),
        ("1024/p01_00000.npy", "c", 1024), ("2048/p01_00000.npy", "b" * 300, 1500),
        ("beyond/p00_00003.npy", "z", 300000)]


def _manifest_bytes(rows) -> bytes:
    return (manifest.MANIFEST_HEADER + "\n" + "".join(manifest.format_row(*r) for r in rows)).encode()


def _groups(rows):
    """(files, part) per (bucket, partition) group, as a writer stages them."""
    out = []
    for _, group in groupby(rows, key=lambda r: layout.parse_shard_rel_path(r[0])[:2]):
        group = list(group)
        files = [(rel, len(list(docs)), 0) for rel, docs in groupby(group, key=lambda r: r[0])]
        files = [(rel, n, sum(t for r, _, t in group if r == rel)) for rel, n, _ in files]
        part = reader_index.encode_part([i for _, i, _ in group], np.asarray([t for _, _, t in group]))
        out.append((files, part))
    return out


def _from_manifest(data: bytes) -> bytes:
    buf = io.BytesIO()
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    reader_index.write_index(manifest.read_rows(text), len(data), buf, hashlib.sha256(data).digest())
    return buf.getvalue()


def _from_parts(groups, data: bytes) -> bytes:
    buf = io.BytesIO()
    reader_index.write_index_from_parts(groups, len(data), buf, hashlib.sha256(data).digest())
    return buf.getvalue()


@pytest.mark.parametrize("rows", [[], ROWS[:1], ROWS])
def test_the_index_from_parts_is_the_index_from_the_manifest(rows):
    data = _manifest_bytes(rows)
    assert _from_parts(_groups(rows), data) == _from_manifest(data)


def test_a_part_that_does_not_hold_its_files_tokens_is_refused():
    groups = _groups(ROWS)
    files, part = groups[0]
    groups[0] = ([(files[0][0], files[0][1], files[0][2] + 1), *files[1:]], part)
    with pytest.raises(ValueError, match="do not hold its"):
        _from_parts(groups, _manifest_bytes(ROWS))


def test_parts_that_do_not_add_up_to_the_manifest_are_refused():
    data = _manifest_bytes(ROWS)
    with pytest.raises(ValueError, match="describe a manifest of"):
        _from_parts(_groups(ROWS), data + b"extra row\n")


def test_a_torn_part_is_refused():
    groups = _groups(ROWS)
    groups[1] = (groups[1][0], groups[1][1][:-1])
    with pytest.raises(ValueError, match="not a whole one"):
        _from_parts(groups, _manifest_bytes(ROWS))


def test_parts_out_of_storage_order_get_no_index():
    groups = _groups(ROWS)
    with pytest.raises(reader_index.NotIndexable):
        _from_parts(groups[::-1], _manifest_bytes(ROWS))


@pytest.mark.parametrize("seed", [0, 7, 2**40])
def test_the_hashes_of_arrays_are_the_per_id_hashes(seed):
    ids = ["a", "é", "doc-1", "x" * 500, "", "𝔘"]
    raw = [i.encode() for i in ids]
    assert layout.partitions_of(raw, 32).tolist() == [layout.partition_of(i, 32) for i in ids]
    assert layout.shuffle_keys(raw, seed).tolist() == [layout.shuffle_key(i, seed) for i in ids]
    assert layout.hashes64(raw, b"ptk-index").tolist() == [reader_index.id_hash(r) for r in raw]


@pytest.mark.parametrize("n, slice_docs", [(1, 7), (100, 1000), (1000, 7), (1000, 64)])
def test_the_lookup_is_the_hashes_sorted_with_their_rows_whatever_the_slices(tmp_path, monkeypatch, n, slice_docs):
    """Split into slice files by the hashes' top bits, a block at a time, and sorted per slice: the
    table is (hash, row) sorted, equal hashes in row order, as one sort of the whole gives it."""
    monkeypatch.setattr(reader_index, "_LOOKUP_SLICE", slice_docs)
    monkeypatch.setattr(reader_index, "_LOOKUP_BLOCK", 13)
    rng = np.random.default_rng(n)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    hashes[rng.integers(0, n, n // 10)] = hashes[0]  # repeats: their rows must stay in order
    path = tmp_path / "hashes"
    hashes.astype("<u8").tofile(path)
    out = io.BytesIO()
    reader_index._write_lookup(str(path), n, out)
    order = np.lexsort((np.arange(n), hashes))
    pad = b"\0" * ((-(n * 8)) % 8)
    assert out.getvalue() == hashes[order].astype("<u8").tobytes() + pad + order.astype("<i8").tobytes()


def test_a_miss_reads_the_ids_without_a_python_step_per_row(tmp_path, monkeypatch):
    """A lookup the table cannot answer scans the ids (ReaderIndex.scan). Ids of one shape (every
    FinePDFs id is ``<urn:uuid:...>``, 47 bytes) passed its first, middle and last byte probes, so it
    compared nearly every row in Python: 3 s a miss at a million documents, under load."""
    n = 5000
    rows = [("1024/p00_00000.npy", f"<urn:uuid:{i:036d}>", 5) for i in range(n)]
    path = tmp_path / "index"
    with open(path, "wb") as f:
        reader_index.write_index(iter(rows), 0, f, bytes(32))
    index = reader_index.open_index(str(path))
    calls = []
    real_id = reader_index.ReaderIndex.id
    monkeypatch.setattr(reader_index.ReaderIndex, "id", lambda self, i: calls.append(i) or real_id(self, i))
    assert index.scan(f"<urn:uuid:absent{0:030d}>".encode()) is None
    assert index.scan(f"<urn:uuid:{4321:036d}>".encode()) == 4321
    assert index.scan(b"<urn:uuid:") is None and index.scan(b"") is None
    assert len(calls) <= 1, f"{len(calls)} rows compared one at a time"
