"""An optional torch ``IterableDataset`` over the reader: batches of windows, split across ranks and
DataLoader workers, resumable. Needs the ``torch`` extra; importing this module does not import
torch, only touching ``WindowDataset`` does. Which batch goes where, and the resumable state, are
plain Python here (``global_batch``, ``worker_steps``, ``WorkerBatches``), usable without torch.

    from shards.torch_dataset import WindowDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = WindowDataset("out/finepdfs", seq_len=4096, batch_size=8, seed=0, split="train", val_fraction=0.01)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=4)   # or torch's DataLoader
    for batch in loader:  # input_ids, labels, position_ids: (8, 4096); cu_seqlens, max_seqlen; step
        loss = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"]).loss
    checkpoint["data"] = loader.state_dict()   # later: loader.load_state_dict(checkpoint["data"])

What a batch holds, by ``convention``:

- ``"hf"`` (the default), Hugging Face's causal LM convention: ``input_ids`` (B, S), the window's
  inputs; ``labels`` (B, S), the same tokens, which the model shifts itself (logits at i against
  labels at i + 1), with -100 where no loss is taken; ``position_ids`` (B, S); and, with
  ``attention_mask=True``, ``attention_mask`` (B, 1, S, S) bool, the block-causal mask of the
  documents in each window (for attention that takes neither ``position_ids`` boundaries nor
  ``cu_seqlens``; B * S * S bytes, 134 MB at B = 8, S = 4096). A window is never padded, so there
  is no 2-D attention mask: Hugging Face's flash-attention path finds packed documents from
  ``position_ids`` when it gets none.
  Masked at document boundaries: a document's first token gets label -100, so nothing predicts it
  from the document before (whose EOS is trained on as that document's last prediction).
  ``mask_across_docs`` makes every label after the window's first document -100 too. As Hugging
  Face shifts within the S inputs, a window's last target (its token S + 1, the next window's first
  input) is not trained on: S - 1 predictions a window.
- ``"megatron"``, Megatron-LM's GPTDataset layout, already shifted: ``tokens`` (the inputs),
  ``labels`` (the targets, one token later), ``loss_mask`` (float32, 0.0 where no loss is taken,
  the same places) and ``position_ids``: S predictions a window.

Both add ``cu_seqlens`` (int32, the document pieces over the B*S tokens flattened) and ``max_seqlen``
for varlen attention kernels, and ``step``. The numpy reader's ``Batch`` keeps ``inputs`` and
``targets`` (shifted), which say what they are. ``hf_labels`` and ``megatron_arrays`` turn a
``Batch`` into either convention without torch.

Which batch goes where is fixed by arithmetic, not by the number of workers:

- global batch ``g`` is the sampler's batch g: windows ``g*B .. g*B + B - 1`` of its epochs (or
  ``length_sampler``'s batch g with ``tokens_per_batch``), a pure function of the seed;
- rank ``r`` of ``R`` takes, at its step ``j``, global batch ``j*R + r``;
- DataLoader worker ``w`` of ``W`` makes the steps ``j`` with ``(j - start_step) % W == w``, and the
  DataLoader hands them back round-robin, so each rank sees its steps in order, the same ones with any
  ``num_workers``. The step of each batch is in ``batch["step"]``.

Resuming: torchdata's ``StatefulDataLoader`` keeps, per worker, the ``state_dict()`` of the worker's
copy of the dataset as it was after the last batch it handed back, and gives it to that worker's copy
again (``load_state_dict``) before iterating; that state is the next step the worker makes. So the
resumed loader yields exactly the batches the interrupted one would have yielded next. The number of
workers must then be the same (StatefulDataLoader checks it); to resume with another number of workers
or ranks, start a new dataset at ``start_step`` = the last step trained + 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from shards.reading.epochs import as_json, refuse_other_fingerprint
from shards.reading.opening import open_tree
from shards.reading.records import Batch, block_causal_mask
from shards.reading.samplers import LengthSampler, WindowSampler
from shards.reading.shard_tree import ShardTree

CONVENTIONS = ("hf", "megatron")
IGNORE_INDEX = -100  # Hugging Face's (and torch cross_entropy's) label for "no loss here"


def hf_labels(batch: Batch) -> np.ndarray:
    """Hugging Face labels of a batch: its inputs (the model shifts them), -100 where no loss is taken.

    The loss of logits at position i is taken against labels[i + 1] = targets[i]; so where the
    reader's ``loss_mask[i]`` is 0 (the target starts a document, or lies past the window's first
    document with ``mask_across_docs``), labels[i + 1] is -100. labels[0] is no model's target.
    """
    labels = batch.inputs.copy()
    labels[:, 1:][batch.loss_mask[:, :-1] == 0] = IGNORE_INDEX
    return labels


def block_causal_masks(batch: Batch) -> np.ndarray:
    """(B, 1, S, S) bool: True where a query may attend to a key (causal, within its document piece)."""
    b, s = batch.inputs.shape
    out = np.empty((b, 1, s, s), dtype=bool)
    for i, w in enumerate(batch.windows):
        out[i, 0] = block_causal_mask(w.cu_seqlens)
    return out


def batch_arrays(batch: Batch, convention: str = "hf", attention_mask: bool = False) -> dict[str, np.ndarray]:
    """The numpy arrays of one batch in a convention (see the module docstring), without torch."""
    if convention == "hf":
        arrays = {"input_ids": batch.inputs, "labels": hf_labels(batch), "position_ids": batch.position_ids}
        if attention_mask:
            arrays["attention_mask"] = block_causal_masks(batch)
    elif convention == "megatron":
        if attention_mask:
            raise ValueError("attention_mask is given in the hf convention; Megatron builds its own")
        arrays = {"tokens": batch.inputs, "labels": batch.targets, "loss_mask": batch.loss_mask,
                  "position_ids": batch.position_ids}
    else:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    arrays["cu_seqlens"] = batch.cu_seqlens
    return arrays


def global_batch(step: int, rank: int, world_size: int) -> int:
    """The global batch index rank ``rank`` of ``world_size`` takes at its step ``step``."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    return step * world_size + rank


