"""The surgical removal job: drop flagged ids from a finished bucketed output, touching only the
shards that hold them.

    pretokenize remove --output out/ --removal-list flagged.txt [--runner FnApiRunner ...]

See transforms/tools/surgery.py for the order of the steps and why a crash at any point is finished by
running the same command again.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import uuid
from typing import TYPE_CHECKING

from pipelines.common import add_break_lock_flag, add_flag, add_workers_flag, launching, parse_job_args
from pipelines.help_format import DefaultsHelpFormatter
from shards import layout, lock, storage, tree
from shards.manifest import DatasetStats
from shards.removal import read_removal_list

if TYPE_CHECKING:  # Beam and the steps are imported once the flags are read: --help imports none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.tools.surgery import RemovalPlan

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RemoveOptions:
    output: str
    removal_list: str


def parse_args(argv: list[str]) -> tuple[RemoveOptions, PipelineOptions]:
    p = argparse.ArgumentParser(
        prog="pretokenize remove",
        description="Remove the documents a list of original ids names from a bucketed output, in place.",
        epilog="Other flags go to Beam's PipelineOptions (--runner, ...).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_flag(p, "output", required=True, help="the output tree of pretokenize bucketed")
    add_flag(p, "removal-list", required=True, help="ids to remove, one a line, no comments; path or URL")
    add_workers_flag(p)
    add_break_lock_flag(p)
    ours, beam_args = parse_job_args(p, argv)
    from apache_beam.options.pipeline_options import PipelineOptions

    return RemoveOptions(storage.normalize(ours.output), storage.normalize(ours.removal_list)), PipelineOptions(
        beam_args
    )


def prepare(options: RemoveOptions) -> RemovalPlan | None:
    """The plan to carry out: an interrupted one first, else a new one; None when nothing is flagged.

    A new plan is journalled and dataset_stats.txt removed before any shard changes.
    """
    from transforms.tools.surgery import load_journal, make_plan, write_journal

    plan = load_journal(options.output)
    if plan is not None:
        print(
            f"resuming the interrupted removal {plan.run} (started {plan.utc_time}); once it is finished, "
            f"run this command again if {options.removal_list} is a different list",
            flush=True,
        )
    else:
        ids = read_removal_list(options.removal_list)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        plan = make_plan(options.output, ids, run=uuid.uuid4().hex[:12], utc_time=now)
        _report_not_found(plan, len(ids))
        if not plan.files:
            return None
        write_journal(options.output, plan)
    tree.delete_listed(options.output, [layout.STATS_NAME])  # the tree reads as unfinished until the removal is done
    return plan


def _report_not_found(plan: RemovalPlan, listed: int) -> None:
    found = listed - len(plan.not_found)
    print(f"removal list: {listed} ids, {found} found in the manifest, {len(plan.not_found)} not found", flush=True)
    for doc_id in plan.not_found[:20]:
        print(f"  not found: {doc_id}", flush=True)
    if len(plan.not_found) > 20:
        print(f"  ... and {len(plan.not_found) - 20} more", flush=True)


def build(pipeline: beam.Pipeline, options: RemoveOptions, plan: RemovalPlan):
    from transforms.tools.surgery import RemoveDocuments

    itemsize = layout.DTYPES[DatasetStats.from_text(plan.stats_before).dtype].itemsize
    return pipeline | "RemoveDocuments" >> RemoveDocuments(options.output, plan, itemsize)


@lock.command("remove")
def run(argv: list[str] | None = None) -> RemovalPlan | None:
    with launching():
        options, pipeline_options = parse_args(argv or [])
        fs, path = storage.filesystem(options.output)
        if not fs.isdir(path):
            raise FileNotFoundError(f"--output {options.output} is not a directory")
        tree.owned(options.output, "bucketed")  # never rewrite files this tool did not write
        lock.take(options.output)  # one writer at a time: before the journal is read or anything changes
        plan = prepare(options)
    if plan is None:
        print("nothing to remove: no listed id is in the output; nothing was changed", flush=True)
        return None
    import apache_beam as beam

    from pipelines.common import new_run_id, showing_progress
    from transforms.core.progress import Stage

    stages = [Stage("rewrite", "rewrite", ("files",), "files", total=len(plan.files))]
    with showing_progress(pipeline_options, new_run_id(), stages), beam.Pipeline(options=pipeline_options) as pipeline:
        build(pipeline, options, plan)
    rows = plan.removed_rows
    deleted = sum(1 for f in plan.files if f.tokens_after == 0)
    print(
        f"removed {len(rows)} documents ({sum(n for _, _, n in rows):,} tokens) from {len(plan.files)} files "
        f"({deleted} deleted, now empty); every other file is unchanged; audit lines in removals.txt "
        f"under run {plan.run}",
        flush=True,
    )
    return plan
