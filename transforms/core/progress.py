"""Progress a person can follow: each worker logs what it has done every few seconds.

Beam counters reach Dataflow's UI, but a local runner shows them only at the end; a log line
every ``interval`` seconds per worker and step shows a long local run moving.

A step that knows how much work was planned at launch (the read step: the rows of every parquet
row group, or the number of input units when a JSONL file's rows are unknown) also logs the share
done and an ETA. On a local runner the workers are processes of one machine: each one writes its
totals to a file in a directory they share (``shared_dir``), and reads the others', so the share
is of the whole job, whatever the number of workers. The ETA assumes the rest goes at the rate so
far. ``PRETOKENIZE_PROGRESS_SECONDS`` sets the interval (default 10 s).

The whole job's display (pipelines/progress_display.py: bars in a terminal, a line per stage every
interval otherwise) is drawn by the launcher from the same files. While a local run goes,
``SHARED_ENV`` names the directory, so that every step's Progress in every worker (in the
launcher's process, or a worker process it started, which inherits its environment) shares its
totals there, every ``SHARE_SECONDS`` (from one thread) and when a unit of work ends (flush_all). ``stages.json``
there says which stages to draw: the job writes it when it is built (announce_stages).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import threading
import time
import weakref

log = logging.getLogger("pretokenize.progress")

INTERVAL_ENV = "PRETOKENIZE_PROGRESS_SECONDS"
# The directory a local run's workers share their totals in (set by the launcher while it runs).
SHARED_ENV = "PRETOKENIZE_PROGRESS_DIR"
SHARE_SECONDS = 0.2
STAGES_NAME = "stages.json"
# Every Progress of this process, for flush_all().
_LIVE: weakref.WeakSet = weakref.WeakSet()


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
        self.shared_dir = shared_dir or os.environ.get(SHARED_ENV) or None
        self.totals: dict[str, int] = {}
        self._wall_start = time.time()
        self._start = time.monotonic()
        self._last = self._start
        self._dirty = False
        self._lock = threading.Lock()
        _LIVE.add(self)

    def add(self, **counts: int) -> None:
        for k, v in counts.items():
            self.totals[k] = self.totals.get(k, 0) + v
        if self.shared_dir:
            self._dirty = True
            _start_sharing()
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.report(now)

    def flush(self) -> None:
        """Share the totals now (the launcher's display reads them)."""
        if self.shared_dir and self.totals:
            self._share()

    def _share(self, create: bool = False) -> None:
        """This worker's totals, to its file in the shared directory (replaced whole). The
        directory is created only by a step's own report (``create``): the sharing thread's late
        share, after the launcher has removed it at the end of the run, finds it gone and does nothing."""
        with self._lock, contextlib.suppress(OSError):  # progress is never worth failing a run over
            shared = self.shared_dir
            if not shared:
                return
            if create:
                os.makedirs(shared, exist_ok=True)
            self._dirty = False
            totals = dict(self.totals)  # a copy: the step may be adding to it in its own thread
            mine = sum(totals.get(k, 0) for k in self.planned.keys) if self.planned else 0
            if not os.path.isdir(shared):
                self.shared_dir = None  # the run is over: nothing to share any more
                return
            name = os.path.join(shared, f"{self.step}-{os.getpid()}-{id(self):x}.json")
            with open(name + ".tmp", "w") as f:
                json.dump({"start": self._wall_start, "done": mine, "totals": totals}, f)
            os.replace(name + ".tmp", name)

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
        self._share(create=True)
        try:
            done, start = 0, self._wall_start
            for figures in read_shared(self.shared_dir, self.step):
                done += int(figures["done"])
                start = min(start, float(figures["start"]))
        except (OSError, ValueError, KeyError, TypeError):  # never worth failing a run: this worker's own figures
            return mine, elapsed
        return done, max(time.time() - start, elapsed)


_SHARER: list = []


def _start_sharing() -> None:
    """One thread per process shares the totals that changed, every SHARE_SECONDS: the steps'
    own threads never wait on a file, and the last figures of a step are shared too."""
    if _SHARER:
        return

    def share_changed():
        while True:
            time.sleep(SHARE_SECONDS)
            for p in list(_LIVE):
                if p._dirty:
                    p.flush()

    thread = threading.Thread(target=share_changed, name="pretokenize-progress-share", daemon=True)
    _SHARER.append(thread)
    thread.start()


def flush_all() -> None:
    """Share the totals of every Progress of this process: a unit of work has ended, and the
    launcher's display should see all of it (transforms.run.resume calls it)."""
    for p in list(_LIVE):
        p.flush()


def read_shared(shared_dir: str, step: str) -> list[dict]:
    """The figures each worker's Progress of ``step`` last shared in ``shared_dir`` (a file being
    replaced, or half-written by a dying worker, is skipped)."""
    out = []
    for entry in os.listdir(shared_dir):
        if entry.startswith(f"{step}-") and entry.endswith(".json"):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(shared_dir, entry)) as f:
                    figures = json.load(f)
                if isinstance(figures, dict):
                    out.append(figures)
    return out


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage of the job's display: the sum of ``keys`` in the totals step ``step`` shares, out of
    ``total`` ``unit`` (planned at launch), or else out of the sum of ``total_keys`` in the totals
    step ``total_step`` shares (the write stage: the tokens the tokenize step has made so far).
    ``work_keys`` and ``work_total``: what the time the stage takes grows with, when it is not what
    the bar counts (the text bytes of the rows read: a large document takes longer than a row), for
    the ETA to the end of the job."""

    label: str
    step: str
    keys: tuple[str, ...]
    unit: str
    total: int | None = None
    total_step: str | None = None
    total_keys: tuple[str, ...] = ()
    work_keys: tuple[str, ...] = ()
    work_total: int | None = None


def announce_stages(shared_dir: str | None, stages: list[Stage]) -> None:
    """Tell the launcher's display which stages the job has (a no-op without a shared directory:
    a remote runner's UI shows its progress)."""
    if not shared_dir:
        return
    with contextlib.suppress(OSError):
        os.makedirs(shared_dir, exist_ok=True)
        with open(os.path.join(shared_dir, STAGES_NAME + ".tmp"), "w") as f:
            json.dump([dataclasses.asdict(s) for s in stages], f)
        os.replace(os.path.join(shared_dir, STAGES_NAME + ".tmp"), os.path.join(shared_dir, STAGES_NAME))


