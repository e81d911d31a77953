"""train-bpe's Beam graph (the words counted), apart from its flags, learner and publishing in
pipelines/train_bpe.py so that --help and a flag's error import no Beam: train_bpe.build imports it."""

from __future__ import annotations

import json

import apache_beam as beam

from pipelines import launch, progress, run_mode
from shards import kinds, storage
from shards.removal.lists import read_removal_list
from transforms.bpe.count import STATS, CountConfig, CountWordsFn, WriteWordCounts
from transforms.bpe.settings import TrainBpeSettings
from transforms.bucketed.filter import DROPPED, FilterDocumentsFn
from transforms.core.drops import CountDrops
from transforms.core.progress import Stage, announce_stages
from transforms.inputs.read import RECORDS, CountRecords, ReadDocuments, ReadUnitFn
from transforms.removal import MATCHED, DropRemovedFn
from transforms.run.steps import RunUnits


def build(pipeline: beam.Pipeline, options: TrainBpeSettings, run_id: str, mode: run_mode.RunMode,
          counting: CountConfig, stats_url: str):
    """Adds the counting to ``pipeline``: the count shards (``counting``) and the run's numbers
    (``stats_url``) go to the run directory."""
    output = storage.normalize(options.output)
    progress_dir = progress.progress_dir(pipeline.options, run_id)
    read_config = options.read_config()
    read = ReadDocuments(read_config, progress_dir=progress_dir)  # the units planned and checked; run below
    launch.prepare_output(output, kinds.TOKENIZER.name, inputs=[u.path for u in read.units], mode=mode)
    read.log_planned()  # once the output is claimed: a launch error is the only line said
    announce_stages(progress_dir, [Stage("read and count", "read", read.planned.keys, read.planned.what,
                                         total=read.planned.total)])

    read_unit = ReadUnitFn(read_config, read.planned if progress_dir else None, progress_dir)
    # Each input unit read, cleared of removed ids, filtered and counted in one step, as the other jobs do.
    counted = pipeline | "CountInputUnits" >> RunUnits(read.units, read_unit, _count_steps(options, counting),
                                                       (DROPPED, RECORDS, MATCHED, STATS))
    distinct = counted.main | "WriteWordCounts" >> WriteWordCounts(counting)
    raw = counted[RECORDS] | "CountDocuments" >> CountRecords()
    numbers = (
        raw | "NameRecords" >> beam.Map(lambda n: ("documents_read", n)),
        (counted[DROPPED],) | "CountDrops" >> CountDrops()
        | "NameDrops" >> beam.Map(lambda d: (f"dropped:{d[0]}", d[1])),
        counted[STATS],
        distinct,
    )
    return (
        numbers
        | "CollectNumbers" >> beam.Flatten()
        | "SumNumbers" >> beam.CombinePerKey(sum)
        | "GatherNumbers" >> beam.combiners.ToDict()
        | "WriteRunStats" >> beam.Map(_write_run_stats, stats_url)
    )


def _count_steps(options: TrainBpeSettings, counting) -> list[beam.DoFn]:
    """The DoFns each input unit's batches go through: removed ids dropped (a missing or
    unreadable list fails here, at launch), the filter's conditions, the word count."""
    steps = []
    if options.removal_list:
        removal_url = storage.normalize(options.removal_list)
        read_removal_list(removal_url)
        steps.append(DropRemovedFn((removal_url,)))
    return [*steps, FilterDocumentsFn(options.conditions()), CountWordsFn(counting)]


def _write_run_stats(numbers: dict, url: str) -> None:
    storage.write_atomic(url, json.dumps(dict(sorted(numbers.items()))).encode())
