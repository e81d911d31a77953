"""Reader throughput (issue 16): batches/s and tokens/s of ``shards.reader`` on one thread, from local
memory maps, at 8 x 1024 and 8 x 4096, for each way of drawing windows.

    .venv/bin/python tests/bench/reader_bench.py                      # prints the rows as a markdown table
    .venv/bin/python tests/bench/reader_bench.py --baseline OLD.py    # adds rows for an older reader.py

``--baseline`` loads another version of ``shards/reader.py`` from when the reader was one file (e.g.
``git show d30e902:shards/reader.py > /tmp/old_reader.py``; later it is a facade over shards/reading/,
whose version here it would import) and measures its ``sampler(S, seed).batch(i, 8)`` on the same
tree in the same run, so the cost of the new features is read against the old code on the same
machine and load.

The tree is synthetic and built once under ``--cache`` (~256 MB): ``--tokens`` uint32 tokens in
documents of log-normal length (median 600, a few above 32768), written as the bucketed job lays
them out (``{bucket}/pPP_00000.npy``, manifest, dataset_stats.txt). Its pages are read once before
timing, so every row reads from memory maps in the page cache. The process is pinned to one CPU.

Each row draws consecutive batches 0, 1, 2, ... for about ``--seconds``; the rows take turns,
``--repeats`` times, so a busy moment of the machine slows them alike, and each keeps its best run.
Rates are per CPU second of this one thread (``time.process_time``: reading the memory maps is page
cache work done in this thread), so other work on the machine inflates them less than wall time:
batches per second and tokens (B x S) per second, and the ratio to the first row of its batch size
(the baseline reader, when given). Not a test: pytest never collects it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from shards import (  # noqa: E402
    conditions,  # noqa: E402
    layout,
    manifest,
)
from shards.reader import open_tree  # noqa: E402

EOS = 151643
SHAPES = ((8, 1024), (8, 4096))


def build_tree(root: Path, tokens: int, seed: int = 0) -> Path:
    """A bucketed tree of about ``tokens`` tokens under ``root`` (kept: rebuilt only when missing)."""
    if (root / layout.STATS_NAME).exists():
        return root
    rng = np.random.default_rng(seed)
    lengths = []
    total = 0
    while total < tokens:
        n = int(np.clip(rng.lognormal(np.log(600), 1.3), 2, 300_000))
        lengths.append(n)
        total += n
    lengths = np.array(lengths)
    buckets = {name: manifest.BucketStats() for name in layout.BUCKET_NAMES}
    files: dict[str, list[int]] = {}
    for i, n in enumerate(lengths):
        files.setdefault(f"{layout.bucket_name(int(n))}/p{i % 4:02d}_00000.npy", []).append(i)
    order = sorted(files, key=lambda r: (layout.BUCKET_NAMES.index(r.split("/")[0]), r))
    rows = [manifest.MANIFEST_HEADER + "\n"]
    for rel in order:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        docs = files[rel]
        data = rng.integers(0, 150_000, int(lengths[docs].sum()), dtype=np.uint32)
        ends = np.cumsum(lengths[docs]) - 1
        data[ends] = EOS
        data.tofile(root / rel)
        b = buckets[rel.split("/")[0]]
        b.files += 1
        for i in docs:
            rows.append(manifest.format_row(rel, f"doc-{i}", int(lengths[i])))
            b.documents += 1
            b.tokens += int(lengths[i])
    (root / layout.MANIFEST_NAME).write_text("".join(rows), encoding="utf-8")
    stats = manifest.DatasetStats(
        raw_documents=len(lengths), filter=conditions.record(conditions.SHORTHANDS), tokenizer="bench",
        eos_id=EOS, vocab_size=151936, dtype="uint32", partitions=4, seed=0, buckets=buckets, drops={},
    )
    (root / layout.STATS_NAME).write_text(stats.to_text(), encoding="utf-8")
    return root


def warm(tree) -> None:
    """Read every page of the tree's memory maps in this process, so no row pays a first fault."""
    store = tree.store
    for i in range(len(store.rel_paths)):
        int(store.read(int(store.starts[i]), int(store.starts[i + 1])).sum())


