"""shards.reader as trainers use it (issue 16): epochs without replacement, resumable state for the
numpy path and for WindowDataset (ranks, DataLoader workers), loss masks, one sequence length per
bucket, and the "Training from the shards" section of docs/reading-and-training.md (moved there from
the README by issue 24), every snippet of it run here.

Trees are written by hand (test_reader.write_bucketed_tree) with documents in several buckets, and
every window is checked against a stream rebuilt here from the manifest (test_reader.check_window).
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter, deque

import numpy as np
import pytest
from conftest import REPO, bucketed_sample, import_trainer_module
from test_reader import EOS, check_window, doc_tokens, manifest_view, stream_for, val_key, write_bucketed_tree

from shards import layout
from shards.reader import open_tree
from shards.reading.hashes import Permutation
from shards.torch_dataset import WorkerBatches, global_batch, hf_labels

S = 100  # not a power of two, and not a divisor of any stream's length
TORCH_REASON = "torch is optional (the 'torch' extra) and not installed here; WorkerBatches is tested without it"
TORCHDATA_REASON = "torchdata (StatefulDataLoader) is not installed here; WorkerBatches is tested without it"


# --------------------------------------------------------------------------------------------
# Trees.


def write_tree(root, lengths: dict[str, list[int]], *, seed=0, partitions=4, keep=lambda doc_id: True):
    """A bucketed tree of random documents, ``{bucket: [length, ...]}``; document i goes to partition
    i % partitions. Ids for which ``keep`` is false are skipped (to choose the validation split)."""
    rng = np.random.default_rng(seed)
    files, i, serial = {}, 0, 0
    for bucket in layout.BUCKET_NAMES:
        for n in lengths.get(bucket, []):
            low, high = layout.bucket_range(bucket)
            assert low <= n and (high is None or n <= high), (bucket, n)
            while not keep(f"doc{serial}"):
                serial += 1
            rel = f"{bucket}/p{i % partitions:02d}_00000.npy"
            files.setdefault(rel, []).append((f"doc{serial}", doc_tokens(rng, n)))
            i += 1
            serial += 1
    ordered = sorted(files, key=lambda r: (layout.BUCKET_NAMES.index(r.split("/")[0]), r))
    return write_bucketed_tree(str(root), {r: files[r] for r in ordered})


def mixed_lengths(seed=1):
    rng = np.random.default_rng(seed)
    return {
        "1024": [1, 1, 2, 99, 100, 101, 1024, *rng.integers(1, 1025, 150).tolist()],
        "2048": rng.integers(1025, 2049, 30).tolist(),
        "4096": rng.integers(2049, 4097, 12).tolist(),
        "8192": [4097, 6000, 8192],
    }


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("epochs") / "tree", mixed_lengths())


@pytest.fixture(scope="module")
def mixed(mixed_root):
    return open_tree(mixed_root)


def train_docs(root, val_fraction=0.2, bucket=None):
    """The manifest's documents of the train split (and of ``bucket``), in stream order."""
    return [d for d in manifest_view(root)
            if val_key(d[0]) >= val_fraction and (bucket is None or d[1].startswith(bucket + "/"))]


def visits(windows, n_tokens, seq_len):
    """How many windows have each stream position as an input, and as a target."""
    inputs, targets = np.zeros(n_tokens, dtype=np.int64), np.zeros(n_tokens, dtype=np.int64)
    for w in windows:
        inputs[w.start:w.start + seq_len] += 1
        targets[w.start + 1:w.start + seq_len + 1] += 1
    return inputs, targets


# --------------------------------------------------------------------------------------------
# 1. Epochs without replacement.


def test_an_epoch_visits_every_token_once_but_a_remainder_shorter_than_a_window(mixed_root, mixed):
    stream = stream_for(mixed, train_docs(mixed_root))
    n_tokens = len(stream.tokens)
    sampler = mixed.sampler(S, seed=7, split="train", val_fraction=0.2)
    assert len(sampler) == (n_tokens - 1) // S
    epoch = [sampler.window(k) for k in range(len(sampler))]
    for w in epoch:
        check_window(w, stream, S)
        assert w.bucket is None
    inputs, targets = visits(epoch, n_tokens, S)
    covered = len(sampler) * S
    remainder = n_tokens - covered
    assert 1 <= remainder < S + 1  # the documented remainder: the stream's last 1 + (N - 1) % S tokens
    assert remainder == 1 + (n_tokens - 1) % S == sampler.cuts[0].leftover
    assert (inputs[:covered] == 1).all() and (inputs[covered:] == 0).all()
    assert targets[0] == 0 and (targets[1:covered + 1] == 1).all() and (targets[covered + 1:] == 0).all()
    # Starts are a permutation of 0, S, 2S, ...; shuffled, not in stream order.
    starts = [w.start for w in epoch]
    assert sorted(starts) == list(range(0, covered, S)) and starts != sorted(starts)
    # Window k + len is window k's place in epoch 1: the same windows in another order.
    second = [sampler.window(k + len(sampler)).start for k in range(len(sampler))]
    assert sorted(second) == sorted(starts) and second != starts
    # Batches are consecutive windows, so an epoch's batches share it out too.
    batch = sampler.batch(3, batch_size=5)
    assert [w.start for w in batch.windows] == starts[15:20]


