"""Profile the bucketed job on the benchmark corpus with py-spy and print where its time goes.

    python tests/bench/profile_job.py [--workers 2] [--corpus x4] [--cache DIR] [--target-mb 160]
    python tests/bench/profile_job.py --corpus scale [--documents 2000000]   # short documents
    python tests/bench/profile_job.py --summarize RAW        # the summary of samples taken before

py-spy samples every thread of the job (and, with --workers 2, of its worker processes) 200 times a
second. Samples of threads that only wait (a lock, an event, a sleeping thread's loop, the progress
and lock-heartbeat threads) are left out, so the shares are of time spent working. Three lists: the
stages of the job (STAGES: the run's fixed cost, then each step of the steady state, with each
steady stage's share of the steady state), the functions the samples were in (self), and the
functions of this project, tiktoken and pyarrow the samples were under (inclusive). The raw
samples stay in the cache directory, for flamegraph.pl or speedscope. ``--corpus x4`` (the base
files and the 3x corpus's, as speed_bench.py runs them) makes the steady state most of the run;
``--corpus scale`` runs the short documents of scale_corpus.py, where the cost per document shows
(the write and publish stages, issue 38).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import corpus as corpus_mod  # noqa: E402
from run_bench import JOB, TWO_WORKERS  # noqa: E402

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")
WAITING = re.compile(r"^(Condition\.wait|Event\.wait|Thread\.run|_worker|select|poll|sleep|Queue\.get)\b")
# Threads that only sleep between small chores (py-spy shows them in their own frame, not in sleep).
IDLE_THREADS = ("share_changed", "JobDisplay._loop", "Lock._beat")
# (stage, a regex a sample's stack must match), first match wins. The fixed stages come first: a
# frame of theirs anywhere in the stack puts the sample there.
FIXED = "fixed: "
STAGES = [
    (FIXED + "imports", r"_find_and_load"),
    (FIXED + "tokenizer load and probe", r"TokenizerConfig\.load|load_encoder"),
    (FIXED + "flags, pipeline build", r"parse_settings|built \("),
    ("read (parquet, Arrow)", r"ReadUnitFn"),
    ("tokenizer call (quicktok/tiktoken)", r"encode_flat \([^;]*$|encode_one \([^;]*$"),
    ("NFC", r"<locals>\.prepare \(|encode_text \([^;]*$"),  # not BucketedFormat.prepare (publish)
    ("text to Python strings", r"DocBatch\.column"),
    ("filter (LID, removals)", r"filter\.py|removal\.py|DocBatch\.filter"),
    ("EOS, token batches", r"encode_batch \(transforms/bucketed|join_with_eos"),
    ("group keys (id hashes)", r"shard_group_keys|bucketed_keys"),
    ("spill write", r"SpillTokensFn"),
    ("shard write and sha256", r"AtomicFile\.write \([^;]*$"),
    ("gather from spill files", r"SpillReader|gather_ranges"),
    ("references, plan", r"load_refs|decode_refs|plan_partition|Refs\.concat"),
    ("reader index parts (writers)", r"encode_part"),
    ("reader index at publish", r"write_index|build_from_manifest|_spool_rows|_spool_parts|column_problem"),
    ("publish, manifest, stats", r"publish\.py|PublishOutput|manifest|index\.py"),
    ("the runner (Beam), rest", r"."),
]
OURS = re.compile(r"(transforms|pipelines|shards)/|tiktoken|pyarrow|unicodedata")


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file").split("site-packages/")[-1]
    path = re.sub(r"^.*?/(transforms|pipelines|shards|tests)/", r"\1/", path)
    return f"{m.group('func')} ({path})"


def idle_thread(frame: str) -> bool:
    """Whether ``frame`` (short()'s form) is the loop of an IDLE_THREADS thread, however nested
    its function is (``_start_sharing.<locals>.share_changed``)."""
    func = frame.split(" (", 1)[0]
    return any(func == name or func.endswith(f".{name}") for name in IDLE_THREADS)


def stage_of(frames: list[str]) -> str:
    stack = ";".join(frames)
    return next(name for name, pattern in STAGE_RES if pattern.search(stack))


STAGE_RES = [(name, re.compile(pattern)) for name, pattern in STAGES]


def summarize(raw: Path, top: int) -> str:
    self_time: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    stages: collections.Counter = collections.Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [short(f) for f in stack.split(";")]
        if WAITING.match(frames[-1]) or any(idle_thread(f) for f in frames):
            idle += n
            continue
        total += n
        stages[stage_of(frames)] += n
        self_time[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    steady = sum(n for name, n in stages.items() if not name.startswith(FIXED)) or 1
    lines = [f"{total:,} working samples ({idle:,} waiting samples left out)", "",
             "stages (share of all working samples; of the steady state):"]
    for name, _ in STAGES:
        n = stages.get(name, 0)
        of_steady = "" if name.startswith(FIXED) else f"  {n / steady:6.1%}"
        lines.append(f"  {n / max(total, 1):6.1%}{of_steady}  {name}")
    lines += ["", "self:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in self_time.most_common(top)]
    lines += ["", "inclusive (this project, tiktoken, pyarrow):"]
    ours = [(name, n) for name, n in inclusive.most_common() if OURS.search(name)]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in ours[:top]]
    return "\n".join(lines)


def corpus_of(args) -> Path:
    """The directory of the corpus ``args`` name, built once in the cache."""
    if args.corpus == "scale":
        import scale_corpus

        return scale_corpus.ensure(args.cache, args.documents)[0]
    corpus_dir, _ = corpus_mod.ensure(args.cache, args.target_mb)
    if args.corpus == "x4":
        from speed_bench import four_times

        return four_times(corpus_dir)
    return corpus_dir / "base"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench")
    p.add_argument("--target-mb", type=float, default=160.0)
    p.add_argument("--workers", type=int, choices=(1, 2), default=1)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--corpus", choices=("base", "x4", "scale"), default="base")
    p.add_argument("--documents", type=int, default=2_000_000, help="with --corpus scale: its documents")
    p.add_argument("--summarize", type=Path, help="only summarize these raw samples (an earlier run's)")
    args = p.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize, args.top))
        return 0
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    corpus_dir = corpus_of(args)
    output = args.cache / "runs" / "profile"
    shutil.rmtree(output, ignore_errors=True)
    raw = args.cache / f"profile-{args.workers}w-{args.corpus}.txt"
    extra = TWO_WORKERS if args.workers == 2 else []
    cmd = [py_spy, "record", "--rate", "200", "--format", "raw", "--output", str(raw)]
    cmd += ["--subprocesses"] if args.workers == 2 else []
    cmd += ["--", *JOB, "--input", str(corpus_dir), "--output", str(output), "--runner=FnApiRunner", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(output, ignore_errors=True)
    print(summarize(raw, args.top))
    print(f"\nraw samples: {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
