"""The job ETA before a local run's own figures say enough: from this user's previous runs.

With two worker processes the workers' first figures can arrive after half of a short run (issue
37: on the bench corpus the worker processes start, import Beam, load the tokenizer and read a first
batch for 4 s of a 10 s run on a quiet machine). Until then this run has no rate to go by. The
launcher knows the work planned (the first stage's text bytes, or its rows), and the last
``KEPT_RUNS`` runs of the same kind (the same stages, tokenizer and number of workers) say how long
each part took: the launch (from the command's start until it has planned the input and imported
Beam; the display comes up in between, once the input is planned), the start-up (from there to the
first figure), the first stage's work after its first figure, and the rest (the later stages and
the publish), the last two per unit of planned work. The median of each is the estimate (one run
slowed by a cold disk cache or a busy machine does not make it), marked ``~`` while this run has no
rate of its own.

The load of the machine changes between runs, so the estimate is scaled by how much slower this
run goes than the kept runs (``Prior.speed``): as much as its launch took longer (the command
planning its input and importing Beam, the same work every run), but at least as much as it is
already late for its first figure; then as much as its start-up took longer. Until the launch has
ended, the kept runs' times are the estimate as they are. (The launcher's build after the launch,
the tokenizer loaded and the output claimed, was tried as a sign and left out: on four runs of the
same work it took 1.0 to 2.0 s, in no relation to how fast each run went.) Once figures come, the
rate measured since the first counts more with every unit of work done, the kept runs' rate (so
scaled) weighing as ``PRIOR_WEIGHT`` of the planned work: a first figure or two, a batch each, say
little of a rate. On the bench corpus's two-worker runs with a load that changed between runs, this
put the ETA at half the run within 30% of the time left in 11 of 14 runs (replayed on traces), where
the last run's figures alone did in 6 (BENCHMARKS.md, "A terminal").

Kept in the user's cache directory ($PRETOKENIZE_PROGRESS_CACHE, else $XDG_CACHE_HOME or ~/.cache,
then beam-pretokenize/job-rates.json), never in an output tree; plain JSON numbers, read with json
and checked, never executed. A file that does not parse, or is no regular file of at most
MAX_BYTES, is ignored, then replaced; a run's figures that are not four numbers a run can have
are left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import statistics
import tempfile
import time

CACHE_ENV = "PRETOKENIZE_PROGRESS_CACHE"
FILE_NAME = "job-rates.json"
KEPT_KINDS = 64  # the kinds of run remembered, the latest kept
KEPT_RUNS = 5  # the runs of a kind whose median is the estimate
MAX_BYTES = 1 << 20  # a file read at most: KEPT_KINDS kinds of KEPT_RUNS runs take about 30 kB
# Figures beyond these are no run's (a hand-edited file): times the planned work, they could make
# an estimate no clock can show.
MAX_SECONDS = 86400.0  # to the display, and to the first figure
MAX_PER_WORK = 60.0  # seconds a byte or a row
# How much slower (or faster) this run may be taken to go than the kept runs, and how far the
# measured ratio is believed: a part of a few seconds is a noisy clock, so the ratio is shrunk
# toward 1 (its power SPEED_TRUST).
SPEED_LIMITS = (1 / 3, 3.0)
SPEED_TRUST = 0.75
# A launch's ratio to the kept runs' that says nothing: on a quiet machine five launches of the same
# command took 0.98 to 1.35 s with no relation to how fast each run went; under a load it was twice.
LAUNCH_NOISE = 1.3
# What the kept runs' rate weighs against this run's once its figures come, as a share of the
# planned work: this run's rate counts as much once it has done a quarter of the work.
PRIOR_WEIGHT = 0.25


@dataclasses.dataclass(frozen=True)
class Prior:
    """A run's parts: ``launch``, seconds from the command's start to the launch's end, its input
    planned and Beam imported (0: not known, a run from Python); ``startup``, seconds from there
    (from the display's start for a run with no launch) to the first stage's first figure; then in
    seconds per unit of the first stage's planned work, ``per_work`` for its work after that figure
    and ``tail`` for what came after the stage (the later stages, the publish)."""

    launch: float
    startup: float
    per_work: float
    tail: float

    def speed(self, launch: float | None, first: float | None, elapsed: float) -> float:
        """How many times slower this run goes than the kept runs: by its start-up once its first
        figure has come (``first``: seconds from the launch's end); before, by its launch (the
        command planning its input and importing Beam: ``launch`` seconds), but at least by how late
        it already is for its first figure. 1 when nothing says (a launch within LAUNCH_NOISE of
        theirs says nothing). Within SPEED_LIMITS; a measured ratio is shrunk toward 1 (SPEED_TRUST),
        the lower bound of being late is not."""
        if first is not None:
            return _trusted(first / self.startup) if self.startup > 0 else 1.0
        ratio = 1.0
        if launch is not None and self.launch > 0 and not 1 / LAUNCH_NOISE < launch / self.launch < LAUNCH_NOISE:
            ratio = _trusted(launch / self.launch)  # beyond what quiet runs' launches differ by: a load
        late = elapsed / self.startup if self.startup > 0 else 1.0
        return min(max(ratio, late), SPEED_LIMITS[1])

    def launching_left(self, work_total: int, since_command: float | None) -> float:
        """The whole job's time left while it still launches (the display is up, the command imports
        Beam), ``since_command`` seconds after the command started (None: not timed): the rest of
        the launch, the start-up and all the work, as the kept runs took them."""
        rest = max(self.launch - since_command, 0.0) if since_command is not None and self.launch > 0 else 0.0
        return rest + self.startup + (self.per_work + self.tail) * work_total

    def seconds_left(self, work_total: int, elapsed: float, speed: float) -> float:
        """The whole job's time left ``elapsed`` s after the launch's end, no figure seen yet: the
        rest of the start-up, all the first stage's work, then the rest, at ``speed``."""
        return max(speed * self.startup - elapsed, 0.0) + speed * (self.per_work + self.tail) * work_total

    def blended_left(self, work_total: int, done: int, since_first: float, done_since_first: int,
                     speed: float) -> float:
        """The whole job's time left with the first stage at ``done`` of its work: its rate since its
        first figure (``since_first`` seconds for ``done_since_first``), weighed against the kept
        runs' rate at ``speed`` as if that were PRIOR_WEIGHT of the work, then the rest."""
        weight = PRIOR_WEIGHT * work_total
        per_work = (speed * self.per_work * weight + since_first) / (weight + done_since_first)
        return per_work * max(work_total - done, 0) + speed * self.tail * work_total


