"""shards.reader against trees written by the bucketed job and by hand: documents through the
manifest, windows checked token for token against a stream rebuilt here from the manifest, the
validation split, per-bucket weights, llm.c shards, fsspec trees and the torch dataset."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import pickle
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
from conftest import DEFAULT_FILTER, bucketed_sample

from shards import layout, llmc, manifest, reader
from shards.reader import IncompleteTreeError, open_llmc, open_tree
from shards.torch_dataset import global_batch, hf_labels, worker_steps

EOS = 151643
SEQ = 256


# --------------------------------------------------------------------------------------------
# Trees, and the independent view of them the tests compare against.


def write_bucketed_tree(root, files, *, eos=EOS, dtype="uint32", vocab_size=151936, partitions=4, marker=True):
    """A bucketed tree by hand. ``files`` maps rel paths (in layout order) to [(id, tokens), ...],
    each document's tokens already ending with ``eos``."""
    np_dtype = layout.DTYPES[dtype]
    buckets = {name: manifest.BucketStats() for name in layout.BUCKET_NAMES}
    rows = [manifest.MANIFEST_HEADER + "\n"]
    for rel, docs in files.items():
        os.makedirs(os.path.join(root, rel.split("/")[0]), exist_ok=True)
        data = np.concatenate([np.asarray(t, dtype=np_dtype) for _, t in docs])
        data.tofile(os.path.join(root, rel))
        b = buckets[rel.split("/")[0]]
        b.files += 1
        for doc_id, tokens in docs:
            rows.append(manifest.format_row(rel, doc_id, len(tokens)))
            b.documents += 1
            b.tokens += len(tokens)
    with open(os.path.join(root, layout.MANIFEST_NAME), "w", encoding="utf-8") as f:
        f.writelines(rows)
    stats = manifest.DatasetStats(
        raw_documents=sum(b.documents for b in buckets.values()), filter=DEFAULT_FILTER, tokenizer="test", eos_id=eos,
        vocab_size=vocab_size, dtype=dtype,
        partitions=partitions, seed=0, buckets=buckets, drops={},
    )
    if marker:
        with open(os.path.join(root, layout.STATS_NAME), "w", encoding="utf-8") as f:
            f.write(stats.to_text())
    return root


def doc_tokens(rng, n, eos=EOS, high=1000):
    """n tokens: n - 1 ids below ``high`` (never EOS), then EOS."""
    return np.append(rng.integers(0, high, n - 1), eos)


def manifest_view(root):
    """[(id, rel_path, offset, tokens)] in manifest order, parsed here without shards.manifest."""
    with open(os.path.join(root, layout.MANIFEST_NAME), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "rel_path | original_id | processed_token_count"
    data, offsets, out = {}, {}, []
    for line in lines[1:]:
        rel, doc_id, n = line.split(" | ")
        if rel not in data:
            data[rel] = np.fromfile(os.path.join(root, rel), dtype="<u4")
        start = offsets.get(rel, 0)
        out.append((doc_id, rel, start, data[rel][start:start + int(n)]))
        offsets[rel] = start + int(n)
    return out


def val_key(doc_id):
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, person=b"validation").digest()
    return int.from_bytes(digest, "little") / 2**64


def start_uniform(seed, k):
    digest = hashlib.blake2b(k.to_bytes(8, "little"), digest_size=16, key=seed.to_bytes(8, "little"),
                             person=b"windows").digest()
    return (int.from_bytes(digest[:8], "little") >> 11) / 2**53, (int.from_bytes(digest[8:], "little") >> 11) / 2**53


class Stream:
    """Selected documents concatenated, with each one's start: the chapter's training stream."""

    def __init__(self, docs):
        self.ids = [d[0] for d in docs]
        self.tokens = np.concatenate([d[3] for d in docs]).astype(np.int64)
        self.starts = np.cumsum([0] + [len(d[3]) for d in docs])


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    """The bundled sample through the bucketed job: 4 partitions, small files so partitions roll."""
    return str(bucketed_sample(tmp_path_factory.mktemp("reader") / "out", "--partitions", "4",
                               "--max-shard-bytes", "120000"))


