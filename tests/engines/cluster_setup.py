"""The local Flink and Spark clusters of deploy/ for the cluster tests: whether `make engines` left
their jars, a cluster started for a test module and stopped after it, the jobs run on it as the CLI
runs them, and a watch on an output tree that counts its publishes.

A cluster whose jars are missing skips its tests quoting the reason, unless PRETOKENIZE_REQUIRE_ENGINES
names `cluster` or the engine (`flink`, `spark`), which turns the skip into a failure (engine_setup.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO
from engine_setup import required_engines

DEPLOY = REPO / "deploy"


def _load(path: Path, name: str):
    """A deploy/ script as a module (a file, not a package module; the two are both `cluster.py`)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPTS = {engine: DEPLOY / engine / "cluster.py" for engine in ("flink", "spark")}
CLUSTERS = {engine: _load(path, f"{engine}_cluster") for engine, path in SCRIPTS.items()}
localcluster = sys.modules["localcluster"]  # deploy/localcluster.py, which both scripts import


def cluster_flags_or_skip(engine: str) -> None:
    """Skip (or fail, when required) unless `make engines` left this engine's jars and java is here."""
    lib = CLUSTERS[engine].default_lib()
    problem = None
    if shutil.which("java") is None:
        problem = "no `java` on PATH"
    elif not lib.is_dir() or not any(lib.glob("*.jar")):
        problem = f"no jars at {lib}: `make engines` has not been run (or failed; see its log)"
    if problem:
        message = f"the local {engine} cluster (deploy/{engine}/cluster.py): {problem}"
        if required_engines() & {"cluster", engine}:
            pytest.fail(f"{message} (required by PRETOKENIZE_REQUIRE_ENGINES)")
        pytest.skip(message)


class Cluster:
    """A cluster started through its script's command line, as a user starts it."""

    def __init__(self, engine: str, state_dir: Path):
        self.engine = engine
        self.state = localcluster.State(state_dir)
        self.flags: list[str] = []

    def command(self, action: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPTS[self.engine]), action, "--state-dir", str(self.state.root)],
                              capture_output=True, text=True, timeout=600)

    def start(self) -> None:
        started = self.command("start")
        assert started.returncode == 0, f"{self.engine} cluster did not start: {started.stderr.strip()[-2000:]}"
        self.flags = started.stdout.split()

    def family(self) -> dict[str, list[int]]:
        """Each running process by name, with every process it started (executors, SDK workers)."""
        found = {}
        for name in self.state.names():
            pid = self.state.pid(name)
            if pid is not None:
                found[name] = [pid, *localcluster.descendants(pid)]
        return found

    def stop(self) -> None:
        """Stop it, and check that nothing it started is left running."""
        family = [pid for pids in self.family().values() for pid in pids]
        stopped = self.command("stop")
        assert stopped.returncode == 0, stopped.stderr
        left = [pid for pid in family if localcluster._alive(pid)]
        assert not left, f"the {self.engine} cluster's stop left processes running: {left}"


class SocketWatch:
    """Every listening socket of every process of ``cluster`` (and what each started: executors,
    SDK workers), sampled every 0.2 s while in the ``with`` block: Beam's servers in the
    TaskManagers and executors live only while a job runs. ``seen`` maps each process name to
    the (address, port) pairs it listened on."""

    def __init__(self, cluster: Cluster, seen: dict[str, set] | None = None):
        self.cluster = cluster
        self.seen = seen if seen is not None else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def sample(self) -> None:
        for name, pids in self.cluster.family().items():
            for n, pid in enumerate(pids):
                role = name if n == 0 else f"{name} (started by it, pid {pid})"
                self.seen.setdefault(role, set()).update(localcluster.listening_sockets(pid))

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def job_command(job: str, flags: list[str], output: Path, gpt2: str) -> list[str]:
    """The CLI command of ``job`` on the bundled sample (test_engines.py's settings) with ``flags``."""
    sample = str(REPO / "tests" / "data" / "finepdfs_sample.parquet")
    settings = {
        "bucketed": ["--input", sample, "--partitions", "4", "--max-shard-bytes", "120000"],
        "scaffold": ["--input", sample, "--annotate", "--long-docs", "chunk", "--tokenizer", gpt2,
                     "--shard-tokens", "50000", "--val-fraction", "0.1"],
    }[job]
    return [sys.executable, "-m", "pipelines.cli", job, *settings, "--output", str(output), *flags]


def run(command: list[str], log: Path) -> subprocess.Popen:
    """Start ``command`` (from the repository root), its output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))


class PublishWatch:
    """Watches an output tree's commit point (dataset_stats.txt, written last by every publish,
    atomically, so each publish gives it a new inode) and counts the publishes it saw: each new
    (inode, mtime) of the file is one, and so is the file going away once it was there (a
    second publish removes it before anything else). A poll every 20 ms: a publish redone after the
    first committed (a retried bundle, a restarted job) cannot slip between two polls, since the
    first one's stats file stays until the second publish starts, a job restart later.
    """

    def __init__(self, output: Path, interval: float = 0.02):
        self.stats = Path(output) / "dataset_stats.txt"
        self.interval = interval
        self.versions: list[tuple[int, int]] = []
        self.removals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._look()  # the state at the end, whatever the last poll saw

    def _look(self) -> None:
        try:
            st = self.stats.stat()
        except FileNotFoundError:
            if self.versions and self.versions[-1] != (0, 0):
                self.removals += 1
                self.versions.append((0, 0))
            return
        version = (st.st_ino, st.st_mtime_ns)
        if not self.versions or self.versions[-1] != version:
            self.versions.append(version)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._look()
            time.sleep(self.interval)

    @property
    def publishes(self) -> int:
        return len([v for v in self.versions if v != (0, 0)])

    def assert_published_once(self) -> None:
        assert self.publishes == 1 and self.removals == 0, (
            f"{self.stats.parent} was published {self.publishes} times (its stats file was written {self.publishes} "
            f"times and removed {self.removals} times after it first appeared): a job publishes exactly once")


def spill_written(output: Path) -> bool:
    """Whether the job has written a spill file yet (under the tree's temporary directory)."""
    temp = Path(output) / ".pretokenize-tmp"
    return any(path.is_file() for path in temp.glob("*/spill/**/*"))
