"""The bucketed job: documents to length-bucketed token shards in the FinePDFs-Edu layout.

    pretokenize bucketed --input 'data/*.parquet' --output out/ [--runner FnApiRunner ...]

Flags this job does not know go to Beam's PipelineOptions (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING

from pipelines import flags, job, launch, progress, run_mode, summary
from shards import layout, lock, storage
from shards.manifest import DatasetStats
from shards.removal.sources import RemovalSources
from transforms.bucketed.settings import DOCUMENT_FILTER_FLAGS, BucketedSettings
from transforms.core.settings import CARD_FLAGS
from transforms.run.provenance import launch_provenance

if TYPE_CHECKING:  # Beam and the steps are imported by build(): --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.bucketed.format import BucketedFormat
    from transforms.bucketed.tokenize import TokenizerConfig
    from transforms.bucketed.write import ShardConfig
    from transforms.inputs.read import ReadUnitFn
    from transforms.run import resume

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


def build(pipeline: beam.Pipeline, options: BucketedSettings, run_id: str | None = None,
          mode: run_mode.RunMode = run_mode.RUN):
    """Adds the job to ``pipeline``; returns the PCollection holding the published DatasetStats.

    Each input unit is read, cleared of removed ids, filtered, tokenized and spilled in one step,
    its completion recorded (resume.ProcessUnits); the spilled references are then grouped into
    shards, and the shards published with the stats. What is checked and prepared first: see _launch.
    """
    import apache_beam as beam

    from transforms.bucketed.filter import DROPPED, filter_steps
    from transforms.bucketed.tokenize import TokenizeFn
    from transforms.bucketed.write import WriteShards, spill_fn
    from transforms.core.publish import PublishOutput
    from transforms.inputs.read import RECORDS, CountRecords
    from transforms.removal import MATCHED, DropRemovedFn
    from transforms.run import resume

    run = _launch(pipeline, options, run_id, mode)
    steps = [DropRemovedFn(run.removal_sources)] if run.removal_sources else []
    steps += filter_steps(options.conditions(), TokenizeFn(run.tokenizer))
    tags = (DROPPED, RECORDS, MATCHED) if run.removal_sources else (DROPPED, RECORDS)
    spilled = pipeline | "TokenizeInputUnits" >> resume.ProcessUnits(
        run.work, run.units, run.work.done, run.read_unit, steps, spill_fn(run.shards), tags)
    raw = spilled[RECORDS] | "CountDocuments" >> CountRecords()
    drops = [spilled[DROPPED]]
    extras = {}
    if run.removal_sources:
        removal_found = (
            spilled[MATCHED]
            | "DistinctRemovedIds" >> beam.Distinct()
            | "CountRemovedIds" >> beam.combiners.Count.Globally()
        )
        extras["removal_found"] = beam.pvalue.AsSingleton(removal_found)
    written = spilled.refs | "WriteShards" >> WriteShards(run.shards, spilled=True)
    drops.append(written[DROPPED])
    return written.groups | "PublishOutput" >> PublishOutput(run.publish_format, run.shards, raw, tuple(drops),
                                                             **extras)


@dataclasses.dataclass(frozen=True)
class _Launched:
    """What build checked and prepared before it adds a step."""

    tokenizer: TokenizerConfig  # pinned to the files the launcher loaded
    units: list  # the input's units, planned and checked
    read_unit: ReadUnitFn
    work: resume.SavedWork  # the output claimed; the units an interrupted run finished
    shards: ShardConfig
    removal_sources: tuple[str, ...]  # what DropRemovedFn reads ids from (none: no removal)
    publish_format: BucketedFormat


def _launch(pipeline: beam.Pipeline, options: BucketedSettings, run_id: str | None, mode: run_mode.RunMode):
    """Everything checkable, checked before the pipeline runs: the tokenizer loads and fits the
    dtype, every input file exists and has the columns the job reads, and the removal sources'
    ids are values of --id-field. Then the output is claimed (launch.prepare_output): input units
    an interrupted run with the same input and settings finished are not redone (transforms.run.resume),
    and the removal requests the output accepted stay honoured (shards/removal/sources.py)."""
    from transforms.bucketed.format import BucketedFormat
    from transforms.inputs.read import ReadDocuments, ReadUnitFn
    from transforms.removal import DropRemoved
    from transforms.run import resume

    output = storage.normalize(options.output)
    shards = options.shard_config(run_id or launch.new_run_id())
    tokenizer = options.tokenizer_config()  # its options and spec checked, nothing loaded yet
    read_config = options.read_config()
    progress_dir = progress.progress_dir(pipeline.options, run_id)
    # The input before the tokenizer: a missing or unreadable one (local or remote) costs no load.
    # Its units are logged once the tokenizer has loaded, so that a load error is said alone.
    read = ReadDocuments(read_config, progress_dir=progress_dir)
    encoder = tokenizer.load()
    tokenizer = tokenizer.pinned(encoder)  # each worker checks it loads these very files
    read.log_planned()
    removals = RemovalSources.read(output, options.removal_list, options.id_field)
    description = resume.WorkDescription.of("bucketed", options, read.units, {
        "tokenizer_probe": resume.tokenizer_probe(encoder),
        "removal_ids": removals.fingerprint(),
    }, ignore=("read_connections",))
    work = launch.prepare_output(output, "bucketed", inputs=[u.path for u in read.units], keep=removals.keep,
                                 work=description, restart=options.restart, mode=mode)
    progress.announce_write_stages(progress_dir, read.units, work.done, "tokenize", "tokenize")
    sources = removals.stage(shards.run_id, mode.scratch)
    shards = dataclasses.replace(shards, work_dir=work.dir_name, removal_list=(removals.lists or (None,))[0],
                                 pending_removal=removals.pending.run if removals.pending else None)
    publish_format = BucketedFormat(
        options, encoder.eos_id, encoder.max_token_id + 1, shards, len(DropRemoved(*sources).ids) if sources else None,
        tokenizer_backend=encoder.library,
        provenance=launch_provenance("bucketed", options, read.units, options.tokenizer),
    )
    read_unit = ReadUnitFn(read_config, read.planned if progress_dir else None, progress_dir)
    return _Launched(tokenizer, read.units, read_unit, work, shards, sources, publish_format)


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
    return job.run_job(argv or [], parse_args, build, summary_table, plan=_plan, wait=wait)


def _plan(options: BucketedSettings) -> str:
    from pipelines import plan

    return plan.bucketed(options)
