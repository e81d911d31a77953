"""Wall time and peak memory of a job on a local cluster (deploy/flink/cluster.py,
deploy/spark/cluster.py), for BENCHMARKS.md's "Engines: clusters" rows:

    .venv/bin/python tests/engines/cluster_bench.py flink [--job bucketed] [--runs 2] [--input FILE]

starts the cluster, runs the job ``--runs`` times (each into a new output), samples the resident
memory of every cluster process (and of what each started: executors, SDK workers) and of the
submitting command every 0.5 s, stops the cluster, and prints one markdown row: best and all walls,
the load average before and after, and each process's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

# The checkout first (tests/ has folders named as its packages), then tests/engines and tests/, as pytest has them.
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE), str(HERE.parent)]
from cluster_setup import Cluster, job_command, run  # noqa: E402
from conftest import GPT2_RANKS  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Peaks:
    """Peak RSS by role: each cluster process, the largest single process it started (an
    executor, an SDK worker), and the submitting command."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.peaks: dict[str, float] = {}
        self.client: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _note(self, role: str, mb: float) -> None:
        self.peaks[role] = max(self.peaks.get(role, 0.0), mb)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for name, (pid, *children) in self.cluster.family().items():
                self._note(name, rss_mb(pid))
                if children:
                    self._note(f"{name}: largest child", max(rss_mb(child) for child in children))
                    self._note(f"{name}: children together", sum(rss_mb(child) for child in children))
            if self.client:
                self._note("submitting command", rss_mb(self.client))
            time.sleep(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=["flink", "spark"])
    parser.add_argument("--job", default="bucketed", choices=["bucketed", "scaffold"])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix=f"{args.engine}-cluster-bench-"))
    cluster = Cluster(args.engine, work / "state")
    load_before = os.getloadavg()
    start = time.monotonic()
    cluster.start()
    started = time.monotonic() - start
    walls = []
    try:
        with Peaks(cluster) as peaks:
            for n in range(args.runs):
                out = work / f"out-{n}"
                begin = time.monotonic()
                job = run(job_command(args.job, cluster.flags, out, f"tiktoken:{GPT2_RANKS}"), work / f"job-{n}.log")
                peaks.client = job.pid
                if job.wait() != 0:
                    print(f"run {n} failed: see {work / f'job-{n}.log'}", file=sys.stderr)
                    return 1
                walls.append(time.monotonic() - begin)
    finally:
        cluster.stop()
    load_after = os.getloadavg()
    memory = ", ".join(f"{role} {mb:.0f}" for role, mb in sorted(peaks.peaks.items()))
    print(f"| {args.engine} cluster | {args.job} | {min(walls):.1f} | {' / '.join(f'{w:.1f}' for w in walls)} "
          f"| {started:.1f} | {load_before[0]:.1f} → {load_after[0]:.1f} | {memory} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