def worker_steps(start_step: int, worker: int, num_workers: int, num_steps: int | None) -> Iterator[int]:
    """The rank-local steps one DataLoader worker makes: every num_workers-th from start_step + worker."""
    step = start_step + worker
    end = None if num_steps is None else start_step + num_steps
    while end is None or step < end:
        yield step
        step += num_workers


class WorkerBatches:
    """The batches one worker of one rank makes, in order, as ``(step, batch)``; resumable.

    ``batch_of(g)`` gives global batch g. The steps are ``worker_steps(start_step, worker,
    num_workers, num_steps)``; ``state_dict()`` is the next of them with the fingerprint of what
    decides the batches (``fingerprint``, e.g. WindowDataset's: the tree, the sampler, the batch
    size; then the split: world size, rank, number of workers, worker, start step), and
    ``load_state_dict`` continues from a saved one, refusing one of another fingerprint in one line
    naming the first field that differs: the ``Stateful`` protocol of torchdata.
    """

    def __init__(self, batch_of: Callable[[int], Batch], *, rank: int = 0, world_size: int = 1, worker: int = 0,
                 num_workers: int = 1, start_step: int = 0, num_steps: int | None = None,
                 fingerprint: Mapping[str, object] | None = None):
        global_batch(0, rank, world_size)  # checks the pair
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker {worker} is outside {num_workers} workers")
        if start_step < 0 or (num_steps is not None and num_steps < 0):
            raise ValueError("start_step and num_steps must be >= 0")
        self.batch_of = batch_of
        self.rank, self.world_size = rank, world_size
        self.worker, self.num_workers = worker, num_workers
        self.start_step = start_step
        self.end = None if num_steps is None else start_step + num_steps
        self.next_step = start_step + worker
        self.fingerprint = as_json({**(fingerprint or {}), **self._split()})

    def __iter__(self) -> WorkerBatches:
        return self

    def __next__(self) -> tuple[int, Batch]:
        step = self.next_step
        if self.end is not None and step >= self.end:
            raise StopIteration
        batch = self.batch_of(global_batch(step, self.rank, self.world_size))
        self.next_step = step + self.num_workers
        return step, batch

    def _split(self) -> dict:
        return {"world_size": self.world_size, "rank": self.rank, "num_workers": self.num_workers,
                "worker": self.worker, "start_step": self.start_step}

    def state_dict(self) -> dict:
        return {"next_step": self.next_step, "fingerprint": dict(self.fingerprint)}

    def load_state_dict(self, state: Mapping) -> None:
        refuse_other_fingerprint(state, self.fingerprint, "loader")
        step = state.get("next_step")
        if (not isinstance(step, int) or step < self.start_step + self.worker
                or (step - self.start_step - self.worker) % self.num_workers):
            raise ValueError(f"next_step {step!r} is not a step of worker {self.worker} of {self.num_workers} "
                             f"from step {self.start_step}")
        self.next_step = step


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError(
            "shards.torch_dataset needs torch: pip install 'beam-pretokenize[torch]' "
            "(shards.reader works without it)"
        ) from None
    return torch