def announced_stages(shared_dir: str) -> list[Stage]:
    try:
        with open(os.path.join(shared_dir, STAGES_NAME)) as f:
            raw = json.load(f)
        return [Stage(**{**s, "keys": tuple(s["keys"]), "total_keys": tuple(s["total_keys"]),
                         "work_keys": tuple(s.get("work_keys", ()))}) for s in raw]
    except (OSError, ValueError, TypeError, KeyError):
        return []


# A local runner's worker processes (the FnApiRunner's multi_processing mode) send their log
# records to the launcher, which logs each one as the text of its protobuf from this logger.
WORKER_LOGGER = "apache_beam.runners.portability.local_job_service"
_WORKER_MESSAGE = re.compile(r'\bmessage: "((?:[^"\\]|\\.)*)"')
_WORKER_LOCATION = re.compile(r'\blog_location: "((?:[^"\\]|\\.)*)"')
_OUR_PACKAGES = ("/transforms/", "/pipelines/", "/shards/")
_HELD = {"progress": False}  # hold_worker_progress
# What each worker logs again of what the launcher has said once already: the tokenizer's probe
# (a worker whose tokenizer disagrees raises; its agreeing is not news).
_SAID_BY_THE_LAUNCHER = ("/transforms/tokenizers/load.py",)


def hold_worker_progress(hold: bool) -> None:
    """Hold back (or show again) the progress lines worker processes send: while the launcher
    draws bars (pipelines/progress_display.py), they would tear them."""
    _HELD["progress"] = hold


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
        if record.levelno <= logging.INFO and any(p in location.group(1) for p in _SAID_BY_THE_LAUNCHER):
            return False
        if _HELD["progress"] and "/transforms/core/progress.py" in location.group(1):
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