@pytest.fixture(scope="module")
def tree(sample_tree):
    return open_tree(sample_tree)


# --------------------------------------------------------------------------------------------
# Opening, listing and reading documents.


def test_a_tree_without_its_commit_marker_is_refused(sample_tree, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sample_tree, copy)
    os.remove(copy / layout.STATS_NAME)
    with pytest.raises(IncompleteTreeError, match=r"no dataset_stats\.txt.*commit point"):
        open_tree(str(copy))


def test_a_shard_that_does_not_match_the_manifest_is_refused(sample_tree, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(sample_tree, copy)
    rel = manifest_view(sample_tree)[0][1]
    with open(copy / rel, "r+b") as f:
        f.truncate(os.path.getsize(copy / rel) - 4)
    with pytest.raises(ValueError, match=rf"{rel} holds .* bytes, the manifest's rows sum to"):
        open_tree(str(copy))


def test_documents_listed_through_the_manifest(sample_tree, tree):
    expected = manifest_view(sample_tree)
    assert len(tree) == len(expected) == tree.stats.kept_documents
    listed = list(tree.list_documents())
    assert [(d.id, d.shard, d.offset, d.length) for d in listed] == [(i, r, o, len(t)) for i, r, o, t in expected]
    for info, (doc_id, rel, _, tokens) in zip(listed, expected, strict=True):
        name = layout.parse_shard_rel_path(rel)
        assert (info.bucket, info.partition) == (name.bucket, name.partition)
        assert tree.info(doc_id) == info
        got = tree.document(doc_id)
        assert np.array_equal(got, tokens) and got[-1] == EOS and int((got == EOS).sum()) == 1
    with pytest.raises(KeyError, match="no document with id 'nope'"):
        tree.document("nope")
    with pytest.raises(KeyError):
        tree.document("x" * 500)  # longer than any stored id


def test_local_trees_are_memory_mapped(tree):
    doc = tree.document(0)
    bases = [doc]
    while isinstance(bases[-1], np.ndarray) and bases[-1].base is not None:
        bases.append(bases[-1].base)
    assert any(isinstance(b, np.memmap) for b in bases)  # a view of the map, not a copy


# --------------------------------------------------------------------------------------------
# Windows.


def check_window(w, stream, seq_len, eos=EOS):
    """Everything a window must be, against the stream rebuilt from the manifest."""
    want = stream.tokens[w.start:w.start + seq_len + 1]
    assert np.array_equal(w.inputs, want[:-1]) and np.array_equal(w.targets, want[1:])
    assert np.array_equal(w.targets[:-1], w.inputs[1:])  # teacher forcing: the targets are shifted inputs
    # Boundaries: exactly the document starts of the manifest that fall inside the inputs.
    inside = [int(s) - w.start for s in stream.starts[:-1] if w.start < s < w.start + seq_len]
    assert w.cu_seqlens.tolist() == [0, *inside, seq_len] and w.cu_seqlens.dtype == np.int32
    first_doc = int(np.searchsorted(stream.starts, w.start, side="right")) - 1
    assert w.first_offset == w.start - stream.starts[first_doc]
    assert [stream.ids[first_doc + j] for j in range(len(w.cu_seqlens) - 1)] == \
        [stream.doc_ids_by_row[i] for i in w.doc_index]
    # Megatron's eod_mask_loss: no loss on the target after an EOS (the next document's first token).
    assert w.loss_mask.dtype == np.float32 and np.array_equal(w.loss_mask, (w.inputs != eos).astype(np.float32))
    # Position ids restart at every document, and a document starts right after an EOS.
    for j, (a, b) in enumerate(zip(w.cu_seqlens[:-1], w.cu_seqlens[1:], strict=True)):
        assert w.position_ids[a:b].tolist() == list(range(b - a))
        assert j == 0 or w.inputs[a - 1] == eos
        assert eos not in w.inputs[a:b - 1]


def stream_for(tree, docs):
    s = Stream(docs)
    s.doc_ids_by_row = {i: tree.documents.id(i) for i in range(len(tree))}
    return s


def test_windows_are_the_chapters_windows_over_the_manifest_stream(sample_tree, tree):
    docs = manifest_view(sample_tree)
    stream = stream_for(tree, docs)
    n = len(stream.tokens)
    sampler = tree.sampler(SEQ, seed=3, replacement=True)  # the draws with replacement (epochs: test_reader_epochs)
    assert sampler.tokens == n == tree.stats.total_tokens
    for k in range(300):
        w = sampler.window(k)
        # start = floor(u (N - S - 1)), u from the seeded generator: pinned here from its definition.
        assert w.start == math.floor(start_uniform(3, k)[1] * (n - SEQ - 1))
        check_window(w, stream, SEQ)
    # Some windows cross documents, some lie inside one.
    pieces = [len(sampler.window(k).cu_seqlens) - 1 for k in range(300)]
    assert pieces.count(1) > 100 and sum(p > 1 for p in pieces) > 5


def test_the_same_seed_gives_the_same_windows(sample_tree, tree):
    a = [tree.sampler(SEQ, seed=11).window(k) for k in range(50)]
    again = open_tree(sample_tree).sampler(SEQ, seed=11)
    b = [again.window(k) for k in reversed(range(50))][::-1]  # random access: order of calls does not matter
    for x, y in zip(a, b, strict=True):
        assert x.start == y.start and np.array_equal(x.inputs, y.inputs) and np.array_equal(x.cu_seqlens, y.cu_seqlens)
    other = [tree.sampler(SEQ, seed=12).window(k).start for k in range(50)]
    assert other != [x.start for x in a]
    iterated = tree.sampler(SEQ, seed=11).windows(start=10, step=5)
    assert [next(iterated).start for _ in range(4)] == [a[k].start for k in (10, 15, 20, 25)]


def test_a_batch_stacks_windows_with_flattened_cu_seqlens(tree):
    sampler = tree.sampler(SEQ, seed=5)
    batch = sampler.batch(2, batch_size=4)
    windows = [sampler.window(k) for k in range(8, 12)]
    assert batch.inputs.shape == batch.targets.shape == batch.position_ids.shape == (4, SEQ)
    assert batch.inputs.dtype == np.int64
    for i, w in enumerate(windows):  # written straight into the batch, the same as the window on its own
        for field in ("inputs", "targets", "position_ids", "loss_mask"):
            assert np.array_equal(getattr(batch, field)[i], getattr(w, field)), field
        assert np.array_equal(batch.windows[i].cu_seqlens, w.cu_seqlens)
    assert np.array_equal(batch.loss_mask, reader.stack_windows(windows).loss_mask)
    want = [c + i * SEQ for i, w in enumerate(windows) for c in w.cu_seqlens[:-1]] + [4 * SEQ]
    assert batch.cu_seqlens.tolist() == want and batch.cu_seqlens.dtype == np.int32
    assert batch.max_seqlen == max(int(np.diff(w.cu_seqlens).max()) for w in windows)


def test_block_causal_mask_follows_the_boundaries():
    mask = reader.block_causal_mask(np.array([0, 2, 5], dtype=np.int32))
    want = np.zeros((5, 5), dtype=bool)
    want[0, 0] = want[1, 0] = want[1, 1] = True
    for i in range(2, 5):
        want[i, 2:i + 1] = True
    assert np.array_equal(mask, want)


def test_windows_aligned_to_documents_start_at_a_document(sample_tree, tree):
    stream = stream_for(tree, manifest_view(sample_tree))
    sampler = tree.sampler(SEQ, seed=1, align_to_docs=True, replacement=True)
    firsts = set()
    for k in range(300):
        w = sampler.window(k)
        assert w.first_offset == 0 and w.start in set(stream.starts.tolist())
        check_window(w, stream, SEQ)
        firsts.add(int(w.doc_index[0]))
    assert len(firsts) > 60  # each eligible document equally likely, not only the long ones


# --------------------------------------------------------------------------------------------
# The validation split.


def test_validation_split_is_disjoint_stable_and_by_its_own_hash(sample_tree, tree):
    ids = [tree.documents.id(i) for i in range(len(tree))]
    train = {ids[i] for i in tree.select("train", val_fraction=0.2)}
    val = {ids[i] for i in tree.select("val", val_fraction=0.2)}
    assert train.isdisjoint(val) and train | val == set(ids)
    assert val == {i for i in ids if val_key(i) < 0.2}  # the hash as specified, so it survives code changes
    assert 10 < len(val) < 50
    again = open_tree(sample_tree)
    assert {again.documents.id(i) for i in again.select("val", val_fraction=0.2)} == val
    # Growing the fraction only moves documents into val.
    assert {ids[i] for i in tree.select("val", val_fraction=0.1)} <= val
    # Not the partition hash: val takes documents from every partition and leaves some in each.
    parts = {p: {ids[i] for i in range(len(ids)) if tree.documents.partition[i] == p} for p in range(4)}
    assert all(parts[p] & val and parts[p] - val for p in range(4))


def test_training_windows_never_touch_validation_documents(sample_tree, tree):
    docs = manifest_view(sample_tree)
    train_docs = [d for d in docs if val_key(d[0]) >= 0.2]
    stream = stream_for(tree, train_docs)
    sampler = tree.sampler(SEQ, seed=2, split="train", val_fraction=0.2)
    val_rows = set(tree.select("val", val_fraction=0.2).tolist())
    assert sampler.tokens == len(stream.tokens)
    for k in range(200):
        w = sampler.window(k)
        assert val_rows.isdisjoint(w.doc_index.tolist())
        check_window(w, stream, SEQ)
    val_sampler = tree.sampler(64, seed=2, split="val", val_fraction=0.2)
    assert all(set(val_sampler.window(k).doc_index.tolist()) <= val_rows for k in range(100))


# --------------------------------------------------------------------------------------------
# Buckets, partitions and weights.


def test_bucket_and_partition_selection(tree):
    rows = tree.select(buckets=["2048", "4096"], partitions=[1, 3])
    infos = list(tree.list_documents(rows))
    assert infos and all(i.bucket in ("2048", "4096") and i.partition in (1, 3) for i in infos)
    assert len(rows) == sum(1 for i in tree.list_documents() if i.bucket in ("2048", "4096") and i.partition in (1, 3))
    with pytest.raises(ValueError, match="unknown bucket"):
        tree.select(buckets=["3000"])


def test_weights_pick_buckets_in_proportion_and_stay_inside_them(sample_tree, tree):
    docs = manifest_view(sample_tree)
    sampler = tree.sampler(SEQ, seed=4, weights={"1024": 1, "16384": 3, "beyond": 0}, replacement=True)
    by_bucket = {b: stream_for(tree, [d for d in docs if d[1].startswith(b + "/")]) for b in ("1024", "16384")}
    counts = {"1024": 0, "16384": 0}
    for k in range(2000):
        w = sampler.window(k)
        counts[w.bucket] += 1
        assert {tree.info(int(i)).bucket for i in w.doc_index} == {w.bucket}
        if k < 200:
            check_window(w, by_bucket[w.bucket], SEQ)
            u_bucket, u_start = start_uniform(4, k)
            assert w.bucket == ("1024" if u_bucket < 0.25 else "16384")
            assert w.start == math.floor(u_start * (len(by_bucket[w.bucket].tokens) - SEQ - 1))
    assert 0.21 < counts["1024"] / 2000 < 0.29


def test_bad_sampler_arguments_say_what_is_wrong(tree):
    with pytest.raises(ValueError, match="unknown bucket"):
        tree.sampler(SEQ, weights={"2000": 1})
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.sampler(SEQ, weights={"1024": -1})
    with pytest.raises(ValueError, match="at least one bucket"):
        tree.sampler(SEQ, weights={"1024": 0})
    with pytest.raises(ValueError, match=r"bucket 32768 hold 18445 tokens.*at least 100002"):
        tree.sampler(100_000, weights={"32768": 1})
    with pytest.raises(ValueError, match=r"val_fraction must be within \[0, 1\)"):
        tree.sampler(SEQ, val_fraction=1.0)


# --------------------------------------------------------------------------------------------
# Small trees by hand: exact boundaries, uint16, remote filesystems.


def test_a_hand_made_tree_reads_back_exactly(tmp_path):
    rng = np.random.default_rng(0)
    a, b, c, d = (doc_tokens(rng, n) for n in (5, 3, 1, 7))
    write_bucketed_tree(tmp_path, {"1024/p00_00000.npy": [("a", a), ("b", b)],
                                   "1024/p01_00000.npy": [("c", c), ("d", d)]})
    tree = open_tree(str(tmp_path))
    assert [tree.info(x)[2:5] for x in "abcd"] == [
        ("1024/p00_00000.npy", 0, 5), ("1024/p00_00000.npy", 5, 3), ("1024/p01_00000.npy", 0, 1),
        ("1024/p01_00000.npy", 1, 7)]
    # One window covering the whole 16-token stream: S = 14 (the chapter's N - S - 1 = 1, so start 0).
    w = tree.sampler(14, seed=0).window(0)
    stream = np.concatenate([a, b, c, d])
    assert w.start == 0 and np.array_equal(w.inputs, stream[:14]) and np.array_equal(w.targets, stream[1:15])
    assert w.cu_seqlens.tolist() == [0, 5, 8, 9, 14]
    assert w.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 1, 2, 3, 4]
    assert w.doc_index.tolist() == [0, 1, 2, 3]


