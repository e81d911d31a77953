"""Progress a person can follow: each worker logs what it has done every few seconds.

Beam counters reach Dataflow's UI, but a local runner shows them only at the end; a log line
every ``interval`` seconds per worker and step shows a long local run moving.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("pretokenize.progress")


def _fmt(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


class Progress:
    """Running totals for one step in one worker process, logged at most every ``interval`` s."""

    def __init__(self, step: str, interval: float = 10.0):
        self.step = step
        self.interval = interval
        self.totals: dict[str, int] = {}
        self._start = time.monotonic()
        self._last = self._start

    def add(self, **counts: int) -> None:
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + v
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.report(now)

    def report(self, now: float | None = None) -> None:
        elapsed = max((now or time.monotonic()) - self._start, 1e-9)
        parts = [f"{k} {_fmt(v)} ({_fmt(v / elapsed)}/s)" for k, v in self.totals.items()]
        log.info("[%s pid %d] %s", self.step, os.getpid(), ", ".join(parts))
