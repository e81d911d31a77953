"""Opening a tree (issue 26): ``open_tree`` and one window, with and without the reader index, at
several document counts.

    .venv/bin/python tests/bench/open_bench.py --documents 1000000 10000000

For each count, a synthetic bucketed tree of that many short documents (2 to 12 tokens, ids of 36
characters like the corpus's UUIDs, 32 partitions) is built once under ``--cache``, with its
manifest, stats, record and index (shards.index, as publish writes it). Each row is a fresh
process (nothing cached in Python; the files are in the page cache after the first run) that
imports shards.reader (not timed), then opens the tree, draws window 0 of ``sampler(1024)`` and
looks one document up by id; it reports its wall time and peak RSS (VmHWM), best of ``--repeats``.
"manifest" rows are the same tree with the record not listing the index (the path of a tree an
older version wrote).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from fsspec.implementations.local import LocalFileSystem

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from shards import (  # noqa: E402
    conditions,  # noqa: E402
    layout,
    manifest,
    tree,
)
from shards import index as reader_index  # noqa: E402

EOS = 151643
PARTITIONS = 32


def build_tree(root: Path, documents: int) -> Path:
    if (root / layout.STATS_NAME).exists():
        return root
    tmp = root.with_name(root.name + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(documents)
    lengths = rng.integers(2, 13, documents)
    partition = np.arange(documents) % PARTITIONS
    buckets = {name: manifest.BucketStats() for name in layout.BUCKET_NAMES}
    (tmp / "1024").mkdir()
    files = []
    with open(tmp / layout.MANIFEST_NAME, "w", encoding="utf-8") as m:
        m.write(manifest.MANIFEST_HEADER + "\n")
        for p in range(PARTITIONS):
            docs = np.flatnonzero(partition == p)
            rel = f"1024/p{p:02d}_00000.npy"
            files.append(rel)
            n = lengths[docs]
            data = rng.integers(0, 150_000, int(n.sum()), dtype=np.uint32)
            data[np.cumsum(n) - 1] = EOS
            data.tofile(tmp / rel)
            m.writelines(manifest.format_row(rel, f"{i:08x}-0000-4000-8000-{i:012x}", int(k))
                         for i, k in zip(docs.tolist(), n.tolist(), strict=True))
            b = buckets["1024"]
            b.files += 1
            b.documents += len(docs)
            b.tokens += int(n.sum())
    with open(tmp / reader_index.INDEX_NAME, "wb") as out:  # as publish builds it, the manifest hashed
        reader_index.build_from_manifest(LocalFileSystem(), str(tmp), out)
    (tmp / tree.RECORD_NAME).write_text(json.dumps({"tool": tree.TOOL, "kind": "bucketed", "files": files,
                                                    "derived": [reader_index.INDEX_NAME]}))
    stats = manifest.DatasetStats(
        raw_documents=documents, filter=conditions.record(conditions.SHORTHANDS), tokenizer="bench",
        eos_id=EOS, vocab_size=151936, dtype="uint32", partitions=PARTITIONS, seed=0, buckets=buckets, drops={},
    )
    (tmp / layout.STATS_NAME).write_text(stats.to_text(), encoding="utf-8")
    tmp.rename(root)
    return root


CHILD = """
import sys, time
sys.path.insert(0, {repo!r})

def peak():  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

from shards import reader
imported = peak()
start = time.perf_counter()
t = reader.open_tree({url!r})
opened = time.perf_counter() - start
w = t.sampler(1024, seed=0).window(0)
doc = t.document(t.documents.id(len(t) // 2))
total = time.perf_counter() - start
print(opened, total, peak(), imported, type(t.documents).__name__)
"""


def measure(url: str, repeats: int) -> tuple[float, float, int, int, str]:
    best = None
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO), url=url)], check=True,
                             capture_output=True, text=True).stdout.split()
        row = (float(out[0]), float(out[1]), int(out[2]), int(out[3]), out[4])
        best = row if best is None or row[1] < best[1] else best
    return best


def without_index(root: Path) -> None:
    record = json.loads((root / tree.RECORD_NAME).read_text())
    record["derived"] = []
    (root / tree.RECORD_NAME).write_text(json.dumps(record))


def with_index(root: Path) -> None:
    record = json.loads((root / tree.RECORD_NAME).read_text())
    record["derived"] = [reader_index.INDEX_NAME]
    (root / tree.RECORD_NAME).write_text(json.dumps(record))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "pretokenize-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-manifest", action="store_true", help="only the rows with the index")
    args = parser.parse_args(argv)
    print("| documents | opened by | open_tree (s) | + window 0 and a lookup (s) | peak RSS (MiB) |")
    print("|---:|---|---:|---:|---:|")
    for n in args.documents:
        t0 = time.perf_counter()
        root = build_tree(Path(args.cache) / f"open-{n}", n)
        print(f"<!-- built in {time.perf_counter() - t0:.0f} s -->", file=sys.stderr)
        modes = [("index", with_index)] + ([] if args.skip_manifest else [("manifest", without_index)])
        for name, prepare in modes:
            prepare(root)
            opened, total, rss, imported, kind = measure(str(root), args.repeats)
            print(f"| {n:,} | {name} ({kind}) | {opened:.3f} | {total:.3f} | {rss / 2**20:.0f} "
                  f"({imported / 2**20:.0f} after imports) |", flush=True)
        with_index(root)
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
