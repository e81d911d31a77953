"""What the jobs that write an output tree share: flags, run ids, leftovers of dead runs, running.

Each job module keeps its own options, ``build`` and summary; ``run_job`` runs one of them the
same way: parse, run the pipeline, read back the stats the job published, print the summary.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from shards import layout, storage

log_name = "pipelines"


def add_flag(parser: argparse.ArgumentParser, name: str, **kwargs) -> None:
    """``--lid-threshold`` on the command line, and ``--lid_threshold`` as templates pass it."""
    parser.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"), **kwargs)


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


def clear_interrupted_runs(output: str) -> None:
    """Remove what runs that died before publishing left in the output's temporary directory.

    Two runs into one output at the same time are not supported; this is where they would collide.
    """
    import logging

    fs, root = storage.filesystem(output)
    temp_root = f"{root.rstrip('/')}/{layout.TEMP_DIR_NAME}"
    if fs.isdir(temp_root):
        for leftover in fs.ls(temp_root, detail=False):
            logging.getLogger(log_name).warning("removing %s, left by an interrupted run", leftover)
            fs.rm(leftover, recursive=True)


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
    """Parse, run, then print the summary of the stats the job published; returns the stats."""
    options, pipeline_options = parse_args(argv)
    start = time.monotonic()
    with beam.Pipeline(options=pipeline_options) as pipeline:
        build(pipeline, options)
    seconds = time.monotonic() - start
    stats = read_stats(options.output)
    print(summary_table(stats, storage.normalize(options.output), seconds), flush=True)
    return stats
