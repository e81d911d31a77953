"""Spill files: SpillReader gives back exactly the tokens asked for, in the order asked, chunk by
chunk; roll cuts documents into files as the writers always have."""

from __future__ import annotations

import os

import fsspec
import fsspec.implementations.memory
import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem

from transforms.core.batches import RefBatch, Refs
from transforms.core.spill import SpillReader, roll


def roll_by_hand(sizes, limit: int) -> list[tuple[int, int]]:
    """The writers' rule, one document at a time: a file takes documents until the next would pass
    ``limit``; a document larger than ``limit`` gets a file of its own."""
    files, first, size = [], 0, 0
    for i, n in enumerate(sizes):
        if i > first and size + n > limit:
            files.append((first, i))
            first, size = i, 0
        size += n
    if first < len(sizes):
        files.append((first, len(sizes)))
    return files


@pytest.mark.parametrize(
    "sizes, limit, files",
    [
        ([], 8, []),
        ([4, 4, 4], 8, [(0, 2), (2, 3)]),
        ([8, 8], 8, [(0, 1), (1, 2)]),  # exactly the limit fits
        ([10], 4, [(0, 1)]),  # too large: a file of its own, never split
        ([3, 10, 3], 8, [(0, 1), (1, 2), (2, 3)]),
        ([3, 3, 10, 1, 1], 8, [(0, 2), (2, 3), (3, 5)]),
    ],
)
def test_roll_cuts_files_as_written_out(sizes, limit, files):
    assert roll(np.asarray(sizes, dtype=np.int64), limit) == files == roll_by_hand(sizes, limit)


def test_roll_agrees_with_the_rule_one_document_at_a_time():
    rng = np.random.default_rng(4)
    for _ in range(300):
        limit = int(rng.integers(1, 50))
        sizes = rng.integers(1, 2 * limit + 2, size=int(rng.integers(0, 40)))
        assert roll(sizes, limit) == roll_by_hand(sizes.tolist(), limit), (sizes.tolist(), limit)


def _spill(fs, root: str, dtype, lengths_by_file: dict[str, list[int]], seed: int) -> tuple[Refs, list[np.ndarray]]:
    """Spill files of random documents; their Refs (a RefBatch per file) and each document's tokens."""
    rng = np.random.default_rng(seed)
    batches, docs = [], []
    fs.makedirs(root, exist_ok=True)
    for name, lengths in lengths_by_file.items():
        tokens = [rng.integers(0, np.iinfo(dtype).max, n, dtype=np.int64).astype(dtype) for n in lengths]
        path = f"{root}/{name}"
        with fs.open(path, "wb") as f:
            data = np.concatenate(tokens)
            f.write(np.zeros(3, dtype).tobytes())  # documents need not start at the file's beginning
            f.write(data.tobytes())
        ends = np.cumsum(lengths)
        ids = [f"{name}:{i}" for i in range(len(lengths))]
        batches.append(RefBatch(path, "in.parquet", ids, np.zeros(len(lengths), np.int64),
                                np.asarray(lengths, np.int64), (3 + ends - lengths) * data.itemsize,
                                np.arange(len(lengths), dtype=np.int64)))
        docs.extend(tokens)
    # Refs.concat keeps the batches' order: the docs list is in the same order.
    return Refs.concat(batches), docs


