"""The scaffold job: documents to countdown-token shards in llm.c's format (train/ and val/).

    pretokenize scaffold --input 'data/*.json' --output out/scaffold [--annotate] [--runner FnApiRunner ...]

Flags this job does not know go to Beam's PipelineOptions (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from pipelines import flags, job, run_mode, summary
from shards import llmc, lock
from shards.llmc import ScaffoldStats
from transforms.scaffold.settings import ScaffoldSettings

if TYPE_CHECKING:  # Beam and the graph are imported by build(): --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.inputs.units import InputUnit

log = logging.getLogger(__name__)

def make_parser() -> argparse.ArgumentParser:
    p = flags.job_parser("scaffold", "Encode documents with a countdown token before every word (GPT-2 BPE + "
                         "<ff_N> ids 50257..51256) into llm.c shards: train/shard_NNN.bin, val/shard_NNN.bin.",
                         read_options=("json_values",))
    flags.add_setting_flags(p, ScaffoldSettings)
    return p


def parse_args(argv: list[str]) -> tuple[ScaffoldSettings, PipelineOptions]:
    return flags.parse_settings(make_parser(), argv, ScaffoldSettings)


def parse_job(argv: list[str]) -> tuple[ScaffoldSettings, flags.BeamArgs]:
    """parse_args with Beam's flags not yet made PipelineOptions: no Beam imported (job.run_job)."""
    return flags.parse_job(make_parser(), argv, ScaffoldSettings)


def plan_input(options: ScaffoldSettings, progress_dir: str | None) -> list[InputUnit]:
    """The input planned into units at launch, before Beam is imported; the display's stages
    announced in ``progress_dir`` (None: no display), so its bars and job ETA appear."""
    return job.planned_input(options.read_config(), progress_dir, "scaffold", "encode")


def build(pipeline: beam.Pipeline, options: ScaffoldSettings, run_id: str | None = None,
          mode: run_mode.RunMode = run_mode.RUN, units: list[InputUnit] | None = None):
    """The job added to ``pipeline`` (pipelines/scaffold_graph.py): the PCollection of its published
    ScaffoldStats. ``units``: the input as plan_input planned it (None: planned here)."""
    from pipelines import scaffold_graph

    return scaffold_graph.build(pipeline, options, run_id, mode, units)


def summary_table(stats: ScaffoldStats, output: str, seconds: float) -> str:
    lines = [f"{'split':>6} {'documents':>11} {'sequences':>11} {'words':>13} {'tokens':>15} {'files':>6}"]
    for name in llmc.SPLITS:
        s = stats.splits.get(name)
        if s:
            lines.append(f"{name:>6} {s.documents:>11,} {s.sequences:>11,} {s.words:>13,} {s.tokens:>15,} {s.files:>6}")
    lines.append("")
    lines += summary.drop_lines(stats.raw_documents, stats.kept_documents, stats.drops)
    lines.append(f"input countdown differed from the words (recomputed): {stats.countdown_mismatches:,} documents")
    for name in llmc.SPLITS:
        s = stats.splits.get(name)
        if s and s.files and s.tokens % stats.shard_tokens:
            # llm.c's loader (and the published train.py) wants at least T + 1 tokens in every shard.
            lines.append(f"the last {name} shard holds {s.tokens % stats.shard_tokens:,} tokens: a loader that "
                         f"reads windows of T + 1 tokens from each shard needs T < that")
    lines += summary.timing_lines(stats.total_tokens, seconds, output)
    return "\n".join(lines)


@lock.command("scaffold")
def run(argv: list[str] | None = None, wait: bool = True) -> ScaffoldStats | None:
    """``wait``: False to return once the runner has the job (a Flex Template's launcher)."""
    return job.run_job(argv or [], parse_job, plan_input, build, summary_table, plan=_plan, wait=wait)


def _plan(options: ScaffoldSettings) -> str:
    from pipelines import plan

    return plan.scaffold(options)
