"""Runs a writing job: parse, build, run the pipeline, read back the stats the job published and
print its summary; a failure deletes the run's temporary files and says what the output holds.

Each job module keeps its own settings, ``build`` (its graph in pipelines/<job>_graph.py) and
summary, and hands them to ``run_job``. The run loop's guard (``stopping``) and its wait
(``wait_for``) are every pipeline command's: the jobs', train-bpe's, remove's and verify's; each says
only what its output holds once it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pipelines.errors import RunStopped, launching, noting_interrupts, stopped_line
from pipelines.flags import BeamArgs, wants_plan
from pipelines.launch import abandon_run, kept_work_note, new_run_id
from pipelines.progress import announce_write_stages, remove_progress, showing_progress
from pipelines.run_mode import RunMode, building, end_dry_run, is_dry_run, submitted_line
from pipelines.summary import read_stats
from shards import layout, storage
from transforms.inputs.plan import plan_input
from transforms.inputs.units import InputUnit

if TYPE_CHECKING:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.inputs.fields import ReadConfig

log = logging.getLogger("pipelines")


def run_job(
    argv: list[str],
    parse_args: Callable[[list[str]], tuple[Any, BeamArgs]],
    plan_input: Callable[[Any, str | None], list],
    build: Callable[..., Any],
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
    without ``say_summary`` no summary is printed (the Python API returns the stats instead).

    The launch, in its order: the flags parsed (no Beam imported); the display up and the input
    planned (``plan_input(settings, the display's shared directory)``): the bars and the job ETA
    appear then, before Beam is imported, not seconds later (issue 37); Beam imported with its
    options; the job built (``build(..., units=)``: the tokenizer loaded, the output claimed). A
    launch error clears the bars before it is said."""
    start = time.monotonic()
    run_id = new_run_id()
    with launching():
        options, beam_args = parse_args(argv)
        if plan is not None and wants_plan(argv):
            beam_args.options()  # Beam's flags checked as a run checks them
            print(plan(options), flush=True)
            return None
    output = storage.normalize(options.output)
    on_stop = functools.partial(_stopped, output, run_id)
    workers = beam_args.workers
    with showing_progress(workers, run_id, tokenizer=_tokenizer_name(options), building=True) as display:
        with launching():
            units = plan_input(options, display.shared_dir)
            pipeline_options = beam_args.options()
            mode = RunMode(dry_run=is_dry_run(pipeline_options), wait=wait)
            display.launched()
            pipeline = built(functools.partial(build, units=units), options, pipeline_options, run_id, mode)
        display.running()
        with stopping(on_stop, dry_run=mode.dry_run) as interrupted:
            result = pipeline.run()
            if not mode.wait or mode.dry_run:
                print(_not_waiting(mode, result, output, pipeline_options), flush=True)
                return None
            wait_for(result, interrupted)
    remove_progress(workers, run_id)
    return _published(options.output, summary_table if say_summary else None, time.monotonic() - start)


def _published(output: str, summary_table: Callable[[Any, str, float], str] | None, seconds: float):
    """The stats the job published, and their ``summary_table`` printed (None: not printed)."""
    stats = read_stats(output)
    if summary_table is not None:
        print(summary_table(stats, storage.normalize(output), seconds), flush=True)
    return stats


def planned_input(config: ReadConfig, progress_dir: str | None, encode_step: str, encoding: str) -> list[InputUnit]:
    """A writing job's input planned into units (transforms.inputs.plan.plan_input: no Beam
    imported), and its display's stages announced in ``progress_dir`` (None: no display)."""
    units = plan_input(config)
    announce_write_stages(progress_dir, units, set(), encode_step, encoding)
    return units


def _tokenizer_name(options) -> str | None:
    """The tokenizer a job's settings name (its ETA figures are kept per tokenizer), or None."""
    name = getattr(options, "tokenizer", None)
    return name if isinstance(name, str) else None


def built(build, options, pipeline_options: PipelineOptions, run_id: str, mode: RunMode) -> beam.Pipeline:
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


@contextlib.contextmanager
def stopping(on_stop: Callable[[BaseException, bool], BaseException | None], dry_run: bool = False,
             passing: tuple[type[BaseException], ...] = ()) -> Iterator[list]:
    """The run loop's guard, one for every command that runs a pipeline. Ctrl-C is noted in the list
    it yields even when a runner turns it into its own error; a run that fails or is interrupted
    becomes ``on_stop(error, interrupted)``, or is raised as it is when that says None. A dry run's
    error, and ``passing`` errors, are raised as they are: a dry run wrote nothing into the output,
    and must remove nothing there (a real run may be writing)."""
    interrupted: list = []
    try:
        with noting_interrupts(interrupted):
            yield interrupted
    except passing:
        raise
    except BaseException as e:
        if dry_run:
            raise
        stopped = on_stop(e, bool(interrupted) or isinstance(e, KeyboardInterrupt))
        if stopped is None:
            raise
        raise stopped from None


def wait_for(result, interrupted: list) -> None:
    """Waits until the runner's job is done; Ctrl-C cancels the job too (when the runner can)."""
    try:
        result.wait_until_finish()
    except BaseException as e:
        if interrupted or isinstance(e, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                result.cancel()
        raise


def _stopped(output: str, run_id: str, error: BaseException, interrupted: bool) -> RunStopped | None:
    """A failed or interrupted run's temporary files deleted (its progress is, by showing_progress,
    once the display has drawn its last figures); a RunStopped saying what the output holds, or
    None: the error is raised as it is. Deleting them may fail too (the store that failed the
    run): that is said in the same line, never instead of it."""
    state, kept_note, kept = _abandoned(output, run_id)
    stopped = stopped_line(error, output, interrupted, f"{state}; {kept_note}")
    if stopped is None and kept:
        log.warning("the run failed; %s", kept_note)
    return stopped


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