LAYOUTS = {
    # Many short documents per file and chunk: gathered with one fancy-indexed copy per file.
    "many_short": {"a.bin": [1, 2, 3, 1, 5] * 60, "b.bin": [4, 1, 2] * 80},
    # Few long documents: copied one by one.
    "few_long": {"a.bin": [3000, 70, 5000], "b.bin": [200, 9000]},
    # Both in one file.
    "mixed": {"a.bin": [2] * 200 + [4000, 1, 1], "b.bin": [1] * 70},
}


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("chunk_tokens", [1 << 20, 700])
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_the_reader_gathers_exactly_what_is_asked_in_chunks(tmp_path, where, layout, chunk_tokens, dtype):
    if where == "local":
        fs, root = LocalFileSystem(), str(tmp_path)
    else:
        fs, root = fsspec.filesystem("memory"), f"/spilltest/{tmp_path.name}"  # read with cat_ranges
    refs, docs = _spill(fs, root, dtype, LAYOUTS[layout], seed=len(layout))
    order = np.random.default_rng(7).permutation(refs.size)[: refs.size - 3]  # not all, not in order
    reader = SpillReader(fs, np.dtype(dtype), chunk_tokens=chunk_tokens)
    try:
        chunks = list(reader.chunks(refs, order))
    finally:
        reader.close()
    assert [(first, end) for first, end, _ in chunks] == roll(refs.lengths[order], chunk_tokens)
    for first, end, tokens in chunks:
        assert tokens.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(tokens, np.concatenate([docs[i] for i in order[first:end]]))
    if chunk_tokens == 700:
        assert len(chunks) > 1


@pytest.mark.parametrize("where", ["local", "memory"])
def test_reads_cut_at_iov_max_and_partial_reads_still_give_every_token(tmp_path, monkeypatch, where):
    """Documents back to back in a spill file (or the scratch file) are read by one preadv call of at
    most IOV_MAX buffers; a call that reads less than asked is finished buffer by buffer."""
    import transforms.core.spill as spill

    if where == "local":
        fs, root = LocalFileSystem(), str(tmp_path)
    else:
        fs, root = fsspec.filesystem("memory"), f"/spilliov/{tmp_path.name}"
    refs, docs = _spill(fs, root, np.uint16, {"a.bin": [1, 2, 3, 4] * 10, "b.bin": [5] * 7}, seed=3)
    calls = []

    def partial_preadv(fd, buffers, offset):  # at most 3 bytes a call, as a signal could leave it
        calls.append(len(buffers))
        data = os.pread(fd, 3, offset)
        buffers[0][:len(data)] = data[:len(buffers[0])]
        return min(len(data), len(buffers[0]))

    monkeypatch.setattr(spill, "IOV_MAX", 4)
    monkeypatch.setattr(spill.os, "preadv", partial_preadv)
    order = np.random.default_rng(5).permutation(refs.size)
    reader = SpillReader(fs, np.dtype(np.uint16))
    try:
        (first, end, tokens), = list(reader.chunks(refs, order))
    finally:
        reader.close()
    np.testing.assert_array_equal(tokens, np.concatenate([docs[i] for i in order]))
    assert calls and max(calls) == 4  # back-to-back documents in one call, cut at IOV_MAX


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_short_spill_file_is_an_error_not_short_tokens(tmp_path, where):
    fs, root = (LocalFileSystem(), str(tmp_path)) if where == "local" else (fsspec.filesystem("memory"),
                                                                              f"/spillshort/{tmp_path.name}")
    refs, _ = _spill(fs, root, np.uint16, {"a.bin": [5, 5, 5]}, seed=1)
    path = refs.spill_paths[0]
    data = fs.cat_file(path)
    with fs.open(path, "wb") as f:
        f.write(data[:-2])
    reader = SpillReader(fs, np.dtype(np.uint16))
    with pytest.raises(OSError, match="is short"):
        list(reader.chunks(refs, np.arange(refs.size)))


