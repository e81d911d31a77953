"""A job's command line: its flags, parsed into its settings object and Beam's PipelineOptions.

A flag spelled with dashes (``--batch-docs``) is also taken with underscores, as templates
pass it; a flag neither the job nor Beam knows is an error naming the closest one (Beam alone
would only log a warning). ``--workers N`` becomes Beam's flags for N local worker processes.
Nothing here imports Beam before the job's own flags are parsed: ``--help`` imports none of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from typing import TYPE_CHECKING, Any

from pipelines.beam_flags import beam_flag, beam_flag_names, beam_options, surely_unknown
from pipelines.engines import engine_flags
from pipelines.help_format import DefaultsHelpFormatter
from pipelines.run_mode import Workers, is_local_runner, runner_class
from shards import lock
from transforms.core.records import UsageError
from transforms.core.settings import (
    CHOICES,
    FLAGS,
    HELP,
    MANY,
    METAVAR,
    REPEATED,
    REQUIRED,
    SPELLED,
    flag_fields,
    spelled_as_float,
)
from transforms.inputs.discover import expand_pattern
from transforms.inputs.registry import input_help

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions


def add_flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """A job flag: ``--batch-docs``; parse_job_args also takes ``--batch_docs``, as templates
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
    """Beam's flags, with those ``--workers`` stands for and those a Flink or Spark runner takes by
    default (pipelines/engines.py); takes --workers and --plan out of ``known``."""
    if hasattr(known, "workers"):
        rest = rest + worker_flags(known.workers, rest)
        del known.workers
    given = {arg[2:].partition("=")[0] for arg in rest if arg.startswith("--")}
    rest = engine_flags(beam_flag(rest, "runner"), given) + rest
    if hasattr(known, "plan"):  # run_job reads it from the command line (wants_plan)
        del known.plan
    if hasattr(known, "break_lock"):  # the command's lock scope reads it from the command line (shards.lock)
        del known.break_lock
    return rest


def check_beam_flags(args: list[str], job_flags: list[str]) -> None:
    """A UsageError naming the arguments in ``args`` that neither the job (``job_flags``) nor Beam
    knows, or a value Beam's parser refuses. A flag no Beam source spells is refused before Beam is
    imported (pipelines/beam_flags.py); the rest by Beam's own parser, which imports it."""
    refuse_surely_unknown(args, job_flags)
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    # A value it refuses is a UsageError said in one line, not argparse's usage and exit: the
    # progress bars may be up (run_job checks these flags once the input is planned).
    parser = _BeamArgumentParser(allow_abbrev=False, exit_on_error=False)
    classes = {}
    for cls in PipelineOptions.__subclasses__():
        classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)
    try:
        _, unknown = parser.parse_known_args(args)
    except argparse.ArgumentError as e:
        raise UsageError(f"{e}; see --help") from None
    if not unknown:
        return
    _refuse_unknown(unknown, job_flags + [s for a in parser._actions for s in a.option_strings])


def refuse_surely_unknown(args: list[str], job_flags: list[str]) -> None:
    """A UsageError for the flags in ``args`` that no Beam source spells, without importing Beam."""
    unknown = surely_unknown(args)
    if unknown:
        _refuse_unknown(unknown, job_flags + list(beam_flag_names()))


def _refuse_unknown(unknown: list[str], known: list[str]) -> None:
    problems = []
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1) if name.startswith("-") else []
        problems.append(f"{arg}" + (f" (did you mean {close[0]}?)" if close else ""))
    raise UsageError(f"unknown flag or argument: {', '.join(problems)}; see --help")


