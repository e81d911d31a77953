"""The verifier: checks an output tree against its format, and optionally against its source.

    pretokenize verify --output out/ [--input 'data/*.parquet' [--sample 0.1]] [--runner ...]

Exits 0 when the tree is right, 1 with a report of each problem (file, document, what is wrong)
otherwise, and prints a one-line verdict either way.

A check never writes where it reads: the tree may be a read-only mount or a full disk. The Beam
job's report goes to ``--report`` when given; else under Beam's ``--temp_location`` (a runner's
workers, on Dataflow say, cannot see the launcher's disk); else to a local temporary directory.
Those last two are removed afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING

from pipelines.errors import launching, stopped_line
from pipelines.flags import add_setting_flags, add_workers_flag, parse_settings, tool_parser
from pipelines.job import stopping, wait_for
from pipelines.launch import new_run_id
from pipelines.progress import showing_progress
from pipelines.run_mode import end_dry_run
from shards import kinds, layout, lock, storage
from shards.removal.journal import load_journal
from shards.tree import IncompleteTreeError, OutputTree, UnreadableStatsError
from transforms.core.progress import Stage
from transforms.core.records import UsageError
from transforms.core.settings import REQUIRED, setting

if TYPE_CHECKING:  # Beam and the graph are imported by check(): --help and a flag's error import none of it
    from apache_beam.options.pipeline_options import PipelineOptions


@dataclasses.dataclass(frozen=True)
class VerifySettings:
    """verify's settings, one typed object: its flags are generated from it."""

    output: str = setting(REQUIRED, "the output tree to check (bucketed or scaffold)")
    input: str | None = setting(None, "the source documents, to re-tokenize and compare")
    sample: float = setting(1.0, "fraction of ids to compare with the source (default 1)")
    removal_list: str | None = setting(None, "the --removal-list the job ran with: its ids are not expected in the "
                                       "output")
    report: str | None = setting(None, "where to write the JSON report, kept (default: under --temp_location if "
                                 "set, else a local temporary directory; removed afterwards)")

    def __post_init__(self):
        if not 0.0 < self.sample <= 1.0:
            raise ValueError(f"--sample must be within (0, 1], got {self.sample}")


def make_parser() -> argparse.ArgumentParser:
    p = tool_parser("verify", "Check a bucketed output tree against its format (and its source with --input).")
    add_setting_flags(p, VerifySettings)
    add_workers_flag(p)
    return p


def parse_args(argv: list[str]) -> tuple[VerifySettings, PipelineOptions]:
    """The settings and Beam's options; a local --input is the source to compare, checked later."""
    return parse_settings(make_parser(), argv, VerifySettings, input_files=False)


def _problems(n: int) -> str:
    return f"{n} problem" if n == 1 else f"{n} problems"


def _verify_in_process(output: str, args: VerifySettings, kind: kinds.TreeKind, shown: int) -> Verdict:
    """The kind's own checks (its ``checks`` in shards/kinds.py: the scaffold kind's read each split
    once, in order), run here, the first ``shown`` problems listed; a kind without them, or a tree
    nothing says the kind of, is checked by the Beam job of pipelines/verify_graph.py (check, below)."""
    if args.input:
        print(f"verify: --input is not supported for {kind.name} trees; checking the format only", flush=True)
    problems = kind.part("checks")(output)
    return Verdict(output, len(problems), tuple(problems[:shown]), kind.checked_as, more=False)


def _read_report(url: str) -> dict:
    fs, path = storage.filesystem(url)
    try:
        with fs.open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(
            f"the verify job's report is not at {url}: on a runner whose workers do not share this "
            "machine's disk, pass --temp_location or --report with a URL both can reach"
        ) from None


def _remove_scratch(scratch: str | None) -> None:
    if scratch is None:
        return
    fs, path = storage.filesystem(scratch)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def run(argv: list[str] | None = None) -> int:
    """0 when the tree is right, 1 when verify found a problem (each said, then the verdict)."""
    with launching():
        args, options = parse_args(argv or [])
    verdict = check(args, options)
    return 0 if verdict is None else say(verdict)


