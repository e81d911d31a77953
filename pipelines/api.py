"""The Python API: each job and tool as a function that takes keyword arguments and returns an object.

    from pipelines import api

    result = api.bucketed(input="tests/data/finepdfs_sample.parquet", output="out/api-sample",
                          runner="FnApiRunner")
    result.stats.total_tokens, result.drops, result.files[:3]

A function takes the job's settings as keyword arguments of the same names as its flags (dashes
as underscores: ``--batch-docs`` is ``batch_docs``), with the same defaults and the same
checks, read from the same declarations (the job's parser, generated from its settings dataclass:
pipelines/flags.py); and how to run: ``runner`` (any Beam runner, default Beam's), ``workers``
(``--workers``), ``beam_args`` (any other Beam flag, as on the command line) and ``break_lock``.
It returns what the run made (JobResult, RemoveResult, verify.Verdict, stats.StatsWritten,
ExportResult, decode.Decoded, TrainBpeResult) and prints no summary.

A failure is one of the exceptions below, whose text is the line the command prints after
``pretokenize JOB: ``: the CLI says its errors through ``job_error``. docs/python-api.md has an
example per job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pipelines import jobs
from pipelines.beam_flags import beam_options
from pipelines.errors import RunStopped as Stopped
from pipelines.errors import bad_input_message, launching, unreachable_message
from pipelines.flags import BeamArgs, check_beam_flags, check_input, worker_flags
from pipelines.job import run_job
from pipelines.jobs import PUBLISHING
from shards import lock, storage
from shards import tokenizer_files as files
from shards.layout import CHECKSUMS_NAME
from shards.manifest import parse_checksums
from transforms.bpe.settings import TrainBpeSettings
from transforms.bucketed.settings import BucketedSettings
from transforms.core.records import UsageError as Usage
from transforms.core.settings import spelled_as_float
from transforms.scaffold.settings import ScaffoldSettings

if TYPE_CHECKING:
    import argparse

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.decode import Decoded
    from pipelines.stats import StatsWritten
    from pipelines.verify import Verdict


class PretokenizeError(Exception):
    """Any failure the command line says in one line (and exits 2 for); ``job`` names the job."""

    def __init__(self, job: str, message: str):
        super().__init__(message)
        self.job = job


class UsageError(PretokenizeError):
    """A bad argument, setting or path, a tokenizer that will not load, a tree another command
    holds: found before anything ran."""


class BadInputError(PretokenizeError):
    """The input is not what the job reads: the message names the file and the problem."""


class RunStopped(PretokenizeError):
    """A run that failed (a full disk) or was interrupted: the message says what the output holds."""


class Unreachable(PretokenizeError):
    """A store (gs://, s3://, a hub) could not be reached or refused the credentials."""


def job_error(job: str, error: BaseException) -> PretokenizeError | None:
    """The error of the API (and the line of the CLI) that ``error`` is, or None for a failure that
    is none of them (a bug: its traceback is kept)."""
    published = "; nothing was published" if job in PUBLISHING else ""
    if isinstance(error, PretokenizeError):
        return error
    if isinstance(error, Usage):
        return UsageError(job, f"{error}{published}")
    if isinstance(error, Stopped):
        return RunStopped(job, str(error))
    message = bad_input_message(error)
    if message is not None:
        return BadInputError(job, f"{message}{published}")
    message = unreachable_message(error)
    if message is not None:
        return Unreachable(job, f"{message}{published}")
    return None


@contextlib.contextmanager
def _said_as(job: str) -> Iterator[None]:
    """Errors of ``job`` raised as the API's."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - raised again, as the API's error or as it was
        error = job_error(job, e)
        if error is None:
            raise
        raise error from e


# --- Settings from keyword arguments, checked as the flags are ------------------------------------------

# The flags that say how to run, not what: the API's own arguments.
_RUN_FLAGS = ("help", "workers", "break_lock", "plan")


def check_values(parser: argparse.ArgumentParser, settings_cls, values: dict[str, Any]) -> None:
    """Keyword arguments ``values`` named as the parser's flags (with underscores), checked as
    argparse checks the flags: an unknown name, a missing required one, a value of the wrong type
    or not among the flag's choices is a UsageError saying what argparse says."""
    actions = {a.dest: a for a in parser._actions if a.dest not in _RUN_FLAGS}
    for name in values:
        if name not in actions:
            close = difflib.get_close_matches(name, actions, n=1)
            raise Usage(f"unknown argument {name!r}" + (f" (did you mean {close[0]}?)" if close else ""))
    missing = [(a.option_strings or [a.dest])[0] for a in actions.values()
               if a.required and values.get(a.dest) in (None, [], ())]
    if missing:
        raise Usage(f"the following arguments are required: {', '.join(missing)}")
    _check_groups(parser, values)
    floats = spelled_as_float(settings_cls)
    for name, value in values.items():
        _check_value(actions[name], value, name in floats)


def _check_groups(parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """A UsageError saying what argparse says of flags that exclude each other given together, or
    of none given of a group that needs one (train-bpe's --vocab-size or --merges)."""
    for group in parser._mutually_exclusive_groups:
        given = [a.option_strings[0] for a in group._group_actions if values.get(a.dest) not in (None, False)]
        if len(given) > 1:
            raise Usage(f"argument {given[1]}: not allowed with argument {given[0]}")
        if group.required and not given:
            flags = " ".join(a.option_strings[0] for a in group._group_actions)
            raise Usage(f"one of the arguments {flags} is required")


def command_line(parser: argparse.ArgumentParser, settings_cls, values: dict[str, Any], run: Run) -> list[str]:
    """The command line checked keyword ``values`` are twin to: each flag in the order given,
    ``--flag=VALUE`` (many values: ``--flag V1 V2``), a switch alone when on; a value of None and
    a switch off left out (the flag's default); then ``--workers=N``, ``--break-lock``,
    ``beam_args`` and ``--runner=R``. A job that records its command line (train-bpe) records this."""
    floats = spelled_as_float(settings_cls)
    actions = {a.dest: a for a in parser._actions}
    argv: list[str] = []
    for name, value in values.items():
        action = actions[name]
        flag = next(s for s in action.option_strings if s.startswith("--"))
        if value is None or (action.nargs == 0 and value != action.const):
            continue
        texts = [str(int(v)) if name in floats else str(_plain(v))
                 for v in (value if isinstance(value, (list, tuple)) else [value])]
        if action.nargs == 0:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *texts]
        else:
            argv.append(f"{flag}={texts[0]}")
    argv += [f"--workers={run.workers}"] if run.workers is not None else []
    argv += ["--break-lock"] if run.break_lock else []
    return argv + list(run.beam_args) + ([f"--runner={run.runner}"] if run.runner else [])


def build_settings(settings_cls, values: dict[str, Any]):
    """``settings_cls`` from checked ``values`` (check_values), through the settings' own checks."""
    floats = spelled_as_float(settings_cls)
    return settings_cls(**{k: int(v) if k in floats else _plain(v) for k, v in values.items()})


def _plain(value):
    """A path given as a ``pathlib.Path`` is its text, as the flag's would be; many values a tuple."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def _check_value(action, value, spelled_as_float: bool) -> None:
    """A UsageError saying what argparse says of a bad value of ``action``'s flag."""
    flag = action.option_strings[0] if action.option_strings else action.dest
    many = action.nargs == "+" or isinstance(action.default, list)  # --paths A B; a repeatable --keep A --keep B
    values = value if isinstance(value, (list, tuple)) and many else [value]
    for v in values:
        wanted = (int, float) if spelled_as_float else action.type
        if action.const is True and not isinstance(v, bool):  # an on/off switch
            raise Usage(f"argument {flag}: expected True or False, got {v!r}")
        if wanted in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise Usage(f"argument {flag}: invalid {wanted.__name__} value: {v!r}")
        if wanted is int and isinstance(v, float) and not v.is_integer():
            raise Usage(f"argument {flag}: invalid int value: {v!r}")
        if wanted is str and v is not None and not isinstance(v, (str, os.PathLike)):
            raise Usage(f"argument {flag}: invalid value: {v!r}")
        if action.choices is not None and v not in action.choices:
            choices = ", ".join(repr(c) for c in action.choices)
            raise Usage(f"argument {flag}: invalid choice: {v!r} (choose from {choices})")


def pipeline_options(parser: argparse.ArgumentParser, runner: str | None, workers: int | None,
                     beam_args: Sequence[str]) -> PipelineOptions:
    """Beam's options: ``runner``, ``workers`` (--workers) and ``beam_args``, checked as the flags are."""
    args = list(beam_args) + ([f"--runner={runner}"] if runner else [])
    check_beam_flags(args, sorted({s for a in parser._actions for s in a.option_strings}))
    return beam_options("PipelineOptions")(args + worker_flags(workers, args))


def _lock_scope(job: str, output: str, break_lock: bool):
    """The scope of the locks the run takes; the lock names the caller as a command would be."""
    return lock.scope(f"pipelines.api.{job}(output={output!r})", break_lock)


@dataclasses.dataclass(frozen=True)
class Run:
    """How to run a job: ``runner`` (a Beam runner's name; None: Beam's default), ``workers``
    (--workers: local worker processes), ``beam_args`` (any other Beam flag, as typed on a command
    line) and ``break_lock`` (--break-lock)."""

    runner: str | None = None
    workers: int | None = None
    beam_args: Sequence[str] = ()
    break_lock: bool = False


def _prepared(job: str, module, settings_cls, values: dict[str, Any], run: Run, input_files: bool = True):
    """The settings and Beam's options of ``job`` from keyword arguments, checked in the order and
    with the words of its flags (pipelines/flags.py parse_settings): the values, then that a local
    input names files, then Beam's flags, then the settings' own checks."""
    with launching():  # a ValueError or OSError here is about how the job was asked: a UsageError
        parser = module.make_parser()
        check_values(parser, settings_cls, values)
        if input_files and values.get("input"):
            check_input(storage_text(values["input"]))
        options = pipeline_options(parser, run.runner, run.workers, run.beam_args)
        return build_settings(settings_cls, values), options


def storage_text(value) -> str:
    """A path or URL given as text or as a ``pathlib.Path``."""
    return _plain(value)


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What a writing job (bucketed, scaffold) published: ``output``, the tree's URL; ``stats``, its
    dataset_stats.txt (shards.manifest.DatasetStats or shards.llmc.ScaffoldStats); ``files``, the
    shard files written, relative to the tree (its checksums.sha256)."""

    job: str
    output: str
    stats: Any
    files: tuple[str, ...]

    @property
    def drops(self) -> dict[str, int]:
        """The documents dropped, by reason (``language``, ``token_count``, ...)."""
        return dict(self.stats.drops)

    @property
    def documents(self) -> int:
        return self.stats.kept_documents

    @property
    def tokens(self) -> int:
        return self.stats.total_tokens


def _written(output: str) -> tuple[str, ...]:
    url = storage.join(output, CHECKSUMS_NAME)
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        return ()
    with fs.open(path, "rb") as f:
        return tuple(sorted(parse_checksums(f.read().decode("utf-8"), url)))


def _writing_job(job: str, settings_cls, values: dict[str, Any], run: Run) -> JobResult:
    module = jobs.load(job)
    with _said_as(job), _lock_scope(job, str(values.get("output")), run.break_lock):
        settings, options = _prepared(job, module, settings_cls, values, run)
        stats = run_job([], lambda _argv: (settings, BeamArgs(built=options)), module.plan_input, module.build,
                        module.summary_table, say_summary=False)
        output = storage.normalize(settings.output)
        return JobResult(job, output, stats, _written(output))


def bucketed(input: str, output: str, *, runner: str | None = None, workers: int | None = None,
             beam_args: Sequence[str] = (), break_lock: bool = False, **settings: Any) -> JobResult:
    """``pretokenize bucketed``: documents to length-bucketed token shards. ``settings``: the job's
    flags as keyword arguments (``tokenizer="gpt2"``, ``batch_docs=32``, ``restart=True``, ...;
    transforms.bucketed.settings.BucketedSettings)."""
    values = {"input": input, "output": output, **settings}
    return _writing_job("bucketed", BucketedSettings, values, Run(runner, workers, beam_args, break_lock))


def scaffold(input: str, output: str, *, runner: str | None = None, workers: int | None = None,
             beam_args: Sequence[str] = (), break_lock: bool = False, **settings: Any) -> JobResult:
    """``pretokenize scaffold``: documents to countdown-token shards in llm.c's format (train/, val/).
    ``settings``: its flags as keyword arguments (transforms.scaffold.settings.ScaffoldSettings)."""

    values = {"input": input, "output": output, **settings}
    return _writing_job("scaffold", ScaffoldSettings, values, Run(runner, workers, beam_args, break_lock))


def verify(output: str, *, runner: str | None = None, workers: int | None = None, beam_args: Sequence[str] = (),
           **settings: Any) -> Verdict | None:
    """``pretokenize verify``: the tree's problems, as a pipelines.verify.Verdict (``ok``,
    ``problems``, ``shown``, ``checked``); None for a dry run. ``settings``: ``input``, ``sample``,
    ``removal_list``, ``report`` (pipelines.verify.VerifySettings)."""
    module = jobs.load("verify")

    with _said_as("verify"):
        args, options = _prepared("verify", module, module.VerifySettings, {"output": output, **settings},
                                  Run(runner, workers, beam_args), input_files=False)
        return module.check(args, options)


@dataclasses.dataclass(frozen=True)
class RemoveResult:
    """What ``remove`` did to the tree ``output``: the documents and tokens it took out, the shard
    files it rewrote (``deleted``: those of them now empty, so gone) and the run named in removals.txt
    (None when no listed id was in the tree: nothing changed)."""

    output: str
    removed_documents: int
    removed_tokens: int
    files: tuple[str, ...]
    deleted: tuple[str, ...]
    run: str | None


def remove(output: str, removal_list: str, *, runner: str | None = None, workers: int | None = None,
           beam_args: Sequence[str] = (), break_lock: bool = False) -> RemoveResult:
    """``pretokenize remove``: the documents ``removal_list`` names taken out of a bucketed tree."""
    module = jobs.load("remove")

    values = {"output": output, "removal_list": removal_list}
    run = Run(runner, workers, beam_args, break_lock)
    with _said_as("remove"), _lock_scope("remove", str(output), break_lock):
        prepared = _prepared("remove", module, module.RemoveSettings, values, run, input_files=False)
        plan = module.run_prepared(lambda: prepared)
    url = storage.normalize(storage_text(output))
    if plan is None:
        return RemoveResult(url, 0, 0, (), (), None)
    return RemoveResult(url, plan.removed_documents, plan.removed_tokens, tuple(f.rel_path for f in plan.files),
                        tuple(f.rel_path for f in plan.files if f.tokens_after == 0), plan.run)


def stats(output: str, *, break_lock: bool = False, **settings: Any) -> StatsWritten:
    """``pretokenize stats``: the document lengths per bucket of a finished tree, as a table and a
    histogram PNG (written, by default in the tree); returns pipelines.stats.StatsWritten: ``table``,
    ``png`` (their URLs), ``text`` (the table) and ``summary`` (what --json prints). ``settings``:
    ``png``, ``table``, ``split``, ``val_fraction``, ``bins`` (pipelines.stats.StatsSettings)."""
    module = jobs.load("stats")

    values = {"output": output, **settings}
    with _said_as("stats"), _lock_scope("stats", str(output), break_lock), launching():
        parser = module.make_parser()
        check_values(parser, module.StatsSettings, values)
        return module.write_stats(build_settings(module.StatsSettings, values))


# --- The tools over a tree, and train-bpe -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What ``export`` wrote (``written``) or, with ``check=True``, found: ``output``, the tree's
    URL; ``prefixes``, each shard's Megatron prefix (relative to the tree: ``megatron/1024/p00_00000``);
    the ``sequences`` and ``tokens`` the indexes describe; ``blends``, the files for Megatron's
    ``--data-args-path`` (URLs); ``problems``, with ``check=True``, each stale or missing file in
    one line (none: the export is current)."""

    output: str
    prefixes: tuple[str, ...]
    sequences: int
    tokens: int
    blends: tuple[str, ...]
    problems: tuple[str, ...]
    written: bool


