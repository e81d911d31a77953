"""A local run's progress: where its workers share their totals, the stages a writing job
announces, and the display (pipelines/progress_display.py) drawn while the job runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from pipelines.progress_display import JobDisplay
from pipelines.run_mode import Workers
from pipelines.worker_stderr import filtering_worker_stderr
from transforms.core.progress import SHARED_ENV, Stage, announce_stages
from transforms.inputs.units import planned_work

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions


def progress_dir(workers: Workers | PipelineOptions, run_id: str | None) -> str | None:
    """Where a local run's workers share their progress (transforms.core.progress), so a log line
    says how much of the whole job is done; None on a remote runner, whose UI shows progress.
    run_job removes it when the run ends. ``workers``: where they run, or the run's PipelineOptions."""
    if run_id is None or not _workers(workers).local:
        return None
    return os.path.join(tempfile.gettempdir(), f"pretokenize-progress-{run_id}")


def announce_write_stages(progress_dir: str | None, units, done: set[int], encode_step: str, encoding: str) -> None:
    """The display's stages of a writing job (pipelines/progress_display.py): reading and
    ``encoding`` the input units not ``done`` at launch (their planned rows, or units), then
    writing the tokens the ``encode_step`` step made."""
    todo = [u for i, u in enumerate(units) if i not in done]
    planned = planned_work(todo)
    # The ETA goes by the text bytes read when every unit's are known (parquet): units are worked
    # largest first, so the rows of the first take longer than the rest's. Files whose rows are
    # not planned (JSON) go by their bytes as stored, read so far (transforms.inputs.read): a unit
    # is a whole file, and one large file would show no share until it was done.
    text_bytes = sum(u.text_bytes for u in todo) if todo and all(u.text_bytes >= 0 for u in todo) else None
    work = {}
    if text_bytes and planned.what == "rows":
        work = {"work_keys": ("bytes",), "work_total": text_bytes}
    elif text_bytes and all(u.rows < 0 for u in todo):
        work = {"work_keys": ("stored_bytes",), "work_total": text_bytes}
    announce_stages(progress_dir, [
        Stage(f"read and {encoding}", "read", planned.keys, planned.what, total=planned.total, **work),
        Stage("write", "write", ("tokens",), "tokens", total_step=encode_step, total_keys=("tokens",)),
    ])


@contextlib.contextmanager
def showing_progress(workers: Workers | PipelineOptions, run_id: str, stages=None,
                     ending: tuple[str, str] = ("publishing", "published"), tokenizer: str | None = None,
                     building: bool = False):
    """The job run inside shows its progress (pipelines/progress_display.py) on a local runner:
    its workers share their totals in progress_dir() (named to them by the environment, which a
    worker process inherits), and the display draws the stages announced there (``stages``, or
    those the job's build announced). Worker processes' own standard error is kept to what is not
    Beam's harness logging (pipelines/worker_stderr.py). Nothing on a remote runner, whose UI shows progress.
    With ``tokenizer`` named, the job ETA while reading comes from the last runs of the same kind
    (pipelines/progress_prior.py), weighed against this run's figures as they come, and this run's
    figures are kept for the next.

    Yields the display (JobDisplay: its ``shared_dir``, and ``launched`` and ``running`` to call as
    the job's launch goes on), or NO_DISPLAY on a remote runner. With ``building``, the job is built
    inside (run_job): the display draws the bars as soon as the launch announces its stages, and a
    launch error before ``running`` leaves no bar or line of it."""
    workers = _workers(workers)
    shared = progress_dir(workers, run_id)
    if shared is None:
        yield NO_DISPLAY
        return
    with contextlib.suppress(OSError):  # the workers' Progress writes into it, never creates it
        os.makedirs(shared, exist_ok=True)
    if stages:
        announce_stages(shared, stages)

    previous = os.environ.get(SHARED_ENV)
    os.environ[SHARED_ENV] = shared
    try:
        with filtering_worker_stderr(workers.processes), JobDisplay(
                shared, ending=ending, kind=_run_kind(workers, tokenizer), launching=building) as display:
            yield display
    finally:
        if previous is None:
            os.environ.pop(SHARED_ENV, None)
        else:
            os.environ[SHARED_ENV] = previous
        remove_progress(workers, run_id)


class _NoDisplay:
    """showing_progress's display on a remote runner: nothing drawn, nothing shared."""

    shared_dir = None

    def launched(self) -> None:
        pass

    def running(self) -> None:
        pass


NO_DISPLAY = _NoDisplay()


def _workers(workers: Workers | PipelineOptions) -> Workers:
    return workers if isinstance(workers, Workers) else Workers.of_options(workers)


def _run_kind(workers: Workers, tokenizer: str | None) -> str | None:
    """What a run's ETA figures are kept under: its tokenizer and number of worker processes."""
    if tokenizer is None:
        return None
    count = workers.count if workers.processes else 1
    return f"tokenizer {tokenizer}, {count} worker{'s' if count != 1 else ''}"


def remove_progress(workers: Workers | PipelineOptions, run_id: str) -> None:
    shared = progress_dir(workers, run_id)
    if shared is None:
        return
    # Renamed first: a worker's late share (its sharing thread) names the old path and, never
    # creating it, writes nothing; so nothing lands in the directory while it is being removed.

    gone = f"{shared}.removed"
    with contextlib.suppress(OSError):
        os.rename(shared, gone)
    for _ in range(3):
        shutil.rmtree(gone, ignore_errors=True)
        if not os.path.exists(gone):
            break
    shutil.rmtree(shared, ignore_errors=True)
