"""The shards as each training framework reads them, checked with that framework's own code: a Hugging
Face causal LM's loss on WindowDataset's batches (issue 25)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import import_trainer_module
from test_reader import doc_tokens, manifest_view, write_bucketed_tree

from shards.reader import open_tree
from shards.torch_dataset import global_batch

TORCH_REASON = "torch is optional (the 'torch' extra); CI installs it"
VOCAB = 500
EOS = VOCAB - 1
S = 48
BATCH = 4


# --------------------------------------------------------------------------------------------
# A tree of short documents, so that windows hold several, and the stream rebuilt from its files.


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    rng = np.random.default_rng(25)
    lengths = [1, 2, 5, 17, 48, 49, 50, 3, 90, 7, 33, 120, 11, 64, 2, 9, 200, 30, 45, 1, 77, 13]
    docs = [(f"doc{i}", doc_tokens(rng, n, eos=EOS, high=EOS)) for i, n in enumerate(lengths)]
    files = {"1024/p00_00000.npy": docs[0::2], "1024/p01_00000.npy": docs[1::2]}
    return write_bucketed_tree(str(tmp_path_factory.mktemp("trainers") / "tree"), files, eos=EOS,
                               vocab_size=VOCAB)


class TokenStream:
    """The documents of the tree laid end to end in storage order, from the files and the manifest
    alone: what "next-token prediction within a document" means, computed without shards.reader."""

    def __init__(self, root):
        docs = sorted(manifest_view(root), key=lambda d: (d[1], d[2]))  # file, then offset: storage order
        self.tokens = np.concatenate([d[3] for d in docs]).astype(np.int64)
        self.doc_start = np.cumsum([0] + [len(d[3]) for d in docs])[:-1]
        self.doc_of = np.repeat(np.arange(len(docs)), [len(d[3]) for d in docs])

    def positions(self, start, n):
        """Position ids of stream tokens start .. start + n - 1: 0 at the window's start and at each document's."""
        idx = np.arange(start, start + n)
        return idx - np.maximum(self.doc_start[self.doc_of[idx]], start)

    def pieces(self, start, n):
        """(a, b) ranges of the window's tokens, one per document piece."""
        doc = self.doc_of[start:start + n]
        cuts = [0, *(np.flatnonzero(doc[1:] != doc[:-1]) + 1).tolist(), n]
        return list(zip(cuts[:-1], cuts[1:], strict=True))

    def trained(self, start, n_predictions, mask_across_docs):
        """For predictions i = 0 .. n - 1 (of token start + i + 1 from the tokens up to start + i):
        whether the loss is taken, i.e. both tokens are of one document (and, with mask_across_docs,
        of the window's first document)."""
        idx = np.arange(start, start + n_predictions)
        same = self.doc_of[idx + 1] == self.doc_of[idx]
        if mask_across_docs:
            same &= self.doc_of[idx + 1] == self.doc_of[start]
        return same


def reference_loss(torch, model, stream, starts, n_predictions, mask_across_docs, documents_apart):
    """The mean next-token cross-entropy over the windows at ``starts``, from the token stream: each
    window's logits from its tokens (each document piece run on its own when ``documents_apart``,
    else the whole window with positions restarting at each document), against the stream's next token."""
    losses = []
    for start in starts:
        tokens = torch.from_numpy(stream.tokens[start:start + S])[None]
        if documents_apart:
            logits = torch.cat([model(input_ids=tokens[:, a:b]).logits for a, b in stream.pieces(start, S)], dim=1)
        else:
            logits = model(input_ids=tokens, position_ids=torch.from_numpy(stream.positions(start, S))[None]).logits
        target = torch.from_numpy(stream.tokens[start + 1:start + 1 + n_predictions])
        ce = torch.nn.functional.cross_entropy(logits[0, :n_predictions], target, reduction="none")
        keep = torch.from_numpy(stream.trained(start, n_predictions, mask_across_docs))
        losses.append(ce[keep])
    return torch.cat(losses).mean()


