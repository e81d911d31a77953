"""The bucketed job's Beam graph (launch checks, then steps), apart from its flags in pipelines/bucketed.py
so that --help and a flag's error import no Beam: bucketed.build imports this module when a run builds."""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from pipelines import launch, progress, run_mode
from shards import storage
from shards.removal.sources import RemovalSources
from transforms.bucketed.filter import DROPPED, filter_steps
from transforms.bucketed.format import BucketedFormat
from transforms.bucketed.settings import BucketedSettings
from transforms.bucketed.tokenize import TokenizeFn, TokenizerConfig
from transforms.bucketed.write import ShardConfig, WriteShards, spill_fn
from transforms.core.publish import PublishOutput
from transforms.inputs.read import RECORDS, CountRecords, ReadDocuments, ReadUnitFn
from transforms.inputs.units import InputUnit
from transforms.removal import MATCHED, DropRemoved, DropRemovedFn
from transforms.run import resume
from transforms.run.provenance import launch_provenance


def build(pipeline: beam.Pipeline, options: BucketedSettings, run_id: str | None = None,
          mode: run_mode.RunMode = run_mode.RUN, units: list[InputUnit] | None = None):
    """Adds the job to ``pipeline``; returns the PCollection holding the published DatasetStats.

    Each input unit is read, cleared of removed ids, filtered, tokenized and spilled in one step,
    its completion recorded (resume.ProcessUnits); the spilled references are then grouped into
    shards, and the shards published with the stats. What is checked and prepared first: see _launch.
    ``units``: the input as the launch planned it (pipelines/bucketed.py plan_input; None: planned here).
    """

    run = _launch(pipeline, options, run_id, mode, units)
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


def _launch(pipeline: beam.Pipeline, options: BucketedSettings, run_id: str | None, mode: run_mode.RunMode,
            units: list[InputUnit] | None):
    """Everything checkable, checked before the pipeline runs: the tokenizer loads and fits the
    dtype, every input file exists and has the columns the job reads, and the removal sources'
    ids are values of --id-field. Then the output is claimed (launch.prepare_output): input units
    an interrupted run with the same input and settings finished are not redone (transforms.run.resume),
    and the removal requests the output accepted stay honoured (shards/removal/sources.py)."""
    output = storage.normalize(options.output)
    shards = options.shard_config(run_id or launch.new_run_id())
    tokenizer = options.tokenizer_config()  # its options and spec checked, nothing loaded yet
    read_config = options.read_config()
    progress_dir = progress.progress_dir(pipeline.options, run_id)
    # The input before the tokenizer: a missing or unreadable one (local or remote) costs no load.
    # Its units are logged once the tokenizer has loaded, so that a load error is said alone.
    read = ReadDocuments(read_config, progress_dir=progress_dir, units=units)
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
