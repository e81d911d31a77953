"""train-bpe against Hugging Face tokenizers' BpeTrainer on the bench corpus; prints BENCHMARKS.md rows.

    .venv/bin/python tests/bench/bpe_bench.py [--cache ~/.cache/beam-pretokenize/bench] [--vocab-size 32000]

The corpus is tests/bench/corpus.py's (built once, cached); the text is what the jobs keep of it
(confident English, the bucketed job's filter). Every run is a child process, one after another,
so the ratios come from one sitting of the machine:

    count       train-bpe --merges 0 on the FnApiRunner with one worker process, with two worker processes
                (--direct_running_mode=multi_processing --direct_num_workers=1 and 2), and with one worker
                in the launcher's process (the FnApiRunner's default), one after the other, --repeats
                times; the best pipeline wall time of each (the launch, planning the input and claiming
                the output, is shown apart). A worker process starts, importing Beam, once the pipeline
                runs: its figures include that start, which the in-process worker does without
    merges      train-bpe --vocab-size N, one worker: its merge phase (the launcher's learner alone), wall
                and CPU seconds
    BpeTrainer  tokenizers' BpeTrainer, vocab_size N with the same pattern (Qwen2's split, byte level),
                the 256 bytes as its initial alphabet and <|endoftext|> as its special token (so the same
                N - 257 merges), trained from the same texts with RAYON_NUM_THREADS=1: its whole training

Then both tokenizers encode every kept text (ours through tiktoken from tokenizer.tiktoken, HF's through
its own tokenizer.json, special-token strings as text), for the characters per token of each.
Targets (issue 17): 2 worker processes count at least 1.7x faster than one; the merge phase within 3x of
BpeTrainer's whole training; characters per token within 1% of BpeTrainer's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "bench"))

HF_TRAIN = r"""
import json, sys, time
import pyarrow.parquet as pq
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
sys.path.insert(0, sys.argv[1])
from bpe_bench import kept_texts
from transforms.tokenizers.vocabularies import QWEN2_PATTERN
texts = kept_texts(sys.argv[2])
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
])
trainer = trainers.BpeTrainer(vocab_size=int(sys.argv[3]), special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
start, start_cpu = time.monotonic(), time.process_time()
tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
seconds, cpu = time.monotonic() - start, time.process_time() - start_cpu
tok.save(sys.argv[4])
print(json.dumps({"seconds": seconds, "cpu": cpu, "vocab": tok.get_vocab_size()}))
"""


def kept_texts(corpus_dir: str) -> list[str]:
    """The texts the jobs keep of the corpus (the bucketed job's language filter), in file order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shards import conditions
    from transforms.bucketed.filter import drop_masks
    from transforms.inputs.fields import ReadConfig

    conds = conditions.conditions({})
    texts: list[str] = []
    for path in sorted(Path(corpus_dir).glob("*.parquet")):
        table = pq.read_table(path, columns=["text", *(f.name for f in ReadConfig("").filter_fields())])
        for batch in table.to_batches():
            masks = drop_masks(batch.column, conds, batch.num_rows)
            dropped = sum(masks.values())
            texts += batch.filter(pa.array(~dropped.astype(bool))).column("text").to_pylist()
    return texts


def run(cmd: list[str], env: dict | None = None) -> tuple[str, float, float, float]:
    """The command's stdout, wall seconds, CPU seconds of its whole process tree (the rusage of the
    reaped children) and the machine's load average over the last minute when it ended."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout, seconds, cpu, os.getloadavg()[0]


# How the counting runs: worker processes (0: one worker in the launcher's process).
MODES = {"1 worker process": 1, "2 worker processes": 2, "1 worker in the launcher's process": 0}


def train_bpe(corpus: Path, out: Path, size_flags: list[str], workers: int) -> dict:
    cmd = [sys.executable, "-m", "pipelines.cli", "train-bpe", "--input", str(corpus), "--output", str(out),
           *size_flags, "--runner=FnApiRunner"]
    if workers:
        cmd += ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    stdout, wall, cpu, load = run(cmd, env)
    m = re.search(r"launch ([\d.]+) s, counting ([\d.]+) s, merges ([\d.]+) s \(([\d.]+) CPU s\)", stdout)
    return {"launch": float(m.group(1)), "count": float(m.group(2)), "merges": float(m.group(3)),
            "merges_cpu": float(m.group(4)), "wall": wall, "cpu": cpu, "load": load, "stdout": stdout}


def main() -> None:
    import corpus as corpus_mod

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench")
    p.add_argument("--target-mb", type=float, default=160)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=2, help="counting runs per worker count (the best is shown)")
    args = p.parse_args()
    corpus_dir, _ = corpus_mod.ensure(args.cache, args.target_mb)
    base = corpus_dir / "base"
    work = args.cache / "runs" / "bpe"
    work.mkdir(parents=True, exist_ok=True)
    ours_dir = work / f"ours-{args.vocab_size}"

    counts: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode, workers in MODES.items():
            counts[mode].append(train_bpe(base, work / f"count-{workers}w", ["--merges", "0"], workers))
            r = counts[mode][-1]
            print(f"count, {mode}: launch {r['launch']:.1f} s, pipeline {r['count']:.1f} s; the whole "
                  f"run {r['wall']:.1f} s wall, {r['cpu']:.1f} CPU s; load average {r['load']:.2f}", flush=True)
    best = {mode: min(runs, key=lambda r: r["count"]) for mode, runs in counts.items()}
    one = train_bpe(base, ours_dir, ["--vocab-size", str(args.vocab_size)], 0)
    print(one["stdout"], flush=True)
    hf_path = work / f"hf-{args.vocab_size}.json"
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    stdout, *_ = run([sys.executable, "-c", HF_TRAIN, str(REPO / "tests" / "bench"), str(base), str(args.vocab_size),
                     str(hf_path)], env)
    hf = json.loads(stdout.strip().splitlines()[-1])
    print(f"BpeTrainer: {hf['seconds']:.1f} s, vocab {hf['vocab']}", flush=True)

    from tokenizers import Tokenizer

    from transforms.tokenizers.load import load_encoder

    texts = kept_texts(str(base))
    chars = sum(len(t) for t in texts)
    ours = load_encoder(f"trained:{ours_dir}")
    ours_tokens = sum(len(ids) for ids in ours.encode_arrays(texts))
    theirs = Tokenizer.from_file(str(hf_path))
    theirs.encode_special_tokens = True
    theirs_tokens = sum(len(e.ids) for e in theirs.encode_batch_fast(texts, add_special_tokens=False))
    ours_cpt, theirs_cpt = chars / ours_tokens, chars / theirs_tokens
    stats = (ours_dir / "training_stats.txt").read_text()
    words = re.search(r"distinct words: (\d+)", stats).group(1)
    print()
    print(f"corpus: {len(texts):,} kept documents, {chars:,} characters, {int(words):,} distinct words (qwen2 pattern)")
    print("| row | figure |")
    print("|---|---|")
    c1, c2, c0 = (best[mode] for mode in MODES)
    for mode, c in best.items():
        print(f"| train-bpe counting (pipeline), {mode} | {c['count']:.1f} s (launch {c['launch']:.1f} s; the "
              f"whole run {c['wall']:.1f} s wall, {c['cpu']:.1f} CPU s of the process tree: "
              f"{c['cpu'] / c['wall']:.2f} cores busy; load average {c['load']:.2f}) |")
    print(f"| 2 worker processes against 1 (target at least 1.7x) | {c1['count'] / c2['count']:.2f}x; with the "
          f"launch {(c1['count'] + c1['launch']) / (c2['count'] + c2['launch']):.2f}x |")
    print(f"| 2 worker processes against 1 worker in the launcher's process | {c0['count'] / c2['count']:.2f}x |")
    print(f"| train-bpe merge phase, vocab {args.vocab_size:,} | {one['merges']:.1f} s wall, "
          f"{one['merges_cpu']:.1f} CPU s |")
    print(f"| BpeTrainer whole training, RAYON_NUM_THREADS=1 | {hf['seconds']:.1f} s wall, {hf['cpu']:.1f} CPU s "
          f"(merge phase / BpeTrainer: {one['merges'] / hf['seconds']:.2f}x wall, "
          f"{one['merges_cpu'] / hf['cpu']:.2f}x CPU; target at most 3x) |")
    print(f"| characters per token, train-bpe | {ours_cpt:.4f} ({ours_tokens:,} tokens) |")
    print(f"| characters per token, BpeTrainer | {theirs_cpt:.4f} ({theirs_tokens:,} tokens; ours/theirs "
          f"{ours_cpt / theirs_cpt:.4f}; target within 1%) |")


if __name__ == "__main__":
    main()
