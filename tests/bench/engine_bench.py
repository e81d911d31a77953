"""The bundled sample's bucketed job on the in-process FnApiRunner, embedded Flink (parallelism 1
and 2) and Spark local[2], run as a user runs it (the CLI, with `make engines` done): wall time
and the peak RSS of each process (the Python launcher and the job server's JVM), best of N by
wall time, with the machine's load average. Prints the rows of BENCHMARKS.md's "Engines" table.

    .venv/bin/python tests/bench/engine_bench.py [--repeat 2] [--out DIR] [--only Spark]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import monitor

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "data" / "finepdfs_sample.parquet"
CONFIGS = {
    "FnApiRunner, in process": ["--runner=FnApiRunner"],
    "embedded Flink 1.19, parallelism 1": ["--runner=FlinkRunner", "--parallelism=1"],
    "embedded Flink 1.19, parallelism 2": ["--runner=FlinkRunner", "--parallelism=2"],
    "Spark 3.5 local[2]": ["--runner=SparkRunner"],
}


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def one_run(flags: list[str], out: Path) -> monitor.RunUsage:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(SAMPLE), "--output", str(out), *flags]
    usage = monitor.run(cmd, interval=0.2, cwd=str(REPO))
    if usage.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{usage.stderr[-3000:]}")
    return usage


def row(name: str, usage: monitor.RunUsage, load: tuple[float, float]) -> str:
    python = max((p.peak_rss for p in usage.processes if p.name.startswith("python")), default=0)
    java = max((p.peak_rss for p in usage.processes if p.name == "java"), default=0)
    return (f"| {name} | {usage.wall_seconds:.1f} | {mib(python)} | {mib(java) if java else '-'} | "
            f"{load[0]:.1f} / {load[1]:.1f} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default="", help="run only the rows whose name contains this")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="engine-bench-"))
    print("| run | wall s (best) | peak RSS, Python | peak RSS, job-server JVM | load average at start / end |")
    print("|---|---:|---:|---:|---:|")
    for name, flags in CONFIGS.items():
        if args.only not in name:
            continue
        best = None
        for _ in range(args.repeat):
            start = os.getloadavg()[0]
            usage = one_run(flags, out / "tree")
            load = (start, os.getloadavg()[0])
            if best is None or usage.wall_seconds < best[0].wall_seconds:
                best = (usage, load)
        print(row(name, *best), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