def _trusted(ratio: float) -> float:
    return min(max(ratio, SPEED_LIMITS[0]), SPEED_LIMITS[1]) ** SPEED_TRUST


_COMMAND_START: list[float] = []


def command_started() -> None:
    """The command starts now (pipelines.cli.main): a run's launch is timed from here. Not
    called for a run from Python (a notebook's process started long before): no launch is timed."""
    _COMMAND_START[:] = [time.monotonic()]


def command_ended() -> None:
    """The command has ended (pipelines.cli.main): a run from Python in the same process after it
    times no launch from its start."""
    _COMMAND_START.clear()


def launch_seconds(until: float) -> float | None:
    """Seconds from the command's start to ``until``, or None (not run as a command)."""
    return until - _COMMAND_START[0] if _COMMAND_START and until >= _COMMAND_START[0] else None


def cache_file() -> str:
    given = os.environ.get(CACHE_ENV)
    base = given or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                                 "beam-pretokenize")
    return os.path.join(base, FILE_NAME)


def _read_all() -> dict[str, list]:
    """The kept kinds, or none when the file cannot be read or is no JSON object (json raises
    RecursionError, no ValueError, on nesting deeper than the interpreter's stack)."""
    with contextlib.suppress(OSError, ValueError, RecursionError):
        raw = json.loads(_bounded_text(cache_file()))
        if isinstance(raw, dict):
            return raw
    return {}