def iterated(sampler, batch_size: int):
    """draw(i) for the iteration a training loop does: the next batch, then the state to checkpoint."""
    batches = sampler.batches(batch_size)
    return lambda i: (next(batches), sampler.state_dict())


def rows(tree, baseline_module, url: str):
    """(label, draw(i) -> batch i) for every row of the table."""
    for b, s in SHAPES:
        if baseline_module is not None:
            old_tree = baseline_module.open_tree(url)
            warm(old_tree)
            old = old_tree.sampler(s, seed=0)
            yield f"{b} x {s}: baseline reader (--baseline), with replacement", lambda i, x=old, b=b: x.batch(i, b)
        sampler = tree.sampler(s, seed=0, replacement=True)
        yield f"{b} x {s}: replacement=True (the old draws) + loss_mask", lambda i, x=sampler, b=b: x.batch(i, b)
        sampler = tree.sampler(s, seed=0)
        yield f"{b} x {s}: epochs (the default) + loss_mask", lambda i, x=sampler, b=b: x.batch(i, b)
        yield f"{b} x {s}: epochs, iterated by batches(), state_dict() after each", iterated(tree.sampler(s, seed=0), b)
        sampler = tree.sampler(s, seed=0, mask_across_docs=True)
        yield f"{b} x {s}: epochs, mask_across_docs", lambda i, x=sampler, b=b: x.batch(i, b)
        sampler = tree.sampler(s, seed=0, align_to_docs=True)
        yield f"{b} x {s}: epochs, align_to_docs", lambda i, x=sampler, b=b: x.batch(i, b)
        sampler = tree.sampler(s, seed=0, weights={"1024": 1, "4096": 1, "16384": 2})
        yield f"{b} x {s}: epochs, weights 1024:1 4096:1 16384:2", lambda i, x=sampler, b=b: x.batch(i, b)
    lengths = tree.length_sampler(tokens_per_batch=8 * 4096, seed=0, buckets=["1024", "2048", "4096"])
    yield "length_sampler: 32768 tokens a batch, one bucket each (32 x 1024, 16 x 2048 or 8 x 4096)", lengths.batch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "reader-bench")
    p.add_argument("--tokens", type=int, default=64_000_000)
    p.add_argument("--seconds", type=float, default=2.0, help="about this long per run of a row")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", type=Path, help="a one-file shards/reader.py (d30e902 or older) to measure too")
    args = p.parse_args(argv)

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    root = build_tree(args.cache / f"tree-{args.tokens}", args.tokens)
    tree = open_tree(str(root))
    warm(tree)
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("reader_baseline", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)

    print(f"tree: {len(tree):,} documents, {tree.total_tokens:,} tokens, {root}")
    measured = []
    for label, draw in rows(tree, baseline, str(root)):
        probe = draw(0)
        batch = probe if hasattr(probe, "inputs") else probe[0]
        t = time.perf_counter()
        for i in range(1, 21):
            draw(i)
        n = max(20, int(20 / (time.perf_counter() - t) * args.seconds))
        measured.append([label, batch.inputs.size, draw, n, 0.0])
    # Rows take turns, run after run, so a busy moment of the machine slows every row alike.
    for r in range(args.repeats):
        for row in measured:
            label, shape, draw, n, best = row
            t = time.process_time()
            for i in range(r * n, (r + 1) * n):
                draw(i)
            row[4] = max(best, n / (time.process_time() - t))

    print("| reader, one thread | tokens a batch | batches per CPU s | tokens per CPU s | vs first row of its size |")
    print("|---|---:|---:|---:|---:|")
    reference = {}
    for label, size, _, _, bps in measured:
        ref = reference.setdefault(size, bps)
        print(f"| {label} | {size:,} | {bps:,.0f} | {bps * size / 1e6:.1f}M | {bps / ref:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
