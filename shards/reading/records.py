"""The records a reader hands to its caller: a stored document's place (``DocumentInfo``), a window
of S+1 tokens with the documents inside it (``Window``), windows stacked (``Batch``), and the
block-causal attention mask of a window's documents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class DocumentInfo(NamedTuple):
    """A stored document: ``tokens = shard[offset:offset + length]``, EOS included."""

    index: int  # row in the tree's document table (storage order)
    id: str
    shard: str  # rel path of the file holding its first token
    offset: int  # in tokens, within that file
    length: int
    bucket: str
    partition: int  # -1 for llm.c trees
    split: str  # "train" / "val" for llm.c trees, "" for bucketed ones (see ShardTree.is_validation)


class Window(NamedTuple):
    """S+1 consecutive tokens of a stream as inputs and targets, with the documents inside them.

    ``cu_seqlens`` are the cumulative lengths of the document pieces in ``inputs`` (0, each document
    start inside the inputs, S), as varlen attention kernels take them; ``position_ids`` count from 0
    at the window's start and again at each document start. ``doc_index[j]`` is the document of
    piece j (a row of ``tree.documents``), and ``first_offset`` where in its document the window starts.

    ``loss_mask[i]`` is 1.0 where ``targets[i]`` is trained on. It is 0.0 where ``targets[i]`` is the
    first token of a document, i.e. the target after each EOS (Megatron's ``eod_mask_loss``): no
    model can predict the next document from the end of the last. With ``mask_across_docs`` it is
    also 0.0 on every later target, so that only the window's first document is trained on.
    """

    inputs: np.ndarray  # (S,) int64
    targets: np.ndarray  # (S,) int64
    cu_seqlens: np.ndarray  # (pieces + 1,) int32
    position_ids: np.ndarray  # (S,) int64
    doc_index: np.ndarray  # (pieces,) int64
    first_offset: int
    bucket: str | None  # the bucket whose stream it was cut from; None when the sampler has one stream
    start: int  # its first token's position in that stream
    loss_mask: np.ndarray  # (S,) float32


class Batch(NamedTuple):
    """Windows stacked; ``cu_seqlens`` runs over the B*S tokens flattened, as flash-attn's varlen API takes.

    Shifted, as Megatron's: ``targets[:, i]`` is the token after ``inputs[:, i]``. Hugging Face's
    convention (labels = the inputs, -100 where ``loss_mask`` is 0) is shards.torch_dataset.hf_labels.
    """

    inputs: np.ndarray  # (B, S) int64
    targets: np.ndarray  # (B, S) int64
    position_ids: np.ndarray  # (B, S) int64
    cu_seqlens: np.ndarray  # (pieces + 1,) int32
    max_seqlen: int
    windows: tuple[Window, ...]
    loss_mask: np.ndarray  # (B, S) float32


def stack_windows(windows: Sequence[Window]) -> Batch:
    if not windows:
        raise ValueError("a batch needs at least one window")
    s = len(windows[0].inputs)
    cu = [w.cu_seqlens[:-1] + i * s for i, w in enumerate(windows)]
    cu.append(np.array([len(windows) * s], dtype=np.int32))
    cu_seqlens = np.concatenate(cu)
    return Batch(
        inputs=np.stack([w.inputs for w in windows]),
        targets=np.stack([w.targets for w in windows]),
        position_ids=np.stack([w.position_ids for w in windows]),
        cu_seqlens=cu_seqlens,
        max_seqlen=int(np.diff(cu_seqlens).max()),
        windows=tuple(windows),
        loss_mask=np.stack([w.loss_mask for w in windows]),
    )


def block_causal_mask(cu_seqlens: np.ndarray) -> np.ndarray:
    """(S, S) bool, True where query i may attend to key j: j <= i and both in the same document piece.

    For attention without a varlen kernel (e.g. ``scaled_dot_product_attention(attn_mask=...)``).
    """
    lengths = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
    piece = np.repeat(np.arange(len(lengths)), lengths)
    return (piece[:, None] == piece[None, :]) & np.tri(len(piece), dtype=bool)
