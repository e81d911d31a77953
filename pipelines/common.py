"""What the jobs that write an output tree share: flags, run ids, leftovers of dead runs, running.

Each job module keeps its own options, ``build`` and summary; ``run_job`` runs one of them the
same way: parse, run the pipeline, read back the stats the job published, print the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import time
import uuid
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from shards import layout, storage
from transforms.records import UsageError

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


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of every job that reads documents and publishes a tree."""
    add_flag(parser, "on-bad-record", default="fail", choices=("fail", "skip"),
             help="a record that cannot be read (bad JSON or UTF-8, null or mistyped field, bad id): "
             "stop naming it, or drop and count it")
    # Tests only (see ShardConfig.test_fail_first_attempts, test_publish_delay); not in --help.
    add_flag(parser, "test-fail-first-attempts", type=int, default=0, help=argparse.SUPPRESS)
    add_flag(parser, "test-publish-delay", type=float, default=0.0, help=argparse.SUPPRESS)


def new_run_id() -> str:
    """Names the run's temporary directory; never part of the output's bytes."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def prepare_output(output: str, other_format: Callable[[str], bool] | None = None) -> None:
    """Check the output at launch, and remove what runs that died before publishing left there.

    The output must be a directory (or not exist yet) that this process can write, and must not
    hold a finished tree of the other job's format (``other_format(stats_text)`` says which).
    Two runs into one output at the same time are not supported; this is where they would collide.
    """
    import logging

    fs, root = storage.filesystem(output)
    root = root.rstrip("/") or "/"
    if fs.exists(root) and not fs.isdir(root):
        raise UsageError(f"--output {output} is a file, not a directory")
    stats = f"{root}/{layout.STATS_NAME}"
    if other_format is not None and fs.exists(stats) and other_format(fs.cat_file(stats).decode("utf-8", "replace")):
        raise UsageError(
            f"--output {output} holds the other job's output (see its {layout.STATS_NAME}); "
            "write to another directory or delete it first"
        )
    temp_root = f"{root}/{layout.TEMP_DIR_NAME}"
    if fs.isdir(temp_root):
        for leftover in fs.ls(temp_root, detail=False):
            logging.getLogger(log_name).warning("removing %s, left by an interrupted run", leftover)
            fs.rm(leftover, recursive=True)
    try:
        fs.makedirs(temp_root, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output {output} cannot be written: {e}") from None


@contextlib.contextmanager
def launching():
    """Errors of the launch (settings checked, input planned, output prepared) as UsageErrors;
    bad input found there stays a BadInputError."""
    from transforms.records import BadInputError

    try:
        yield
    except (UsageError, BadInputError):
        raise
    except (ValueError, OSError, ImportError) as e:
        raise UsageError(str(e) or type(e).__name__) from e


def read_text(output: str, name: str) -> str:
    fs, root = storage.filesystem(storage.normalize(output))
    with fs.open(f"{root.rstrip('/')}/{name}", "r", encoding="utf-8") as f:
        return f.read()


def drop_lines(raw: int, kept: int, drops: dict[str, int]) -> list[str]:
    lines = [f"documents read {raw:,}, kept {kept:,}, dropped {sum(drops.values()):,}"]
    lines += [f"  dropped ({reason}): {n:,}" for reason, n in drops.items()]
    return lines


def timing_lines(tokens: int, seconds: float, output: str) -> list[str]:
    rate = tokens / seconds if seconds > 0 else 0.0
    return [f"wall time {seconds:.1f} s, {rate:,.0f} tokens/s", f"output: {output}"]


def run_job(
    argv: list[str],
    parse_args: Callable[[list[str]], tuple[Any, PipelineOptions]],
    build: Callable[[beam.Pipeline, Any], Any],
    read_stats: Callable[[str], Any],
    summary_table: Callable[[Any, str, float], str],
):
    """Parse, run, then print the summary of the stats the job published; returns the stats.

    What fails before the pipeline starts (a flag, a setting, a path, a tokenizer that will not
    load) is a UsageError: the CLI says it in one line.
    """
    start = time.monotonic()
    with launching():
        options, pipeline_options = parse_args(argv)
        pipeline = beam.Pipeline(options=pipeline_options)
        build(pipeline, options)
    pipeline.run().wait_until_finish()
    seconds = time.monotonic() - start
    stats = read_stats(options.output)
    print(summary_table(stats, storage.normalize(options.output), seconds), flush=True)
    return stats