def _bounded_text(path: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most MAX_BYTES, else b"" (no JSON): a
    FIFO in its place would hang the display's thread on open (and the run's end, which waits for
    it), a symlink to /dev/zero would be read until the memory ran out."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is then refused
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        data = f.read(MAX_BYTES + 1)
    return data if len(data) <= MAX_BYTES else b""


def load_prior(kind: str) -> Prior | None:
    """The median of each of the kept runs' figures of ``kind`` (a launch, of those that timed it),
    or None: no run kept, or none whose figures are four finite non-negative numbers within
    MAX_SECONDS and MAX_PER_WORK."""
    runs = _runs(_read_all().get(kind))
    if not runs:
        return None
    launches = [run[0] for run in runs if run[0] > 0]
    return Prior(statistics.median(launches) if launches else 0.0,
                 *(statistics.median(run[i] for run in runs) for i in range(1, 4)))


def _runs(entry) -> list[list[float]]:
    """The runs of a kept entry that are a run's figures (an entry of another form: none)."""
    if not isinstance(entry, list):
        return []
    return [[float(x) for x in run] for run in entry[-KEPT_RUNS:] if _a_runs(run)]


def _a_runs(run) -> bool:
    numbers = isinstance(run, list) and len(run) == 4 and all(type(x) in (int, float) for x in run)
    if not numbers:
        return False
    limits = (MAX_SECONDS, MAX_SECONDS, MAX_PER_WORK, MAX_PER_WORK)
    # Compared, never converted: an integer beyond a float's range (JSON has them) would raise in
    # math.isfinite; NaN and the infinities fail the comparison.
    return all(0 <= x <= limit for x, limit in zip(run, limits, strict=True))


def save_prior(kind: str, prior: Prior) -> None:
    """Add ``prior`` to the runs kept for ``kind`` (the last KEPT_RUNS), replacing the file whole;
    never worth failing a run over."""
    entries = _read_all()
    runs = _runs(entries.pop(kind, None))
    runs.append([round(prior.launch, 3), round(prior.startup, 3), prior.per_work, prior.tail])
    entries[kind] = runs[-KEPT_RUNS:]
    entries = dict(list(entries.items())[-KEPT_KINDS:])
    path = cache_file()
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        _remove_orphans(os.path.dirname(path))
        # A new file of a random name (mkstemp: O_EXCL), never a predictable one a symlink planted
        # in a shared cache directory could send the write through.
        fd, tmp = tempfile.mkstemp(prefix=FILE_NAME + ".", suffix=".tmp", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


# A temporary file of save_prior older than this is an orphan (its process was killed before the
# os.replace); a save in progress takes milliseconds.
ORPHAN_SECONDS = 600.0


def _remove_orphans(directory: str) -> None:
    """Remove the temporary files (``job-rates.json.*.tmp``) that saves killed before their
    os.replace left in ``directory``: regular files only, older than ORPHAN_SECONDS (another
    process's save in progress is not one). A symlink of that name is left, and never followed
    (os.unlink removes a name, never what it points to); an error leaves the rest as it is."""
    prefix, suffix = FILE_NAME + ".", ".tmp"
    old = time.time() - ORPHAN_SECONDS
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(suffix)
                    and len(entry.name) > len(prefix) + len(suffix)):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime < old:
                    os.unlink(entry.path)


def measured_prior(launch: float | None, start: float, first: tuple[float, int] | None, stage_end: float | None,
                   end: float, work_total: int | None) -> Prior | None:
    """What a run that ended at ``end`` leaves for the next: its launch (None: not timed), its
    start-up from ``start`` (the launch's end) to the first figure (``first``: when, and the work done
    then), the seconds per unit of the first stage's work after it (to ``stage_end``; None: the
    job's end), and per unit of all of it from there to the end."""
    if first is None or not work_total or work_total <= first[1]:
        return None
    seen_at, seen = first
    stage_end = end if stage_end is None else max(min(stage_end, end), seen_at)
    return Prior(launch or 0.0, max(seen_at - start, 0.0), (stage_end - seen_at) / (work_total - seen),
                 (end - stage_end) / work_total)