def job_parser(job: str, description: str, read_options: tuple[str, ...] = (),
               resumable: bool = True) -> argparse.ArgumentParser:
    """A writing job's parser with its --input and --output, --workers, and (``resumable``: the jobs
    that run through run_job and save their work per input unit) --plan and --restart; the job adds
    its own flags. --input's help lists the formats the input registry reads with the job's
    ReadConfig ``read_options`` set (transforms.inputs.registry.input_help)."""
    inputs = input_help(read_options)
    p = argparse.ArgumentParser(
        prog=f"pretokenize {job}",
        description=description,
        epilog="Any other flag is passed to Beam's PipelineOptions, e.g. --runner=FnApiRunner "
        "--direct_running_mode=multi_processing --direct_num_workers=2 (what --workers 2 says).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_flag(p, "input", required=True, help=f"glob, file or directory of {inputs} files; local or fsspec URL")
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


def parse_plain_settings(parser: argparse.ArgumentParser, argv: list[str], settings_cls):
    """The settings of a plain tool (no pipeline, no Beam flags) from its flags; a bad value the
    settings refuse is said as argparse says a bad flag (usage and one line, exit 2)."""
    values = vars(parser.parse_args(argv))
    values.pop("break_lock", None)  # the command's lock scope reads it from the command line (shards.lock)
    try:
        return settings_cls(**values)
    except ValueError as e:
        parser.error(str(e))


def tool_parser(job: str, description: str) -> argparse.ArgumentParser:
    """The parser of a tool over a finished tree that runs a pipeline (remove, verify); it adds its flags."""
    return argparse.ArgumentParser(
        prog=f"pretokenize {job}",
        description=description,
        epilog="Other flags go to Beam's PipelineOptions (--runner, ...).",
        formatter_class=DefaultsHelpFormatter,
    )


def add_break_lock_flag(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "break-lock", action="store_true", help=lock.BREAK_HELP)


def add_workers_flag(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "workers", type=int, default=None,
             help="run locally with this many worker processes (the FnApiRunner in multi_processing "
             "mode); the default is one in-process worker")


def worker_flags(workers: int | None, beam_args: list[str]) -> list[str]:
    """Beam's flags for ``--workers N``: the FnApiRunner with N worker processes. A UsageError for
    N < 1, for a runner that is not local, and beside Beam's own flags for the same thing."""
    if workers is None:
        return []
    if workers < 1:
        raise UsageError(f"--workers must be at least 1 (got {workers})")
    runner = beam_flag(beam_args, "runner")
    if not is_local_runner(runner):
        raise UsageError(f"--workers is for a local run; --runner={runner} has its own worker flags "
                         "(e.g. --num_workers, --max_num_workers on Dataflow)")
    for name in ("direct_num_workers", "direct_running_mode"):
        if beam_flag(beam_args, name) is not None:
            raise UsageError(f"--workers {workers} and --{name} both say how to run locally; give one")
    flags = [] if runner is not None and runner_class(runner) == "FnApiRunner" else ["--runner=FnApiRunner"]
    if runner is not None and runner_class(runner) not in ("FnApiRunner", "DirectRunner"):
        raise UsageError(f"--workers runs the FnApiRunner; --runner={runner} is another one")
    return flags + ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]


def add_setting_flags(parser: argparse.ArgumentParser, settings_cls, names: tuple[str, ...] | None = None) -> None:
    """The flags of the fields ``names`` of a settings dataclass (all that have one, in their order,
    without ``names``), generated from the fields (transforms.core.settings): read off the class, so
    that ``--help`` builds no settings object (whose checks import the steps, and Beam)."""
    fields = flag_fields(settings_cls)
    for name in names if names is not None else tuple(fields):
        spellings, kwargs = _flag_of(name, fields[name])
        parser.add_argument(*spellings, **kwargs)


