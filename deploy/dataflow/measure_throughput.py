"""Measure the tokens per second per core that SIZING.md's arithmetic starts from.

    python deploy/dataflow/measure_throughput.py [--copies 20]

Two numbers, on the bundled sample repeated --copies times under fresh ids (so the job runs long
enough for its start-up to fade):

1. the whole bucketed job (read parquet, filter, tokenize, spill, group, write, publish) on the
   in-process FnApiRunner: one Python process, so its CPU seconds are core seconds;
2. the bare tokenizer the job loads, over the text of exactly the documents the job kept, in the
   job's batches: the ceiling for the job on the same core.

Run it on an otherwise idle machine; it prints both rates and the resident memory of the process.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import bucketed
from shards import layout, manifest
from transforms.bucketed.tokenize import TokenizerConfig

SAMPLE = Path(__file__).resolve().parents[2] / "tests" / "data" / "finepdfs_sample.parquet"


def make_corpus(directory: Path, copies: int) -> None:
    """The sample, ``copies`` times over, one parquet file per copy, ids made unique per copy."""
    table = pq.read_table(SAMPLE)
    ids = table.column("id").to_pylist()
    for k in range(copies):
        fresh = pa.array([f"{doc_id}#{k}" for doc_id in ids], type=pa.string())
        column = table.schema.get_field_index("id")
        pq.write_table(table.set_column(column, "id", fresh), directory / f"{k:03d}.parquet")


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "in"
        corpus.mkdir()
        make_corpus(corpus, args.copies)
        out = Path(tmp) / "out"
        stats, job_wall, job_cpu = timed(
            lambda: bucketed.run(["--input", str(corpus), "--output", str(out), "--runner=FnApiRunner"]))

        with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
            kept = {doc_id for _, doc_id, _ in manifest.read_rows(f)}
        texts = [
            text
            for part in sorted(corpus.glob("*.parquet"))
            for doc_id, text in zip(*pq.read_table(part, columns=["id", "text"]).to_pydict().values(), strict=True)
            if doc_id in kept
        ]
        encoder = TokenizerConfig(spec="jet-nemotron").load()

        def tokenize_all() -> int:
            return sum(len(ids) + 1 for i in range(0, len(texts), 64) for ids in encoder.encode_batch(texts[i:i + 64]))

        raw_tokens, raw_wall, raw_cpu = timed(tokenize_all)

    assert raw_tokens == stats.total_tokens, (raw_tokens, stats.total_tokens)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\ncorpus: the sample x {args.copies}: {stats.raw_documents:,} documents read, "
          f"{stats.kept_documents:,} kept, {stats.total_tokens:,} tokens, {len(''.join(texts)):,} characters kept")
    print(f"{'':22} {'wall s':>8} {'cpu s':>8} {'tokens/cpu-s':>13} {'tokens/wall-s':>14}")
    for name, wall, cpu in (("bucketed job (FnApi)", job_wall, job_cpu), ("bare tokenizer", raw_wall, raw_cpu)):
        print(f"{name:22} {wall:8.1f} {cpu:8.1f} {stats.total_tokens / cpu:13,.0f} {stats.total_tokens / wall:14,.0f}")
    print(f"job / bare tokenizer: {raw_cpu / job_cpu:.0%} of the tokenizer's rate; peak RSS {rss_mib:,.0f} MiB")


if __name__ == "__main__":
    main()
