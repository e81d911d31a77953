"""What the bucketed and scaffold crash tests share: a watcher over a tree while a job runs, a
SIGKILL at a chosen moment, and an output filesystem that fails on write."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from fsspec.implementations.memory import MemoryFileSystem


class TreeWatcher(threading.Thread):
    """Polls an output tree while a job runs, calling ``check`` every 5 ms; ``check`` appends to
    ``violations`` each moment the tree looked complete but was not."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root = root
        self.violations: list[str] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.check()
            time.sleep(0.005)

    def check(self):
        raise NotImplementedError


def kill_when(proc: subprocess.Popen, condition, timeout: float = 120.0) -> bool:
    """SIGKILL the job's process group as soon as ``condition()`` holds; False if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if condition():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the job neither reached the kill point nor ended")


def has_files(root, part: str) -> bool:
    """Whether a directory whose path contains ``part`` holds a shard or spill file (or a part of one)."""
    for dirpath, _, files in os.walk(root):
        if part in dirpath and any(".bin" in f or ".npy" in f for f in files):
            return True
    return False


class FaultyFileSystem(MemoryFileSystem):
    """An in-memory filesystem whose writes fail once more than ``FAIL_AFTER`` files have been
    opened for writing under a path containing ``FAIL_UNDER``. Register it under a protocol of the
    test's own."""

    FAIL_UNDER = "/staged/"
    FAIL_AFTER = 3
    opened = 0

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode and self.FAIL_UNDER in path:
            FaultyFileSystem.opened += 1
            if FaultyFileSystem.opened > self.FAIL_AFTER:
                raise OSError(f"injected storage failure writing {path}")
        return super()._open(path, mode, **kwargs)