def export(output: str, target: str = "megatron", *, break_lock: bool = False, **settings: Any) -> ExportResult:
    """``pretokenize export megatron``: a Megatron-LM index and a .bin link per shard, under the
    tree's ``megatron/``. ``settings``: ``mount``, ``check`` (pipelines.export.ExportSettings)."""
    module = jobs.load("export")

    values = {"target": target, "output": output, **settings}
    with _said_as("export"), _lock_scope("export", str(output), break_lock), launching():
        check_values(module.make_parser(), module.ExportSettings, values)
        options = build_settings(module.ExportSettings, values)
        tree = module.opened(options)
        if options.check:
            indexes, problems = module.shard_indexes(tree), module.check_megatron(tree, options.mount)
        else:
            indexes, problems = module.export_megatron(tree, options.mount), []
        return ExportResult(tree.url, tuple(x.prefix for x in indexes), sum(x.sequences for x in indexes),
                            sum(x.tokens for x in indexes), tuple(module.blend_files(tree, indexes)),
                            tuple(problems), written=not options.check)


def decode(paths: str | Sequence[str], **settings: Any) -> list[Decoded]:
    """``pretokenize decode``: documents back as text, each a pipelines.decode.Decoded (``id``: a
    bucketed tree's original id, None in llm.c shards; ``text``). ``paths``: a bucketed tree, or
    llm.c shard files (in order) or split directories, one or a list. ``settings``: ``docs``,
    ``doc_id`` (``--id``), ``markers``, ``tokenizer`` (pipelines.decode.DecodeSettings)."""
    module = jobs.load("decode")

    values = {"paths": [paths] if isinstance(paths, (str, os.PathLike)) else list(paths), **settings}
    with _said_as("decode"), launching():
        check_values(module.make_parser(), module.DecodeSettings, values)
        return list(module.documents(build_settings(module.DecodeSettings, values), sys.stderr))


