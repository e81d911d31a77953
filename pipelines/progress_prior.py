"""The job ETA before a local run's workers have shared a figure: from this user's previous runs.

With two worker processes the workers' first figures can arrive after half of a short run (issue
37: on the bench corpus at a load of 17, the worker processes start, import Beam and the tokenizer
and read a first batch of 600 documents for 9 s after the display is up). Until then this run has
no rate to go by. The launcher knows the work planned (the first stage's text bytes, or its rows),
and a previous run of the same kind (the same stages, tokenizer and number of workers) says how
long its start-up took (from the display's start to the first figure) and how long each unit of
work took after it. The display shows that estimate, marked ``~``, until this run's own figures
give a rate; each run that ends replaces its kind's figures.

Kept in the user's cache directory ($PRETOKENIZE_PROGRESS_CACHE, else $XDG_CACHE_HOME or ~/.cache,
then beam-pretokenize/job-rates.json), never in an output tree; plain JSON numbers, read with json
and checked, never executed. A file that does not parse is ignored, then replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile

CACHE_ENV = "PRETOKENIZE_PROGRESS_CACHE"
FILE_NAME = "job-rates.json"
KEPT_KINDS = 64  # the kinds of run remembered, the latest kept
# Figures beyond these are no run's (a hand-edited file): times the planned work, they could make
# an estimate no clock can show.
MAX_STARTUP = 86400.0  # seconds to the first figure
MAX_PER_WORK = 60.0  # seconds a byte or a row


@dataclasses.dataclass(frozen=True)
class Prior:
    """A previous run's seconds from the display's start to its first figure (``startup``), and
    seconds per unit of the first stage's work after it (``per_work``)."""

    startup: float
    per_work: float

    def seconds_left(self, work_total: int, elapsed: float) -> float:
        """The whole job's time left ``elapsed`` s after the display's start, no figure seen yet: the
        rest of the start-up (none once it has run longer than last time), then all the work."""
        return max(self.startup - elapsed, 0.0) + self.per_work * work_total


def cache_file() -> str:
    given = os.environ.get(CACHE_ENV)
    base = given or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                                 "beam-pretokenize")
    return os.path.join(base, FILE_NAME)


def _read_all() -> dict[str, list]:
    with contextlib.suppress(OSError, ValueError):
        with open(cache_file()) as f:
            raw = json.load(f)
        if isinstance(raw, dict):
            return raw
    return {}


def load_prior(kind: str) -> Prior | None:
    """The figures the last run of ``kind`` left, or None (none, or not two finite non-negative
    numbers within MAX_STARTUP and MAX_PER_WORK)."""
    entry = _read_all().get(kind)
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, int | float) for x in entry)):
        return None
    if not all(math.isfinite(x) and x >= 0 for x in entry) or entry[0] > MAX_STARTUP or entry[1] > MAX_PER_WORK:
        return None
    return Prior(float(entry[0]), float(entry[1]))


def save_prior(kind: str, prior: Prior) -> None:
    """Remember ``prior`` for the next run of ``kind`` (replacing the file whole; never worth
    failing a run over)."""
    entries = {k: v for k, v in _read_all().items() if k != kind}
    entries[kind] = [round(prior.startup, 3), prior.per_work]
    entries = dict(list(entries.items())[-KEPT_KINDS:])
    path = cache_file()
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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


def measured_prior(start: float, first: tuple[float, int] | None, end: float, work_total: int | None) -> Prior | None:
    """What a run that ended at ``end`` leaves for the next: its start-up up to the first figure
    (``first``: when, and the work done then), and the seconds per unit of the work after it."""
    if first is None or not work_total or work_total <= first[1]:
        return None
    seen_at, seen = first
    return Prior(max(seen_at - start, 0.0), max(end - seen_at, 0.0) / (work_total - seen))
