"""Profile the bucketed job on the benchmark corpus with py-spy and print where its time goes.

    python tests/bench/profile_job.py [--workers 2] [--cache DIR] [--target-mb 160]

py-spy samples every thread of the job (and, with --workers 2, of its worker processes) 200 times a
second. Samples of threads that only wait (a lock, an event, a sleeping thread's loop) are left out,
so the shares are of time spent working. Two lists: the functions the samples were in (self), and
the functions of this project, tiktoken and pyarrow the samples were under (inclusive). The raw
samples stay in the cache directory, for flamegraph.pl or speedscope.
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
OURS = re.compile(r"(transforms|pipelines|shards)/|tiktoken|pyarrow|unicodedata")


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file").split("site-packages/")[-1]
    path = re.sub(r"^.*?/(transforms|pipelines|shards|tests)/", r"\1/", path)
    return f"{m.group('func')} ({path})"


def summarize(raw: Path, top: int) -> str:
    self_time: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = idle = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [short(f) for f in stack.split(";")]
        if WAITING.match(frames[-1]):
            idle += n
            continue
        total += n
        self_time[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    lines = [f"{total:,} working samples ({idle:,} waiting samples left out)", "", "self:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in self_time.most_common(top)]
    lines += ["", "inclusive (this project, tiktoken, pyarrow):"]
    ours = [(name, n) for name, n in inclusive.most_common() if OURS.search(name)]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in ours[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "beam-pretokenize" / "bench")
    p.add_argument("--target-mb", type=float, default=160.0)
    p.add_argument("--workers", type=int, choices=(1, 2), default=1)
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    corpus_dir, _ = corpus_mod.ensure(args.cache, args.target_mb)
    output = args.cache / "runs" / "profile"
    shutil.rmtree(output, ignore_errors=True)
    raw = args.cache / f"profile-{args.workers}w.txt"
    extra = TWO_WORKERS if args.workers == 2 else []
    cmd = [py_spy, "record", "--rate", "200", "--format", "raw", "--output", str(raw)]
    cmd += ["--subprocesses"] if args.workers == 2 else []
    cmd += ["--", *JOB, "--input", str(corpus_dir / "base"), "--output", str(output), "--runner=FnApiRunner", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(output, ignore_errors=True)
    print(summarize(raw, args.top))
    print(f"\nraw samples: {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