def test_aligned_epochs_cut_every_document_on_its_own(mixed_root, mixed):
    docs = train_docs(mixed_root)
    stream = stream_for(mixed, docs)
    sampler = mixed.sampler(S, seed=3, split="train", val_fraction=0.2, align_to_docs=True)
    per_doc = [(len(t) - 1) // S for _, _, _, t in docs]
    assert len(sampler) == sum(per_doc)
    epoch = [sampler.window(k) for k in range(len(sampler))]
    inputs, targets = visits(epoch, len(stream.tokens), S)
    for (_, _, _, tokens), count, a in zip(docs, per_doc, stream.starts[:-1], strict=True):
        length = len(tokens)
        covered = count * S
        # Every document is a cut unit: inputs cover its first count * S tokens once each ...
        assert (inputs[a:a + covered] == 1).all() and (inputs[a + covered:a + length] == 0).all()
        # ... and leave a remainder of fewer than S + 1 tokens (all of a document of S tokens or fewer).
        assert 1 <= length - covered < S + 1
    assert inputs.sum() == len(epoch) * S == targets.sum()
    for w in epoch:
        check_window(w, stream, S)
        # Nothing crosses a document: one piece, its start a multiple of S into its document.
        assert w.cu_seqlens.tolist() == [0, S] and len(w.doc_index) == 1 and w.first_offset % S == 0
        assert w.loss_mask.all()
    with pytest.raises(ValueError, match="no selected train document of bucket 1024 is longer than 2000 tokens"):
        mixed.sampler(2000, weights={"1024": 1, "2048": 1}, align_to_docs=True)


def test_the_epoch_order_is_fixed_by_the_seed_alone(mixed_root, mixed):
    # Pinned: the permutation is a pure function of (n, seed, name) on every machine and version.
    assert [Permutation(10, 0, "windows", 0)(i) for i in range(10)] == [4, 7, 5, 8, 1, 3, 6, 2, 9, 0]
    assert [Permutation(10, 0, "windows", 1)(i) for i in range(10)] == [3, 9, 6, 4, 1, 0, 7, 5, 2, 8]
    assert [Permutation(10, 1, "windows", 0)(i) for i in range(10)] == [2, 7, 1, 4, 8, 6, 5, 9, 0, 3]
    big = Permutation(1_000_003, 42, "windows", "1024", 7)
    assert [big(i) for i in (0, 1, 2, 999_999, 1_000_002)] == [683420, 884913, 183220, 462339, 107948]
    # And so the windows: another open of the tree, a pickled sampler, another rank's or worker's
    # copy all give window k the same start.
    a = mixed.sampler(S, seed=5, split="train", val_fraction=0.2)
    b = open_tree(mixed_root).sampler(S, seed=5, split="train", val_fraction=0.2)
    c = pickle.loads(pickle.dumps(a))
    ks = list(range(0, 3 * len(a), 7))
    assert [a.window(k).start for k in ks] == [b.window(k).start for k in ks] == [c.window(k).start for k in ks]
    other = mixed.sampler(S, seed=6, split="train", val_fraction=0.2)
    assert [other.window(k).start for k in range(50)] != [a.window(k).start for k in range(50)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 63, 64, 65, 1000, 4097])
def test_a_permutation_is_a_bijection(n):
    perm = Permutation(n, 9, "test", n)
    assert sorted(perm(i) for i in range(n)) == list(range(n))
    with pytest.raises(IndexError):
        perm(n)


def test_a_permutation_scatters_neighbours():
    n = 100_000
    perm = Permutation(n, 0, "scatter")
    values = np.array([perm(i) for i in range(n)])
    # Consecutive draws land far apart, and the order is unrelated to the index.
    assert np.mean(np.abs(np.diff(values)) < 100) < 0.01  # 0.002 for a uniform shuffle
    assert abs(np.corrcoef(np.arange(n), values)[0, 1]) < 0.02
    # Where index 0 goes is uniform over seeds (chi-square of 10 cells, 2000 seeds; 99.9% bound 27.9).
    cells = np.bincount([Permutation(10, seed, "uniform")(0) for seed in range(2000)], minlength=10)
    assert ((cells - 200) ** 2 / 200).sum() < 27.9


def shares_by_largest_remainder(total, weights):
    """The apportionment the README states, computed here with exact fractions."""
    from fractions import Fraction

    w = [Fraction(x) for x in weights]
    raw = [x / sum(w) * total for x in w]
    floors = [int(r) for r in raw]
    order = sorted(range(len(w)), key=lambda i: (-(raw[i] - floors[i]), i))
    for i in order[:total - sum(floors)]:
        floors[i] += 1
    return floors


