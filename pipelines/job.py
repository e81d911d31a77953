"""Runs a writing job: parse, build, run the pipeline, read back the stats the job published and
print its summary; a failure deletes the run's temporary files and says what the output holds.

Each job module keeps its own settings, ``build`` and summary, and hands them to ``run_job``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipelines.errors import RunStopped, launching, no_space_message, noting_interrupts
from pipelines.flags import wants_plan
from pipelines.launch import abandon_run, kept_work_note, new_run_id
from pipelines.progress import remove_progress, showing_progress
from pipelines.run_mode import RunMode, building, end_dry_run, is_dry_run, submitted_line
from pipelines.summary import read_stats
from shards import layout, storage

if TYPE_CHECKING:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

log = logging.getLogger("pipelines")


def run_job(
    argv: list[str],
    parse_args: Callable[[list[str]], tuple[Any, PipelineOptions]],
    build: Callable[[beam.Pipeline, Any, str, RunMode], Any],
    summary_table: Callable[[Any, str, float], str],
    plan: Callable[[Any], str] | None = None, wait: bool = True, say_summary: bool = True,
):
    """Parse, run, then print the summary of the stats the job published; returns the stats.

    What fails before the pipeline starts (a flag, a setting, a path, a tokenizer that will not
    load) is a UsageError: the CLI says it in one line. A run that fails or is interrupted (Ctrl-C)
    has its temporary files deleted; a full disk or an interruption becomes a RunStopped that says
    whether the previous output is intact. Without ``wait`` (a Flex Template's launcher) it
    returns None once the runner has the job, and prints where its finished output will appear.
    With ``--plan``, ``plan(settings)`` is printed instead, and nothing runs (pipelines/plan.py);
    without ``say_summary`` no summary is printed (the Python API returns the stats instead)."""
    start = time.monotonic()
    run_id = new_run_id()
    with launching():
        options, pipeline_options = parse_args(argv)
        if plan is not None and wants_plan(argv):
            print(plan(options), flush=True)
            return None
        mode = RunMode(dry_run=is_dry_run(pipeline_options), wait=wait)
        pipeline = _built(build, options, pipeline_options, run_id, mode)
    output = storage.normalize(options.output)
    result = None
    interrupted = []
    try:
        with noting_interrupts(interrupted), showing_progress(
                pipeline_options, run_id, tokenizer=_tokenizer_name(options)):
            result = pipeline.run()
            if not mode.wait or mode.dry_run:
                print(_not_waiting(mode, result, output, pipeline_options), flush=True)
                return None
            result.wait_until_finish()
    except BaseException as e:
        if mode.dry_run:
            raise  # it wrote nothing into the output, and must remove nothing there (a real run may be writing)
        remove_progress(pipeline_options, run_id)
        stopped = _stopped(e, result, output, run_id, bool(interrupted) or isinstance(e, KeyboardInterrupt))
        if stopped is None:
            raise
        raise stopped from None
    remove_progress(pipeline_options, run_id)
    seconds = time.monotonic() - start
    stats = read_stats(options.output)
    if say_summary:
        print(summary_table(stats, storage.normalize(options.output), seconds), flush=True)
    return stats


def _tokenizer_name(options) -> str | None:
    """The tokenizer a job's settings name (its ETA figures are kept per tokenizer), or None."""
    name = getattr(options, "tokenizer", None)
    return name if isinstance(name, str) else None


def _built(build, options, pipeline_options: PipelineOptions, run_id: str, mode: RunMode) -> beam.Pipeline:
    """The job's pipeline, built by ``build`` in ``mode``. A build that fails (a launch check)
    removes the temporary directory Beam made for the pipeline: only ``run`` would have."""
    import apache_beam as beam

    pipeline = beam.Pipeline(options=pipeline_options)
    try:
        with building(mode) as built:
            build(pipeline, options, run_id, built)
    except BaseException:
        shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)
        raise
    return pipeline


def _not_waiting(mode: RunMode, result, output: str, pipeline_options: PipelineOptions) -> str:
    """What a run that ends without waiting for its job says: only submitted, or only translated."""
    if mode.dry_run and mode.wait:
        return end_dry_run(output, pipeline_options)
    line = submitted_line(result, output, pipeline_options)
    if mode.dry_run:
        return line
    return (f"{line}\nwarning: the job outlives this launcher, which frees its lock on {output} now: until "
            f"{layout.STATS_NAME} appears, start no other command that writes there")


def _stopped(error: BaseException, result, output: str, run_id: str, interrupted: bool) -> RunStopped | None:
    """A failed or interrupted run's temporary files deleted (its job cancelled if Ctrl-C stopped
    it); a RunStopped saying what the output holds, or None: the error is raised as it is. Deleting
    them may fail too (the store that failed the run): that is said in the same line, never
    instead of it."""
    if result is not None and interrupted:
        with contextlib.suppress(Exception):
            result.cancel()
    state, kept_note, kept = _abandoned(output, run_id)
    if interrupted:
        return RunStopped(f"interrupted; {state}; {kept_note}")
    full = no_space_message(error)
    if full is not None:
        return RunStopped(f"{full} ({output}); {state}; {kept_note}")
    from pipelines.cli import unreachable_message

    unreachable = unreachable_message(error)
    if unreachable is not None:
        return RunStopped(f"{unreachable}; {state}; {kept_note}")
    if kept:
        log.warning("the run failed; %s", kept_note)
    return None


def _abandoned(output: str, run_id: str) -> tuple[str, str, int]:
    """The run's temporary files deleted (``abandon_run``): what the output holds, what was kept,
    and how many finished units; a store that cannot be asked leaves them, saying so."""
    try:
        published, kept = abandon_run(output, run_id)
    except Exception as e:  # noqa: BLE001 - said in the run's one line, never instead of it
        problem = storage.unreachable_problem(e) or storage.one_line(e)
        return (f"its temporary files could not be deleted ({problem}); the output may be unfinished: run the "
                "same command again", "the next run deletes them", 0)
    state = (
        f"the output is unfinished (publishing had begun, so it has no {layout.STATS_NAME}): run the same "
        "command again"
        if published
        else "nothing was published and the previous output is intact"
    )
    return state, kept_work_note(kept), kept
