"""The scaffold job: documents to countdown-token shards in llm.c's format (train/ and val/).

    pretokenize scaffold --input 'data/*.json' --output out/scaffold [--annotate] [--runner FnApiRunner ...]

Flags this job does not know go to Beam's PipelineOptions (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING

from pipelines import flags, job, launch, progress, run_mode, summary
from shards import llmc, lock
from shards.llmc import ScaffoldStats
from transforms.run.provenance import launch_provenance
from transforms.scaffold.settings import ScaffoldSettings

if TYPE_CHECKING:  # Beam and the steps are imported by build(): --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

log = logging.getLogger(__name__)

def make_parser() -> argparse.ArgumentParser:
    p = flags.job_parser("scaffold", "Encode documents with a countdown token before every word (GPT-2 BPE + "
                         "<ff_N> ids 50257..51256) into llm.c shards: train/shard_NNN.bin, val/shard_NNN.bin.",
                         read_options=("json_values",))
    flags.add_setting_flags(p, ScaffoldSettings)
    return p


def parse_args(argv: list[str]) -> tuple[ScaffoldSettings, PipelineOptions]:
    return flags.parse_settings(make_parser(), argv, ScaffoldSettings)


def build(pipeline: beam.Pipeline, options: ScaffoldSettings, run_id: str | None = None,
          mode: run_mode.RunMode = run_mode.RUN):
    """Adds the job to ``pipeline``; returns the PCollection holding the published ScaffoldStats.

    Checked before the pipeline runs: the options, that the tokenizer is GPT-2's vocabulary, and
    that every input file exists (and a parquet file has the id and text columns). Input units an
    interrupted run with the same input and settings finished are not redone (transforms.run.resume).
    """
    import apache_beam as beam

    from transforms.inputs.read import RECORDS, CountRecords, ReadDocuments, ReadUnitFn
    from transforms.run import resume
    from transforms.scaffold.encode import COUNTS, DROPPED, EncodeScaffoldFn
    from transforms.scaffold.write import PublishLlmcOutput, ScaffoldFormat, WriteLlmcShards, spill_fn

    scaffold = options.scaffold_config()
    shards = options.shard_config(run_id or launch.new_run_id())
    read_config = options.read_config()
    progress_dir = progress.progress_dir(pipeline.options, run_id)
    # The input first: a missing or unreadable one (local or remote) is said before the tokenizer loads;
    # its units are logged once the tokenizer has loaded, so that a load error is said alone.
    read = ReadDocuments(read_config, progress_dir=progress_dir)
    units = read.units  # planned and checked here; read by ProcessUnits
    encoder = scaffold.load()
    scaffold = scaffold.pinned(encoder)  # each worker checks it loads these very files
    read.log_planned()
    provenance = launch_provenance("scaffold", options, units, options.tokenizer)
    publish_format = ScaffoldFormat(options, shards, provenance, encoder.library)
    description = resume.WorkDescription.of("scaffold", options, units,
                                            {"tokenizer_probe": resume.tokenizer_probe(encoder)})
    work = launch.prepare_output(shards.output, "scaffold", inputs=[u.path for u in units], work=description,
                                 restart=options.restart, mode=mode)
    shards = dataclasses.replace(shards, work_dir=work.dir_name)
    publish_format = dataclasses.replace(publish_format, config=shards)
    progress.announce_write_stages(progress_dir, units, work.done, "scaffold", "encode")

    # Each input unit read, encoded and spilled in one step, its completion recorded.
    spilled = pipeline | "EncodeInputUnits" >> resume.ProcessUnits(
        work, units, work.done, ReadUnitFn(read_config, read.planned if progress_dir else None, progress_dir),
        [EncodeScaffoldFn(scaffold)], spill_fn(shards),
        (DROPPED, RECORDS, COUNTS))
    raw = spilled[RECORDS] | "CountDocuments" >> CountRecords()
    written = spilled.refs | "WriteLlmcShards" >> WriteLlmcShards(shards, spilled=True)
    drops = (spilled[DROPPED], written.dropped)
    # What each kept document added, less what each copy of an id that was left out had added.
    counts = (spilled[COUNTS], written.counts) | "CollectSplitCounts" >> beam.Flatten()
    return written.staged | "PublishLlmcOutput" >> PublishLlmcOutput(publish_format, raw, drops, counts)


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
    return job.run_job(argv or [], parse_args, build, summary_table, plan=_plan, wait=wait)


def _plan(options: ScaffoldSettings) -> str:
    from pipelines import plan

    return plan.scaffold(options)
