"""What the jobs that write an output tree share: flags, run ids, leftovers of dead runs, running.

Each job module keeps its own options, ``build`` and summary; ``run_job`` runs one of them the
same way: parse, run the pipeline, read back the stats the job published, print the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import posixpath
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from shards import layout, storage, tree
from transforms.core import resume
from transforms.core.records import UsageError

log_name = "pipelines"


def add_flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """A job flag: ``--lid-threshold``; parse_job_args also takes ``--lid_threshold``, as templates
    pass it."""
    parser.add_argument(f"--{name}", dest=name.replace("-", "_"), **kwargs)


def parse_job_args(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The job's own flags, and the rest for Beam's PipelineOptions; a UsageError for a flag that
    neither knows (Beam would only log a warning and run with its default)."""
    ours = {s for a in parser._actions for s in a.option_strings if s.startswith("--")}
    spelled = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        dashed = name.replace("_", "-")
        spelled.append(dashed + eq + value if name.startswith("--") and name not in ours and dashed in ours else arg)
    known, rest = parser.parse_known_args(spelled)
    check_beam_flags(rest, sorted(ours))
    return known, rest


def check_beam_flags(args: list[str], job_flags: list[str]) -> None:
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    classes = {}
    for cls in PipelineOptions.__subclasses__():
        classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(args)
    if not unknown:
        return
    known = job_flags + [s for a in parser._actions for s in a.option_strings]
    problems = []
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1) if name.startswith("-") else []
        problems.append(f"{arg}" + (f" (did you mean {close[0]}?)" if close else ""))
    raise UsageError(f"unknown flag or argument: {', '.join(problems)}; see --help")


def job_parser(job: str, description: str, inputs: str) -> argparse.ArgumentParser:
    """A writing job's parser with its --input and --output; the job adds its own flags."""
    p = argparse.ArgumentParser(
        prog=f"pretokenize {job}",
        description=description,
        epilog="Any other flag is passed to Beam's PipelineOptions, e.g. --runner=FnApiRunner "
        "--direct_running_mode=multi_processing --direct_num_workers=2.",
    )
    add_flag(p, "input", required=True, help=f"glob, file or directory of {inputs}; local or fsspec URL")
    add_flag(p, "output", required=True, help="output directory; local or fsspec URL (gs://, s3://)")
    add_flag(p, "restart", action="store_true",
             help="redo every input unit: discard the work an interrupted run into this output saved "
             "(by default a re-run with the same input and settings resumes from it)")
    return p


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of every job that reads documents and publishes a tree."""
    add_flag(parser, "on-bad-record", default="fail", choices=("fail", "skip"),
             help="a record that cannot be read (bad JSON or UTF-8, null or mistyped field, bad id): "
             "stop naming it, or drop and count it")


def new_run_id() -> str:
    """Names the run's temporary directory; never part of the output's bytes."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def prepare_output(output: str, kind: str, inputs: list[str] = (), keep: tuple[str, ...] = (),
                   work: resume.WorkDescription | None = None, restart: bool = False) -> resume.SavedWork | None:
    """Check the output at launch, claim it, and remove what runs that died before publishing left,
    but the work this run can resume from; returns that work (None without a ``work`` description).

    The output must be empty, missing, or a tree of ``kind`` this tool wrote (shards.tree: a run
    into anything else is refused, naming a file that is not ours), and no input file may lie
    inside it. Leftovers are the entries of the tree's temporary directory, but those named in
    ``keep`` (a pending removal's journal) and the saved work made for the same description
    (transforms.core.resume), unless ``restart``. Saved work made for another description is
    removed with a one-line warning saying what changed. Two runs into one output at the same time
    are not supported; this is where they would collide.
    """
    import logging

    log = logging.getLogger(log_name)
    for path in inputs:
        if tree.inside(path, output):
            raise UsageError(f"--input {path} is inside --output {output}; write the output elsewhere")
    try:
        tree.claim(output, kind)
    except tree.NotOurTreeError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"--output {output} cannot be written: {e}") from None
    fs, root = storage.filesystem(output)
    temp_root = f"{root.rstrip('/')}/{layout.TEMP_DIR_NAME}"
    saved = resume.SavedWork(output, work) if work is not None else None
    if fs.isdir(temp_root):
        for leftover in fs.ls(temp_root, detail=False):
            name = posixpath.basename(leftover.rstrip("/"))
            if name in keep:
                continue
            if saved is not None and name == saved.dir_name and not restart:
                continue
            if not name.startswith(resume.WORK_PREFIX):
                log.warning("removing %s, left by an interrupted run", leftover)
            elif saved is not None and name == saved.dir_name:
                log.warning("starting afresh (--restart): removing the work an earlier run saved in %s", leftover)
            else:
                old = resume.read_description(storage.unstrip(fs, leftover, output))
                why = (work.difference(old) if work is not None and old is not None else "") or "its settings differ"
                log.warning("starting afresh: %s since the earlier run; removing the work it saved in %s", why,
                            leftover)
            fs.rm(leftover, recursive=True)
    try:
        fs.makedirs(temp_root, exist_ok=True)
        if saved is not None:
            saved.done = saved.done_units()
            saved.begin()
    except OSError as e:
        full = no_space_message(e)
        if saved is not None and not saved.done:
            with contextlib.suppress(OSError):
                fs.rm(storage.filesystem(saved.url)[1], recursive=True)
        if full is not None:
            raise RunStopped(f"{full} ({output}); nothing was published and the previous output is intact") from None
        raise UsageError(f"--output {output} cannot be written: {e}") from None
    if saved is not None and saved.done:
        log.warning("resuming: %d of %d input units were finished by an earlier run and are not redone "
                    "(--restart redoes them)", len(saved.done), len(work.inputs))
    return saved


