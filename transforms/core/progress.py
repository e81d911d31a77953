"""Progress a person can follow: each worker logs what it has done every few seconds.

Beam counters reach Dataflow's UI, but a local runner shows them only at the end; a log line
every ``interval`` seconds per worker and step shows a long local run moving.

A step that knows how much work was planned at launch (the read step: the rows of every parquet
row group, or the number of input units when a JSONL file's rows are unknown) also logs the share
done and an ETA. On a local runner the workers are processes of one machine: each one writes its
totals to a file in a directory they share (``shared_dir``), and reads the others', so the share
is of the whole job, whatever the number of workers. The ETA assumes the rest goes at the rate so
far. ``PRETOKENIZE_PROGRESS_SECONDS`` sets the interval (default 10 s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import time

log = logging.getLogger("pretokenize.progress")

INTERVAL_ENV = "PRETOKENIZE_PROGRESS_SECONDS"


def _fmt(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def format_duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``, ``2d04h``: what an ETA needs, no more."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


@dataclasses.dataclass(frozen=True)
class Planned:
    """The work a step will do, as known at launch: ``total`` of ``what``, and the totals whose
    sum says how much of it is done."""

    total: int
    what: str = "rows"
    keys: tuple[str, ...] = ("documents",)


def share_line(done: int, planned: Planned, elapsed: float) -> str:
    """``45.3% of 2.60M rows, ETA 1m12s``: the share of the planned work done and the time left at
    the rate so far (no ETA before anything is done)."""
    total = max(planned.total, 1)
    fraction = min(done / total, 1.0)
    eta = f"ETA {format_duration(elapsed * (total - min(done, total)) / done)}" if done else "ETA unknown"
    return f"{100.0 * fraction:.1f}% of {_fmt(planned.total)} {planned.what}, {eta}"


class Progress:
    """Running totals for one step in one worker process, logged at most every ``interval`` s."""

    def __init__(self, step: str, interval: float | None = None, planned: Planned | None = None,
                 shared_dir: str | None = None):
        self.step = step
        self.interval = float(os.environ.get(INTERVAL_ENV, 10.0)) if interval is None else interval
        self.planned = planned
        self.shared_dir = shared_dir
        self.totals: dict[str, int] = {}
        self._wall_start = time.time()
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
        line = ", ".join(parts)
        if self.planned is not None:
            done, since = self._job_done(elapsed)
            line += f"; {'all workers: ' if self.shared_dir else ''}{share_line(done, self.planned, since)}"
        log.info("[%s pid %d] %s", self.step, os.getpid(), line)

    def _job_done(self, elapsed: float) -> tuple[int, float]:
        """How much of the planned work is done, and for how long the step has run: this worker's
        figures, or, with a shared directory, those of every worker that has reported to it."""
        mine = sum(self.totals.get(k, 0) for k in self.planned.keys)
        if not self.shared_dir:
            return mine, elapsed
        try:
            os.makedirs(self.shared_dir, exist_ok=True)
            name = os.path.join(self.shared_dir, f"{self.step}-{os.getpid()}-{id(self):x}.json")
            with open(name + ".tmp", "w") as f:
                json.dump({"start": self._wall_start, "done": mine}, f)
            os.replace(name + ".tmp", name)
            done, start = 0, self._wall_start
            for entry in os.listdir(self.shared_dir):
                if entry.startswith(f"{self.step}-") and entry.endswith(".json"):
                    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                        with open(os.path.join(self.shared_dir, entry)) as f:
                            figures = json.load(f)
                        done += int(figures["done"])
                        start = min(start, float(figures["start"]))
        except OSError:  # progress is never worth failing a run over: this worker's own figures
            return mine, elapsed
        return done, max(time.time() - start, elapsed)


# A local runner's worker processes (the FnApiRunner's multi_processing mode) send their log
# records to the launcher, which logs each one as the text of its protobuf from this logger.
WORKER_LOGGER = "apache_beam.runners.portability.local_job_service"
_WORKER_MESSAGE = re.compile(r'\bmessage: "((?:[^"\\]|\\.)*)"')
_WORKER_LOCATION = re.compile(r'\blog_location: "((?:[^"\\]|\\.)*)"')
_OUR_PACKAGES = ("/transforms/", "/pipelines/", "/shards/")


class _WorkerRecords(logging.Filter):
    """Keeps a worker's records that this project's code logged, as their own plain message, and
    the launcher's own warnings; drops Beam's chatter from the workers."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("Worker: "):
            return record.levelno >= logging.WARNING
        message, location = _WORKER_MESSAGE.search(text), _WORKER_LOCATION.search(text)
        if message is None or location is None or not any(p in location.group(1) for p in _OUR_PACKAGES):
            return False
        raw = message.group(1)
        with contextlib.suppress(UnicodeError):  # protobuf's text format escapes bytes as \ooo
            raw = raw.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode("utf-8")
        record.msg, record.args, record.name = raw, (), "pretokenize.worker"
        return True


def show_worker_logs() -> None:
    """Let a local multi-process run show its workers' progress lines and warnings as an
    in-process run does."""
    logger = logging.getLogger(WORKER_LOGGER)
    if not any(isinstance(f, _WorkerRecords) for f in logger.filters):
        logger.addFilter(_WorkerRecords())
    logger.setLevel(logging.INFO)