def check(args: VerifySettings, options: PipelineOptions) -> Verdict | None:
    """What verify finds in the tree ``args.output`` (None for a dry run, which checks nothing)."""
    from pipelines import verify_graph  # Beam and the checks, once the flags are read: --help imports none of it

    with launching():
        output, tree, held = _open_tree(args)
    if held is not None:
        print(f"verify: {held}", flush=True)
    kind = tree.tree_kind
    if kind is not None and kind.checks is not None:
        return _verify_in_process(output, args, kind, verify_graph.MAX_REPORTED)
    try:
        stats = tree.stats()
    except (IncompleteTreeError, UnreadableStatsError) as e:
        return Verdict(output, 1, (_unfinished_problem(output, e),), None, more=False)
    with launching():
        job = verify_graph.build(options, args, output, stats)
    if job.dry_run:  # translated, never run: no report to read, no scratch directory made
        job.pipeline.run()
        print(end_dry_run(output, options), flush=True)
        return None

    stages = [Stage("verify", "verify", ("files",), "files", total=len(job.units))]
    try:
        unchanged = "the tree was not changed (verify writes nothing there)"  # said after what stopped it
        with stopping(lambda e, stop: stopped_line(e, output, stop, unchanged)) as interrupted, showing_progress(
                options, new_run_id(), stages, ending=("reporting", "done")):
            wait_for(job.pipeline.run(), interrupted)
        result = _read_report(job.report_url)
    finally:
        _remove_scratch(job.scratch)
    return _verdict(result, output, args.sample if args.input else None)


def _unfinished_problem(output: str, error: IncompleteTreeError | UnreadableStatsError) -> str:
    """The report's line for a tree without readable stats; for one a removal left unfinished (its
    journal holds the plan), what finishes it, or why its journal cannot be read."""
    if not isinstance(error, IncompleteTreeError):
        return error.problem
    try:
        pending = load_journal(output)  # every journal file a regular one, read through no link
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the journal, said in one line
        return f"{error.problem}; its removal journal cannot be read: {e}"
    if pending is None:
        return error.problem
    return (f"{layout.STATS_NAME}: missing: the removal {pending.run} (started {pending.utc_time}) is journalled "
            f"and unfinished; run pretokenize remove --output {output} --removal-list LIST to finish it (it is "
            "finished first, then LIST is applied; a bucketed re-run into this output finishes it too)")


def _open_tree(args: VerifySettings) -> tuple[str, OutputTree, str | None]:
    """The output's URL, its tree, and the line saying a writer holds it (verify takes no lock)."""
    output = storage.normalize(args.output)
    fs, path = storage.filesystem(output)
    with storage.reaching(output):
        if not fs.isdir(path):
            raise FileNotFoundError(f"--output {output} is not a directory")
    return output, OutputTree.open(output), lock.held_line(output)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What verify found in the tree ``output``: the number of ``problems``, the first of them
    (``shown``; ``more``: whether a line says how many more there are) and what was checked
    (``checked``: files, documents, tokens; None when the tree could not be read)."""

    output: str
    problems: int
    shown: tuple[str, ...]
    checked: str | None
    more: bool = True

    @property
    def ok(self) -> bool:
        return self.problems == 0


def _verdict(result: dict, output: str, sample: float | None) -> Verdict:
    """The Beam job's report as a Verdict (``sample``: of a source compared)."""
    compared = "" if sample is None else f", source compared on {'all' if sample >= 1 else f'{sample:.0%} of'} ids"
    what = f"{result['files']} files, {result['documents']:,} documents, {result['tokens']:,} tokens{compared}"
    return Verdict(output, result["problems"], tuple(result["sample"]), what)


def say(verdict: Verdict) -> int:
    """Print the verdict's problems and its one line; the exit status."""
    for problem in verdict.shown:
        print(f"  {problem}")
    if verdict.more and verdict.problems > len(verdict.shown):
        print(f"  ... and {verdict.problems - len(verdict.shown)} more")
    what = "" if verdict.checked is None else f" ({verdict.checked})"
    if verdict.problems:
        print(f"verify: FAILED, {_problems(verdict.problems)} in {verdict.output}{what}", flush=True)
        return 1
    print(f"verify: OK, {verdict.output}{what}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