@dataclasses.dataclass(frozen=True)
class TrainBpeResult:
    """What ``train_bpe`` published: ``output``, the tokenizer's directory (``AutoTokenizer.
    from_pretrained`` loads it; ``--tokenizer trained:DIR`` of the jobs); ``stats``, its
    training_stats.txt (shards.tokenizer_files.TrainingStats); ``files``, the files it is; ``argv``,
    the command line its files record: ``pretokenize train-bpe`` given it writes the same bytes."""

    output: str
    stats: Any
    files: tuple[str, ...]
    argv: tuple[str, ...]


def train_bpe(input: str, output: str, *, runner: str | None = None, workers: int | None = None,
              beam_args: Sequence[str] = (), break_lock: bool = False, **settings: Any) -> TrainBpeResult | None:
    """``pretokenize train-bpe``: a BPE tokenizer learnt from documents (words counted on Beam).
    ``settings``: ``vocab_size`` or ``merges``, and its other flags (transforms.bpe.settings.
    TrainBpeSettings). The files record the command line the keywords are twin to (command_line:
    the flags in the order given). None: a dry run (``--dry_run`` in ``beam_args``) ran nothing."""
    module = jobs.load("train-bpe")

    values = {"input": input, "output": output, **settings}
    with _said_as("train-bpe"):
        with launching():
            parser = module.make_parser()
            check_values(parser, TrainBpeSettings, values)
            argv = command_line(parser, TrainBpeSettings, values, Run(runner, workers, beam_args, break_lock))
        stats = module.run(argv, say_summary=False)
    if stats is None:
        return None
    return TrainBpeResult(storage.normalize(storage_text(output)), stats, files.FILES, tuple(argv))
