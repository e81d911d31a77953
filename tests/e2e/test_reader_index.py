"""The reader index (processed_spec.idx): written at publish, listed in the record, checked by verify,
mapped by open_tree; what it gives is exactly what parsing the manifest gives, and a tree without
one (or with one that no longer describes its manifest) opens from the manifest."""

from __future__ import annotations

import io
import json
import os
import pickle

import numpy as np
import pytest
from conftest import DEFAULT_FILTER, bucketed_sample
from fsspec.implementations.local import LocalFileSystem

from pipelines import cli
from shards import index as reader_index
from shards import layout, manifest, reader, storage, tree
from shards.reading import opening
from shards.reading.store import IndexedDocuments

FLAGS = ["--partitions", "4", "--max-shard-bytes", "120000", "--runner=FnApiRunner"]


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    return bucketed_sample(tmp_path_factory.mktemp("indexed") / "out", *FLAGS)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def _parsed(out) -> reader.ShardTree:
    """The tree as the manifest alone gives it (the path of a tree without an index)."""
    t = tree.OutputTree.open(str(out))
    fs, root = storage.filesystem(str(out))
    return opening._open_bucketed(fs, root.rstrip("/"), str(out), t.stats())


def test_publish_writes_the_index_and_lists_it_in_the_record(sample_tree):
    record = json.loads((sample_tree / tree.RECORD_NAME).read_text(encoding="utf-8"))
    assert reader_index.INDEX_NAME in record["derived"]
    assert (sample_tree / reader_index.INDEX_NAME).is_file()
    assert isinstance(reader.open_tree(str(sample_tree)).documents, IndexedDocuments)


def test_the_index_gives_what_the_manifest_gives(sample_tree):
    fast, slow = reader.open_tree(str(sample_tree)), _parsed(sample_tree)
    assert isinstance(fast.documents, IndexedDocuments)
    assert not isinstance(slow.documents, IndexedDocuments)
    assert len(fast) == len(slow) > 100
    assert fast.store.rel_paths == slow.store.rel_paths
    np.testing.assert_array_equal(fast.store.starts, slow.store.starts)
    for col in ("start", "length", "file", "bucket", "partition", "split"):
        np.testing.assert_array_equal(getattr(fast.documents, col), getattr(slow.documents, col), err_msg=col)
    assert [fast.documents.id(i) for i in range(len(fast))] == [slow.documents.id(i) for i in range(len(slow))]
    for i in range(len(slow)):
        doc_id = slow.documents.id(i)
        assert fast.row(doc_id) == i
        np.testing.assert_array_equal(fast.document(doc_id), slow.document(doc_id))
    with pytest.raises(KeyError, match="no document"):
        fast.row("not-an-id")
    a, b = fast.sampler(256, seed=3, val_fraction=0.1), slow.sampler(256, seed=3, val_fraction=0.1)
    assert len(a) == len(b)
    for k in (0, 1, len(a) - 1):
        wa, wb = a.window(k), b.window(k)
        for name in wa._fields:
            np.testing.assert_array_equal(getattr(wa, name), getattr(wb, name))


def test_a_pickled_tree_carries_the_index_path_not_its_columns(sample_tree):
    t = reader.open_tree(str(sample_tree))
    data = pickle.dumps(t.documents)
    assert len(data) < 1000
    again = pickle.loads(data)  # noqa: S301 - our own object, pickled above
    np.testing.assert_array_equal(again.length, t.documents.length)
    assert again.index_of(t.documents.id(7)) == 7


def test_a_tree_without_the_index_opens_from_the_manifest(sample_tree, tmp_path):
    out = _copy(sample_tree, tmp_path / "old")
    os.remove(out / reader_index.INDEX_NAME)  # as a tree written before indexes
    t = reader.open_tree(str(out))
    assert not isinstance(t.documents, IndexedDocuments)
    assert len(t) == len(_parsed(sample_tree))


def test_an_index_that_no_longer_describes_the_manifest_is_not_used(sample_tree, tmp_path):
    out = _copy(sample_tree, tmp_path / "edited")
    path = out / layout.MANIFEST_NAME
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:2] + lines[3:]), encoding="utf-8")  # a row fewer: its shard disagrees
    with pytest.raises(ValueError, match="manifest's rows sum"):
        reader.open_tree(str(out))  # the manifest decides, and says what is wrong