@pytest.fixture(scope="module")
def gpt2():
    torch = import_trainer_module("torch", reason=TORCH_REASON)
    transformers = import_trainer_module("transformers", reason="transformers is in the hf extra")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=2 * S, n_embd=32, n_layer=2, n_head=2,
                                     bos_token_id=EOS, eos_token_id=EOS)
    return torch, transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("mask_across_docs", [False, True])
@pytest.mark.parametrize("attention_mask", [False, True])
def test_a_hugging_face_model_takes_the_next_token_loss_of_the_stream(small_root, gpt2, mask_across_docs,
                                                                       attention_mask):
    torch, model = gpt2
    from shards.torch_dataset import WindowDataset

    ds = WindowDataset(small_root, seq_len=S, batch_size=BATCH, seed=3, num_steps=3,
                       mask_across_docs=mask_across_docs, **({"attention_mask": True} if attention_mask else {}))
    sampler = open_tree(small_root).sampler(S, seed=3)
    stream = TokenStream(small_root)
    crossed = 0
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):
            inputs = {k: batch[k] for k in ("input_ids", "labels", "position_ids", "attention_mask") if k in batch}
            loss = model(**inputs).loss
            starts = [w.start for w in sampler.batch(global_batch(batch["step"], 0, 1), BATCH).windows]
            want = reference_loss(torch, model, stream, starts, S - 1, mask_across_docs, attention_mask)
            assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
            crossed += sum(len(stream.pieces(s, S)) > 1 for s in starts)
    assert crossed >= 3  # the windows did hold document boundaries


def test_the_megatron_convention_is_shifted_with_a_loss_mask(small_root, gpt2):
    torch, model = gpt2
    from shards.torch_dataset import WindowDataset

    ds = WindowDataset(small_root, seq_len=S, batch_size=BATCH, seed=3, num_steps=2, convention="megatron")
    sampler = open_tree(small_root).sampler(S, seed=3)
    stream = TokenStream(small_root)
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):
            assert {"tokens", "labels", "loss_mask", "position_ids", "cu_seqlens"} <= set(batch)
            assert "input_ids" not in batch
            assert torch.equal(batch["tokens"][:, 1:], batch["labels"][:, :-1])
            logits = model(input_ids=batch["tokens"], position_ids=batch["position_ids"]).logits
            ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="none")
            mask = batch["loss_mask"].flatten()
            loss = (ce * mask).sum() / mask.sum()  # as Megatron's loss_func takes it
            starts = [w.start for w in sampler.batch(batch["step"], BATCH).windows]
            want = reference_loss(torch, model, stream, starts, S, False, False)
            assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


def test_a_convention_is_checked_before_any_worker_starts(small_root):
    import_trainer_module("torch", reason=TORCH_REASON)
    from shards.torch_dataset import WindowDataset

    with pytest.raises(ValueError, match="convention must be one of"):
        WindowDataset(small_root, seq_len=S, batch_size=2, convention="nemo")
    with pytest.raises(ValueError, match="attention_mask is given in the hf convention"):
        WindowDataset(small_root, seq_len=S, batch_size=2, convention="megatron", attention_mask=True)


# --------------------------------------------------------------------------------------------
# OLMo-core's own NumpyFSLDataset over the shard files (docs/training.md, "OLMo-core", says how its
# instances relate to the reader's windows; this checks that statement).

OLMO_REASON = ("ai2-olmo-core is installed in CI: pip install --no-deps ai2-olmo-core cached-path "
               "dataclass-extensions bettermap dill")


@pytest.fixture(scope="module")
def olmo_tree(tmp_path_factory):
    """Files of several lengths (none a multiple of S), in two buckets and three partitions."""
    rng = np.random.default_rng(6)
    files = {}
    for rel, lengths in [("1024/p00_00000.npy", [5, 40, 17, 90, 3]), ("1024/p01_00000.npy", [64, 1, 30, 22]),
                         ("1024/p02_00000.npy", [200, 9]), ("2048/p01_00000.npy", [1500])]:
        files[rel] = [(f"{rel}:{i}", doc_tokens(rng, n, eos=EOS, high=EOS)) for i, n in enumerate(lengths)]
    return write_bucketed_tree(str(tmp_path_factory.mktemp("olmo") / "tree"), files, eos=EOS, vocab_size=VOCAB)