def test_spilled_references_come_back_through_their_pointers(tmp_path):
    """SpillTokens writes each group's documents together and emits only pointers (once the
    bundle's files are closed); the references they point to find every document's tokens
    again, whichever group it went to."""
    import types

    from transforms.core.batches import TokenBatch
    from transforms.core.spill import SpillTokensFn, load_refs

    docs = {"a": [1, 2, 9], "b": [3, 9], "c": [4, 5, 6, 9], "d": [9], "e": [7, 8, 9]}
    ids = list(docs)
    batch = TokenBatch("src", ids, np.arange(5, dtype=np.int64),
                       np.array([len(docs[i]) for i in ids], np.int64),
                       np.concatenate([np.array(docs[i], np.uint32) for i in ids]))
    fn = SpillTokensFn(types.SimpleNamespace(spill_url=str(tmp_path / "spill"), output=str(tmp_path)),
                       lambda b, _: (["odd" if i % 2 else "even" for i in range(b.size)], np.arange(b.size) * 7))
    fn.setup()
    fn.start_bundle()
    assert list(fn.process(batch)) == []  # held until the bundle ends or enough is held
    emitted = [w.value for w in fn.finish_bundle()]
    assert sorted(k for k, _ in emitted) == ["even", "odd"]
    assert all(p.size > 0 and p.path.endswith(".refs") for _, p in emitted)
    fs = fsspec.filesystem("file")
    for key, pointer in emitted:
        (ref,) = load_refs(fs, [pointer])
        members = [i for n, i in enumerate(ids) if (n % 2 == 1) == (key == "odd")]
        assert ref.ids == members
        assert ref.sort_keys.tolist() == [ids.index(i) * 7 for i in ref.ids]
        refs = Refs.concat([ref])
        got = np.concatenate([t for _, _, t in SpillReader(fs, np.uint32).chunks(refs, np.arange(refs.size))])
        assert got.tolist() == [t for i in ref.ids for t in docs[i]]


def _ref(ids, **extra):
    from transforms.core.batches import RefBatch

    n = len(ids)
    return RefBatch("/w/spill/abc.bin", "/in/a.jsonl", list(ids), np.arange(n, dtype=np.int64) * 3,
                    np.arange(1, n + 1, dtype=np.int64), np.arange(n, dtype=np.int64) * 8,
                    np.arange(n, dtype=np.int64), extra)


@pytest.mark.parametrize("ref", [
    _ref(["a", "b", "ü-日本"]),
    _ref([]),
    _ref(["with\0nul", "x"]),  # a NUL in an id: the strings go as a JSON array
    _ref(["d1", "d2"], split=np.array([0, 1], np.int8), words=np.array([5, 7], np.int64),
         doc_id=np.array(["s1", "s1"], dtype=object)),
])
def test_references_are_data_that_come_back_as_they_went(ref):
    from transforms.core.spill import RefPointer, decode_refs, encode_refs

    data = encode_refs(ref)
    back = decode_refs(data, RefPointer("/w/spill/abc.refs", 0, len(data), ref.size))
    assert back.spill_path == "/w/spill/abc.bin" and back.source == ref.source and back.ids == ref.ids
    for name in ("sort_keys", "lengths", "offsets", "rows"):
        assert np.array_equal(getattr(back, name), getattr(ref, name)) and getattr(back, name).dtype == np.int64
    assert sorted(back.extra) == sorted(ref.extra)
    for name, values in ref.extra.items():
        assert back.extra[name].dtype == values.dtype and back.extra[name].tolist() == values.tolist()


def test_references_that_do_not_check_are_refused_never_run():
    import pickle

    from transforms.core.records import BadInputError
    from transforms.core.spill import RefPointer, decode_refs, encode_refs

    good = encode_refs(_ref(["a", "b"]))
    bad_length = bytearray(good)
    lengths_at = len(good) - 4 - 8 * 2 * 3  # the lengths column: 3 columns of 2 int64 before the 4 id bytes
    bad_length[lengths_at:lengths_at + 8] = (0).to_bytes(8, "little")
    for data, documents in [(pickle.dumps(_ref(["a", "b"])), 2), (b"", 2), (good, 3), (good[:-1] + b"\xff", 2),
                            (bytes(bad_length), 2), (good + b"x", 2)]:
        with pytest.raises(BadInputError, match="not a references file this tool wrote"):
            decode_refs(data, RefPointer("/w/spill/abc.refs", 0, len(data), documents))