def test_verify_checks_the_index_against_the_manifest(sample_tree, tmp_path, capsys):
    assert cli.main(["verify", "--output", str(sample_tree), "--runner=FnApiRunner"]) == 0
    out = _copy(sample_tree, tmp_path / "bad")
    path = out / reader_index.INDEX_NAME
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a byte of the lookup table
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), "--runner=FnApiRunner"]) == 1
    assert f"{reader_index.INDEX_NAME}: does not describe {layout.MANIFEST_NAME}" in capsys.readouterr().out
    os.remove(path)
    assert cli.main(["verify", "--output", str(out), "--runner=FnApiRunner"]) == 1
    assert "listed in the tree's record but missing" in capsys.readouterr().out


def test_a_removal_rewrites_the_index(sample_tree, tmp_path):
    out = _copy(sample_tree, tmp_path / "removal")
    before = reader.open_tree(str(out))
    gone = [before.documents.id(i) for i in (0, 5, 50)]
    ids = tmp_path / "ids.txt"
    ids.write_text("".join(f"{i}\n" for i in gone), encoding="utf-8")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(ids), "--runner=FnApiRunner"]) == 0
    after = reader.open_tree(str(out))
    assert isinstance(after.documents, IndexedDocuments)
    assert len(after) == len(before) - 3
    for doc_id in gone:
        with pytest.raises(KeyError):
            after.row(doc_id)
    assert [after.documents.id(i) for i in range(len(after))] == \
        [_parsed(out).documents.id(i) for i in range(len(after))]
    assert cli.main(["verify", "--output", str(out), "--runner=FnApiRunner"]) == 0


def test_publish_builds_the_index_from_the_groups_parts_not_the_manifest(tmp_path, monkeypatch):
    """Issue 38: publish's serial work is per group, not per document: the index comes from the
    writers' parts, and it is the bytes a parse of the manifest gives."""
    parse = reader_index.build_from_manifest

    def refused(*args, **kwargs):
        raise AssertionError("publish parsed the manifest")

    monkeypatch.setattr(reader_index, "build_from_manifest", refused)
    out = bucketed_sample(tmp_path / "out", *FLAGS)
    rebuilt = io.BytesIO()
    parse(LocalFileSystem(), str(out), rebuilt)
    assert (out / reader_index.INDEX_NAME).read_bytes() == rebuilt.getvalue()


@pytest.mark.parametrize("rows", [
    [],
    [("1024/p00_00000.npy", "a", 3)],
    [("1024/p00_00000.npy", "a", 3), ("1024/p00_00000.npy", "é", 1), ("2048/p01_00000.npy", "b" * 300, 1500),
     ("beyond/p00_00003.npy", "z", 300000)],
])
def test_the_index_of_rows_finds_every_id(tmp_path, rows):
    buf = io.BytesIO()
    assert reader_index.write_index(iter(rows), 123, buf) == len(rows)
    path = tmp_path / "x.idx"
    path.write_bytes(buf.getvalue())
    index = reader_index.open_index(str(path))
    assert index.manifest_bytes == 123
    assert index.files == list(dict.fromkeys(r for r, _, _ in rows))
    assert [index.id(i).decode() for i in range(len(rows))] == [i for _, i, _ in rows]
    assert index.length.tolist() == [n for _, _, n in rows]
    assert index.bucket.tolist() == [layout.bucket_index(n) for _, _, n in rows]
    for row, (_, doc_id, _) in enumerate(rows):
        assert index.find(doc_id.encode()) == row
    assert index.find(b"missing") is None


def test_rows_out_of_storage_order_get_no_index():
    rows = [("2048/p00_00000.npy", "a", 1500), ("1024/p00_00000.npy", "b", 3)]
    with pytest.raises(reader_index.NotIndexable):
        reader_index.write_index(iter(rows), 1, io.BytesIO())