def test_weights_share_out_each_epoch_and_an_upsampled_bucket_repeats(mixed_root, mixed):
    weights = {"1024": 1, "2048": 1, "4096": 6}
    sampler = mixed.sampler(S, seed=2, weights=weights)
    streams = {b: stream_for(mixed, train_docs(mixed_root, 0.0, b)) for b in weights}
    counts = {b: (len(streams[b].tokens) - 1) // S for b in weights}
    assert len(sampler) == sum(counts.values())  # an epoch keeps the length of one pass over every bucket
    shares = dict(zip(weights, shares_by_largest_remainder(len(sampler), list(weights.values())), strict=True))
    assert shares["4096"] > counts["4096"] and shares["1024"] < counts["1024"]  # one up-, one downsampled
    epochs = [[sampler.window(k + e * len(sampler)) for k in range(len(sampler))] for e in range(2)]
    for w in epochs[0][:200]:
        check_window(w, streams[w.bucket], S)
        assert {mixed.info(int(i)).bucket for i in w.doc_index} == {w.bucket}
    first = Counter(w.bucket for w in epochs[0])
    assert first == shares  # exactly its share in every epoch
    assert Counter(w.bucket for w in epochs[1]) == shares
    # Interleaved, not one bucket after another.
    assert len({w.bucket for w in epochs[0][:30]}) == 3
    # The upsampled bucket passes over all its windows, then again: each window q or q + 1 times.
    q, extra = divmod(shares["4096"], counts["4096"])
    up = Counter(w.start for w in epochs[0] if w.bucket == "4096")
    assert len(up) == counts["4096"] and sorted(Counter(up.values()).items()) == [(q, counts["4096"] - extra),
                                                                                 (q + 1, extra)]
    # The downsampled bucket carries on where it stopped: no window twice before all were used.
    down = [w.start for e in epochs for w in e if w.bucket == "1024"]
    assert 2 * shares["1024"] <= counts["1024"] and len(set(down)) == len(down)
    assert set(down) <= set(range(0, counts["1024"] * S, S))


def test_ranks_and_workers_get_the_same_batches_whatever_their_number(mixed):
    sampler = mixed.sampler(S, seed=4, split="train", val_fraction=0.2)
    want = {g: [w.start for w in sampler.batch(g, 3).windows] for g in range(24)}
    for world in (1, 2, 4):
        for num_workers in (1, 2, 4):
            taken = {}
            for rank in range(world):
                steps = []
                for worker in range(num_workers):
                    wb = WorkerBatches(lambda g: sampler.batch(g, 3), rank=rank, world_size=world, worker=worker,
                                       num_workers=num_workers, num_steps=24 // world)
                    steps += [(step, [w.start for w in batch.windows]) for step, batch in wb]
                for step, starts in steps:
                    taken[global_batch(step, rank, world)] = starts
            assert taken == want, (world, num_workers)


# --------------------------------------------------------------------------------------------
# 2. Resumable state.


def test_a_sampler_resumes_from_its_state_dict(mixed_root, mixed):
    sampler = mixed.sampler(S, seed=1, split="train", val_fraction=0.2)
    batches = sampler.batches(batch_size=4)
    for _ in range(5):
        next(batches)
    state = json.loads(json.dumps(sampler.state_dict()))  # JSON, as a checkpoint may store it
    assert state["position"] == 20
    after = [next(batches) for _ in range(3)]
    resumed = open_tree(mixed_root).sampler(S, seed=1, split="train", val_fraction=0.2)
    resumed.load_state_dict(state)
    again = [next(resumed.batches(4)) for _ in range(3)]
    for x, y in zip(after, again, strict=True):
        assert np.array_equal(x.inputs, y.inputs) and np.array_equal(x.loss_mask, y.loss_mask)
        assert np.array_equal(x.cu_seqlens, y.cu_seqlens)
    assert resumed.state_dict() == sampler.state_dict()
    # Windows one by one, across the end of an epoch.
    sampler.position = len(sampler) - 2
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    rest = [next(it).start for _ in range(4)]
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert [next(it).start for _ in range(4)] == rest
    # Explicit indices leave the position alone.
    before = resumed.state_dict()
    next(resumed.batches(4, start=0))
    assert resumed.state_dict() == before


def test_a_state_from_another_sampler_is_refused(mixed):
    state = mixed.sampler(S, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"another sampler: seed 1 \(this sampler: 2\)"):
        mixed.sampler(S, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="seq_len"):
        mixed.sampler(S + 1, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="replacement"):
        mixed.sampler(S, seed=1, replacement=True).load_state_dict(state)
    with pytest.raises(ValueError, match="position must be an integer >= 0"):
        mixed.sampler(S, seed=1).load_state_dict({**state, "position": -1})


def loader_run(batch_of, *, rank, world, num_workers, take, resume=None, prefetch=2):
    """What a DataLoader over WorkerBatches yields for one rank, the way torchdata's StatefulDataLoader
    does it: each worker runs ``prefetch`` batches ahead and sends each with its state just after
    making it; the main process hands batches out round-robin and keeps, per worker, the state sent
    with the last batch it handed out. ``resume`` is the (states, last worker) of an earlier run."""
    workers = [WorkerBatches(batch_of, rank=rank, world_size=world, worker=w, num_workers=num_workers)
               for w in range(num_workers)]
    states, turn = [w.state_dict() for w in workers], 0
    if resume is not None:
        saved, last = copy.deepcopy(resume)
        for worker, state in zip(workers, saved, strict=True):
            worker.load_state_dict(state)
        states, turn = saved, 0 if last is None else (last + 1) % num_workers
    queues = [deque() for _ in workers]
    out, last = [], None if resume is None else resume[1]
    while len(out) < take:
        for worker, queue in zip(workers, queues, strict=True):
            while len(queue) < prefetch:
                step, batch = next(worker)
                queue.append((step, batch, worker.state_dict()))
        step, batch, states[turn] = queues[turn].popleft()
        out.append((step, batch))
        last, turn = turn, (turn + 1) % num_workers
    return out, (states, last)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("num_workers", [1, 2, 4])
def test_resuming_gives_the_batches_of_an_uninterrupted_run(mixed, world, num_workers):
    sampler = mixed.sampler(S, seed=8, split="train", val_fraction=0.2, mask_across_docs=True)

    def batch_of(g):
        return sampler.batch(g, 3)

    for rank in range(world):
        whole, _ = loader_run(batch_of, rank=rank, world=world, num_workers=num_workers, take=12)
        assert [s for s, _ in whole] == list(range(12))
        for s, b in whole:
            assert np.array_equal(b.inputs, sampler.batch(global_batch(s, rank, world), 3).inputs)
        for stop in (0, 1, 3, 5):
            head, saved = loader_run(batch_of, rank=rank, world=world, num_workers=num_workers, take=stop)
            saved = json.loads(json.dumps(saved))
            tail, _ = loader_run(batch_of, rank=rank, world=world, num_workers=num_workers, take=12 - stop,
                                 resume=saved)
            got = head + tail
            assert [s for s, _ in got] == list(range(12)), (rank, stop)
            for (_, x), (_, y) in zip(got, whole, strict=True):
                assert np.array_equal(x.inputs, y.inputs) and np.array_equal(x.loss_mask, y.loss_mask)


def test_a_worker_state_fits_only_its_own_worker(mixed):
    sampler = mixed.sampler(S, seed=8)
    state = WorkerBatches(lambda g: sampler.batch(g, 2), worker=1, num_workers=2).state_dict()
    with pytest.raises(ValueError, match=r"^the state was saved by another loader: worker 1 \(this loader: 0\)$"):
        WorkerBatches(lambda g: sampler.batch(g, 2), worker=0, num_workers=2).load_state_dict(state)
    with pytest.raises(ValueError, match="num_workers 2 \\(this loader: 3\\)"):
        WorkerBatches(lambda g: sampler.batch(g, 2), worker=1, num_workers=3).load_state_dict(state)
    with pytest.raises(ValueError, match="start_step 0 \\(this loader: 5\\)"):
        WorkerBatches(lambda g: sampler.batch(g, 2), worker=1, num_workers=2, start_step=5).load_state_dict(state)
    with pytest.raises(ValueError, match="is not a step of worker 1 of 2"):
        WorkerBatches(lambda g: sampler.batch(g, 2), worker=1, num_workers=2).load_state_dict(
            {**state, "next_step": 4})
    # From an odd start step, worker 1 of 2 makes the even steps: its state is its own.
    odd = WorkerBatches(lambda g: sampler.batch(g, 2), worker=1, num_workers=2, start_step=5)
    next(odd)
    again = WorkerBatches(lambda g: sampler.batch(g, 2), worker=1, num_workers=2, start_step=5)
    again.load_state_dict(json.loads(json.dumps(odd.state_dict())))
    assert next(again)[0] == 8


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
def test_window_dataset_resumes_in_a_stateful_dataloader(mixed_root, mixed, world, num_workers):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason=TORCHDATA_REASON)
    from shards.torch_dataset import WindowDataset

    rank = world - 1
    sampler = mixed.sampler(64, seed=2, split="train", val_fraction=0.2)

    def loader():
        ds = WindowDataset(mixed_root, 64, 3, seed=2, rank=rank, world_size=world, num_steps=12, split="train",
                           val_fraction=0.2)
        return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)

    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = pickle.loads(pickle.dumps(first.state_dict()))  # as torch.save would keep it
    tail = list(it)
    assert [b["step"] for b in head + tail] == list(range(12))
    for b in head + tail:
        want = sampler.batch(global_batch(b["step"], rank, world), 3)
        assert np.array_equal(b["input_ids"].numpy(), want.inputs)
        assert np.array_equal(b["labels"].numpy(), hf_labels(want))
        assert b["labels"].dtype == torch.int64 and "loss_mask" not in b  # -100 in labels is the loss mask
        assert np.array_equal(b["cu_seqlens"].numpy(), want.cu_seqlens)
    second = loader()
    second.load_state_dict(state)
    resumed = list(second)
    assert [b["step"] for b in resumed] == list(range(5, 12))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(resumed, tail, strict=True))


