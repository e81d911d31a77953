"""The jobs ``pretokenize`` runs, each declared once: its module (loaded only when it runs, so that
``pretokenize --help`` imports no Beam), its line in the usage, the kind of tree it publishes
(shards/kinds.py declares the kind and its parts below this layer), and how it may be run. The console
script (cli.py), the Python API (api.py) and the Dataflow template's launcher ask here.

A new kind of tree is its entry in shards/kinds.py, the entry of the job that writes it here, and
their own modules.
"""

import importlib
from types import ModuleType
from typing import NamedTuple


class Job(NamedTuple):
    module: str  # its run(argv) (and, for a pipeline, make_parser, build, summary_table)
    help: str  # its line in ``pretokenize --help``
    # The kind of tree it publishes (shards/kinds.py): a failure leaves the previous output as it was.
    publishes: str | None = None
    submittable: bool = False  # it can return once the runner has it, without waiting (main's ``wait``)
    plain: bool = False  # a tool without a pipeline: any ValueError or OSError is about how it was asked


JOBS = {
    "bucketed": Job("pipelines.bucketed", "documents to length-bucketed token shards (FinePDFs-Edu layout)",
                    publishes="bucketed", submittable=True),
    "scaffold": Job("pipelines.scaffold", "documents to countdown-token shards in llm.c's format (train/, val/)",
                    publishes="scaffold", submittable=True),
    "decode": Job("pipelines.decode", "print a bucketed tree's documents, or llm.c scaffold shards, back as text",
                  plain=True),
    "remove": Job("pipelines.remove", "take flagged ids out of a bucketed output, rewriting only their shards",
                  publishes="bucketed"),
    "verify": Job("pipelines.verify", "check an output tree against its format (and its source with --input)"),
    "export": Job("pipelines.export", "zero-copy indexes for other trainers: export megatron (.idx and .bin link)",
                  plain=True),
    "stats": Job("pipelines.stats", "document lengths per bucket: a table and a histogram PNG, for mixing weights",
                 plain=True),
    "train-bpe": Job("pipelines.train_bpe", "learn a BPE tokenizer from documents (words counted on Beam)",
                     publishes="tokenizer"),
}

PUBLISHING = frozenset(name for name, job in JOBS.items() if job.publishes)
PLAIN_TOOLS = frozenset(name for name, job in JOBS.items() if job.plain)
SUBMITTABLE = tuple(name for name, job in JOBS.items() if job.submittable)


def load(job: str) -> ModuleType:
    """The module of ``job``, imported now: the one place a job's code is loaded, when it runs."""
    return importlib.import_module(JOBS[job].module)