def test_the_lookup_table_is_sorted_in_slices_whatever_their_count(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_index, "_LOOKUP_SLICE", 7)  # many slices of the hash range
    rows = [("1024/p00_00000.npy", f"doc-{i}", 1 + i % 5) for i in range(100)]
    buf = io.BytesIO()
    reader_index.write_index(iter(rows), 1, buf)
    path = tmp_path / "s.idx"
    path.write_bytes(buf.getvalue())
    index = reader_index.open_index(str(path))
    assert np.all(np.diff(index.hashes.astype(np.float64)) >= 0)
    assert sorted(index.hash_rows.tolist()) == list(range(100))
    assert all(index.find(f"doc-{i}".encode()) == i for i in range(100))


def _indexed_tree(root, documents: int, partitions: int = 8):
    """A bucketed tree of ``documents`` short documents (2 to 9 tokens) in bucket 1024, with its
    reader index listed in the record, as publish leaves it."""
    rng = np.random.default_rng(documents)
    lengths = rng.integers(2, 10, documents)
    root.mkdir()
    (root / "1024").mkdir()
    files = []
    with open(root / layout.MANIFEST_NAME, "w", encoding="utf-8") as m:
        m.write(manifest.MANIFEST_HEADER + "\n")
        for p in range(partitions):
            docs = np.arange(p, documents, partitions)
            rel = f"1024/p{p:02d}_00000.npy"
            files.append(rel)
            data = rng.integers(0, 1000, int(lengths[docs].sum()), dtype=np.uint32)
            data[np.cumsum(lengths[docs]) - 1] = 151643
            data.tofile(root / rel)
            m.writelines(manifest.format_row(rel, f"doc{i}", int(lengths[i])) for i in docs.tolist())
    with open(root / reader_index.INDEX_NAME, "wb") as out:  # as publish builds it, the manifest hashed
        reader_index.build_from_manifest(LocalFileSystem(), str(root), out)
    (root / tree.RECORD_NAME).write_text(json.dumps({"tool": tree.TOOL, "kind": "bucketed", "files": files,
                                                      "derived": [reader_index.INDEX_NAME]}))
    buckets = {name: manifest.BucketStats() for name in layout.BUCKET_NAMES}
    buckets["1024"] = manifest.BucketStats(files=partitions, documents=documents, tokens=int(lengths.sum()))
    stats = manifest.DatasetStats(
        raw_documents=documents, filter=DEFAULT_FILTER, tokenizer="test",
        eos_id=151643, vocab_size=151936, dtype="uint32", partitions=partitions, seed=0, buckets=buckets, drops={})
    (root / layout.STATS_NAME).write_text(stats.to_text(), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def large_tree(tmp_path_factory):
    return _indexed_tree(tmp_path_factory.mktemp("large") / "tree", 200_000)


def test_a_sampler_over_an_indexed_tree_holds_nothing_per_document(large_tree):
    """Opening, a sampler and its windows allocate by the tree's runs and files, not its 200,000
    documents (the epoch tables of an earlier version took ~50 bytes a document: ~10 MB here)."""
    import tracemalloc

    reader.open_tree(str(large_tree))  # the first open on a machine proves the index (a slice at a time)
    tracemalloc.start()
    try:
        t = reader.open_tree(str(large_tree))
        assert isinstance(t.documents, IndexedDocuments)
        sampler = t.sampler(64, seed=3)
        windows = [sampler.window(k) for k in (0, 1, len(sampler) - 1)]
        batch = sampler.batch(5, 8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak:,} bytes allocated for a tree of {len(t):,} documents"
    assert [len(s.run_lo) for s in sampler.streams] == [1]
    assert batch.inputs.shape == (8, 64)
    slow = _parsed(large_tree)
    for w in windows:  # the same windows as the manifest's tree, with its per-document tables
        again = slow.sampler(64, seed=3).streams[0].window_at(w.start, 64)
        for field in ("inputs", "cu_seqlens", "position_ids", "doc_index", "loss_mask"):
            np.testing.assert_array_equal(getattr(w, field), getattr(again, field), err_msg=field)
        assert w.first_offset == again.first_offset


def _mapped_kib(path) -> int:
    """The resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, mine = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and ":" not in line.split(" ", 1)[0]:
                mine = line.rstrip("\n").endswith(" " + str(path))
            elif mine and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_a_lookup_by_id_leaves_no_page_of_the_index_mapped(large_tree):
    """A lookup's binary search maps the page cache's folios it lands in whole (MBs each with large
    folios): dropped after it, so repeated lookups never add to a reader's resident memory."""
    path = large_tree / reader_index.INDEX_NAME
    index = reader_index.open_index(str(path))
    np.asarray(index.start[:1000]).sum()  # a window's pages: dropped too
    assert index.find(b"doc-absent") is None
    row = index.find(b"doc777")
    assert _mapped_kib(path) == 0
    assert index.id(row) == b"doc777"


@pytest.mark.parametrize("selection", [
    {}, {"partitions": [3]}, {"partitions": [0, 1, 5]}, {"split": "val", "val_fraction": 0.3},
    {"split": "train", "val_fraction": 0.3, "partitions": [2, 7]}, {"buckets": ["2048"]}, {"split": "val"},
])
def test_the_runs_of_a_selection_are_its_rows(large_tree, selection):
    t = reader.open_tree(str(large_tree))
    rows = t.select(**selection)
    runs = t.select_runs(**selection)
    assert np.concatenate([np.arange(a, b) for a, b in runs] or [np.zeros(0, int)]).tolist() == rows.tolist()
    if "val_fraction" not in selection:  # a partition is one file: one run at most, whatever its documents
        assert len(runs) <= len(selection.get("partitions", [0]))


def test_a_remote_tree_opens_through_a_local_copy_of_its_index(sample_tree, tmp_path, monkeypatch):
    import fsspec

    cache = tmp_path / "cache"
    monkeypatch.setenv(reader_index.CACHE_ENV, str(cache))
    fs = fsspec.filesystem("memory")
    for path in sample_tree.rglob("*"):
        if path.is_file():
            fs.pipe(f"/index-remote/{path.relative_to(sample_tree).as_posix()}", path.read_bytes())
    try:
        remote, local = reader.open_tree("memory://index-remote"), reader.open_tree(str(sample_tree))
        assert isinstance(remote.documents, IndexedDocuments) and not remote.store.local
        copies = list(cache.glob("*.idx"))
        assert len(copies) == 1 and copies[0].read_bytes() == (sample_tree / reader_index.INDEX_NAME).read_bytes()
        some = local.documents.id(11)
        assert remote.documents.index_of(some) == local.documents.index_of(some)
        np.testing.assert_array_equal(remote.document(some), local.document(some))
        for k in range(5):
            np.testing.assert_array_equal(remote.sampler(128, seed=1).window(k).inputs,
                                          local.sampler(128, seed=1).window(k).inputs)
        again = reader.open_tree("memory://index-remote")  # the copy is reused, not made again
        assert list(cache.glob("*.idx")) == copies and len(again) == len(local)
        # A new index (another removal, another run) is another copy; a damaged one is not used.
        fs.pipe("/index-remote/" + reader_index.INDEX_NAME, b"not an index" * 30)
        assert not isinstance(reader.open_tree("memory://index-remote").documents, IndexedDocuments)
        assert not list(cache.glob("*.partial"))
    finally:
        fs.rm("/index-remote", recursive=True)


def _remote_copy(fs, tree, prefix):
    for path in tree.rglob("*"):
        if path.is_file():
            fs.pipe(f"/{prefix}/{path.relative_to(tree).as_posix()}", path.read_bytes())


def test_the_cache_keeps_one_copy_per_remote_index_and_only_touches_its_own_files(sample_tree, tmp_path, monkeypatch):
    """A remote tree rewritten (a removal, a re-run) gets a new copy of its index: the old version's copy
    goes, another tree's stays, and so does everything in the cache directory that is not a copy this
    tool names: a link (and what it points to), a file of the user's, a copy being made right now."""
    import os
    import time

    import fsspec

    cache = tmp_path / "cache"
    monkeypatch.setenv(reader_index.CACHE_ENV, str(cache))
    fs = fsspec.filesystem("memory")
    _remote_copy(fs, sample_tree, "versions")
    _remote_copy(fs, sample_tree, "another")
    index = (sample_tree / reader_index.INDEX_NAME).read_bytes()
    try:
        reader.open_tree("memory://versions")
        reader.open_tree("memory://another")
        first = set(cache.glob("*.idx"))
        assert len(first) == 2
        outside = tmp_path / "outside.idx"
        outside.write_bytes(b"keep me")
        keys = sorted(p.name.split("-")[0] for p in first)
        planted = {
            "link": cache / f"{keys[0]}-{'0' * 32}.idx",  # named as a copy, but a link: left, and its target
            "mine": cache / "notes.txt",
            "live": cache / f"{keys[0]}-{'1' * 32}.abc123.partial",  # a copy being made now
        }
        planted["link"].symlink_to(outside)
        planted["mine"].write_text("the user's")
        planted["live"].write_bytes(b"half")
        stale = cache / f"{keys[1]}-{'2' * 32}.zzz999.partial"  # a killed copier's, two days old
        stale.write_bytes(b"half")
        os.utime(stale, (time.time() - 2 * 86400,) * 2)
        unkeyed = cache / f"{'3' * 32}.idx"  # the name copies had before the tree key
        unkeyed.write_bytes(index)

        fs.pipe("/versions/" + reader_index.INDEX_NAME, index)  # the same bytes, a new version of the object
        again = reader.open_tree("memory://versions")
        assert isinstance(again.documents, IndexedDocuments)
        copies = set(cache.glob("*.idx")) - {planted["link"]}
        assert len(copies) == 2 and len(copies & first) == 1  # the other tree's kept, this tree's replaced
        assert all(p.exists() or p.is_symlink() for p in planted.values()) and outside.read_bytes() == b"keep me"
        assert not stale.exists() and not unkeyed.exists()
    finally:
        fs.rm("/versions", recursive=True)
        fs.rm("/another", recursive=True)


def test_a_remote_tree_opens_from_its_manifest_when_no_local_copy_can_be_made(sample_tree, tmp_path, monkeypatch,
                                                                                caplog):
    """A read-only home or a full disk: the index cannot be copied, and the tree still opens (by its
    manifest, as before the index), with one warning that says why."""
    import fsspec

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(reader_index.CACHE_ENV, str(blocker / "cache"))  # under a file: not a directory
    fs = fsspec.filesystem("memory")
    _remote_copy(fs, sample_tree, "no-cache")
    try:
        remote, local = reader.open_tree("memory://no-cache"), reader.open_tree(str(sample_tree))
        assert not isinstance(remote.documents, IndexedDocuments)
        assert len(remote) == len(local) and remote.documents.id(3) == local.documents.id(3)
        assert any("its reader index has no local copy" in r.getMessage() for r in caplog.records)
    finally:
        fs.rm("/no-cache", recursive=True)


def test_a_local_copy_written_to_since_is_copied_again_not_trusted(sample_tree, tmp_path, monkeypatch):
    """The cached copy of a remote index is checked for more than its size: a copy edited in place
    (here two ids of one length swapped, same size) is replaced by a fresh copy of the remote."""
    import fsspec

    cache = tmp_path / "cache"
    monkeypatch.setenv(reader_index.CACHE_ENV, str(cache))
    fs = fsspec.filesystem("memory")
    _remote_copy(fs, sample_tree, "edited-copy")
    try:
        local = reader.open_tree(str(sample_tree))
        reader.open_tree("memory://edited-copy")
        (copy,) = cache.glob("*.idx")
        first, second = local.documents.id(0).encode(), local.documents.id(1).encode()
        assert len(first) == len(second) and first != second
        data = copy.read_bytes()
        assert data.count(first) == 1 and data.count(second) == 1
        copy.write_bytes(data.replace(first, b"\0" * len(first)).replace(second, first).replace(b"\0" * len(first),
                                                                                                   second))
        again = reader.open_tree("memory://edited-copy")
        assert again.documents.id(0).encode() == first and again.documents.id(1).encode() == second
        assert copy.read_bytes() == (sample_tree / reader_index.INDEX_NAME).read_bytes()
    finally:
        fs.rm("/edited-copy", recursive=True)