def test_a_manifest_listing_files_out_of_layout_order(tmp_path):
    rng = np.random.default_rng(2)
    a, b, c = (doc_tokens(rng, n) for n in (4, 6, 5))
    write_bucketed_tree(tmp_path, {"2048/p00_00000.npy": [("c", np.append(rng.integers(0, 9, 1100), EOS))],
                                   "1024/p01_00000.npy": [("b", b)], "1024/p00_00000.npy": [("a", a), ("a2", c)]})
    tree = open_tree(str(tmp_path))
    assert [tree.documents.id(i) for i in range(len(tree))] == ["a", "a2", "b", "c"]  # storage order
    assert tree.info("a2")[2:5] == ("1024/p00_00000.npy", 4, 5) and np.array_equal(tree.document("b"), b)
    assert tree.info("c").bucket == "2048"


def test_a_tree_pickles_without_its_tokens(tree):
    for i in range(len(tree)):
        tree.document(i)  # every file memory-mapped
    data = pickle.dumps(tree)  # as a spawned DataLoader worker receives it
    assert len(data) < tree.total_tokens * tree.dtype.itemsize / 4
    copy = pickle.loads(data)
    for k in range(20):
        assert np.array_equal(copy.sampler(SEQ, seed=6).window(k).inputs, tree.sampler(SEQ, seed=6).window(k).inputs)



