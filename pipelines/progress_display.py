"""The whole job's progress, drawn by the launcher of a local run from what its workers share.

Each stage the job announced (transforms.core.progress.announce_stages: for the writing jobs, one
for reading and tokenizing, one for writing) is a bar in a terminal (tqdm: the share, the count,
the rate, the elapsed time and the ETA), redrawn a few times a second from the first second of
the run until it has published; a stage's bar is full once the next stage has begun (a local
runner finishes a stage before the shuffle that feeds the next) and every bar is full once the
job has published. While bars are drawn, the workers' own progress lines are held back (they
would tear the bars) and other log lines are printed above the bars.

When stderr is not a terminal (a log file, CI), the same figures are one plain log line every
``PRETOKENIZE_PROGRESS_SECONDS`` (10 s) and one at the end:
``progress: read and tokenize 45.3% of 2.60M rows, ETA 31s; write 0.0% of 1.20G tokens``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

from pipelines.progress_prior import Prior, launch_seconds, load_prior, measured_prior, save_prior
from transforms.core import progress
from transforms.core.progress import Stage, announced_stages, read_shared, share_line

log = logging.getLogger("pretokenize.progress")

REDRAW_SECONDS = 0.1
# Until a stage after the first has begun, its time is guessed as this share of the first stage's:
# writing took about a third of the time reading and tokenizing took on the bench corpus (issue 37:
# reading is about 75% of a bucketed run), a sixth on the bundled sample repeated 24 times; a quarter
# keeps the ETA at half the run within 30% for anything from a tenth to 45%. Corrected by the
# stage's own rate once it runs.
LATER_STAGE_SHARE = 0.25


def job_seconds_left(figures: list[tuple[int, int | None]], elapsed: list[float | None]) -> float | None:
    """The seconds left to the end of the whole job, from each stage's (done, total) and the
    seconds since it began (None: not begun); None while nothing is known to go by.

    A stage under way takes the rest of its work at its rate so far; one not begun, the first
    stage's whole time (measured, or estimated at its rate) times LATER_STAGE_SHARE. A pure
    function of what the display read, so each redraw corrects it."""
    first = _stage_seconds(figures[0], elapsed[0]) if figures else None
    left = 0.0
    for (done, total), since in zip(figures, elapsed, strict=True):
        if total is not None and done >= total:
            continue  # ended
        if since is not None and done and total:
            left += since * (total - done) / done
        elif first is not None:
            left += first * LATER_STAGE_SHARE
        else:
            return None
    return left


def from_first_work(figure: tuple[int, int | None], first: tuple[float, int] | None, start: float | None,
                    now: float) -> tuple[tuple[int, int | None], float | None]:
    """A stage's (done, total) and seconds for job_seconds_left, counted from the first of its work
    the display saw (``first``: when, and how much was done then) rather than from when it began
    (``start``): the seconds before (the launch, worker processes starting and importing, a
    first batch) are paid once, and counted in the rate they made the ETA of a two-worker run on
    the bench corpus 201 s at half of a 34 s run."""
    if start is None or first is None:
        return figure, None if start is None else now - start
    (done, total), (seen_at, seen) = figure, first
    return (done - seen, None if total is None else total - seen), now - seen_at


def _stage_seconds(figure: tuple[int, int | None], since: float | None) -> float | None:
    """The whole time of a stage at its rate so far (its elapsed time once it has ended)."""
    done, total = figure
    if since is None or not done or not total:
        return None
    return since * max(total, done) / done



def stage_figures(shared_dir: str, stages: list[Stage]) -> list[tuple[int, int | None]]:
    """(done, total or None when not yet known) of each stage, from the workers' shared totals."""
    out = [(_summed(shared_dir, stage.step, stage.keys),
            stage.total if stage.total is not None else _summed(shared_dir, stage.total_step, stage.total_keys) or None)
           for stage in stages]
    return _ended_before(out)


