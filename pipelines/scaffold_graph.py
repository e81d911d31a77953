"""The scaffold job's Beam graph (launch checks, then steps), apart from its flags in pipelines/scaffold.py
so that --help and a flag's error import no Beam: scaffold.build imports this module when a run builds."""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from pipelines import launch, progress, run_mode
from transforms.inputs.read import RECORDS, CountRecords, ReadDocuments, ReadUnitFn
from transforms.inputs.units import InputUnit
from transforms.run import resume
from transforms.run.provenance import launch_provenance
from transforms.scaffold.encode import COUNTS, DROPPED, EncodeScaffoldFn
from transforms.scaffold.settings import ScaffoldSettings
from transforms.scaffold.write import PublishLlmcOutput, ScaffoldFormat, WriteLlmcShards, spill_fn


def build(pipeline: beam.Pipeline, options: ScaffoldSettings, run_id: str | None = None,
          mode: run_mode.RunMode = run_mode.RUN, units: list[InputUnit] | None = None):
    """Adds the job to ``pipeline``; returns the PCollection holding the published ScaffoldStats.

    Checked before the pipeline runs: the options, that the tokenizer is GPT-2's vocabulary, and
    that every input file exists (and a parquet file has the id and text columns). Input units an
    interrupted run with the same input and settings finished are not redone (transforms.run.resume).
    ``units``: the input as the launch planned it (pipelines/scaffold.py plan_input; None: planned here).
    """

    scaffold = options.scaffold_config()
    shards = options.shard_config(run_id or launch.new_run_id())
    read_config = options.read_config()
    progress_dir = progress.progress_dir(pipeline.options, run_id)
    # The input first: a missing or unreadable one (local or remote) is said before the tokenizer loads;
    # its units are logged once the tokenizer has loaded, so that a load error is said alone.
    read = ReadDocuments(read_config, progress_dir=progress_dir, units=units)
    units = read.units  # planned and checked; read by ProcessUnits
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
