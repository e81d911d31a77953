"""The bucketed job: documents to length-bucketed token shards in the FinePDFs-Edu layout.

    pretokenize bucketed --input 'data/*.parquet' --output out/ [--runner FnApiRunner ...]

Flags this job does not know go to Beam's PipelineOptions (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from pipelines import flags, job, run_mode, summary
from shards import layout, lock
from shards.manifest import DatasetStats
from transforms.bucketed.settings import DOCUMENT_FILTER_FLAGS, BucketedSettings
from transforms.core.settings import CARD_FLAGS

if TYPE_CHECKING:  # Beam and the graph are imported by build(): --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.inputs.units import InputUnit

log = logging.getLogger(__name__)


def make_parser() -> argparse.ArgumentParser:
    p = flags.job_parser("bucketed", "Tokenize parquet/JSONL documents into length-bucketed uint32 shards "
                         "(FinePDFs-Edu layout).")
    flags.add_setting_flags(p, BucketedSettings, DOCUMENT_FILTER_FLAGS + (
        "tokenizer", "tokenizer_backend", "tokenizer_threads", "eos_token", "dtype", "partitions", "max_shard_bytes",
        "seed", "read_connections", "batch_docs", "removal_list", "special_tokens", "on_bad_record") + CARD_FLAGS)
    return p


def parse_args(argv: list[str]) -> tuple[BucketedSettings, PipelineOptions]:
    return flags.parse_settings(make_parser(), argv, BucketedSettings)


def parse_job(argv: list[str]) -> tuple[BucketedSettings, flags.BeamArgs]:
    """parse_args with Beam's flags not yet made PipelineOptions: no Beam imported (job.run_job)."""
    return flags.parse_job(make_parser(), argv, BucketedSettings)


def plan_input(options: BucketedSettings, progress_dir: str | None) -> list[InputUnit]:
    """The input planned into units at launch, before Beam is imported; the display's stages
    announced in ``progress_dir`` (None: no display), so its bars and job ETA appear."""
    return job.planned_input(options.read_config(), progress_dir, "tokenize", "tokenize")


def build(pipeline: beam.Pipeline, options: BucketedSettings, run_id: str | None = None,
          mode: run_mode.RunMode = run_mode.RUN, units: list[InputUnit] | None = None):
    """The job added to ``pipeline`` (pipelines/bucketed_graph.py): the PCollection of its published
    DatasetStats. ``units``: the input as plan_input planned it (None: planned here)."""
    from pipelines import bucketed_graph

    return bucketed_graph.build(pipeline, options, run_id, mode, units)


def summary_table(stats: DatasetStats, output: str, seconds: float) -> str:
    lines = [f"{'bucket':>8} {'documents':>12} {'tokens':>16} {'files':>6}"]
    for name in layout.BUCKET_NAMES:
        b = stats.buckets.get(name)
        if b and b.documents:
            lines.append(f"{name:>8} {b.documents:>12,} {b.tokens:>16,} {b.files:>6}")
    lines.append(f"{'total':>8} {stats.kept_documents:>12,} {stats.total_tokens:>16,} {stats.total_files:>6}")
    lines.append("")
    lines += summary.drop_lines(stats.raw_documents, stats.kept_documents, stats.drops)
    if stats.removal_list_ids is not None:
        lines.append(
            f"removal list: {stats.removal_list_ids:,} ids, {stats.removal_ids_not_found:,} of them not in the input"
        )
    lines += summary.timing_lines(stats.total_tokens, seconds, output)
    return "\n".join(lines)


@lock.command("bucketed")
def run(argv: list[str] | None = None, wait: bool = True) -> DatasetStats | None:
    """``wait``: False to return once the runner has the job (a Flex Template's launcher)."""
    return job.run_job(argv or [], parse_job, plan_input, build, summary_table, plan=_plan, wait=wait)


def _plan(options: BucketedSettings) -> str:
    from pipelines import plan

    return plan.bucketed(options)
