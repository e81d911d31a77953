"""The jobs ``pretokenize`` runs: each one's module (loaded only when it runs, so that ``pretokenize
--help`` imports no Beam), its line in the usage, and what kind of job it is. The console script
(cli.py) and the Python API (api.py) both ask here."""

import importlib
from types import ModuleType

JOBS = {
    "bucketed": ("pipelines.bucketed", "documents to length-bucketed token shards (FinePDFs-Edu layout)"),
    "scaffold": ("pipelines.scaffold", "documents to countdown-token shards in llm.c's format (train/, val/)"),
    "decode": ("pipelines.decode", "print a bucketed tree's documents, or llm.c scaffold shards, back as text"),
    "remove": ("pipelines.remove", "take flagged ids out of a bucketed output, rewriting only their shards"),
    "verify": ("pipelines.verify", "check an output tree against its format (and its source with --input)"),
    "export": ("pipelines.export", "zero-copy indexes for other trainers: export megatron (.idx and .bin link)"),
    "stats": ("pipelines.stats", "document lengths per bucket: a table and a histogram PNG, for mixing weights"),
    "train-bpe": ("pipelines.train_bpe", "learn a BPE tokenizer from documents (words counted on Beam)"),
}

# Jobs that publish an output tree: a failure leaves the previous output as it was.
PUBLISHING = {"bucketed", "scaffold", "remove", "train-bpe"}
# Plain tools without a pipeline: any ValueError or OSError they raise is about how they were asked.
PLAIN_TOOLS = {"decode", "export", "stats"}
# Jobs that can return once the runner has them, without waiting (main's ``wait``).
SUBMITTABLE = ("bucketed", "scaffold")


def load(job: str) -> ModuleType:
    """The module of ``job``, imported now: the one place a job's code is loaded, when it runs."""
    return importlib.import_module(JOBS[job][0])