def test_window_dataset_with_one_length_per_bucket(mixed_root, mixed):
    torch = pytest.importorskip("torch", reason=TORCH_REASON)
    from shards.torch_dataset import WindowDataset

    ds = WindowDataset(mixed_root, tokens_per_batch=2048, seed=1, num_steps=6, buckets=["1024", "2048"])
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    stage = mixed.length_sampler(2048, seed=1, buckets=["1024", "2048"])
    for b in got:
        assert np.array_equal(b["input_ids"].numpy(), stage.batch(b["step"]).inputs)
    with pytest.raises(ValueError, match="tokens_per_batch"):
        WindowDataset(mixed_root, 64, 2, tokens_per_batch=2048)


# --------------------------------------------------------------------------------------------
# 3. The loss mask.


@pytest.fixture
def four_docs(tmp_path):
    """Documents of 5, 3, 1 and 7 tokens: stream positions 0-4, 5-7, 8, 9-15; EOS at 4, 7, 8, 15."""
    rng = np.random.default_rng(0)
    docs = [(name, doc_tokens(rng, n)) for name, n in zip("abcd", (5, 3, 1, 7), strict=True)]
    return open_tree(write_bucketed_tree(str(tmp_path), {"1024/p00_00000.npy": docs}))


def test_the_loss_mask_drops_the_target_after_each_eos(four_docs):
    w = four_docs.sampler(14).window(0)
    assert (w.start, w.cu_seqlens.tolist()) == (0, [0, 5, 8, 9, 14])
    assert w.loss_mask.tolist() == [1, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1, 1]
    assert w.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 1, 2, 3, 4]
    across = four_docs.sampler(14, mask_across_docs=True).window(0)
    assert across.loss_mask.tolist() == [1, 1, 1, 1] + [0] * 10  # only the first document is trained on
    # S = 5: windows at 0, 5, 10. The last target of the first starts document b.
    five = four_docs.sampler(5)
    by_start = {five.window(k).start: five.window(k) for k in range(len(five))}
    assert sorted(by_start) == [0, 5, 10]
    assert by_start[0].loss_mask.tolist() == [1, 1, 1, 1, 0] and by_start[0].cu_seqlens.tolist() == [0, 5]
    assert by_start[5].loss_mask.tolist() == [1, 1, 0, 0, 1] and by_start[5].cu_seqlens.tolist() == [0, 3, 4, 5]
    assert by_start[10].loss_mask.tolist() == [1, 1, 1, 1, 1]
    across = four_docs.sampler(5, mask_across_docs=True)
    assert {across.window(k).start: across.window(k).loss_mask.tolist() for k in range(3)} == {
        0: [1, 1, 1, 1, 0], 5: [1, 1, 0, 0, 0], 10: [1, 1, 1, 1, 1]}
    batch = five.batch(0, batch_size=3)
    assert batch.loss_mask.dtype == np.float32 and batch.loss_mask.shape == (3, 5)
    assert np.array_equal(batch.loss_mask, np.stack([w.loss_mask for w in batch.windows]))
    # Aligned windows lie inside one document: nothing to mask (d: 7 tokens, one window of 3 + 1 at 9,
    # one at 12 that ends on its EOS).
    aligned = four_docs.sampler(3, align_to_docs=True)
    assert sorted(aligned.window(k).start for k in range(len(aligned))) == [0, 9, 12]
    assert all(aligned.window(k).loss_mask.all() for k in range(len(aligned)))


def test_the_loss_mask_of_sampled_windows_follows_their_eos(mixed_root, mixed):
    stream = stream_for(mixed, train_docs(mixed_root, 0.0))
    sampler = mixed.sampler(S, seed=11, mask_across_docs=True)
    for k in range(300):
        w = sampler.window(k)
        eos = np.flatnonzero(w.inputs == EOS)
        want = np.ones(S, dtype=np.float32)
        if len(eos):
            want[eos[0]:] = 0
        assert np.array_equal(w.loss_mask, want)
        assert np.array_equal(w.targets, stream.tokens[w.start + 1:w.start + S + 1])


# --------------------------------------------------------------------------------------------
# 4. One sequence length per bucket.