@pytest.mark.parametrize(
    "spill, starts, stops, max_gap, ranges, member",
    [
        ([], [], [], 0, [], []),
        ([0, 0, 0], [0, 4, 8], [4, 8, 12], 0, [(0, 0, 12)], [0, 0, 0]),  # back to back: one range
        ([0, 0], [0, 6], [4, 8], 0, [(0, 0, 4), (0, 6, 8)], [0, 1]),  # a gap splits
        ([0, 0], [0, 6], [4, 8], 2, [(0, 0, 8)], [0, 0]),  # ... unless within max_gap
        ([0, 1], [0, 4], [4, 8], 0, [(0, 0, 4), (1, 4, 8)], [0, 1]),  # another file: another range
        ([0, 0, 0], [0, 2, 9], [10, 4, 12], 0, [(0, 0, 12)], [0, 0, 0]),  # inside an earlier range
        ([0, 1], [0, 0], [1 << 30, 8], 0, [(0, 0, 1 << 30), (1, 0, 8)], [0, 1]),  # a long range ends in its file
    ],
)
def test_coalesce_merges_neighbouring_ranges_of_one_file(spill, starts, stops, max_gap, ranges, member):
    from transforms.core.spill import coalesce

    got, got_member = coalesce(np.asarray(spill, np.int64), np.asarray(starts, np.int64),
                               np.asarray(stops, np.int64), max_gap)
    assert got == ranges
    assert got_member.tolist() == member


class CountingMemoryFS(fsspec.implementations.memory.MemoryFileSystem):
    """A memory filesystem that counts the range requests it serves and their sizes."""

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        self.sizes.extend(b - a for a, b in zip(starts, ends, strict=True))
        return super().cat_ranges(paths, starts, ends, max_gap=max_gap, on_error=on_error)


def test_an_object_store_group_is_read_in_few_large_requests_whatever_the_order(tmp_path):
    """Spill files on an object store: a writer's documents, asked for in shuffled order over many
    chunks, come in one request per contiguous stretch (cut at read_bytes), not one per document."""
    fs = CountingMemoryFS(skip_instance_cache=True)
    fs.sizes = []
    root = f"/spillcount/{tmp_path.name}"
    # Two spill files of 3,000 short and 40 long documents each: two stretches in all.
    refs, docs = _spill(fs, root, np.uint32, {"a.bin": [3, 9, 20] * 1000 + [5000] * 40,
                                              "b.bin": [7, 1] * 1500 + [3000] * 40}, seed=3)
    order = np.random.default_rng(11).permutation(refs.size)
    reader = SpillReader(fs, np.dtype(np.uint32), chunk_tokens=5000, read_bytes=256 << 10, round_bytes=1 << 20)
    try:
        reader.stage(refs, order)
        got = [t for _, _, t in reader.chunks(refs, order)]
    finally:
        reader.close()
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate([docs[i] for i in order]))
    total = int(refs.lengths.sum()) * 4
    assert max(fs.sizes) <= 256 << 10
    assert len(fs.sizes) == reader.requests <= total // (256 << 10) + 2
    assert reader.requests / refs.size <= 0.02
    assert len(got) > 10  # many chunks, and no request of their own


def test_documents_not_staged_are_fetched_when_asked_for(tmp_path):
    fs = CountingMemoryFS(skip_instance_cache=True)
    fs.sizes = []
    refs, docs = _spill(fs, f"/spilllate/{tmp_path.name}", np.uint16, {"a.bin": [4, 5, 6] * 50}, seed=5)
    reader = SpillReader(fs, np.dtype(np.uint16))
    reader.stage(refs, np.arange(0, 100))
    rest = np.arange(100, refs.size)[::-1]
    got = np.concatenate([t for _, _, t in reader.chunks(refs, rest)])
    reader.close()
    np.testing.assert_array_equal(got, np.concatenate([docs[i] for i in rest]))
    assert reader.requests == 2