def test_a_samplers_state_is_plain_data_that_names_no_module(tree):
    """What a checkpoint keeps of a sampler is plain data: no class or module path (the reader's
    classes moved to shards/reading/ and may move again), so a saved state loads into any layout."""
    lengths = tree.length_sampler(4096, seq_lens={b: 256 for b in tree.buckets_held()})
    for sampler in (tree.sampler(SEQ, seed=3), tree.sampler(SEQ, align_to_docs=True), lengths):
        next(iter(sampler))
        state = sampler.state_dict()
        assert state["position"] == 1 and json.loads(json.dumps(state)) == state
        assert b"shards" not in pickle.dumps(state)


def test_shards_reader_is_the_public_api_and_defines_nothing_itself():
    """shards.reader re-exports the reading API (``__all__``) from the modules that define it
    (shards/reading/, shards/tree.py) and holds no code of its own: one definition of each name."""
    body = ast.parse(Path(reader.__file__).read_text(encoding="utf-8")).body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)  # the docstring
    assert all(isinstance(node, ast.ImportFrom) for node in body[1:-1])
    assert isinstance(body[-1], ast.Assign) and body[-1].targets[0].id == "__all__"
    assert sorted(reader.__all__) == sorted(n for n in vars(reader) if not n.startswith("_"))
    homes = {getattr(reader, n).__module__ for n in reader.__all__ if hasattr(getattr(reader, n), "__module__")}
    assert homes == {"shards.reading.hashes", "shards.reading.opening", "shards.reading.records",
                     "shards.reading.samplers", "shards.reading.shard_tree", "shards.reading.store", "shards.tree"}


