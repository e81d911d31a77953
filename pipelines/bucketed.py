"""The bucketed job: documents to length-bucketed token shards in the FinePDFs-Edu layout.

    pretokenize bucketed --input 'data/*.parquet' --output out/ [--runner FnApiRunner ...]

Flags this job does not know go to Beam's PipelineOptions (--runner, --direct_num_workers, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
from typing import TYPE_CHECKING

from pipelines import common
from shards import layout, lock, storage, tree
from shards.manifest import DatasetStats
from shards.removal import REMOVALS_NAME, check_id_field, read_removal_list, read_removal_source, tree_id_field
from transforms.bucketed.settings import BucketedSettings
from transforms.tokenizers.backends import BACKENDS
from transforms.tokenizers.encoder import SPECIAL_TOKEN_MODES

if TYPE_CHECKING:  # Beam and the steps are imported by build(): --help and a flag's error import none of it
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

log = logging.getLogger(__name__)


def make_parser() -> argparse.ArgumentParser:
    d, flag = common.defaults(BucketedSettings), common.add_flag
    p = common.job_parser("bucketed", "Tokenize parquet/JSONL documents into length-bucketed uint32 shards "
                          "(FinePDFs-Edu layout).", ".parquet/.jsonl files")
    common.add_document_filter_flags(p, d)
    flag(p, "tokenizer", default=d.tokenizer,
         help="jet-nemotron | jet-nemotron:PATH | gpt2 | tiktoken:PATH | hf:NAME_OR_PATH | trained:DIR")
    flag(p, "tokenizer-backend", default=d.tokenizer_backend, choices=list(BACKENDS),
         help="auto: quicktok where it encodes the tokenizer exactly (jet-nemotron), else tiktoken")
    flag(p, "tokenizer-threads", type=int, default=d.tokenizer_threads,
         help="threads of quicktok's batch call per worker (more only for a local run on a large machine)")
    flag(p, "eos-token", default=None,
         help="for hf: and trained: tokenizers, the token appended as EOS (default: its eos)")
    flag(p, "dtype", default=d.dtype, choices=sorted(layout.DTYPES), help="token dtype on disk")
    flag(p, "partitions", type=int, default=d.partitions, help="partitions per bucket")
    flag(p, "max-shard-bytes", type=float, default=d.max_shard_bytes, help="roll to a new file before this size")
    flag(p, "seed", type=int, default=d.seed, help="seed of the order inside each partition")
    flag(p, "read-connections", type=int, default=d.read_connections,
         help="range requests in flight per writer reading spill files on an object store (never changes the bytes)")
    flag(p, "batch-docs", type=int, default=d.batch_docs, help="documents per tokenizer batch")
    flag(p, "removal-list", default=None, help="ids to leave out, one a line, no comments, or a removals.txt")
    flag(p, "special-tokens", default=d.special_tokens, choices=list(SPECIAL_TOKEN_MODES),
         help="text: an added-token string (<|endoftext|>, <tool_call>, ...) in a document is encoded as text; "
              "tokenizer: as its single id, as AutoTokenizer does (EOS may then appear inside a document)")
    common.add_common_flags(p)
    common.add_card_flags(p)
    return p


def parse_args(argv: list[str]) -> tuple[BucketedSettings, PipelineOptions]:
    return common.parse_settings(make_parser(), argv, BucketedSettings, integers=("max_shard_bytes",))


def build(pipeline: beam.Pipeline, options: BucketedSettings, run_id: str | None = None):
    """Adds the job to ``pipeline``; returns the PCollection holding the published DatasetStats.

    Everything checkable is checked here, before the pipeline runs: the tokenizer loads and fits
    the dtype, and every input file exists and has the columns the job reads. Input units an
    interrupted run with the same input and settings finished are not redone (transforms.core.resume).
    """
    import apache_beam as beam

    from transforms.bucketed.filter import DROPPED, FilterLanguageFn
    from transforms.bucketed.format import BucketedFormat
    from transforms.bucketed.removal import MATCHED, DropRemoved, DropRemovedFn
    from transforms.bucketed.tokenize import TokenizeFn
    from transforms.bucketed.write import WriteShards, spill_fn
    from transforms.core import resume
    from transforms.core.provenance import launch_provenance
    from transforms.core.publish import PublishOutput
    from transforms.core.read import RECORDS, CountRecords, ReadDocuments, ReadUnitFn
    from transforms.tools.surgery import JOURNAL_DIR, load_journal, read_tree_log

    output = storage.normalize(options.output)
    tokenizer = options.tokenizer_config()
    encoder = tokenizer.load()
    tokenizer = tokenizer.pinned(encoder)  # each worker checks it loads these very files
    lid = options.lid_filter()
    shards = options.shard_config(run_id or common.new_run_id())
    read_config = options.read_config()
    progress_dir = common.progress_dir(pipeline.options, run_id)
    read = ReadDocuments(read_config, progress_dir=progress_dir)
    units = read.units  # planned and checked here; read by ProcessUnits
    pending = load_journal(output) if tree.read_record(output) is not None else None
    keep = (JOURNAL_DIR,) if pending else ()
    # Removal requests this output has accepted stay honoured: the ids removals.txt lists as taken
    # out, and those of a removal that was interrupted (its journal), which this run finishes.
    # removals.txt is read as the log it is, strictly; a run that would read ids from another
    # field than the one they are values of is refused (the removed documents would come back).
    tree_log = read_tree_log(output)
    removals_txt = output if tree_log is not None else None  # the tree itself: its removals.txt is its log
    if tree_log is not None:
        check_id_field(tree_log.id_field or tree_id_field(_stats_text(output)), storage.join(output, REMOVALS_NAME),
                       options.id_field)
    if pending is not None:
        check_id_field(tree_id_field(pending.stats_before), f"the unfinished removal {pending.run} in {output}",
                       options.id_field)
    lists = [storage.normalize(options.removal_list)] if options.removal_list else []
    for url in lists:
        _, list_field = read_removal_source(url)
        check_id_field(list_field, f"--removal-list {url}", options.id_field)
    removal_ids = removed_ids(lists + ([removals_txt] if removals_txt else []), pending)
    description = resume.WorkDescription.of("bucketed", options, units, {
        "tokenizer_probe": resume.tokenizer_probe(encoder),
        "removal_ids": hashlib.sha256("\n".join(sorted(removal_ids)).encode()).hexdigest()[:16],
    }, ignore=("read_connections",))
    work = common.prepare_output(output, "bucketed", inputs=[u.path for u in units], keep=keep, work=description,
                                 restart=options.restart)
    shards = dataclasses.replace(shards, work_dir=work.dir_name)
    common.announce_write_stages(progress_dir, units, work.done, "tokenize", "tokenize")
    sources = list(lists)
    if options.removal_list:
        shards = dataclasses.replace(shards, removal_list=storage.normalize(options.removal_list))
    if removals_txt:
        sources.append(removals_txt)
        log.warning("%s has a %s: the documents it lists stay out", output, REMOVALS_NAME)
    if pending is not None:
        scratch = common.dry_run_scratch()  # a dry run writes nothing into the output
        ids = "".join(f"{i}\n" for _, i, _ in pending.removed_rows).encode()
        if scratch is not None:
            pending_list = os.path.join(scratch, tree.Tree.PENDING_REMOVAL_LIST)
            storage.write_atomic(pending_list, ids)
        else:
            name = tree.Tree.temp_name(shards.run_id, tree.Tree.PENDING_REMOVAL_LIST)
            tree.Tree(output).write(name, ids)
            pending_list = storage.join(output, name)
        sources.append(pending_list)
        shards = dataclasses.replace(shards, pending_removal=pending.run)
        log.warning("%s has an unfinished removal (run %s, %d documents): they stay out, and this run "
                    "records them in %s", output, pending.run, len(pending.removed_rows), REMOVALS_NAME)
    removal = DropRemoved(*sources) if sources else None
    publish_format = BucketedFormat(
        options, encoder.eos_id, encoder.max_token_id + 1, shards, len(removal.ids) if removal else None,
        tokenizer_backend=encoder.library,
        provenance=launch_provenance("bucketed", options, units, options.tokenizer),
    )

    # Each input unit read, filtered, tokenized and spilled in one step, its completion recorded.
    steps = [DropRemovedFn(tuple(sources))] if removal is not None else []
    steps += [FilterLanguageFn(lid), TokenizeFn(tokenizer)]
    tags = (DROPPED, RECORDS, MATCHED) if removal is not None else (DROPPED, RECORDS)
    spilled = pipeline | "TokenizeInputUnits" >> resume.ProcessUnits(
        work, units, work.done, ReadUnitFn(read_config, read.planned if progress_dir else None, progress_dir), steps,
        spill_fn(shards), tags)
    raw = spilled[RECORDS] | "CountDocuments" >> CountRecords()
    drops = [spilled[DROPPED]]
    removal_found = None
    if removal is not None:
        removal_found = (
            spilled[MATCHED]
            | "DistinctRemovedIds" >> beam.Distinct()
            | "CountRemovedIds" >> beam.combiners.Count.Globally()
        )
    written = spilled.refs | "WriteShards" >> WriteShards(shards, spilled=True)
    drops.append(written[DROPPED])
    extras = {} if removal_found is None else {"removal_found": beam.pvalue.AsSingleton(removal_found)}
    return written.groups | "PublishOutput" >> PublishOutput(publish_format, shards, raw, tuple(drops), **extras)


def _stats_text(output: str) -> str | None:
    return tree.OutputTree.open(output).stats_text if tree.read_record(output) is not None else None


def removed_ids(lists: list[str], pending) -> set[str]:
    """The ids a run leaves out: those of the removal lists (and removals.txt), and of a pending removal."""
    ids = {i for url in lists for i in read_removal_list(url)}
    if pending is not None:
        ids.update(i for _, i, _ in pending.removed_rows)
    return ids


def summary_table(stats: DatasetStats, output: str, seconds: float) -> str:
    lines = [f"{'bucket':>8} {'documents':>12} {'tokens':>16} {'files':>6}"]
    for name in layout.BUCKET_NAMES:
        b = stats.buckets.get(name)
        if b and b.documents:
            lines.append(f"{name:>8} {b.documents:>12,} {b.tokens:>16,} {b.files:>6}")
    lines.append(f"{'total':>8} {stats.kept_documents:>12,} {stats.total_tokens:>16,} {stats.total_files:>6}")
    lines.append("")
    lines += common.drop_lines(stats.raw_documents, stats.kept_documents, stats.drops)
    if stats.removal_list_ids is not None:
        lines.append(
            f"removal list: {stats.removal_list_ids:,} ids, {stats.removal_ids_not_found:,} of them not in the input"
        )
    lines += common.timing_lines(stats.total_tokens, seconds, output)
    return "\n".join(lines)


@lock.command("bucketed")
def run(argv: list[str] | None = None) -> DatasetStats:
    return common.run_job(argv or [], parse_args, build, summary_table, plan=_plan)


def _plan(options: BucketedSettings) -> str:
    from pipelines import plan

    return plan.bucketed(options)