def test_a_length_sampler_makes_batches_of_equal_tokens_one_bucket_each(mixed_root, mixed):
    stage = mixed.length_sampler(tokens_per_batch=4096, seed=3, buckets=["1024", "2048", "4096"])
    assert stage.seq_lens == {"1024": 1024, "2048": 2048, "4096": 4096}
    assert stage.buckets == ["1024", "2048", "4096"]
    streams = {b: stream_for(mixed, train_docs(mixed_root, 0.0, b)) for b in stage.buckets}
    per_batch = {"1024": 4, "2048": 2, "4096": 1}
    windows = {b: (len(streams[b].tokens) - 1) // int(b) for b in stage.buckets}
    full = {b: windows[b] // per_batch[b] for b in stage.buckets}
    assert len(stage) == sum(full.values())
    epoch = [stage.batch(i) for i in range(len(stage))]
    seen = {b: [] for b in stage.buckets}
    for batch in epoch:
        bucket = batch.windows[0].bucket
        assert batch.inputs.shape == (per_batch[bucket], int(bucket)) and batch.inputs.size == 4096
        assert batch.loss_mask.shape == batch.inputs.shape
        for w in batch.windows:
            assert w.bucket == bucket
            check_window(w, streams[bucket], int(bucket))
        seen[bucket] += batch.windows
    assert Counter(b.windows[0].bucket for b in epoch) == full
    assert len({b.windows[0].bucket for b in epoch[:6]}) > 1  # buckets interleaved
    for b, ws in seen.items():
        inputs, _ = visits(ws, len(streams[b].tokens), int(b))
        # At most once per epoch; what is left: the stream's tail, and fewer than one batch of windows.
        assert inputs.max() == 1
        left = len(streams[b].tokens) - inputs.sum()
        assert left == len(streams[b].tokens) - full[b] * per_batch[b] * int(b)
        assert left < per_batch[b] * int(b) + int(b) + 1
    # Resumable as the window sampler is.
    it = iter(stage)
    next(it)
    state = stage.state_dict()
    resumed = open_tree(mixed_root).length_sampler(tokens_per_batch=4096, seed=3, buckets=["1024", "2048", "4096"])
    resumed.load_state_dict(state)
    assert np.array_equal(next(iter(resumed)).inputs, next(it).inputs)


def test_a_length_sampler_says_what_does_not_fit(mixed):
    with pytest.raises(ValueError, match=r"bucket beyond has no bound.*seq_lens=\{'beyond': S\}"):
        mixed.length_sampler(4096, buckets=["1024", "beyond"])
    with pytest.raises(ValueError, match="bucket 8192's sequence length 8192 does not divide tokens_per_batch 4096"):
        mixed.length_sampler(4096)
    with pytest.raises(ValueError, match=r"bucket 8192 hold 18289 tokens, 2 windows of 8192 \+ 1; a batch takes 4"):
        mixed.length_sampler(32768)
    with pytest.raises(ValueError, match="seq_lens name unknown bucket"):
        mixed.length_sampler(4096, seq_lens={"3000": 1000})
    shorter = mixed.length_sampler(8192, buckets=["8192"], seq_lens={"8192": 4096})
    assert shorter.batch(0).inputs.shape == (2, 4096)


def test_a_length_sampler_takes_weights_as_shares_of_its_batches(mixed):
    stage = mixed.length_sampler(2048, seed=0, weights={"1024": 1, "2048": 1})
    counts = Counter(stage.batch(i).windows[0].bucket for i in range(len(stage)))
    assert counts == dict(zip(["1024", "2048"], shares_by_largest_remainder(len(stage), [1, 1]), strict=True))


# --------------------------------------------------------------------------------------------
# 5. Without torch.


def test_the_numpy_path_never_imports_torch(mixed_root):
    code = (
        "import sys\n"
        "from shards import reader, torch_dataset\n"
        f"tree = reader.open_tree({str(mixed_root)!r})\n"
        "sampler = tree.sampler(64, seed=0)\n"
        "batches = torch_dataset.WorkerBatches(lambda g: sampler.batch(g, 2), rank=1, world_size=2)\n"
        "step, batch = next(batches)\n"
        "assert batch.loss_mask.shape == (2, 64)\n"
        "assert tree.length_sampler(2048, buckets=['1024']).batch(0).inputs.size == 2048\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# --------------------------------------------------------------------------------------------
# docs/reading-and-training.md's "Training from the shards" section: this text, every snippet of it run below.

DOC = REPO / "docs" / "reading-and-training.md"
README_SECTION = """\
## Training from the shards

`shards.reader` opens a finished tree (local files are memory-mapped; any fsspec URL works) and
cuts it into windows of S+1 tokens, epoch by epoch, with the document boundaries attention kernels
take. Opening and the first window cost the same for ten documents or ten million: the tree's reader
index (`processed_spec.idx`) is mapped, and a sampler keeps runs of documents, not a table per
document. A remote tree's index is copied once per machine and version into
`$PRETOKENIZE_INDEX_CACHE` (default `~/.cache/beam-pretokenize/indexes`, ~85 bytes a document) and
mapped from there, so DataLoader workers and ranks on one machine share one copy. The cache keeps
one copy per remote tree: a new version's copy (after a removal or a re-run) replaces the old one, and a
copy left half-made by a killed process goes after a day; nothing else in the directory is touched. It needs numpy
only; torch is an extra. How to train from the tree with Hugging Face (a loop
or a `Trainer`), Megatron-LM, OLMo-core and llm.c, and where their conventions differ:
[docs/training.md](training.md).

```python
from shards.reader import open_tree

tree = open_tree("out/sample")                          # refuses a tree without dataset_stats.txt
print(tree.info(0))                                     # id, shard, offset, length, bucket, partition
train = tree.sampler(1024, seed=0, split="train", val_fraction=0.05)
val = tree.sampler(1024, seed=0, split="val", val_fraction=0.05)
print(len(train), "windows an epoch")                   # window k + e * len(train) is its place in epoch e
batch = train.batch(0, batch_size=8)                    # windows 0..7: the same on every run, rank, worker
assert (batch.targets[:, :-1] == batch.inputs[:, 1:]).all()
print(batch.inputs.shape, batch.cu_seqlens[:5], batch.position_ids[0, :3], batch.loss_mask[0, :3])
print(val.window(0).cu_seqlens)
```

- **Epochs, without replacement.** The selected documents are laid end to end, in storage order,
  into one stream of N tokens, cut into windows at 0, S, 2S, ... for as long as S+1 tokens remain:
  `len(sampler)` = (N-1) // S windows. A window's `.start` is its first input's position in the
  stream; its inputs are positions `start .. start+S-1`, its targets `start+1 .. start+S`. Each epoch
  takes the windows in a permutation of its own, seeded, the same on every run, machine, rank count
  and worker count, and computed per index (no table). So one epoch makes every token an input once,
  but the stream's last 1 + (N-1) % S tokens (1 to S of them); the targets are the same, one later.
- **`align_to_docs=True`** cuts each document on its own: windows at its first token and every S
  tokens after, none reaching into the next document. Each document leaves its last 1 + (L-1) % S
  tokens, so a document of S tokens or fewer gives no window: for buckets of long documents.
- **Weights** (`weights={"1024": 1, "4096": 1, "16384": 2}`) make a stream of each bucket named (a
  window's `.bucket`; its `.start` is in that stream). An epoch keeps the length of one pass over
  all of them (the sum of their windows) and gives each bucket its share of it, weight / sum of
  weights, rounded by largest remainders, interleaved by a seeded permutation. A bucket whose share
  is more than its windows repeats them within the epoch, a fresh permutation each pass, as
  Megatron's blended datasets upsample; one whose share is less carries on in the next epoch where
  it stopped, so none of its windows repeats before all were used.
- **`replacement=True`** keeps the earlier draws: each window on its own, from floor(u (N - S - 1))
  with `u` from the seed and the window's index (the bucket first, by weight). No epochs.

Beside its tokens, a window carries what attention and the loss need:

- `cu_seqlens` (int32) and `position_ids` restart at each document inside the window, for varlen
  attention (flash-attn's `cu_seqlens` and `max_seqlen`); `shards.reader.block_causal_mask(cu_seqlens)`
  gives the dense mask instead.
- `loss_mask` (float32, 1 where the target is trained on) is 0 on the target after each EOS: the next
  document's first token, which nothing in the window predicts (Megatron's `eod_mask_loss`). With
  `mask_across_docs=True` it is 0 on every target after the window's first document as well, for
  attention that does not take `cu_seqlens` and so reads across the boundary. Aligned windows hold
  one document and need neither.

A sampler's iterators hand out windows from `sampler.position` and advance it. `state_dict()` and
`load_state_dict()` save and restore that position (the protocol of torchdata's `StatefulDataLoader`),
so a resumed run gets exactly the batches the interrupted one would have. The state carries a
fingerprint of what decides the windows (the tree's contents, not its path; seq_len, seed, split,
buckets, partitions, weights, masking, ...): a sampler of other settings refuses it in one line
naming the first field that differs, as `WindowDataset` does its workers' states (batch size, world
size, rank, number of workers too):

```python
import json

for step, batch in zip(range(3), train.batches(batch_size=8)):   # from train.position on
    per_token_loss_weight = batch.loss_mask
checkpoint = json.dumps(train.state_dict())                       # {"position": 24, ...}

resumed = open_tree("out/sample").sampler(1024, seed=0, split="train", val_fraction=0.05)
resumed.load_state_dict(json.loads(checkpoint))
assert (next(resumed.batches(8)).inputs == next(train.batches(8)).inputs).all()
```

**One sequence length per bucket**, as OLMo-core's variable sequence length: `length_sampler` makes
batches of a fixed number of tokens, each from one bucket, as sequences of that bucket's bound
(`"8192"`: 8192 tokens, room for its longest document; `"beyond"` needs one in `seq_lens`). An
epoch is every bucket's full batches in a seeded order; a bucket's windows left over (fewer than a
batch) wait for its next pass. A long-context stage that draws only from the buckets 32768 and above:

```python
stage = open_tree("out/finepdfs").length_sampler(
    tokens_per_batch=262144, seed=0, split="train", val_fraction=0.01,
    buckets=["32768", "65536", "131072", "262144", "beyond"], seq_lens={"beyond": 262144})
batch = next(iter(stage))                  # iterates from stage.position, like a sampler
print(len(stage), batch.inputs.shape)      # (8, 32768), (4, 65536), (2, 131072) or (1, 262144)
assert batch.inputs.size == 262144 and batch.windows[0].bucket in stage.buckets
```

With the `torch` extra, `shards.torch_dataset.WindowDataset` yields the batches as tensors, by
default in Hugging Face's convention: `input_ids`, `labels` (the same tokens, which the model shifts;
-100 on each document's first token, so no loss crosses a document boundary), `position_ids`,
`cu_seqlens`, `max_seqlen`, `step`; `convention="megatron"` gives Megatron's shifted `tokens`,
`labels`, `loss_mask` instead (`docs/training.md`: each framework, step by step). Rank by
rank: at its step j, rank r of R takes the sampler's batch `j * R + r`, and DataLoader worker w of W
makes the steps w, w + W, w + 2W, ..., so each rank gets the same batches, in order, with any number
of workers. Resuming needs torchdata's `StatefulDataLoader` (`pip install torchdata`) and the same
number of workers; with another number, start a new dataset at `start_step` = the last step + 1.

```python
from torchdata.stateful_dataloader import StatefulDataLoader
from shards.torch_dataset import WindowDataset

def loader():
    ds = WindowDataset("out/sample", seq_len=1024, batch_size=8, seed=0, split="train", val_fraction=0.05)
    return StatefulDataLoader(ds, batch_size=None, num_workers=2)

first = loader()
for step, batch in zip(range(3), first):
    assert batch["step"] == step and batch["labels"].shape == (8, 1024)
checkpoint = first.state_dict()                 # the step each worker makes next

resumed = loader()
resumed.load_state_dict(checkpoint)
assert next(iter(resumed))["step"] == 3
```

```bash
.venv/bin/pretokenize export megatron --output out/sample          # out/sample/megatron/: .idx + .bin link per shard
.venv/bin/pretokenize export megatron --output out/sample --check  # exit 1 if a re-run or remove made it stale
.venv/bin/pretokenize stats --output out/sample                    # length_stats.txt, tokens per bucket in a PNG
.venv/bin/pretokenize stats --output out/sample --json --png none  # the same figures as one JSON object on stdout
```

Megatron-LM reads the shards in place: `--data-args-path megatron/data_args.txt` (each shard
weighted by its tokens), run from the tree's directory: the blend's prefixes are relative to the
tree's root, so a copied or moved tree still reads (and `--check` passes there); `--mount /data/x`
writes them for a tree mounted at /data/x instead (check it with the same `--mount`). The indexes
live under `megatron/`, beside relative links named `.bin` that point at the `.npy` shards, so the
shard directories hold only shards; run the export again after a re-run or a `pretokenize remove`.
"""


CLI = "import sys; from pipelines.cli import main; sys.exit(main())"  # .venv/bin/pretokenize, in this interpreter


def snippets(text):
    """(language, code) of every fenced block."""
    return re.findall(r"^```(\w+)\n(.*?)^```$", text, flags=re.M | re.S)


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    """The bundled sample through the bucketed job, as `make demo` writes out/sample."""
    return bucketed_sample(tmp_path_factory.mktemp("readme") / "sample")


@pytest.fixture
def readme_dir(tmp_path, sample_tree, monkeypatch):
    """A working directory with out/sample (the sample's tree) and out/finepdfs (long documents, in
    the buckets from 32768 up, enough of each for a batch of 262144 tokens; none held out at 1%)."""
    shutil.copytree(sample_tree, tmp_path / "out" / "sample")
    write_tree(tmp_path / "out" / "finepdfs", {
        "16384": [9000, 16384],
        "32768": [16385, *range(27000, 33000, 600)],
        "65536": [32769, 50000, 60000, 64000, 65536, 65000],
        "131072": [65537, 120000, 131072],
        "262144": [131073, 200000, 262144],
        "beyond": [300000],
    }, keep=lambda doc_id: val_key(doc_id) >= 0.01)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.e2e  # a whole job
def test_readme_snippets_run(readme_dir):
    namespace: dict = {}
    blocks = snippets(README_SECTION)
    assert [lang for lang, _ in blocks] == ["python", "python", "python", "python", "bash"]
    for lang, code in blocks:
        if lang == "python" and "torch" not in code:
            exec(compile(code, str(DOC), "exec"), namespace)
        elif lang == "bash":
            for line in code.splitlines():
                args = shlex.split(line.split("  #")[0])
                assert args[0] == ".venv/bin/pretokenize"
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
                subprocess.run([sys.executable, "-c", CLI, *args[1:]], check=True, cwd=readme_dir, env=env)
    assert namespace["stage"].batch(0).inputs.size == 262144
    assert (readme_dir / "out" / "sample" / "megatron" / "data_args.txt").exists()


@pytest.mark.e2e  # a whole job
def test_readme_torch_snippet_runs(readme_dir):
    pytest.importorskip("torch", reason=TORCH_REASON)
    pytest.importorskip("torchdata.stateful_dataloader", reason=TORCHDATA_REASON)
    (code,) = [c for lang, c in snippets(README_SECTION) if lang == "python" and "torch" in c]
    # In a process of its own, in a session of its own: its DataLoaders fork workers, and a fork that
    # races another loader's threads can wait forever (it hung CI once). A timeout then kills the
    # whole session, workers included, and fails the test instead of hanging the suite.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with open(readme_dir / "snippet.log", "w+b") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=readme_dir, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = "killed after 300 s"
        log.seek(0)
        assert status == 0, (status, log.read().decode(errors="replace")[-4000:])


def test_the_doc_holds_the_tested_section():
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Training from the shards\n")
    section = text[start:text.index("\n## ", start + 1)].rstrip("\n") + "\n"
    assert section == README_SECTION


# --------------------------------------------------------------------------------------------
# 6. Fingerprinted states (issue 25): every state names what decides its batches, and a loader of
#    other settings refuses it in one line naming the first field that differs.

SAMPLER = dict(seq_len=S, seed=1, split="train", val_fraction=0.2)


@pytest.mark.parametrize(("field", "change"), [
    ("seq_len", {"seq_len": S + 1}),
    ("seed", {"seed": 7}),
    ("split", {"split": "val"}),
    ("val_fraction", {"val_fraction": 0.3}),
    ("buckets", {"buckets": ["1024", "2048"]}),
    ("partitions", {"partitions": [0, 1]}),
    ("weights", {"weights": {"1024": 1, "2048": 2}}),
    ("align_to_docs", {"align_to_docs": True}),
    ("mask_across_docs", {"mask_across_docs": True}),
    ("replacement", {"replacement": True}),
])
def test_a_sampler_state_is_refused_by_a_sampler_of_other_settings(mixed, field, change):
    sampler = mixed.sampler(**SAMPLER)
    next(sampler.batches(4))
    state = json.loads(json.dumps(sampler.state_dict()))
    other = mixed.sampler(**{**SAMPLER, **change})
    with pytest.raises(ValueError, match=rf"^the state was saved by another sampler: {field} ") as refused:
        other.load_state_dict(state)
    assert "\n" not in str(refused.value)
    assert other.position == 0
    mixed.sampler(**SAMPLER).load_state_dict(state)  # the same settings take it


def test_a_state_is_refused_by_the_same_settings_over_another_tree(mixed_root, mixed, tmp_path):
    state = mixed.sampler(**SAMPLER).state_dict()
    moved = tmp_path / "moved"
    shutil.copytree(mixed_root, moved)
    open_tree(str(moved)).sampler(**SAMPLER).load_state_dict(state)  # a copy is the same tree
    # A tree that lost one document (a removal) is another tree.
    lengths = mixed_lengths()
    lengths["1024"] = lengths["1024"][1:]
    removed = write_tree(tmp_path / "removed", lengths)
    with pytest.raises(ValueError, match=r"^the state was saved by another sampler: tree '[0-9a-f]{32}' \(this"):
        open_tree(removed).sampler(**SAMPLER).load_state_dict(state)
    assert open_tree(removed).fingerprint != mixed.fingerprint == open_tree(str(moved)).fingerprint


def test_a_length_sampler_state_is_refused_by_other_settings(mixed):
    stage = dict(tokens_per_batch=2048, seed=1, buckets=["1024", "2048"])
    state = mixed.length_sampler(**stage).state_dict()
    for field, change in [("tokens_per_batch", {"tokens_per_batch": 4096}), ("seed", {"seed": 2}),
                          ("buckets", {"buckets": ["1024"]}), ("weights", {"weights": {"1024": 1, "2048": 3}}),
                          ("seq_lens", {"seq_lens": {"1024": 512}}), ("mask_across_docs", {"mask_across_docs": True})]:
        with pytest.raises(ValueError, match=rf"^the state was saved by another sampler: {field} "):
            mixed.length_sampler(**{**stage, **change}).load_state_dict(state)
    with pytest.raises(ValueError, match=r"another sampler: sampler 'lengths' \(this sampler: 'windows'\)"):
        mixed.sampler(**SAMPLER).load_state_dict(state)


def test_a_state_without_a_fingerprint_is_refused(mixed):
    with pytest.raises(ValueError, match="the state has no fingerprint"):
        mixed.sampler(**SAMPLER).load_state_dict({"position": 3, "seq_len": S, "seed": 1})


# States a checkpoint holds, as the reader of d30e902 saved them (one file, before shards/reading/),
# with the windows it went on to: (bucket, start) of each window of the next batch.
SAVED_TREE = "841ce548701e83ba85bcc837b66b9bcb"  # the fingerprint of write_tree(mixed_lengths())


def _saved(position: int, **fields) -> dict:
    selection = {"split": "train", "val_fraction": 0.0, "buckets": None, "partitions": None, "weights": None,
                 "align_to_docs": False, "mask_across_docs": False}
    return {"position": position, "fingerprint": {"tree": SAVED_TREE, **selection, **fields}}


@pytest.mark.parametrize(("make", "saved", "resumes_at"), [
    (lambda t: t.sampler(S, 5, split="train", val_fraction=0.2),
     _saved(8, sampler="windows", seq_len=S, seed=5, val_fraction=0.2, replacement=False, epoch_windows=1460,
            tokens=146003),
     [(None, 97500), (None, 25800), (None, 43400), (None, 6100)]),
    (lambda t: t.sampler(S, 1, weights={"1024": 1, "2048": 2}, align_to_docs=True, mask_across_docs=True),
     _saved(12, sampler="windows", seq_len=S, seed=1, weights={"1024": 1.0, "2048": 2.0}, align_to_docs=True,
            mask_across_docs=True, replacement=False, epoch_windows=1202, tokens=130036),
     [("2048", 2214), ("2048", 41772), ("2048", 12143), ("2048", 24753)]),
    (lambda t: t.sampler(S, 2, replacement=True, split="val", val_fraction=0.2),
     _saved(4, sampler="windows", seq_len=S, seed=2, split="val", val_fraction=0.2, replacement=True,
            epoch_windows=371, tokens=37106),
     [(None, 19769), (None, 22935), (None, 36341), (None, 20392)]),
    (lambda t: t.length_sampler(800, 3, seq_lens={"1024": 100, "2048": 200, "4096": 400, "8192": 800}),
     _saved(2, sampler="lengths", tokens_per_batch=800, seed=3,
            seq_lens={"1024": 100, "2048": 200, "4096": 400, "8192": 800}, epoch_batches=227, tokens=183109),
     [("4096", 27600), ("4096", 20800)]),
], ids=["windows", "weighted-aligned", "replacement", "lengths"])
def test_a_state_saved_by_an_earlier_reader_resumes_at_the_same_windows(mixed, make, saved, resumes_at):
    """A checkpoint taken before the reader was split into shards/reading/ resumes today: the
    sampler takes its state, gives the same state back, and goes on at the same windows. A change to
    what a fingerprint holds, to the tree's fingerprint or to the order of windows fails here."""
    assert mixed.fingerprint == SAVED_TREE
    sampler = make(mixed)
    sampler.load_state_dict(json.loads(json.dumps(saved)))
    assert sampler.state_dict() == saved
    batch = next(sampler.batches() if saved["fingerprint"]["sampler"] == "lengths" else sampler.batches(4))
    assert [(w.bucket, w.start) for w in batch.windows] == resumes_at


DATASET = dict(seq_len=64, batch_size=3, seed=0, split="train", val_fraction=0.2)


@pytest.mark.parametrize(("field", "change"), [
    ("seq_len", {"seq_len": 32, "seed": 7, "split": "val"}),  # the case: the first that differs is named
    ("seed", {"seed": 7}),
    ("split", {"split": "val"}),
    ("weights", {"weights": {"1024": 1, "2048": 1}}),
    ("mask_across_docs", {"mask_across_docs": True}),
    ("batch_size", {"batch_size": 4}),
    ("convention", {"convention": "megatron"}),
    ("attention_mask", {"attention_mask": True}),
    ("world_size", {"world_size": 2}),
    ("rank", {"rank": 1, "world_size": 1 + 1}),
    ("start_step", {"start_step": 2}),
])
def test_a_window_dataset_state_is_refused_by_a_dataset_of_other_settings(mixed_root, field, change):
    import_trainer_module("torch", TORCH_REASON)
    from shards.torch_dataset import WindowDataset

    base = {**DATASET, "rank": 0, "world_size": 1}
    ds = WindowDataset(mixed_root, **base)
    it = iter(ds)
    next(it)
    state = pickle.loads(pickle.dumps(ds.state_dict()))
    assert state["next_step"] == 1 and state["fingerprint"]["seq_len"] == 64
    if field == "rank":
        field = "world_size"  # world_size comes before rank: it is the first that differs
    other = WindowDataset(mixed_root, **{**base, **change})
    with pytest.raises(ValueError, match=rf"^the state was saved by another loader: {field} ") as refused:
        other.load_state_dict(state)
    assert "\n" not in str(refused.value)
    same = WindowDataset(mixed_root, **base)
    same.load_state_dict(state)
    assert next(iter(same))["step"] == 1


def test_a_rank_state_is_refused_by_another_rank(mixed_root):
    import_trainer_module("torch", TORCH_REASON)
    from shards.torch_dataset import WindowDataset

    ds = WindowDataset(mixed_root, **DATASET, rank=0, world_size=2)
    next(iter(ds))
    state = ds.state_dict()
    with pytest.raises(ValueError, match=r"another loader: rank 0 \(this loader: 1\)"):
        WindowDataset(mixed_root, **DATASET, rank=1, world_size=2).load_state_dict(state)
    # A copy that never started (and never opened its tree) saves no position: loaded anywhere, it
    # starts at start_step, as a fresh copy does.
    fresh = WindowDataset(mixed_root, **DATASET, rank=0, world_size=2).state_dict()
    assert fresh == {"next_step": None, "fingerprint": None}
    other = WindowDataset(mixed_root, **DATASET, rank=1, world_size=2, start_step=3)
    other.load_state_dict(fresh)
    assert next(iter(other))["step"] == 3


def test_a_stateful_dataloader_refuses_a_state_of_other_settings(mixed_root):
    import_trainer_module("torch", TORCH_REASON)
    stateful = import_trainer_module("torchdata.stateful_dataloader", TORCHDATA_REASON)
    from shards.torch_dataset import WindowDataset

    def loader(seq_len, seed, split, workers):
        ds = WindowDataset(mixed_root, seq_len=seq_len, batch_size=2, seed=seed, split=split, val_fraction=0.2)
        # A timeout: a worker that stalls fails the test instead of hanging the suite.
        return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=workers, timeout=120 if workers else 0)

    def shut_down(*loaders):
        # Each loader's worker processes stopped before the next loader forks its own: a fork beside
        # another loader's live workers and queue threads once left the new workers never fed.
        for done in loaders:
            iterator = getattr(done, "_iterator", None)
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
        gc.collect()

    for workers in (0, 2):
        first = loader(64, 0, "train", workers)
        it = iter(first)
        for _ in range(3):
            next(it)
        state = pickle.loads(pickle.dumps(first.state_dict()))
        shut_down(first)
        resumed = loader(32, 7, "val", workers)
        resumed.load_state_dict(state)
        with pytest.raises(ValueError, match=r"the state was saved by another loader: seq_len 64 \(this loader: 32\)"):
            next(iter(resumed))
        shut_down(resumed)
        good = loader(64, 0, "train", workers)
        good.load_state_dict(state)
        assert next(iter(good))["step"] == 3
        shut_down(good)
