"""What the jobs that write an output tree share: flags, run ids, leftovers of dead runs, running.

Each job module keeps its own options, ``build`` and summary; ``run_job`` runs one of them the
same way: parse, run the pipeline, read back the stats the job published, print the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import difflib
import errno
import posixpath
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipelines.help_format import DefaultsHelpFormatter
from shards import layout, lock, storage, tree
from transforms.core.records import UsageError

if TYPE_CHECKING:  # Beam is imported once a job is past its flags: --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.core import resume

log_name = "pipelines"


def add_flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """A job flag: ``--lid-threshold``; parse_job_args also takes ``--lid_threshold``, as templates
    pass it."""
    parser.add_argument(f"--{name}", dest=name.replace("-", "_"), **kwargs)


def parse_job_args(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The job's own flags, and the rest for Beam's PipelineOptions; a UsageError for a flag that
    neither knows (Beam would only log a warning and run with its default). ``--workers N`` (see
    add_workers_flag) becomes Beam's flags for N local worker processes."""
    known, rest = _parse_ours(parser, argv)
    check_beam_flags(rest, _long_flags(parser))
    return known, _beam_args(known, rest)


def _long_flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})


def _parse_ours(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The job's own flags (no Beam imported: ``--help`` ends here), and the rest unchecked."""
    ours = set(_long_flags(parser))
    spelled = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        dashed = name.replace("_", "-")
        spelled.append(dashed + eq + value if name.startswith("--") and name not in ours and dashed in ours else arg)
    return parser.parse_known_args(spelled)


def _beam_args(known: argparse.Namespace, rest: list[str]) -> list[str]:
    """Beam's flags, with those ``--workers`` stands for; takes --workers and --plan out of ``known``."""
    if hasattr(known, "workers"):
        rest = rest + worker_flags(known.workers, rest)
        del known.workers
    if hasattr(known, "plan"):  # run_job reads it from the command line (wants_plan)
        del known.plan
    if hasattr(known, "break_lock"):  # the command's lock scope reads it from the command line (shards.lock)
        del known.break_lock
    return rest


def check_beam_flags(args: list[str], job_flags: list[str]) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

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


def job_parser(job: str, description: str, inputs: str, resumable: bool = True) -> argparse.ArgumentParser:
    """A writing job's parser with its --input and --output, --workers, and (``resumable``: the jobs
    that run through run_job and save their work per input unit) --plan and --restart; the job adds
    its own flags."""
    p = argparse.ArgumentParser(
        prog=f"pretokenize {job}",
        description=description,
        epilog="Any other flag is passed to Beam's PipelineOptions, e.g. --runner=FnApiRunner "
        "--direct_running_mode=multi_processing --direct_num_workers=2 (what --workers 2 says).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_flag(p, "input", required=True, help=f"glob, file or directory of {inputs}; local or fsspec URL")
    add_flag(p, "output", required=True, help="output directory; local or fsspec URL (gs://, s3://)")
    add_workers_flag(p)
    add_break_lock_flag(p)
    if not resumable:
        return p
    add_flag(p, "plan", action="store_true",
             help="print the input's units and rows, the estimated tokens and core-hours (from a small sample) "
             "and the files a run would write; run nothing, write nothing")
    add_flag(p, "restart", action="store_true",
             help="redo every input unit: discard the work an interrupted run into this output saved "
             "(by default a re-run with the same input and settings resumes from it)")
    return p


# Runners that run the pipeline in this process or in processes it starts on this machine.
LOCAL_RUNNERS = ("DirectRunner", "FnApiRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "PrismRunner")


def add_break_lock_flag(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "break-lock", action="store_true", help=lock.BREAK_HELP)


def add_workers_flag(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "workers", type=int, default=None,
             help="run locally with this many worker processes (the FnApiRunner in multi_processing "
             "mode); the default is one in-process worker")


def _beam_flag(args: list[str], name: str) -> str | None:
    """The value of Beam flag ``--name`` in ``args`` (the last one given), or None."""
    value = None
    for i, arg in enumerate(args):
        flag, eq, given = arg.partition("=")
        if flag == f"--{name}":
            value = given if eq else (args[i + 1] if i + 1 < len(args) else "")
    return value


def is_local_runner(runner: str | None) -> bool:
    return runner is None or runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS


def worker_flags(workers: int | None, beam_args: list[str]) -> list[str]:
    """Beam's flags for ``--workers N``: the FnApiRunner with N worker processes. A UsageError for
    N < 1, for a runner that is not local, and beside Beam's own flags for the same thing."""
    if workers is None:
        return []
    if workers < 1:
        raise UsageError(f"--workers must be at least 1 (got {workers})")
    runner = _beam_flag(beam_args, "runner")
    if not is_local_runner(runner):
        raise UsageError(f"--workers is for a local run; --runner={runner} has its own worker flags "
                         "(e.g. --num_workers, --max_num_workers on Dataflow)")
    for name in ("direct_num_workers", "direct_running_mode"):
        if _beam_flag(beam_args, name) is not None:
            raise UsageError(f"--workers {workers} and --{name} both say how to run locally; give one")
    flags = [] if runner is not None and runner.rsplit(".", 1)[-1] == "FnApiRunner" else ["--runner=FnApiRunner"]
    if runner is not None and runner.rsplit(".", 1)[-1] not in ("FnApiRunner", "DirectRunner"):
        raise UsageError(f"--workers runs the FnApiRunner; --runner={runner} is another one")
    return flags + ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of every job that reads documents and publishes a tree."""
    add_flag(parser, "on-bad-record", default="fail", choices=("fail", "skip"),
             help="a record that cannot be read (bad JSON or UTF-8, null or mistyped field, bad id): "
             "stop naming it, or drop and count it")


def add_document_filter_flags(parser: argparse.ArgumentParser, defaults) -> None:
    """The language filter's flags and the input's field names, of every job that reads and filters
    documents as the bucketed job does (``defaults``: its settings, an InputFields). The defaults are
    the FinePDFs schema's; FineWeb is --language en --language-fields language --lid-score-field
    language_score --lid-threshold 0.65."""
    from transforms.bucketed.settings import OFF as off

    d, flag = defaults, add_flag
    flag(parser, "language", default=d.language,
         help=f"keep documents whose every --language-fields field equals this; {off}: no language filter")
    flag(parser, "lid-threshold", type=float, default=d.lid_threshold, help="minimum LID score (--lid-score-field)")
    flag(parser, "min-token-count", type=int, default=d.min_token_count,
         help="minimum source token count (--token-count-field)")
    flag(parser, "text-field", default=d.text_field, help="field of the document text")
    flag(parser, "id-field", default=d.id_field, help="field of the document id")
    flag(parser, "language-fields", default=d.language_fields,
         help="comma-separated fields that must each equal --language")
    flag(parser, "lid-score-field", default=d.lid_score_field,
         help=f"field of the LID score compared with --lid-threshold; {off}: no score check")
    flag(parser, "token-count-field", default=d.token_count_field,
         help=f"field of the source token count compared with --min-token-count; {off}: no count check")


def add_card_flags(parser: argparse.ArgumentParser) -> None:
    """The dataset card's metadata (shards/card.py) and how inputs are fingerprinted in it. For
    FinePDFs (ODC-By): --license odc-by --source-dataset HuggingFaceFW/finepdfs-edu."""
    add_flag(parser, "license", default=None,
             help="the card's license (a Hub license id, e.g. odc-by for FinePDFs); default: the hub input's "
             "card's, else unknown")
    add_flag(parser, "source-dataset", default=None,
             help="the card's source_datasets, comma-separated Hub ids (e.g. HuggingFaceFW/finepdfs-edu); "
             "default: the hub input's dataset, else none")
    add_flag(parser, "input-sha256", action="store_true",
             help="fingerprint local input files by their sha256 (read once more at launch) rather than their "
             "mtime, so that a copy of the same bytes is recorded the same")


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
    removed with a one-line warning saying what changed. Before anything changes, the output's
    lock is taken (shards.lock): a second command writing into it is refused, naming the first. A
    dry run takes no lock and changes nothing.
    """
    import logging

    from transforms.core import resume

    log = logging.getLogger(log_name)
    for path in inputs:
        if tree.inside(path, output):
            raise UsageError(f"--input {path} is inside --output {output}; write the output elsewhere")
    dry_run = dry_run_scratch() is not None
    out = tree.Tree(output)
    try:
        tree.claim(output, kind, write=False)  # refused before the lock is put into someone else's directory
        if not dry_run:
            lock.take(output, make_root=True)
        record = tree.claim(output, kind, write=not dry_run)
        # Before anything changes: every name the run may write or delete is inside the tree and
        # reached through no link (shards.tree.Tree), the temporary directory included.
        out.check_writable(record.files + record.derived, "recorded file")
        out.check_writable(sorted(tree.fixed_names() - {lock.LOCK_NAME}), "fixed file")  # the lock: shards.lock
        out.check_data_dirs(kind)
        leftovers = out.temp_entries()
    except (tree.NotOurTreeError, tree.UnsafePathError, storage.Unreachable) as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"--output {output} cannot be written: {e}") from None
    saved = resume.SavedWork(output, work) if work is not None else None
    if saved is not None:
        try:
            out.check_no_links(out.temp_name(saved.dir_name), "saved work")
        except tree.UnsafePathError as e:
            raise UsageError(str(e)) from None
    if dry_run:
        # The job is only translated: the output is checked, and nothing in it changes (an earlier
        # run's leftovers, or a real run going on into it, are left alone).
        if saved is not None:
            saved.done = set() if restart else saved.done_units()
        return saved
    for name in leftovers:
        leftover = out.url_of(out.temp_name(name), "temporary entry")
        if name in keep:
            continue
        if saved is not None and name == saved.dir_name and not restart:
            continue
        if not name.startswith(resume.WORK_PREFIX):
            log.warning("removing %s, left by an interrupted run", leftover)
        elif saved is not None and name == saved.dir_name:
            log.warning("starting afresh (--restart): removing the work an earlier run saved in %s", leftover)
        else:
            old = resume.read_description(leftover)
            why = (work.difference(old) if work is not None and old is not None else "") or "its settings differ"
            log.warning("starting afresh: %s since the earlier run; removing the work it saved in %s", why,
                        leftover)
        out.remove_dir(out.temp_name(name), "temporary entry")
    try:
        out.makedirs(out.TEMP_DIR, "temporary directory")
        if saved is not None:
            saved.done = saved.done_units()
            saved.begin()
    except OSError as e:
        full = no_space_message(e)
        if saved is not None and not saved.done:
            with contextlib.suppress(OSError):
                out.remove_dir(out.temp_name(saved.dir_name), "saved work")
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
    from transforms.core import resume

    out = tree.Tree(output)
    run_dir = out.writable(out.temp_name(run_id), "temporary entry")
    published = out.fs.exists(posixpath.join(run_dir, out.PUBLISHING_MARK))
    out.remove_dir(out.temp_name(run_id), "temporary entry")
    kept = 0
    for name in out.temp_entries():
        if not name.startswith(resume.WORK_PREFIX):
            continue
        done = len(resume.done_units(out.url_of(out.temp_name(name), "saved work")))
        if done:
            kept += done
        else:
            out.remove_dir(out.temp_name(name), "saved work")
    out.remove_temp_if_empty()
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


def defaults(settings_cls) -> argparse.Namespace:
    """The defaults of a settings dataclass, for its flags' help: read off the class, so that
    ``--help`` builds no settings object (whose checks import the steps, and Beam)."""
    import dataclasses

    return argparse.Namespace(**{f.name: f.default for f in dataclasses.fields(settings_cls)})


def parse_settings(parser: argparse.ArgumentParser, argv: list[str], settings_cls, integers: tuple[str, ...] = ()):
    """The job's settings object from its flags (``integers`` may be given as 1.5e9), and Beam's
    PipelineOptions from the rest.

    In the order a person wants to hear about a mistake, and cheapest first: the job's own flags,
    then that a local ``--input`` names files (before Beam loads, and before any tokenizer), then
    Beam's flags and the settings' own checks."""
    ours, beam_args = _parse_ours(parser, argv)
    values = vars(ours)
    if values.get("input"):
        check_input(values["input"])
    check_beam_flags(beam_args, _long_flags(parser))
    beam_args = _beam_args(ours, beam_args)
    for name in integers:
        values[name] = int(values[name])
    from apache_beam.options.pipeline_options import PipelineOptions

    return settings_cls(**values), PipelineOptions(beam_args)


def check_input(pattern: str) -> None:
    """A BadInputError when the local ``pattern`` names no input file, found without importing
    Beam; the readers plan the files later. A URL (gs://, s3://, hf://) is left to them: parsing
    the flags never touches the network (a template's launcher parses them offline first)."""
    if "://" in pattern:
        return
    from transforms.inputs.discover import expand_pattern

    expand_pattern(pattern)


def runner_name(pipeline_options: PipelineOptions) -> str:
    from apache_beam.options.pipeline_options import StandardOptions

    runner = pipeline_options.view_as(StandardOptions).runner
    return "the default local runner" if runner is None else str(runner)


def is_dry_run(pipeline_options: PipelineOptions) -> bool:
    """Whether Beam's --dry_run asks to translate the job without running it. A UsageError on a
    local runner, which would ignore it and run the whole job, and for a value Beam would
    misread (it takes any value, --dry_run=False too, as true)."""
    from apache_beam.options.pipeline_options import StandardOptions, TestOptions

    value = pipeline_options.view_as(TestOptions).dry_run
    if not value:
        return False
    if str(value).lower() in ("false", "0", "no", "off"):
        raise UsageError(f"--dry_run={value}: Beam takes any value as true; leave the flag out for a real run")
    if is_local_runner(pipeline_options.view_as(StandardOptions).runner):
        raise UsageError(f"--dry_run is for a remote runner (--runner=DataflowRunner): {runner_name(pipeline_options)} "
                         "would ignore it and run the whole job; --plan shows what a run would do")
    return True


def progress_dir(pipeline_options: PipelineOptions, run_id: str | None) -> str | None:
    """Where a local run's workers share their progress (transforms.core.progress), so a log line
    says how much of the whole job is done; None on a remote runner, whose UI shows progress.
    run_job removes it when the run ends."""
    import os
    import tempfile

    from apache_beam.options.pipeline_options import StandardOptions

    if run_id is None or not is_local_runner(pipeline_options.view_as(StandardOptions).runner):
        return None
    return os.path.join(tempfile.gettempdir(), f"pretokenize-progress-{run_id}")


def announce_write_stages(progress_dir: str | None, units, done: set[int], encode_step: str, encoding: str) -> None:
    """The display's stages of a writing job (pipelines/progress_display.py): reading and
    ``encoding`` the input units not ``done`` at launch (their planned rows, or units), then
    writing the tokens the ``encode_step`` step made."""
    from transforms.core.progress import Stage, announce_stages
    from transforms.inputs.units import planned_work

    planned = planned_work([u for i, u in enumerate(units) if i not in done])
    announce_stages(progress_dir, [
        Stage(f"read and {encoding}", "read", planned.keys, planned.what, total=planned.total),
        Stage("write", "write", ("tokens",), "tokens", total_step=encode_step, total_keys=("tokens",)),
    ])


@contextlib.contextmanager
def showing_progress(pipeline_options: PipelineOptions, run_id: str, stages=None,
                     ending: tuple[str, str] = ("publishing", "published")):
    """The job run inside shows its progress (pipelines/progress_display.py) on a local runner:
    its workers share their totals in progress_dir() (named to them by the environment, which a
    worker process inherits), and the display draws the stages announced there (``stages``, or
    those the job's build announced). Nothing on a remote runner, whose UI shows progress."""
    import os

    from transforms.core.progress import SHARED_ENV, announce_stages

    shared = progress_dir(pipeline_options, run_id)
    if shared is None:
        yield
        return
    with contextlib.suppress(OSError):  # the workers' Progress writes into it, never creates it
        os.makedirs(shared, exist_ok=True)
    if stages:
        announce_stages(shared, stages)
    from pipelines.progress_display import JobDisplay

    previous = os.environ.get(SHARED_ENV)
    os.environ[SHARED_ENV] = shared
    try:
        with JobDisplay(shared, ending=ending):
            yield
    finally:
        if previous is None:
            os.environ.pop(SHARED_ENV, None)
        else:
            os.environ[SHARED_ENV] = previous
        _remove_progress(pipeline_options, run_id)


def read_stats(output: str):
    """The stats a finished tree published (DatasetStats or ScaffoldStats)."""
    return tree.OutputTree.open(storage.normalize(output)).stats()


def _remove_progress(pipeline_options: PipelineOptions, run_id: str) -> None:
    import shutil

    shared = progress_dir(pipeline_options, run_id)
    if shared is None:
        return
    # Renamed first: a worker's late share (its sharing thread) names the old path and, never
    # creating it, writes nothing; so nothing lands in the directory while it is being removed.
    import os

    gone = f"{shared}.removed"
    with contextlib.suppress(OSError):
        os.rename(shared, gone)
    for _ in range(3):
        shutil.rmtree(gone, ignore_errors=True)
        if not os.path.exists(gone):
            break
    shutil.rmtree(shared, ignore_errors=True)


def wants_plan(argv: list[str]) -> bool:
    """Whether the command line asks for ``--plan`` (see job_parser)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--plan", action="store_true")
    return p.parse_known_args(argv)[0].plan


def run_job(
    argv: list[str],
    parse_args: Callable[[list[str]], tuple[Any, PipelineOptions]],
    build: Callable[[beam.Pipeline, Any, str], Any],
    summary_table: Callable[[Any, str, float], str],
    plan: Callable[[Any], str] | None = None,
):
    """Parse, run, then print the summary of the stats the job published; returns the stats.

    What fails before the pipeline starts (a flag, a setting, a path, a tokenizer that will not
    load) is a UsageError: the CLI says it in one line. A run that fails or is interrupted (Ctrl-C)
    has its temporary files deleted; a full disk or an interruption becomes a RunStopped that says
    whether the previous output is intact. Inside submit_only() (a Flex Template's launcher) it
    returns None once the runner has the job, and prints where its finished output will appear.
    With ``--plan``, ``plan(settings)`` is printed instead, and nothing runs (pipelines/plan.py).
    """
    start = time.monotonic()
    run_id = new_run_id()
    with launching():
        options, pipeline_options = parse_args(argv)
        if plan is not None and wants_plan(argv):
            print(plan(options), flush=True)
            return None
        dry_run = is_dry_run(pipeline_options)
        import apache_beam as beam

        pipeline = beam.Pipeline(options=pipeline_options)
        with building(dry_run):
            build(pipeline, options, run_id)
    output = storage.normalize(options.output)
    result = None
    interrupted = []
    try:
        with _noting_interrupts(interrupted), showing_progress(pipeline_options, run_id):
            result = pipeline.run()
            if _SUBMIT_ONLY.get():
                print(submitted_line(result, output, pipeline_options), flush=True)
                if not dry_run:
                    print(f"warning: the job outlives this launcher, which frees its lock on {output} now: until "
                          f"{layout.STATS_NAME} appears, start no other command that writes there", flush=True)
                return None
            if dry_run:
                print(end_dry_run(output, pipeline_options), flush=True)
                return None
            result.wait_until_finish()
    except BaseException as e:
        if dry_run:
            raise  # it wrote nothing into the output, and must remove nothing there (a real run may be writing)
        _remove_progress(pipeline_options, run_id)
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
    _remove_progress(pipeline_options, run_id)
    seconds = time.monotonic() - start
    stats = read_stats(options.output)
    print(summary_table(stats, storage.normalize(options.output), seconds), flush=True)
    return stats


# While a --dry_run job is built: a local scratch directory for what building must write (a pending
# removal's id list), so that prepare_output and the job's build change nothing in the output.
_DRY_RUN = contextvars.ContextVar("dry_run", default=None)


@contextlib.contextmanager
def building(dry_run: bool):
    """The job is built inside. For a dry run (``dry_run``), launching leaves the output as it is,
    and dry_run_scratch() is a local directory, deleted once the job is built (a dry run's job is
    translated, never run, so nothing reads what was written there afterwards)."""
    with tempfile.TemporaryDirectory(prefix="pretokenize-dry-run-") if dry_run else contextlib.nullcontext() as scratch:
        token = _DRY_RUN.set(scratch)
        try:
            yield
        finally:
            _DRY_RUN.reset(token)


def dry_run_scratch() -> str | None:
    """Inside building() for a dry run, where to write what the build needs; else None."""
    return _DRY_RUN.get()


def end_dry_run(output: str, pipeline_options: PipelineOptions) -> str:
    """The line a dry run ends with, its job translated."""
    return (f"dry run: the job was translated for {runner_name(pipeline_options)} and not submitted; "
            f"nothing was written to {output}")


# Set by submit_only(): run_job returns once the runner has accepted the job.
_SUBMIT_ONLY = contextvars.ContextVar("submit_only", default=False)


@contextlib.contextmanager
def submit_only():
    """Runs started inside return as soon as the runner has the job, without waiting for it to
    finish or printing its summary: a Dataflow Flex Template's launcher (deploy/dataflow/main.py).
    The launcher is a short-lived program that Dataflow waits on; one that waited for the whole job
    would hold the launch open for hours and time out (deploy/README.md)."""
    token = _SUBMIT_ONLY.set(True)
    try:
        yield
    finally:
        _SUBMIT_ONLY.reset(token)


def submitted_line(result, output: str, pipeline_options: PipelineOptions) -> str:
    """What a launcher that does not wait says: the job, and where to see that it has finished.

    A Flex Template's launcher may have the runner write the job to ``--template_location`` for
    Dataflow to start, instead of submitting it: that result has no job id (and waiting on it would
    fail), so the line names the file instead."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, TestOptions

    if pipeline_options.view_as(TestOptions).dry_run:
        return "--dry_run: the job was translated, not submitted"
    finished = f"{storage.join(output, layout.STATS_NAME)} appears when it has finished"
    template = pipeline_options.view_as(GoogleCloudOptions).template_location
    if template:
        return f"wrote the job to {template} for Dataflow to start, not waiting for it: {finished}"
    job_id = result.job_id() if getattr(result, "has_job", False) else None
    return f"submitted {f'job {job_id}' if job_id else 'the job'}, not waiting for it: {finished}"