class _WindowDataset:
    """Batches of ``batch_size`` windows of ``seq_len + 1`` tokens from a tree, as dicts of tensors;
    or, given ``tokens_per_batch`` (and neither seq_len nor batch_size), batches of that many tokens
    from ``tree.length_sampler``, one bucket and sequence length each.

    ``tree`` is a URL (each worker opens it) or an opened ShardTree. The sampler's arguments
    (split, val_fraction, buckets, partitions, weights, align_to_docs, mask_across_docs, ...)
    pass through. ``rank`` and ``world_size`` default to torch.distributed's when it is
    initialised. ``num_steps`` bounds the batches this rank yields (None: without end).
    ``state_dict()`` / ``load_state_dict()``: see the module docstring.
    """

    def __init__(self, tree: str | ShardTree, seq_len: int | None = None, batch_size: int | None = None,
                 seed: int = 0, *, tokens_per_batch: int | None = None, rank: int | None = None,
                 world_size: int | None = None, start_step: int = 0, num_steps: int | None = None,
                 convention: str = "hf", attention_mask: bool = False, **sampler_args: object):
        super().__init__()
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        if attention_mask and convention != "hf":
            raise ValueError("attention_mask is given in the hf convention; Megatron builds its own")
        if tokens_per_batch is None and (seq_len is None or batch_size is None):
            raise ValueError("give seq_len and batch_size, or tokens_per_batch")
        if tokens_per_batch is not None and (seq_len is not None or batch_size is not None):
            raise ValueError("tokens_per_batch sets the batch shape per bucket: give it without seq_len "
                             "and batch_size")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if rank is None or world_size is None:
            dist = _torch().distributed
            initialised = dist.is_available() and dist.is_initialized()
            rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
            world_size = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
        global_batch(0, rank, world_size)  # checks the pair
        if start_step < 0 or (num_steps is not None and num_steps < 0):
            raise ValueError("start_step and num_steps must be >= 0")
        self.tree = tree
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.tokens_per_batch = tokens_per_batch
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start_step = start_step
        self.num_steps = num_steps
        self.convention = convention
        self.attention_mask = attention_mask
        self.sampler_args: Mapping[str, object] = dict(sampler_args)
        self._sampler: WindowSampler | LengthSampler | None = None
        self._batches: WorkerBatches | None = None
        self._loaded: Mapping | None = None
        if isinstance(tree, ShardTree):
            self._sampler = self._make_sampler()  # fail here, not in a worker, on bad arguments

    def _make_sampler(self) -> WindowSampler | LengthSampler:
        tree = self.tree if isinstance(self.tree, ShardTree) else open_tree(self.tree)
        if self.tokens_per_batch is not None:
            return tree.length_sampler(self.tokens_per_batch, self.seed, **self.sampler_args)
        return tree.sampler(self.seq_len, self.seed, **self.sampler_args)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_batches"] = None
        if not isinstance(self.tree, ShardTree):
            state["_sampler"] = None  # a worker opens the URL itself
        return state

    def __len__(self) -> int:
        if self.num_steps is None:
            raise TypeError("a WindowDataset without num_steps has no length")
        return self.num_steps

    def _batch_of(self, g: int) -> Batch:
        if self.tokens_per_batch is not None:
            return self._sampler.batch(g)
        return self._sampler.batch(g, self.batch_size)

    def fingerprint(self) -> dict:
        """What decides this rank's batches, JSON-ready, in the order a mismatch is looked for: the
        sampler's fingerprint (the tree, seq_len, seed, split, weights, masking, ...), the batch size,
        what a batch holds (convention, attention_mask), then the split over ranks. A worker's
        state adds the number of workers and its own (WorkerBatches)."""
        if self._sampler is None:
            self._sampler = self._make_sampler()
        return as_json({**self._sampler.fingerprint(), "batch_size": self.batch_size,
                        "convention": self.convention, "attention_mask": self.attention_mask,
                        "world_size": self.world_size, "rank": self.rank, "start_step": self.start_step})

    def state_dict(self) -> dict:
        """The next step this copy of the dataset (one DataLoader worker's) makes, with its fingerprint."""
        if self._batches is not None:
            return self._batches.state_dict()
        if self._loaded is not None:
            return dict(self._loaded)
        # Not started: the next step is start_step + this worker. A copy that has not opened its
        # tree (a URL, in the main process of a loader whose workers do the reading) does not open
        # it for this: such a state holds no position, so nothing can resume from it at a wrong one.
        return {"next_step": None, "fingerprint": self.fingerprint() if self._sampler is not None else None}

    def load_state_dict(self, state: Mapping) -> None:
        """Continue, at the next ``iter()``, from a ``state_dict()`` of the same worker of a dataset
        of the same fingerprint; a state of another is refused here, naming the first field that
        differs (the worker and the number of workers are checked at ``iter()``, where they are known).
        A state of a copy that had not started (``next_step`` None) starts at ``start_step``."""
        if state.get("next_step") is None and state.get("fingerprint") is None:
            self._loaded = self._batches = None
            return
        refuse_other_fingerprint(state, self.fingerprint(), "loader")
        self._loaded = None if state.get("next_step") is None else dict(state)
        self._batches = None

    def __iter__(self):
        if self._sampler is None:
            self._sampler = self._make_sampler()
        info = _torch().utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        dataset = {k: v for k, v in self.fingerprint().items() if k not in ("world_size", "rank", "start_step")}
        batches = WorkerBatches(self._batch_of, rank=self.rank, world_size=self.world_size, worker=worker,
                                num_workers=num_workers, start_step=self.start_step, num_steps=self.num_steps,
                                fingerprint=dataset)
        if self._loaded is not None:
            batches.load_state_dict(self._loaded)
            self._loaded = None  # used once: a later iter() starts at start_step again
        self._batches = batches
        return map(self._tensors, batches)  # unlike a generator, keeps no batch alive between steps

    def _tensors(self, item: tuple[int, Batch]) -> dict:
        step, batch = item
        arrays = batch_arrays(batch, self.convention, self.attention_mask)
        torch = _torch()
        return {**{k: torch.from_numpy(v) for k, v in arrays.items()}, "max_seqlen": batch.max_seqlen,
                "step": step}


def _make_class():
    """WindowDataset: the batches above as a torch IterableDataset (torch imported only now)."""
    torch = _torch()

    class WindowDataset(_WindowDataset, torch.utils.data.IterableDataset):
        __doc__ = _WindowDataset.__doc__

    WindowDataset.__module__ = __name__
    WindowDataset.__qualname__ = "WindowDataset"
    return WindowDataset


def __getattr__(name: str):
    if name == "WindowDataset":
        cls = _make_class()
        globals()["WindowDataset"] = cls  # built once; pickling finds it by name from here on
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
