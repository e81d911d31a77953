"""The surgical removal job: drop flagged ids from a finished bucketed output, touching only the
shards that hold them.

    pretokenize remove --output out/ --removal-list flagged.txt [--runner FnApiRunner ...]

See shards/removal/__init__.py for the order of the steps and why a crash at any point is finished by
running the same command again.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import logging
import tempfile
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipelines.errors import launching, stopped_line
from pipelines.flags import add_break_lock_flag, add_setting_flags, add_workers_flag, parse_settings, tool_parser
from pipelines.job import stopping
from pipelines.launch import new_run_id
from pipelines.progress import showing_progress
from pipelines.run_mode import end_dry_run, is_dry_run
from shards import layout, lock, storage, tree
from shards.removal import journal
from shards.removal.audit import scan_tree_log
from shards.removal.idmatch import Matches
from shards.removal.journal import RemovalPlan
from shards.removal.lists import REMOVALS_NAME, check_id_field, removal_source, tree_id_field
from transforms.core.progress import Stage
from transforms.core.records import BadInputError, UsageError
from transforms.core.settings import REQUIRED, setting

if TYPE_CHECKING:  # Beam and the graph are imported by rewrite(): --help and a flag's error import none of it
    from apache_beam.options.pipeline_options import PipelineOptions

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RemoveSettings:
    """remove's settings, one typed object: its flags are generated from it; the paths are URLs."""

    output: str = setting(REQUIRED, "the output tree of pretokenize bucketed")
    removal_list: str = setting(REQUIRED, "ids to remove, one a line, no comments; path or URL")

    def __post_init__(self):
        object.__setattr__(self, "output", storage.normalize(self.output))
        object.__setattr__(self, "removal_list", storage.normalize(self.removal_list))


def make_parser() -> argparse.ArgumentParser:
    p = tool_parser("remove", "Remove the documents a list of original ids names from a bucketed output, in place.")
    add_setting_flags(p, RemoveSettings)
    add_workers_flag(p)
    add_break_lock_flag(p)
    return p


def parse_args(argv: list[str]) -> tuple[RemoveSettings, PipelineOptions]:
    return parse_settings(make_parser(), argv, RemoveSettings)


def prepare(options: RemoveSettings, write: bool = True, plan_url: str | None = None) -> RemovalPlan | None:
    """The plan to carry out: an interrupted one first, else a new one; None when nothing is flagged.

    Everything is read and checked before any byte changes: the tree's audit log (strictly), the
    list, the manifest, and the plan against the files. A new plan is journalled and
    dataset_stats.txt removed before any shard changes. Without ``write`` (a dry run) the same
    reading and checks, and nothing is written in the tree (the plan's rows go to ``plan_url``).
    """
    journal.check_tree_files(options.output)  # links included, before any of them is read
    audit = scan_tree_log(options.output)  # a log it cannot read stops the removal here, naming the line
    journal.check_checksums(options.output)  # and so do checksums it could not rewrite at the end
    plan = journal.load_journal(options.output)
    if plan is not None:
        print(
            f"resuming the interrupted removal {plan.run} (started {plan.utc_time}); once it is finished, "
            f"{options.removal_list} is applied",
            flush=True,
        )
        journal.check_plan(options.output, plan)
        plan = dataclasses.replace(plan, resumed=True)
    else:
        plan = _new_plan(options, audit, plan_url)
        if plan is None:
            return None
        if write:
            journal.write_journal(options.output, plan)
    if not write:
        return plan
    _delete_stale(options.output)
    tree.delete_listed(options.output, [layout.STATS_NAME])  # the tree reads as unfinished until the removal is done
    return plan


def _new_plan(options: RemoveSettings, audit, plan_url: str | None) -> RemovalPlan | None:
    """A new plan for the list's ids, checked against the files; None when no listed id is in the
    tree. A list or log of ids of another field than the tree's is refused."""
    ids, list_field = removal_source(options.removal_list)
    out = tree.OutputTree.open(options.output)
    id_field = tree_id_field(out.stats_text)
    if audit is not None and id_field is not None:
        check_id_field(audit.id_field, storage.join(options.output, REMOVALS_NAME), id_field,
                       flag="the tree's id field")
    if id_field is not None:
        check_id_field(list_field, f"--removal-list {options.removal_list}", id_field, flag="the tree's id field")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    plan = journal.make_plan(options.output, ids, run=uuid.uuid4().hex[:12], utc_time=now, plan_url=plan_url)
    _report_not_found(plan.matches)
    if not plan.files:
        return None
    journal.check_plan(options.output, plan)
    return plan


def _delete_stale(output: str) -> None:
    """Once the journal holds the request: delete the saved work of interrupted runs (it may hold
    the removed documents) and the files derived from the old shards, saying so."""
    purged = journal.purge_saved_work(output)  # the journal holds the request: a kill here is finished by a re-run
    if purged:
        print(f"deleted the saved work of interrupted runs ({', '.join(purged)}): it may hold the removed "
              "documents; the next bucketed run starts afresh", flush=True)
    derived = journal.drop_derived_exports(output)  # stale once a shard changes; a re-run deletes them too
    if derived:
        tops = ", ".join(sorted({d.split("/")[0] for d in derived}))
        print(f"deleted {len(derived)} files derived from the old shards ({tops}): run export megatron / stats "
              "again once the removal is done", flush=True)


