"""remove's Beam graph (the plan's files rewritten), apart from its flags, its plan and its run loop in
pipelines/remove.py so that --help and a flag's error import no Beam: remove.rewrite imports this
module once there is a plan to carry out."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from shards import layout
from shards.manifest import DatasetStats
from shards.removal.journal import RemovalPlan
from transforms.removal import RemoveDocuments


def run(pipeline_options: PipelineOptions, output: str, plan: RemovalPlan) -> None:
    """Rewrites the files ``plan`` names in the tree ``output`` with one Beam job, and waits for it:
    the pipeline runs as its ``with`` closes, which also stops what Beam started for it (a job server)."""
    with beam.Pipeline(options=pipeline_options) as pipeline:
        build(pipeline, output, plan)


def build(pipeline: beam.Pipeline, output: str, plan: RemovalPlan):
    """Adds the removal to ``pipeline``: each planned file rewritten without its removed documents."""
    itemsize = layout.DTYPES[DatasetStats.from_text(plan.stats_before).dtype].itemsize
    return pipeline | "RemoveDocuments" >> RemoveDocuments(output, plan, itemsize)