def test_the_spill_writer_holds_batches_up_to_its_budget(tmp_path):
    """Batches are held until they pass flush_bytes, then written as one stretch per group: fewer,
    longer stretches; every document is in exactly one, with its own tokens."""
    import types

    from transforms.core.batches import TokenBatch
    from transforms.core.spill import SpillTokensFn, load_refs

    rng = np.random.default_rng(2)
    fn = SpillTokensFn(types.SimpleNamespace(spill_url=str(tmp_path / "spill"), output=str(tmp_path)),
                       lambda b, _: ([int(i.split(":")[1]) % 3 for i in b.ids], np.zeros(b.size, np.int64)),
                       flush_bytes=4000)
    fn.setup()
    fn.start_bundle()
    emitted, expected = [], {}
    for n in range(10):
        lengths = rng.integers(1, 30, 20)
        ids = [f"{n}:{i}" for i in range(20)]
        tokens = rng.integers(0, 1000, int(lengths.sum())).astype(np.uint32)
        ends = np.cumsum(lengths)
        expected.update({d: tokens[e - k:e].tolist() for d, e, k in zip(ids, ends, lengths, strict=True)})
        emitted += list(fn.process(TokenBatch("src", ids, np.arange(20, dtype=np.int64), lengths, tokens)))
    emitted += [w.value for w in fn.finish_bundle()]
    fs = fsspec.filesystem("file")
    refs = [load_refs(fs, [p])[0] for _, p in emitted]
    assert 3 < len(emitted) < 30  # several flushes, each of three groups, not one per batch
    assert sorted(i for r in refs for i in r.ids) == sorted(expected)
    for (key, _), ref in zip(emitted, refs, strict=True):
        assert {int(i.split(":")[1]) % 3 for i in ref.ids} == {key}
        got = SpillReader(fs, np.uint32).chunks(Refs.concat([ref]), np.arange(ref.size))
        assert np.concatenate([t for _, _, t in got]).tolist() == [t for i in ref.ids for t in expected[i]]


def test_a_reader_of_s3_gets_a_connection_pool_as_large_as_its_requests_in_flight(monkeypatch):
    """botocore's pool holds 10 connections unless told: a reader keeping 32 requests in flight (or
    a publish keeping 64 copies) gets a client with that many, and fsspec's own s3 settings stay."""
    s3fs = pytest.importorskip("s3fs")
    from shards import storage

    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": "http://127.0.0.1:9", "anon": True,
                                                   "config_kwargs": {"read_timeout": 7}})
    s3fs.S3FileSystem.clear_instance_cache()
    fs, path = storage.filesystem("s3://bucket/out", connections=48)
    assert path == "bucket/out"
    assert fs.config_kwargs == {"read_timeout": 7, "max_pool_connections": 48}
    assert fs.endpoint_url == "http://127.0.0.1:9"
    plain, _ = storage.filesystem("s3://bucket/out")
    assert "max_pool_connections" not in plain.config_kwargs
    s3fs.S3FileSystem.clear_instance_cache()


def _batch(source: str, ids: list[str]):
    from transforms.core.batches import TokenBatch

    n = len(ids)
    return TokenBatch(source, ids, np.arange(n, dtype=np.int64), np.ones(n, np.int64), np.arange(n, dtype=np.uint32))


@pytest.mark.parametrize("as_rows", [False, True])
def test_keys_given_as_arrays_make_the_stretches_a_list_of_keys_makes(as_rows):
    """A key_fn may give its group keys as an int64 array (one int, or one row of ints, per
    document): the stretches, their keys (Python ints and tuples) and their members are those of
    the same keys as a list."""
    from transforms.core.spill import _array_stretches, _listed_stretches

    batches = [_batch("b.parquet", ["x", "y", "z", "w"]), _batch("a.parquet", ["p", "q", "r"]),
               _batch("b.parquet", ["s", "t"])]
    rows = [np.array([[3, 0], [1, 0], [3, 0], [1, 2]]), np.array([[1, 0], [3, 0], [1, 0]]),
            np.array([[3, 0], [1, 2]])]
    arrays = rows if as_rows else [r[:, 0] for r in rows]
    listed = [[tuple(k) for k in r.tolist()] if as_rows else r[:, 0].tolist() for r in rows]
    batch_of = np.repeat(np.arange(3), [4, 3, 2])
    got = _array_stretches(batches, arrays, batch_of)
    want = _listed_stretches(batches, listed)
    assert list(got) == list(want) or sorted(map(repr, got)) == sorted(map(repr, want))
    assert {repr(k): v.tolist() for k, v in got.items()} == {repr(k): v.tolist() for k, v in want.items()}
