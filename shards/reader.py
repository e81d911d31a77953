"""Read a finished output tree for training: documents by id, and windows of S+1 tokens that carry
their document boundaries.

    tree = open_tree("out/finepdfs")                       # local (memory-mapped) or any fsspec URL
    tree.document("<urn:uuid:...>")                        # one document's tokens, EOS included
    sampler = tree.sampler(seq_len=4096, seed=0, split="train", val_fraction=0.01,
                           weights={"8192": 1, "32768": 3})
    len(sampler)                                           # windows in one epoch
    w = sampler.window(0)                                  # inputs, targets, cu_seqlens, position_ids, loss_mask
    b = sampler.batch(0, batch_size=8)                     # the same, stacked (cu_seqlens flattened)
    for b in sampler.batches(8): ...                       # from sampler.position; state_dict() resumes there
    stage = tree.length_sampler(tokens_per_batch=262144, buckets=["32768", "65536"])  # one length per bucket

Two formats are read:

- the bucketed layout (``{bucket}/pPP_NNNNN.npy``, ``processed_spec.txt``, ``dataset_stats.txt``):
  documents, their ids, shards and offsets come from the manifest; nothing is scanned;
- the llm.c layout of the scaffold job (``train/shard_NNN.bin``, ``val/shard_NNN.bin``): documents
  are found by splitting each split's token stream after every EOT 50256, and may continue from one
  shard into the next; their ids are ``train:0``, ``train:1``, ... in stream order.

A tree is opened only once its ``dataset_stats.txt`` exists: the jobs write it last, as the commit
point (see transforms/core/publish.py). Loose llm.c shard files, e.g. a downloaded copy of the published
dataset, are opened with ``open_llmc``; each file's header count is checked against its size.

Windows follow the chapter on data (``seeds/data-and-tokenisation-chapter.txt``): the selected
documents are concatenated into one stream of N tokens (documents are already separated by their
EOS); a window is S+1 consecutive tokens, its first S the inputs and its last S the targets. A
bucketed document's bounds come from the manifest, never from its EOS: in a tree written with
``--special-tokens tokenizer`` an EOS may stand inside a document.

By default windows come in epochs (as Megatron's GPTDataset samples do): the stream is cut every S
tokens (``WindowCut``; each document on its own with ``align_to_docs``), and epoch e takes the cut's
windows in a seeded ``Permutation`` of its own, computed per index, so window k is the same on every
run, machine and numpy version, whichever rank or worker draws it, and a run resumes from an index
alone. Per-bucket weights give each bucket its share of an epoch (``EpochMix``). ``loss_mask`` is 0
on the target after each EOS. ``replacement=True`` keeps the earlier independent draws: a start at
``floor(u * (N - S - 1))``, ``u`` from a generator keyed by the seed and the window's index (with
weights, the bucket first, by weight; ``align_to_docs``: at a document start, each eligible one
equally likely). ``LengthSampler`` makes batches of a fixed number of tokens, one bucket and one
sequence length each.

This module is the public API, and only that: the names below, each defined in its own module of
shards.reading (its docstring says which concern lives where). Only numpy there (and fsspec for
remote trees): no Beam, no torch.
"""

from shards.reading.hashes import validation_key
from shards.reading.opening import open_llmc, open_tree
from shards.reading.records import Batch, DocumentInfo, Window, block_causal_mask, stack_windows
from shards.reading.samplers import LengthSampler, WindowSampler
from shards.reading.shard_tree import SPLITS, ShardTree
from shards.reading.store import TreeChangedError
from shards.tree import IncompleteTreeError

__all__ = [
    "SPLITS",
    "Batch",
    "DocumentInfo",
    "IncompleteTreeError",
    "LengthSampler",
    "ShardTree",
    "TreeChangedError",
    "Window",
    "WindowSampler",
    "block_causal_mask",
    "open_llmc",
    "open_tree",
    "stack_windows",
    "validation_key",
]