def _report_not_found(matches: Matches) -> None:
    print(f"removal list: {matches.listed} ids, {matches.found} found in the manifest, {matches.gone} already removed "
          f"({REMOVALS_NAME} lists them), {matches.missing} not found", flush=True)
    for doc_id in matches.sample:
        print(f"  not found: {doc_id}", flush=True)
    if matches.missing > len(matches.sample):
        print(f"  ... and {matches.missing - len(matches.sample)} more", flush=True)
    if matches.missing:
        # remove records what it took out; an id the tree does not hold is not recorded, so a later
        # run over other input, or with other filters, would store it: say so, and what keeps it out.
        print(f"warning: {REMOVALS_NAME} records only the documents remove takes out: the {matches.missing} ids not "
              "found are not recorded, and a bucketed run over other input or with other filters would store them; "
              "give that run this list too (--removal-list)", flush=True)


def rewrite(pipeline_options: PipelineOptions, options: RemoveSettings, plan: RemovalPlan) -> None:
    """The plan's files rewritten by its Beam job (pipelines/remove_graph.py), waited for."""
    from pipelines import remove_graph

    remove_graph.run(pipeline_options, options.output, plan)


@lock.command("remove")
def run(argv: list[str] | None = None) -> RemovalPlan | None:
    argv = argv or []
    return run_prepared(lambda: parse_args(argv))


def run_prepared(parse: Callable[[], tuple[RemoveSettings, PipelineOptions]], resumed=False) -> RemovalPlan | None:
    """remove with the settings ``parse`` makes (from flags or the Python API's arguments), in the
    scope of its lock (taken once: an interrupted removal it finishes, then its own list)."""
    with launching():
        options, pipeline_options = parse()
        dry_run = is_dry_run(pipeline_options)  # a local runner refuses it, as the jobs do
        fs, path = storage.filesystem(options.output)
        with storage.reaching(options.output):
            if not fs.isdir(path):
                raise FileNotFoundError(f"--output {options.output} is not a directory")
        tree.owned(options.output, "bucketed")  # never rewrite files this tool did not write
        if not dry_run:
            lock.take(options.output)  # one writer at a time: before the journal is read or anything changes
    # A dry run's plan goes to a local scratch directory, deleted once the job is translated.
    scratch = tempfile.TemporaryDirectory(prefix="pretokenize-dry-run-") if dry_run else None
    try:
        with stopping(functools.partial(_stopped, options.output, dry_run), passing=(UsageError, BadInputError)):
            plan = prepare(options, write=not dry_run, plan_url=scratch.name if scratch else None)
            if plan is None:
                # After an interrupted removal was finished (``resumed``), only this list's part is nothing.
                print("nothing more to remove: no listed id is left in the output; nothing else was changed"
                      if resumed else "nothing to remove: no listed id is in the output; nothing was changed",
                      flush=True)
                return None
            stages = [Stage("rewrite", "rewrite", ("files",), "files", total=len(plan.files))]
            with showing_progress(pipeline_options, new_run_id(), stages):
                rewrite(pipeline_options, options, plan)
    finally:
        if scratch is not None:
            scratch.cleanup()
    if dry_run:
        print(end_dry_run(options.output, pipeline_options), flush=True)
        return plan
    if plan.resumed:  # an interrupted removal is finished: now the list this command was given
        _summary(plan)
        return run_prepared(parse, resumed=True) or plan
    _summary(plan)
    return plan


def _summary(plan: RemovalPlan) -> None:
    deleted = sum(1 for f in plan.files if f.tokens_after == 0)
    print(
        f"removed {plan.removed_documents} documents ({plan.removed_tokens:,} tokens) from {len(plan.files)} files "
        f"({deleted} deleted, now empty); every other file is unchanged; audit lines in removals.txt "
        f"under run {plan.run}",
        flush=True,
    )


def _stopped(output: str, dry_run: bool, error: BaseException, interrupted: bool) -> BaseException | None:
    """What a removal that stopped says, in one line: a RunStopped for Ctrl-C, a full disk and an
    unreachable store, a UsageError for what was found while reading and checking, before any
    change (None: the error itself for anything else)."""
    unasked = None
    try:
        pending = None if dry_run else journal.load_journal(output)
    except ValueError:  # a journal it refuses to read (a link in it): refused before anything changed
        pending = None
    except Exception as e:  # noqa: BLE001 - the store that stopped the removal: said, never instead of its line
        pending, unasked = None, storage.unreachable_problem(e) or storage.one_line(e)
    if unasked is not None:
        state = (f"{output} could not be asked whether the removal began ({unasked}): run the same command again; "
                 "it finishes whatever was begun")
    elif pending is not None:
        state = (f"the removal {pending.run} is journalled and {output} reads as unfinished until it is done: "
                 "run the same command again to finish it")
    else:
        state = f"nothing in {output} was changed"
    stopped = stopped_line(error, output, interrupted, state)
    if stopped is None and isinstance(error, (ValueError, OSError)):  # found while reading and checking
        return UsageError(f"{error}; {state}")
    return stopped
