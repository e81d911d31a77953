"""The bucketed job on each engine, run as a user runs it (the CLI, with `make engines` done): the
in-process FnApiRunner, embedded Flink (parallelism 1 and 2), the Flink session cluster of
deploy/flink/cluster.py, Spark local[2] and the Spark standalone cluster of deploy/spark/cluster.py;
on the bundled sample and on the x4 bench corpus (tests/bench/corpus.py's base and x3 files,
speed_bench.four_times). Wall time and the peak RSS of each process (the Python launcher, which
also runs the LOOPBACK SDK harness of the embedded engines; the job server's JVM; on a cluster
every cluster process, the SDK workers and executors they started, and the submitting command),
best of N by wall time, with the load average at the start and end of that run. Every run's tree
is checked against the FnApiRunner's for the same input (sha256 of every file). Prints the rows of
BENCHMARKS.md's "Engines" table.

    .venv/bin/python tests/bench/engine_bench.py [--repeat 2] [--corpus sample,x4] [--only Spark] [--out DIR]

The engines run one at a time, each cluster started before its runs and stopped after them (its
start is not in the walls). The FnApiRunner row always runs first: it gives the reference trees.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "tests" / "engines")]
import cluster_bench  # noqa: E402 - tests/engines/cluster_bench.py: a cluster's processes, sampled
import corpus as corpus_mod  # noqa: E402
import monitor  # noqa: E402
from conftest import tree_hashes  # noqa: E402
from speed_bench import four_times  # noqa: E402

SAMPLE = REPO / "tests" / "data" / "finepdfs_sample.parquet"
BENCH_CACHE = Path.home() / ".cache" / "beam-pretokenize" / "bench"
TIMEOUT = 1800  # seconds a run may take before it is killed and the bench stops


@dataclasses.dataclass(frozen=True)
class Config:
    """A row: the runner flags, or the local cluster (`flink`, `spark`) whose printed flags to use."""

    name: str
    flags: tuple[str, ...] = ()
    cluster: str | None = None


CONFIGS = [
    Config("FnApiRunner, in process", ("--runner=FnApiRunner",)),
    Config("embedded Flink 1.19, parallelism 1", ("--runner=FlinkRunner", "--parallelism=1")),
    Config("embedded Flink 1.19, parallelism 2", ("--runner=FlinkRunner", "--parallelism=2")),
    Config("Flink 1.19 cluster (JobManager, 2 TaskManagers), parallelism 2", cluster="flink"),
    Config("Spark 3.5 local[2]", ("--runner=SparkRunner",)),
    Config("Spark 3.5 cluster (master, 2 workers)", cluster="spark"),
]


@dataclasses.dataclass
class Result:
    usage: monitor.RunUsage
    load: tuple[float, float]
    cluster_peaks: dict[str, float]
    same_tree: str


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def inputs(names: list[str]) -> dict[str, Path]:
    """The inputs by name: the bundled sample, and the x4 corpus (built once into the bench cache)."""
    found = {}
    for name in names:
        if name == "sample":
            found[name] = SAMPLE
        elif name == "x4":
            corpus_dir, _ = corpus_mod.ensure(BENCH_CACHE, 160.0)  # run_bench.py's default corpus
            found[name] = four_times(corpus_dir)
        else:
            raise SystemExit(f"--corpus: unknown input {name!r} (sample, x4)")
    return found


def one_run(flags: list[str], source: Path, out: Path) -> monitor.RunUsage:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(source), "--output", str(out), *flags]
    usage = monitor.run(cmd, interval=0.2, cwd=str(REPO), timeout=TIMEOUT)
    if usage.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({usage.returncode}):\n{usage.stderr[-3000:]}")
    return usage


def compare(out: Path, reference: dict[str, str] | None) -> tuple[dict[str, str], str]:
    """The tree's hashes, and what they say against the FnApiRunner's (None: this is the reference)."""
    got = tree_hashes(out)
    if reference is None:
        return got, f"reference ({len(got)} files)"
    differing = sorted(rel for rel in set(got) | set(reference) if got.get(rel) != reference.get(rel))
    return got, f"identical ({len(got)} files)" if not differing else f"DIFFERENT: {differing[:5]}"


def best_of(flags: list[str], source: Path, out: Path, repeat: int, reference: dict[str, str] | None,
            cluster) -> tuple[Result, dict[str, str]]:
    """``repeat`` runs; the fastest, and the tree's hashes. A cluster's processes are sampled alongside."""
    best, hashes = None, {}
    for _ in range(repeat):
        start = os.getloadavg()[0]
        if cluster is None:
            usage, peaks = one_run(flags, source, out), {}
        else:
            with cluster_bench.Peaks(cluster) as sampled:
                usage = one_run(flags, source, out)
            peaks = {role: mb * 2**20 for role, mb in sampled.peaks.items()}
        hashes, verdict = compare(out, reference)
        result = Result(usage, (start, os.getloadavg()[0]), peaks, verdict)
        if best is None or usage.wall_seconds < best.usage.wall_seconds:
            best = result
    return best, hashes


def memory(result: Result) -> str:
    """Each process's peak RSS in MiB: the command's tree by role, then each cluster process."""
    usage = result.usage
    parts = [f"launcher {mib(usage.peak('main'))}"]
    java = [p.peak_rss for p in usage.processes if p.name == "java"]
    if java:
        parts.append(f"job-server JVM {mib(max(java))}")
    workers = [p.peak_rss for p in usage.processes if p.role == "worker"]
    if workers:
        parts.append(f"SDK workers {' / '.join(mib(w) for w in sorted(workers, reverse=True))}")
    parts += [f"{role} {mib(rss)}" for role, rss in sorted(result.cluster_peaks.items())]
    return ", ".join(parts)


def row(name: str, corpus: str, result: Result) -> str:
    load = result.load
    return (f"| {name} | {corpus} | {result.usage.wall_seconds:.1f} | {memory(result)} | "
            f"{load[0]:.1f} / {load[1]:.1f} | {result.same_tree} |")


def run_config(config: Config, sources: dict[str, Path], out: Path, repeat: int,
               references: dict[str, dict[str, str]]) -> None:
    """Every input on one engine (a cluster started first, stopped after), a row printed per input."""
    cluster = None
    if config.cluster:
        cluster = cluster_bench.Cluster(config.cluster, out / f"{config.cluster}-cluster-state")
        cluster.start()
    try:
        flags = list(config.flags) + (cluster.flags if cluster else [])
        for corpus, source in sources.items():
            result, hashes = best_of(flags, source, out / "tree", repeat, references.get(corpus), cluster)
            references.setdefault(corpus, hashes)
            print(row(config.name, corpus, result), flush=True)
    finally:
        if cluster:
            cluster.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--corpus", default="sample,x4", help="comma-separated: sample, x4")
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default="", help="run only the rows whose name contains this (and FnApiRunner)")
    args = parser.parse_args(argv)
    sources = inputs(args.corpus.split(","))
    out = Path(args.out or tempfile.mkdtemp(prefix="engine-bench-"))
    print("| run | input | wall s (best) | peak RSS of each process, MiB | load average at start / end | tree |")
    print("|---|---|---:|---|---:|---|")
    references: dict[str, dict[str, str]] = {}
    for config in CONFIGS:
        if config is CONFIGS[0] or args.only in config.name:
            run_config(config, sources, out, args.repeat, references)
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