def olmo_dataset(tree, work_dir, seq_len):
    import_trainer_module("torch", reason=TORCH_REASON)
    numpy_dataset = import_trainer_module("olmo_core.data.numpy_dataset", reason=OLMO_REASON)
    from olmo_core.data import NumpyDatasetDType, TokenizerConfig

    config = numpy_dataset.NumpyFSLDatasetConfig(
        tokenizer=TokenizerConfig(vocab_size=tree.stats.vocab_size, eos_token_id=tree.eos_id, pad_token_id=tree.eos_id),
        paths=[tree.store.path(i) for i in range(len(tree.store.rel_paths))],  # the shard files, in storage order
        sequence_length=seq_len, dtype=NumpyDatasetDType(tree.stats.dtype), generate_doc_lengths=True,
        include_instance_metadata=False, work_dir=str(work_dir))
    dataset = config.build()
    dataset.prepare()
    return dataset


def test_olmo_core_reads_each_shard_file_as_the_reader_windows_it_alone(olmo_tree, tmp_path):
    tree = open_tree(olmo_tree)
    olmo = olmo_dataset(tree, tmp_path / "work", S)
    assert len(olmo.offsets) == len(tree.store.rel_paths) == 4
    for f, (rel, (first, end)) in enumerate(zip(tree.store.rel_paths, olmo.offsets, strict=True)):
        bucket, name = rel.split("/")
        # A selection of this file alone: its bucket, its partition (one file each here).
        sampler = tree.sampler(S, split="all", buckets=[bucket], partitions=[int(name[1:3])])
        n = tree.store.count(f)
        assert sampler.tokens == n and n % S  # no file is a multiple of S: the statement's common case
        # OLMo-core: N // S instances per file, the file's last N % S tokens dropped; the reader:
        # (N - 1) // S windows, the same when S does not divide N.
        assert end - first == n // S == len(sampler) == sampler.cuts[0].count
        for j in range(end - first):
            instance = olmo[first + j]
            window = sampler.cuts[0].stream.window_at(sampler.cuts[0].start(j), S)
            assert np.array_equal(instance["input_ids"].numpy(), window.inputs), (rel, j)
            # Its document lengths (cut after each EOS) are the window's document pieces.
            assert instance["doc_lens"].tolist() == np.diff(window.cu_seqlens).tolist(), (rel, j)
        # And every window of an epoch is one of these instances, in the reader's own order.
        starts = sorted(sampler.window(k).start for k in range(len(sampler)))
        assert starts == [j * S for j in range(end - first)]


def test_olmo_core_over_the_whole_tree_cuts_each_file_apart_where_the_reader_runs_on(olmo_tree, tmp_path):
    tree = open_tree(olmo_tree)
    olmo = olmo_dataset(tree, tmp_path / "work", S)
    sampler = tree.sampler(S, split="all")
    stream = sampler.cuts[0].stream
    assert len(olmo) == sum(tree.store.count(f) // S for f in range(4)) < len(sampler) == (stream.tokens - 1) // S
    for f, (first, end) in enumerate(olmo.offsets):
        file_start = int(tree.store.starts[f])  # the stream is the files end to end: one file per run here
        for j in range(end - first):
            got = olmo[first + j]["input_ids"].numpy()
            assert np.array_equal(got, stream.read(file_start + j * S, file_start + (j + 1) * S))
            if file_start % S == 0:  # only there does an instance start where a reader's window does
                assert np.array_equal(got, stream.window_at(file_start + j * S, S).inputs)
    assert int(tree.store.starts[1]) % S != 0  # so after the first file, none does