def test_a_uint16_tree(tmp_path):
    rng = np.random.default_rng(1)
    docs = [(f"d{i}", doc_tokens(rng, 20 + i, eos=50256, high=50000)) for i in range(6)]
    write_bucketed_tree(tmp_path, {"1024/p00_00000.npy": docs}, eos=50256, dtype="uint16", vocab_size=50257)
    tree = open_tree(str(tmp_path))
    assert tree.dtype == np.dtype("<u2") and tree.eos_id == 50256
    assert np.array_equal(tree.document("d3"), docs[3][1])
    stream = Stream([(i, None, None, t) for i, t in docs])
    stream.doc_ids_by_row = {k: f"d{k}" for k in range(6)}
    for k in range(50):
        check_window(tree.sampler(30, seed=0).window(k), stream, 30, eos=50256)


def test_an_fsspec_tree_reads_like_the_local_one(sample_tree, tree):
    fs = fsspec.filesystem("memory")
    for dirpath, _, names in os.walk(sample_tree):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), sample_tree)
            fs.pipe(f"/reader-remote/{rel}", open(os.path.join(dirpath, name), "rb").read())
    remote = open_tree("memory://reader-remote")
    assert not remote.store.local and len(remote) == len(tree)
    some = tree.documents.id(7)
    assert np.array_equal(remote.document(some), tree.document(some))
    for k in range(30):
        x, y = remote.sampler(SEQ, seed=9).window(k), tree.sampler(SEQ, seed=9).window(k)
        assert np.array_equal(x.inputs, y.inputs) and np.array_equal(x.cu_seqlens, y.cu_seqlens)
    fs.rm("/reader-remote/dataset_stats.txt")
    with pytest.raises(IncompleteTreeError):
        open_tree("memory://reader-remote")
    fs.rm("/reader-remote", recursive=True)


