"""An optional torch ``IterableDataset`` over the reader: batches of windows, split across ranks and
DataLoader workers. Needs the ``torch`` extra; importing this module does not import torch, only
touching ``WindowDataset`` does.

    from shards.torch_dataset import WindowDataset

    ds = WindowDataset("out/finepdfs", seq_len=4096, batch_size=8, seed=0, split="train", val_fraction=0.01)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=4)
    for batch in loader:  # input_ids, labels, position_ids: (8, 4096) int64; cu_seqlens: int32; step
        ...

Which batch goes where is fixed by arithmetic, not by the number of workers:

- global batch ``g`` holds the sampler's windows ``g*B .. g*B + B - 1`` (a pure function of the seed);
- rank ``r`` of ``R`` takes, at its step ``j``, global batch ``j*R + r``;
- DataLoader worker ``w`` of ``W`` makes the steps ``j`` with ``(j - start_step) % W == w``, and the
  DataLoader hands them back round-robin, so each rank sees its steps in order, the same ones with any
  ``num_workers``. ``start_step`` resumes a run: the step of each batch is in ``batch["step"]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from shards.reader import ShardTree, WindowSampler, open_tree


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


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError(
            "shards.torch_dataset needs torch: pip install 'beam-pretokenize[torch]' "
            "(shards.reader works without it)"
        ) from None
    return torch


def _make_class():
    torch = _torch()

    class WindowDataset(torch.utils.data.IterableDataset):
        """Batches of ``batch_size`` windows of ``seq_len + 1`` tokens from a tree, as dicts of tensors.

        ``tree`` is a URL (each worker opens it) or an opened ShardTree. The sampler's arguments
        (split, val_fraction, buckets, partitions, weights, align_to_docs) pass through.
        ``rank`` and ``world_size`` default to torch.distributed's when it is initialised.
        ``num_steps`` bounds the batches this rank yields (None: without end).
        """

        def __init__(self, tree: str | ShardTree, seq_len: int, batch_size: int, seed: int = 0, *,
                     rank: int | None = None, world_size: int | None = None, start_step: int = 0,
                     num_steps: int | None = None, **sampler_args: object):
            super().__init__()
            if batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
            if start_step < 0 or (num_steps is not None and num_steps < 0):
                raise ValueError("start_step and num_steps must be >= 0")
            if rank is None or world_size is None:
                dist = torch.distributed
                initialised = dist.is_available() and dist.is_initialized()
                rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
                world_size = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
            global_batch(0, rank, world_size)  # checks the pair
            self.tree = tree
            self.seq_len = seq_len
            self.batch_size = batch_size
            self.seed = seed
            self.rank = rank
            self.world_size = world_size
            self.start_step = start_step
            self.num_steps = num_steps
            self.sampler_args: Mapping[str, object] = dict(sampler_args)
            self._sampler: WindowSampler | None = None
            if isinstance(tree, ShardTree):
                self._sampler = self._make_sampler()  # fail here, not in a worker, on bad arguments

        def _make_sampler(self) -> WindowSampler:
            tree = self.tree if isinstance(self.tree, ShardTree) else open_tree(self.tree)
            return tree.sampler(self.seq_len, self.seed, **self.sampler_args)

        def __getstate__(self):
            state = self.__dict__.copy()
            if not isinstance(self.tree, ShardTree):
                state["_sampler"] = None  # a worker opens the URL itself
            return state

        def __len__(self) -> int:
            if self.num_steps is None:
                raise TypeError("a WindowDataset without num_steps has no length")
            return self.num_steps

        def __iter__(self):
            if self._sampler is None:
                self._sampler = self._make_sampler()
            info = torch.utils.data.get_worker_info()
            worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
            for step in worker_steps(self.start_step, worker, num_workers, self.num_steps):
                batch = self._sampler.batch(global_batch(step, self.rank, self.world_size), self.batch_size)
                yield {
                    "input_ids": torch.from_numpy(batch.inputs),
                    "labels": torch.from_numpy(batch.targets),
                    "position_ids": torch.from_numpy(batch.position_ids),
                    "cu_seqlens": torch.from_numpy(batch.cu_seqlens),
                    "max_seqlen": batch.max_seqlen,
                    "step": step,
                }

    WindowDataset.__module__ = __name__
    WindowDataset.__qualname__ = "WindowDataset"
    return WindowDataset


def __getattr__(name: str):
    if name == "WindowDataset":
        cls = _make_class()
        globals()["WindowDataset"] = cls  # built once; pickling finds it by name from here on
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