@contextlib.contextmanager
def launching():
    """Errors of the launch (settings checked, input planned, output prepared) as UsageErrors;
    bad input found there stays a BadInputError."""
    from transforms.core.records import BadInputError

    try:
        yield
    except (UsageError, BadInputError):
        raise
    except (ValueError, OSError, ImportError) as e:
        raise UsageError(str(e) or type(e).__name__) from e


def drop_lines(raw: int, kept: int, drops: dict[str, int]) -> list[str]:
    lines = [f"documents read {raw:,}, kept {kept:,}, dropped {sum(drops.values()):,}"]
    lines += [f"  dropped ({reason}): {n:,}" for reason, n in drops.items()]
    return lines


def timing_lines(tokens: int, seconds: float, output: str) -> list[str]:
    rate = tokens / seconds if seconds > 0 else 0.0
    return [f"wall time {seconds:.1f} s, {rate:,.0f} tokens/s", f"output: {output}"]


class RunStopped(Exception):
    """A run that failed or was interrupted, said in one line: what happened and what the output
    holds now. The run's temporary files are gone by the time it is raised, but the work of the
    input units it finished (transforms.core.resume), which the line mentions."""


def abandon_run(output: str, run_id: str) -> tuple[bool, int]:
    """Delete a failed run's temporary directory; whether it had begun publishing (then the tree
    is unfinished, no longer the previous output), and how many finished input units its saved
    work keeps for a re-run to resume from (saved work with none is deleted too)."""
    fs, root = storage.filesystem(output)
    run_dir = posixpath.join(root.rstrip("/"), layout.TEMP_DIR_NAME, run_id)
    published = fs.exists(posixpath.join(run_dir, "publishing"))
    if fs.exists(run_dir):
        fs.rm(run_dir, recursive=True)
    temp_root = posixpath.dirname(run_dir)
    kept = 0
    if fs.isdir(temp_root):
        for entry in fs.ls(temp_root, detail=False):
            if not posixpath.basename(entry.rstrip("/")).startswith(resume.WORK_PREFIX):
                continue
            done = len(resume.done_units(storage.unstrip(fs, entry, output)))
            if done:
                kept += done
            else:
                fs.rm(entry, recursive=True)
    if fs.isdir(temp_root) and not fs.ls(temp_root):
        fs.rmdir(temp_root)
    return published, kept