def _flag_of(name: str, field) -> tuple[tuple[str, ...], dict]:
    """The spellings of the flag of settings field ``name`` and add_argument's other arguments."""
    meta, default = field.metadata, field.default
    kwargs = {"help": meta[HELP]}
    if meta[METAVAR] is not None:
        kwargs["metavar"] = meta[METAVAR]
    if meta[MANY]:
        kwargs["nargs"] = "+"
    spellings = meta[FLAGS] if meta[FLAGS] is not None else (f"--{name.replace('_', '-')}",)
    if spellings:  # a flag; a positional argument is named by its field
        kwargs["dest"] = name
    else:
        spellings = (name,)
    if isinstance(default, bool):
        return spellings, {**kwargs, "action": "store_true"}
    if meta.get(REPEATED):  # the settings object makes the list a tuple
        return spellings, {**kwargs, "action": "append", "default": [], "type": str}
    kwargs["type"] = meta[SPELLED] or (str if default in (None, REQUIRED) else type(default))
    if meta[CHOICES] is not None:
        kwargs["choices"] = list(meta[CHOICES])
    if default is not REQUIRED:
        kwargs["default"] = default
    elif spellings[0].startswith("-"):
        kwargs["required"] = True
    return spellings, kwargs


@dataclasses.dataclass(frozen=True)
class BeamArgs:
    """Beam's flags of a job's run, held without importing Beam: where its workers run
    (``workers``), read off them, and its PipelineOptions once a run needs them (``options``:
    Beam imported, the flags as ``given`` checked by its own parser first). Or options built
    already (``built``: the Python API's)."""

    given: tuple[str, ...] = ()  # as the command line gave them
    args: tuple[str, ...] = ()  # with the flags --workers stands for, and a runner's defaults
    job_flags: tuple[str, ...] = ()  # the job's own, named by a did-you-mean
    built: Any = None

    @property
    def workers(self) -> Workers:
        return Workers.of_options(self.built) if self.built is not None else Workers.of_args(list(self.args))

    def options(self) -> PipelineOptions:
        if self.built is not None:
            return self.built
        check_beam_flags(list(self.given), list(self.job_flags))
        return beam_options("PipelineOptions")(list(self.args))


def parse_settings(parser: argparse.ArgumentParser, argv: list[str], settings_cls,
                   input_files: bool = True) -> tuple[Any, PipelineOptions]:
    """parse_job's settings, and Beam's PipelineOptions (Beam imported) from the rest."""
    settings, beam = parse_job(parser, argv, settings_cls, input_files)
    return settings, beam.options()


def parse_job(parser: argparse.ArgumentParser, argv: list[str], settings_cls,
              input_files: bool = True) -> tuple[Any, BeamArgs]:
    """The job's settings object from its flags (those its fields say are spelled as floats may be
    given as 1.5e9), and Beam's flags from the rest, with no Beam imported.

    In the order a person wants to hear about a mistake, and cheapest first: the job's own flags,
    then (``input_files``: for a job whose ``--input`` is what it reads) that a local ``--input``
    names files (before Beam loads, and before any tokenizer), then a flag no Beam source spells,
    and the settings' own checks. A flag Beam's parser alone can judge is judged when the run asks
    for the options (BeamArgs.options)."""
    ours, given = _parse_ours(parser, argv)
    values = vars(ours)
    if input_files and values.get("input"):
        check_input(values["input"])
    job_flags = _long_flags(parser)
    refuse_surely_unknown(given, job_flags)
    args = _beam_args(ours, given)

    for name in spelled_as_float(settings_cls):
        values[name] = int(values[name])
    return settings_cls(**values), BeamArgs(tuple(given), tuple(args), tuple(job_flags))


def check_input(pattern: str) -> None:
    """A BadInputError when the local ``pattern`` names no input file, found without importing
    Beam; the readers plan the files later. A URL (gs://, s3://, hf://) is left to them: parsing
    the flags never touches the network (a template's launcher parses them offline first)."""
    if "://" in pattern:
        return

    expand_pattern(pattern)


def wants_plan(argv: list[str]) -> bool:
    """Whether the command line asks for ``--plan`` (see job_parser)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--plan", action="store_true")
    return p.parse_known_args(argv)[0].plan
