"""Run a command and watch its process tree: wall time, CPU seconds and peak RSS of every process.

psutil samples the tree every ``interval`` seconds, so a process that lives shorter than that, or
a peak shorter than that, can be missed. The tree's total CPU seconds are exact (the rusage of the
reaped processes); each process's own CPU seconds are its last sampled reading. The
machine's CPU time spent outside the tree is recorded too: this machine may be shared, and a busy
neighbour slows the wall clock of every row.

With a ``timeout``, a command still running after that many seconds is killed with its whole tree
(every process below it, then itself) and the usage says so (``timed_out``); the CPU
seconds of processes killed that way are their last sampled readings.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import subprocess
import threading
import time

import psutil


@dataclasses.dataclass
class ProcessUsage:
    pid: int
    role: str
    name: str = ""  # the executable's name (python3, sh, prism, ...)
    peak_rss: int = 0
    peak_at: float = 0.0  # seconds after the start when peak_rss was sampled
    cpu_seconds: float = 0.0
    samples: int = 0  # how many samples saw it alive


@dataclasses.dataclass
class RunUsage:
    returncode: int
    wall_seconds: float
    processes: list[ProcessUsage]
    cpu_seconds: float  # the whole tree, exact (rusage of the reaped processes)
    other_cpu_seconds: float  # CPU time the machine spent on processes outside the tree
    steal_seconds: float  # CPU time the hypervisor gave other guests while this guest wanted it
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def sampled_cpu_seconds(self) -> float:
        """The sum of every process's last sampled CPU seconds: a lower bound that also counts
        processes this one did not reap (a grandchild orphaned by its parent, a killed tree)."""
        return sum(p.cpu_seconds for p in self.processes)

    @property
    def other_load(self) -> float:
        """Average cores busy outside the tree while it ran."""
        return self.other_cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def steal_load(self) -> float:
        """Average cores taken by the hypervisor while it ran."""
        return self.steal_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def peak(self, role: str) -> int:
        return max((p.peak_rss for p in self.processes if p.role == role), default=0)


def _role(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "main"
    try:
        if proc.name() in ("sh", "dash", "bash"):
            return "shell"  # Beam starts each SDK worker through /bin/sh -c
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    if "sdk_worker_main" in cmdline or "worker_pool_main" in cmdline:
        return "worker"
    return "child"


def machine_cpu() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def machine_steal() -> float:
    return getattr(psutil.cpu_times(), "steal", 0.0)


def _kill_tree(root: psutil.Process) -> None:
    """SIGKILL every process below ``root`` (by the psutil handle, which checks that the pid was
    not reused), then ``root``."""
    try:
        tree = root.children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
    try:
        root.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass


def run(cmd: list[str], env: dict | None = None, interval: float = 0.1, cwd: str | None = None,
        timeout: float | None = None) -> RunUsage:
    """Run ``cmd`` to completion (or until ``timeout`` seconds) while sampling its process tree."""
    usage: dict[int, ProcessUsage] = {}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    children_start = children.ru_utime + children.ru_stime
    machine_start, steal_start = machine_cpu(), machine_steal()
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env={**os.environ, **(env or {})}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out: dict[str, str] = {}

    def drain(name, stream):
        out[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    root = psutil.Process(proc.pid)
    timed_out = False
    while proc.poll() is None:
        if timeout is not None and time.perf_counter() - start > timeout:
            timed_out = True
            _kill_tree(root)
            proc.wait()
            break
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                with p.oneshot():
                    rss = p.memory_info().rss
                    times = p.cpu_times()
                    if p.pid not in usage:
                        usage[p.pid] = ProcessUsage(p.pid, _role(p, proc.pid), p.name())
                    u = usage[p.pid]
                    if rss > u.peak_rss:
                        u.peak_rss, u.peak_at = rss, time.perf_counter() - start
                    u.samples += 1
                    u.cpu_seconds = max(u.cpu_seconds, times.user + times.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(interval)
    wall = time.perf_counter() - start
    for t in readers:
        t.join()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree_cpu = children.ru_utime + children.ru_stime - children_start
    machine = machine_cpu() - machine_start
    steal = machine_steal() - steal_start
    processes = sorted(usage.values(), key=lambda u: (u.role != "main", u.pid))
    other = max(0.0, machine - max(tree_cpu, sum(u.cpu_seconds for u in processes)))
    return RunUsage(proc.returncode, wall, processes, tree_cpu, other, steal, out.get("out", ""), out.get("err", ""),
                    timed_out)