def kept_work_note(kept: int) -> str:
    if not kept:
        return "the run's temporary files were deleted"
    return (f"the work of {kept} finished input unit{'s' if kept != 1 else ''} is kept: the same command resumes "
            "from it (--restart discards it)")


_NO_SPACE = re.compile(r"\[Errno 28\] No space left on device(?:: '([^']*)')?")


def no_space_message(error: BaseException) -> str | None:
    """'no space left on device (writing PATH)' when a full disk is behind ``error``, even inside a
    runner's error text."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            where = f" writing {error.filename}" if error.filename else ""
            return f"no space left on device{where}"
        m = _NO_SPACE.search(str(error))
        if m:
            return "no space left on device" + (f" writing {m.group(1)}" if m.group(1) else "")
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def _noting_interrupts(noted: list):
    """Ctrl-C still raises KeyboardInterrupt, but is also noted in ``noted``: a runner may turn the
    exception into its own error (RuntimeError: KeyboardInterrupt [while running ...])."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum, frame):
        noted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def parse_settings(parser: argparse.ArgumentParser, argv: list[str], settings_cls, integers: tuple[str, ...] = ()):
    """The job's settings object from its flags (``integers`` may be given as 1.5e9), and Beam's
    PipelineOptions from the rest."""
    ours, beam_args = parse_job_args(parser, argv)
    values = vars(ours)
    for name in integers:
        values[name] = int(values[name])
    return settings_cls(**values), PipelineOptions(beam_args)


def read_stats(output: str):
    """The stats a finished tree published (DatasetStats or ScaffoldStats)."""
    return tree.OutputTree.open(storage.normalize(output)).stats()


def run_job(
    argv: list[str],
    parse_args: Callable[[list[str]], tuple[Any, PipelineOptions]],
    build: Callable[[beam.Pipeline, Any, str], Any],
    summary_table: Callable[[Any, str, float], str],
):
    """Parse, run, then print the summary of the stats the job published; returns the stats.

    What fails before the pipeline starts (a flag, a setting, a path, a tokenizer that will not
    load) is a UsageError: the CLI says it in one line. A run that fails or is interrupted (Ctrl-C)
    has its temporary files deleted; a full disk or an interruption becomes a RunStopped that says
    whether the previous output is intact.
    """
    start = time.monotonic()
    run_id = new_run_id()
    with launching():
        options, pipeline_options = parse_args(argv)
        pipeline = beam.Pipeline(options=pipeline_options)
        build(pipeline, options, run_id)
    output = storage.normalize(options.output)
    result = None
    interrupted = []
    try:
        with _noting_interrupts(interrupted):
            result = pipeline.run()
            result.wait_until_finish()
    except BaseException as e:
        interrupted = interrupted or isinstance(e, KeyboardInterrupt)
        if result is not None and interrupted:
            with contextlib.suppress(Exception):
                result.cancel()
        published, kept = abandon_run(output, run_id)
        state = (
            f"the output is unfinished (publishing had begun, so it has no {layout.STATS_NAME}): run the same "
            "command again"
            if published
            else "nothing was published and the previous output is intact"
        )
        if interrupted:
            raise RunStopped(f"interrupted; {state}; {kept_work_note(kept)}") from None
        full = no_space_message(e)
        if full is not None:
            raise RunStopped(f"{full} ({output}); {state}; {kept_work_note(kept)}") from None
        if kept:
            import logging

            logging.getLogger(log_name).warning("the run failed; %s", kept_work_note(kept))
        raise
    seconds = time.monotonic() - start
    stats = read_stats(options.output)
    print(summary_table(stats, storage.normalize(options.output), seconds), flush=True)
    return stats