# --------------------------------------------------------------------------------------------
# llm.c (scaffold) shards.


def write_llmc(path, tokens):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(llmc.make_header(len(tokens)))
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def llmc_doc(n_words, rng):
    """A scaffold document: <ff_N> word-tokens ... <ff_0> word-tokens EOT."""
    out = []
    for k in reversed(range(n_words)):
        out.append(llmc.ff_token(k))
        out.extend(rng.integers(0, 50000, rng.integers(1, 4)).tolist())
    return out + [llmc.GPT2_EOT]


@pytest.fixture
def llmc_tree(tmp_path):
    rng = np.random.default_rng(7)
    train = [llmc_doc(n, rng) for n in (5, 9, 3, 12, 4)]
    val = [llmc_doc(n, rng) for n in (6, 2)]
    stream = sum(train, [])
    cut = len(train[0]) + len(train[1]) // 2  # the second document runs on into the next shard
    write_llmc(tmp_path / "train" / "shard_000.bin", stream[:cut])
    write_llmc(tmp_path / "train" / "shard_001.bin", stream[cut:])
    write_llmc(tmp_path / "val" / "shard_000.bin", sum(val, []))
    (tmp_path / layout.STATS_NAME).write_text("scaffold test tree\n")
    return tmp_path, train, val, cut