def work_figures(shared_dir: str, stages: list[Stage]) -> list[tuple[int, int | None]]:
    """stage_figures, but in what each stage's time grows with where it says (Stage.work_keys)."""
    figures = stage_figures(shared_dir, stages)
    out = [(_summed(shared_dir, stage.step, stage.work_keys), stage.work_total) if stage.work_keys and stage.work_total
           else figure for stage, figure in zip(stages, figures, strict=True)]
    return _ended_before(out)


def _summed(shared_dir: str, step: str | None, keys: tuple[str, ...]) -> int:
    """The sum of ``keys`` in the totals the workers of ``step`` share."""
    n = 0
    with contextlib.suppress(OSError):
        for figures in read_shared(shared_dir, step) if step else ():
            totals = figures.get("totals") or {}
            n += sum(int(totals.get(k, 0)) for k in keys)
    return n


def _ended_before(out: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    """A stage that has begun means the one before it has ended."""
    for i in range(len(out) - 1):
        if out[i + 1][0] and out[i][1] is not None:
            out[i] = (max(out[i][0], out[i][1]), max(out[i][0], out[i][1]))
    return out


class JobDisplay:
    """A context manager drawing the stages announced in ``shared_dir`` while the job runs
    inside it: bars when ``stream`` is a terminal, else a log line every ``interval`` seconds."""

    def __init__(self, shared_dir: str, stream=None, interval: float | None = None,
                 ending: tuple[str, str] = ("publishing", "published"), kind: str | None = None,
                 launching: bool = False):
        self.shared_dir = shared_dir
        self.kind = kind  # the kind of run (workers, tokenizer) whose previous ETA figures to use, or None
        self.ending = ending  # what the last bar says once its stage is done, then once the job is
        self.stream = sys.stderr if stream is None else stream
        self.interval = float(os.environ.get(progress.INTERVAL_ENV, 10.0)) if interval is None else interval
        self.bars = _is_terminal(self.stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pretokenize-progress", daemon=True)
        self._stages: list[Stage] = []
        self._tqdm: list = []
        self._started: list[float | None] = []
        self._first_work: list[tuple[float, int] | None] = []  # per stage: (when, work done) first seen
        self._ended: list[bool] = []
        self._lines: list[str] = []
        self._start = time.monotonic()
        self._building = launching
        # When the launch has planned the input and imported Beam (launched()), and the seconds
        # that took from the command's start: a sign of the machine's speed (pipelines/progress_prior.py).
        self._launched: float | None = None
        self._launch: float | None = None
        self._redirect = contextlib.ExitStack()
        self._prior: Prior | None = None
        # When the job's pipeline started; None while it is launching (being built: running() ends it).
        self._running: float | None = None if launching else self._start

    def __enter__(self) -> JobDisplay:
        if self.bars:
            from tqdm.contrib.logging import logging_redirect_tqdm

            # Other log lines go above the bars; the workers' own progress lines are held back.
            self._redirect.enter_context(logging_redirect_tqdm())
            self._redirect.enter_context(_workers_quiet())
        self._thread.start()
        return self

    def launched(self) -> None:
        """The launch has planned the input and imported Beam (run_job): the job's build comes next.
        The kept runs' parts are timed from here (pipelines/progress_prior.py)."""
        now = time.monotonic()
        self._launch = launch_seconds(now)
        self._launched = now

    def running(self) -> None:
        """The job is built and its pipeline starts: up to now it was launching (see __exit__), and a
        log's lines count their interval from here, as when the display came up only now."""
        self._running = time.monotonic()

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join()
        launch_failed = exc_type is not None and self._running is None
        with _never_fatal():  # the job has ended (or published): nothing of the display may undo that
            if not launch_failed:
                self._draw(finished=exc_type is None)
            if exc_type is None:
                self._remember()
        # A job that failed while it was built (a launch error: the display is up from before the
        # build) leaves no bar and no progress line: its error is said alone, at the start of the
        # first bar's line (cleared last, the cursor ends there).
        for bar in reversed(self._tqdm) if launch_failed else self._tqdm:
            bar.leave = not launch_failed
            bar.close()
        self._redirect.close()

    def _loop(self) -> None:
        """Bars redrawn every REDRAW_SECONDS; a log's figures read every half second, said every
        ``interval``: when a stage begins and its first work is seen are the ETA's, and the next
        run's (_remember), to within that half second, not to within a line's interval."""
        last_line = time.monotonic()
        with _never_fatal():  # a display that fails stops drawing; the job runs on
            while not self._stop.wait(REDRAW_SECONDS if self.bars else 0.5):
                if self.bars:
                    self._draw()
                elif self._running is not None and time.monotonic() - max(last_line, self._running) >= self.interval:
                    last_line = time.monotonic()
                    self._draw()
                else:
                    self._draw(say=False)

    def _draw(self, finished: bool = False, say: bool = True) -> None:
        """The figures read and drawn (bars), or said in a log line (``say``; else only read)."""
        if not self._read_stages():
            return
        figures = stage_figures(self.shared_dir, self._stages)
        if finished:  # published: every stage is done, whatever the last shared figures said
            figures = [(max(d, t or 0), max(d, t or 0)) for d, t in figures]
        now, last = time.monotonic(), len(figures) - 1
        if self.bars and not self._tqdm:
            self._tqdm = self._new_bars(figures, now)
        for i, (done, total) in enumerate(figures):
            if self._ended[i]:
                continue
            if self._started[i] is None:
                before_done, before_total = figures[i - 1]
                if not (done or (before_total is not None and before_done >= before_total)):
                    continue  # not begun: shown as it is (0)
                self._started[i] = now  # its rate and ETA from when the stage before it ended
                if self.bars:
                    self._tqdm[i].reset(total=total)
            ended = total is not None and done >= total and (i < last or finished)
            if self.bars:
                bar = self._tqdm[i]
                bar.total = None if total is None else max(total, done)
                bar.n = done  # the rate is the average since the stage began (smoothing=0): the ETA at the rate so far
                if i == last and total is not None and done >= total:
                    bar.set_postfix_str(self.ending[1] if finished else self.ending[0], refresh=False)
                elif ended:
                    bar.set_postfix_str("", refresh=False)  # the job's ETA is said on the bar of the stage under way
                bar.refresh()  # an ended stage is drawn a last time, then left as it is
            elif say and (total is not None or done):
                self._lines.append(self._line(self._stages[i], done, total, now - self._started[i]))
            if say:  # a stage ends once said: a log's next line says it done
                self._ended[i] = ended
        left, estimated = (None, False) if finished else self._left(figures, now)
        if self.bars and left is not None:
            active = next((i for i, ended in enumerate(self._ended) if not ended), None)
            done, total = figures[active] if active is not None else (0, None)
            if active is not None and self._started[active] is not None and (total is None or done < total):
                self._tqdm[active].set_postfix_str(_eta_text(left, estimated))
        if not self.bars and self._lines:
            kept = " (from the last runs)" if estimated else ""
            to_end = "" if left is None else f"; {_eta_text(left, estimated)}{kept}"
            log.info("progress: %s%s%s", "; ".join(self._lines), to_end, f" ({self.ending[1]})" if finished else "")
            self._lines = []

    def _read_stages(self) -> bool:
        """Whether there are stages to draw, read from what the job announced. Until the first of
        its work is seen they are read again: a job announces its planned work as soon as it is
        known, then again without the units an interrupted run finished, once the output is claimed."""
        if self._stages and any(self._first_work):
            return True
        stages = announced_stages(self.shared_dir)
        if not stages or stages == self._stages:
            return bool(self._stages)
        if self._stages and [(s.label, s.unit) for s in stages] == [(s.label, s.unit) for s in self._stages]:
            self._stages = stages  # the same bars, with the totals left to do
            for bar, stage in zip(self._tqdm, stages, strict=True) if self._tqdm else ():
                bar.reset(total=stage.total)
            return True
        self._stages = stages
        self._started = [self._start] + [None] * (len(self._stages) - 1)
        self._first_work = [None] * len(self._stages)
        self._ended = [False] * len(self._stages)
        self._prior = load_prior(self._full_kind()) if self.kind else None
        for bar in self._tqdm:
            bar.close()
        self._tqdm = []  # drawn anew by the next _draw, with the job ETA on the first (_new_bars)
        return True

    def _work(self, figures: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
        """Each stage's (done, total) in what its time grows with (Stage.work_keys) while it runs."""
        if not any(stage.work_keys for stage in self._stages):
            return figures
        work = work_figures(self.shared_dir, self._stages)
        return [f if self._ended[i] else w for i, (w, f) in enumerate(zip(work, figures, strict=True))]

    def _job_left(self, figures: list[tuple[int, int | None]], now: float) -> float | None:
        """The seconds to the end of the job from this run's figures alone (job_seconds_left, in each
        stage's work); a stage's time runs from when the one before it ended."""
        ends = [*self._started[1:], None]
        counted, elapsed = [], []
        for i, (figure, start, end) in enumerate(zip(figures, self._started, ends, strict=True)):
            if self._first_work[i] is None and start is not None and figure[0] and not self._ended[i]:
                self._first_work[i] = (now, figure[0])
            at = end if end is not None and self._ended[i] else now
            figure, since = from_first_work(figure, self._first_work[i], start, at)
            counted.append(figure)
            elapsed.append(since)
        return job_seconds_left(counted, elapsed)

    def _left(self, figures: list[tuple[int, int | None]], now: float) -> tuple[float | None, bool]:
        """The seconds to the end of the job, and whether they are the kept runs' estimate alone
        (pipelines.progress_prior: this run has no rate yet). While the first stage runs and runs of
        this kind are kept, they carry the estimate, scaled by this run's speed, until this run's
        rate outweighs them; after it, this run's figures alone."""
        work = self._work(figures)
        left = self._job_left(work, now)
        total = self._work_total()
        if self._prior is None or total <= 0 or self._ended[0]:
            return left, False
        first, origin = self._first_work[0], self._origin()
        if first is None and self._building and self._launched is None:  # Beam still being imported
            return self._prior.launching_left(total, launch_seconds(now)), True
        speed = self._prior.speed(self._launch, None if first is None else first[0] - origin, now - origin)
        if first is None:
            return self._prior.seconds_left(total, now - origin, speed), True
        done = work[0][0]
        return self._prior.blended_left(total, done, now - first[0], done - first[1], speed), done <= first[1]

    def _origin(self) -> float:
        """What the kept runs' parts after the launch are timed from: the launch's end (launched()),
        or the display's start for a job that has none."""
        return self._start if self._launched is None else self._launched

    def _full_kind(self) -> str:
        """The kind of run, as previous runs' figures are kept (pipelines.progress_prior): its stages,
        each in its unit and what its time is measured by (Stage.work_keys)."""
        return " / ".join([self.kind or "", *(stage_kind(s) for s in self._stages)])

    def _work_total(self) -> int:
        """The first stage's planned work, in what its time grows with (Stage.work_keys)."""
        first = self._stages[0]
        return (first.work_total if first.work_keys and first.work_total else first.total) or 0

    def _remember(self) -> None:
        """A run that ended leaves its parts' times for the next of its kind."""
        if self.kind and self._stages:
            stage_end = self._started[1] if len(self._started) > 1 else None
            prior = measured_prior(self._launch, self._origin(), self._first_work[0], stage_end, time.monotonic(),
                                   self._work_total())
            if prior is not None:
                save_prior(self._full_kind(), prior)

    @staticmethod
    def _line(stage: Stage, done: int, total: int | None, since: float) -> str:
        if total is None:
            return f"{stage.label} {done:,} {stage.unit}"
        return f"{stage.label} {share_line(done, progress.Planned(total, stage.unit), since)}"

    def _new_bars(self, figures: list[tuple[int, int | None]], now: float) -> list:
        """The stages' bars, the first drawn with the job ETA already on it: a bar drawn first
        without it could stay so for a second, while the launcher's main thread holds the interpreter
        (a tokenizer's tables built in one call of a C library)."""
        left, estimated = self._left(figures, now)
        first = None if left is None else _eta_text(left, estimated)
        return [self._new_bar(i, stage, first if i == 0 else None) for i, stage in enumerate(self._stages)]

    def _new_bar(self, position: int, stage: Stage, postfix: str | None = None):
        from tqdm import tqdm

        # A terminal that says it has no size (a bare pseudo-terminal) gets 80 x 24, not 0 x 0 (no bars).
        sized = all(_size(self.stream))
        return tqdm(total=stage.total, desc=f"{stage.label:<17}", unit=f" {stage.unit}", unit_scale=_scaled(stage.unit),
                    position=position, file=self.stream, dynamic_ncols=sized, ncols=None if sized else 80,
                    nrows=None if sized else 24, leave=True, smoothing=0, postfix=postfix)


def stage_kind(stage: Stage) -> str:
    """A stage as the kind of run names it: its label, unit and what its time goes by."""
    by = f" by {' and '.join(stage.work_keys)}" if stage.work_keys else ""
    return f"{stage.label} in {stage.unit}{by}"


@contextlib.contextmanager
def _never_fatal():
    """What the display does is never worth a job: an error in it (an estimate that cannot be
    formatted, a figure file it cannot read) is said in one line and the display stops, where it
    would have killed its thread with a traceback, or raised after the job had published."""
    try:
        yield
    except Exception as e:  # any error of the display's own: said, and the display left
        log.warning("the progress display stopped: %s: %s", type(e).__name__, e)


def _eta_text(left: float, estimated: bool) -> str:
    """``job ETA 41s``; ``job ETA ~41s`` when it is the kept runs' estimate alone."""
    return f"job ETA {'~' if estimated else ''}{progress.format_duration(left)}"


def _scaled(unit: str) -> bool:
    """1.20M tokens, but 84 files (not 84.0)."""
    return unit in ("tokens", "rows")


def _size(stream) -> tuple[int, int]:
    try:
        return tuple(os.get_terminal_size(stream.fileno()))
    except (AttributeError, ValueError, OSError):
        return 0, 0


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def _workers_quiet():
    """The progress lines of this process's steps, and those its worker processes send, held back."""
    ours = logging.getLogger(progress.log.name)
    previous = ours.level
    ours.setLevel(logging.WARNING)
    progress.hold_worker_progress(True)
    try:
        yield
    finally:
        progress.hold_worker_progress(False)
        ours.setLevel(previous)


class LauncherBar:
    """A bar for work the launcher does itself (train-bpe's merges): drawn when stderr is a
    terminal (``drawn``), else nothing (the caller logs its own lines)."""

    def __init__(self, label: str, total: int, unit: str, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.drawn = _is_terminal(self.stream)
        self._label, self._total, self._unit = label, total, unit
        self._bar = None

    def __enter__(self) -> LauncherBar:
        if self.drawn:
            from tqdm import tqdm

            sized = all(_size(self.stream))
            self._bar = tqdm(total=self._total, desc=f"{self._label:<17}", unit=f" {self._unit}",
                             unit_scale=_scaled(self._unit),
                             file=self.stream, dynamic_ncols=sized, ncols=None if sized else 80,
                             nrows=None if sized else 24, smoothing=0)
        return self

    def set(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._bar is not None:
            self._bar.close()