def test_llmc_shards_split_into_documents_at_eot(llmc_tree):
    root, train, val, cut = llmc_tree
    tree = open_tree(str(root))
    assert tree.kind == "scaffold" and tree.eos_id == 50256 and tree.dtype == np.dtype("<u2")
    assert len(tree) == len(train) + len(val)
    for k, doc in enumerate(train):
        assert tree.document(f"train:{k}").tolist() == doc
    for k, doc in enumerate(val):
        assert tree.document(f"val:{k}").tolist() == doc
    spanning = tree.info("train:1")
    assert (spanning.shard, spanning.offset, spanning.split) == ("train/shard_000.bin", len(train[0]), "train")
    assert tree.info("train:2").shard == "train/shard_001.bin"
    assert {tree.documents.id(i) for i in tree.select("val")} == {"val:0", "val:1"}
    with pytest.raises(ValueError, match="carries its own split"):
        tree.select("train", val_fraction=0.1)


def test_llmc_windows_cross_shards_and_keep_boundaries(llmc_tree):
    root, train, _, cut = llmc_tree
    tree = open_tree(str(root))
    stream = Stream([(f"train:{k}", None, None, np.array(d)) for k, d in enumerate(train)])
    stream.doc_ids_by_row = {i: tree.documents.id(i) for i in range(len(tree))}
    sampler = tree.sampler(16, seed=0, split="train")
    crossed = False
    for k in range(300):
        w = sampler.window(k)
        check_window(w, stream, 16, eos=llmc.GPT2_EOT)
        crossed |= w.start < cut < w.start + 17
    assert crossed


def test_loose_llmc_files_open_and_damaged_ones_are_refused(llmc_tree, tmp_path):
    root, train, val, _ = llmc_tree
    loose = open_llmc({"val": [str(root / "val" / "shard_000.bin")]})
    assert [loose.document(f"val:{k}").tolist() for k in range(2)] == val
    os.remove(root / layout.STATS_NAME)
    with pytest.raises(IncompleteTreeError):
        open_tree(str(root))
    cut_off = tmp_path / "cut" / "val" / "shard_000.bin"
    write_llmc(cut_off, sum(val, [])[:-1])
    with pytest.raises(ValueError, match="does not end with EOT"):
        open_llmc({"val": [str(cut_off)]})
    short = tmp_path / "short.bin"
    short.write_bytes(llmc.make_header(10) + b"\0" * 6)
    with pytest.raises(ValueError, match="header says 10 tokens"):
        open_llmc({"train": [str(short)]})


# --------------------------------------------------------------------------------------------
# The torch dataset: its sharding arithmetic without torch, and the dataset itself with it.


def test_ranks_and_workers_share_out_batches_without_overlap():
    taken = [global_batch(step, rank, 4) for rank in range(4) for step in range(10)]
    assert sorted(taken) == list(range(40))
    steps = [s for w in range(3) for s in worker_steps(5, w, 3, 10)]
    assert sorted(steps) == list(range(5, 15))
    with pytest.raises(ValueError):
        global_batch(0, 4, 4)


def test_the_torch_dataset_is_the_same_with_any_number_of_workers(sample_tree, tree):
    torch = pytest.importorskip("torch", reason="torch is optional (the 'torch' extra); not installed here")
    from shards.torch_dataset import WindowDataset

    def batches(workers, source):
        ds = WindowDataset(source, seq_len=64, batch_size=3, seed=8, rank=1, world_size=2, start_step=4,
                           num_steps=6, split="train", val_fraction=0.1)
        return list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers))

    one = batches(0, sample_tree)
    assert [b["step"] for b in one] == list(range(4, 10))
    sampler = tree.sampler(64, seed=8, split="train", val_fraction=0.1)
    for b in one:
        want = sampler.batch(global_batch(b["step"], 1, 2), 3)
        assert np.array_equal(b["input_ids"].numpy(), want.inputs)
        assert np.array_equal(b["labels"].numpy(), hf_labels(want))  # the inputs, -100 at document starts
        assert np.array_equal(b["cu_seqlens"].numpy(), want.cu_seqlens) and b["cu_seqlens"].dtype == torch.int32
    for other in (batches(2, sample_tree), batches(2, tree)):
        assert [b["step"] for b in other] == [b["step"] for b in one]
        assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(one, other, strict=True))
