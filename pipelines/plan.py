"""``--plan``: what a run would read, make and write, from the input's plan and a small sample.

    pretokenize bucketed --input 'data/*.parquet' --output out/ --plan

Nothing runs and nothing is written: the input is planned as a run plans it (every file listed,
every parquet footer read, so a missing column fails here too), the tokenizer is loaded, and
``SAMPLE_DOCS`` documents from up to ``SAMPLE_UNITS`` input units spread over the input go
through the job's own filter and encoder. The estimates scale the sample to the input's rows:

1. rows: exact for parquet (row-group metadata); else as the input format counts them
   (``count_rows``, transforms.inputs.formats): for JSON lines, counted in a sampled file up to
   ``transforms.inputs.jsonl.SAMPLE_BYTES`` of it (all of a smaller one), a JSON text file up to
   ``transforms.inputs.json_text.COUNT_BYTES`` read whole, and for the rest the rows per stored byte
   of the sampled files (compressed alike) times the other files' bytes;
2. documents and tokens: the sample's kept share and tokens per row, times the rows;
3. core-hours: the tokens over the tokens per CPU second measured while encoding the sample (the
   encoder's own work; reading and writing add to it, and a first call pays warm-up);
4. output files: per bucket (or split), the files the estimated bytes fill, at most one open
   file per partition (a document's partition is a hash of its id, so few documents touch
   few partitions).

A sample is no census: a corpus whose first rows differ from the rest misleads it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np

from shards import layout, llmc, storage
from shards import tree as ownership
from shards.card import CARD_NAME
from shards.provenance import STATS_JSON_NAME
from transforms.core.batches import DocBatch
from transforms.core.records import BadRecord, Document
from transforms.inputs.compression import compression_of
from transforms.inputs.fields import ReadConfig
from transforms.inputs.read import plan_input, read_batches
from transforms.inputs.registry import format_of
from transforms.inputs.units import InputUnit

SAMPLE_DOCS = 256
SAMPLE_UNITS = 16


@dataclasses.dataclass
class InputPlan:
    """The input as a run would plan it, and the sample drawn from it."""

    files: int
    units: list[InputUnit]
    rows: int  # known or estimated
    rows_exact: bool
    sample: list[DocBatch]
    sampled_records: int  # documents and bad records of the sample
    sampled_units: int

    @property
    def scale(self) -> float:
        return self.rows / self.sampled_records if self.sampled_records else 0.0

    @property
    def whole(self) -> bool:
        return self.rows_exact and self.sampled_records == self.rows


def _file_size(path: str) -> int:
    fs, fs_path = storage.filesystem(path)
    return int(fs.info(fs_path).get("size") or 0)


def _spread(units: Sequence[InputUnit], k: int) -> list[InputUnit]:
    """``k`` units spread evenly over the input (the first and the last among them)."""
    if len(units) <= k:
        return list(units)
    return [units[int(i)] for i in np.linspace(0, len(units) - 1, k).round().astype(int)]


def _take(unit: InputUnit, config: ReadConfig, limit: int) -> tuple[list[DocBatch], int]:
    """Up to ``limit`` records from the start of ``unit``: its DocBatches and the records read."""
    batches, records = [], 0
    items: Iterator = read_batches(unit, config)
    try:
        for item in items:
            if isinstance(item, BadRecord):
                records += 1
            else:
                if records + item.size > limit:
                    item = DocBatch(item.source, item.table.slice(0, limit - records))
                batches.append(item)
                records += item.size
            if records >= limit:
                break
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
    return batches, records


def plan_and_sample(config: ReadConfig, sample_docs: int = SAMPLE_DOCS, sample_units: int = SAMPLE_UNITS) -> InputPlan:
    """Plan the input as a run does, and draw the sample."""
    units = plan_input(config)
    files = len({u.path for u in units})
    chosen = _spread(units, sample_units)
    per_unit = max(1, -(-sample_docs // max(len(chosen), 1)))
    sample, sampled = [], 0
    for unit in chosen:
        batches, records = _take(unit, config, per_unit)
        sample += batches
        sampled += records
    rows, exact = sum(u.rows for u in units if u.rows >= 0), True
    others = sorted({u.path: u for u in units if u.rows < 0}.values())
    density: dict[str, list[int]] = {}  # compression -> [records, stored bytes] of the sampled files
    unknown = []
    for unit in others:
        count = format_of(unit.kind).count_rows(unit, config, sampled=unit in chosen)
        if count is None:
            unknown.append(unit)
            continue
        if count.whole:
            rows += count.records
        else:
            rows += round(count.records * _file_size(unit.path) / count.stored_bytes)
            exact = False
        if count.pooled:
            pooled = density.setdefault(compression_of(unit.path), [0, 0])
            pooled[0], pooled[1] = pooled[0] + count.records, pooled[1] + count.stored_bytes
    for unit in unknown:  # the rows per stored byte of sampled files compressed alike (or of any)
        exact = False
        alike = density.get(compression_of(unit.path))
        records, used = alike or [sum(v) for v in zip(*density.values(), strict=True)] or [0, 0]
        if not used:  # JSON text too large to count: rows per byte of the sampled records
            records, used = sum(b.size for b in sample), sum(b.table.nbytes for b in sample)
        rows += round(_file_size(unit.path) * records / used) if used else 0
    return InputPlan(files, units, rows, exact, sample, sampled, len(chosen))


# What a dry run says a run would do with each of shards.tree.find's answers.
_OUTPUT_STATES = {
    "missing": "does not exist: a run creates it",
    "file": "is a file: a run would be refused",
    "empty": "is empty: a run fills it",
    "foreign": "is not empty and was not written by pretokenize: a run would be refused",
}


def output_state(output: str, kind: str) -> str:
    """What a run would find at ``output`` (nothing is created or changed to find out): the tree
    layer's claim rule (shards.tree.find), said."""
    found = ownership.find(output, kind)
    if found.state == "other kind":
        return f"holds the {found.record.kind} job's output: a run would be refused"
    if found.state == "ours":
        return f"holds this job's earlier output ({len(found.record.files)} files): a run replaces it"
    return _OUTPUT_STATES[found.state]


def expected_partitions(documents: float, partitions: int) -> float:
    """How many of ``partitions`` partitions ``documents`` documents, hashed evenly, touch."""
    if documents <= 0:
        return 0.0
    return partitions * (1.0 - (1.0 - 1.0 / partitions) ** documents)


def _count(x: float, exact: bool) -> str:
    """A count: exact, or an estimate to three significant figures (and whole)."""
    return f"{round(x):,}" if exact else f"~{_sig(x, whole=True)}"


def _sig(x: float, whole: bool = False) -> str:
    """Three significant figures, with thousands separators: 1,230,000 or 0.0123 (59 when whole)."""
    if x == 0 or (whole and round(x) == 0):
        return "0"
    digits = 3 - 1 - math.floor(math.log10(abs(x)))
    if whole:
        digits = min(digits, 0)
    value = round(x, digits)
    return f"{value:,.{max(digits, 0)}f}"


def _bytes(n: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def input_lines(plan: InputPlan, config: ReadConfig) -> list[str]:
    kinds = sorted({u.kind for u in plan.units})
    rows = (f"{plan.rows:,} rows" if plan.rows_exact
            else f"~{_sig(plan.rows)} rows (estimated: JSON lines are counted when read)")
    return [
        f"input: {config.pattern}",
        f"  {plan.files:,} {'file' if plan.files == 1 else 'files'} ({', '.join(kinds)}), {len(plan.units):,} "
        f"{'unit' if len(plan.units) == 1 else 'units'} of work, {rows}",
        f"  sample: {plan.sampled_records:,} rows from the start of {plan.sampled_units} of the "
        f"{len(plan.units):,} units"
        + (" (the whole input: the figures below are its own)" if plan.whole else ""),
    ]


def cost_lines(tokens: float, tokens_per_cpu_second: float, exact: bool, what: str) -> list[str]:
    core_hours = tokens / tokens_per_cpu_second / 3600 if tokens_per_cpu_second else float("nan")
    return [
        f"  {what}: {_sig(tokens_per_cpu_second)} tokens per CPU second in the sample",
        f"  core-hours: ~{_sig(core_hours)} ({_sig(core_hours * 3600)} CPU seconds) of encoding for "
        f"{_count(tokens, exact)} tokens (reading and writing add to it)",
    ]


def timed(fn, *args):
    """``fn(*args)`` and the CPU seconds it took (all threads of this process)."""
    start = time.process_time()
    out = fn(*args)
    return out, time.process_time() - start


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i in (0, len(widths) - 1) else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip() for r in rows]


def bucketed(options) -> str:
    """The plan of ``pretokenize bucketed`` with these BucketedSettings."""
    output = storage.normalize(options.output)
    tokenizer = options.tokenizer_config()
    encoder = tokenizer.load()
    lid = options.lid_filter()
    config = options.read_config()
    plan = plan_and_sample(config)
    dtype = np.dtype(options.dtype)
    drops, lengths, ids, cpu = _sample_bucketed(plan, lid, encoder, dtype, tokenizer.batch_docs)
    exact, scale = plan.whole, plan.scale
    kept_docs, tokens = len(lengths) * scale, float(lengths.sum()) * scale
    share = 100.0 * len(lengths) / plan.sampled_records if plan.sampled_records else 0.0

    lines = ["plan of pretokenize bucketed: nothing was run and nothing written", *input_lines(plan, config)]
    lines.append("estimate:")
    drop_text = ", ".join(f"{r} {_count(n * scale, exact)}" for r, n in drops.items() if n) or "none"
    lines.append(f"  documents kept: {_count(kept_docs, exact)} ({share:.1f}% of the rows); dropped: {drop_text}")
    if options.removal_list:
        lines.append("  (the ids of --removal-list are not taken out of these figures)")
    lines.append(f"  tokens: {_count(tokens, exact)} (one EOS per document), {_bytes(tokens * dtype.itemsize)} "
                 f"as {options.dtype}")
    lines += cost_lines(tokens, lengths.sum() / cpu if cpu else 0.0, exact,
                        f"tokenizer {encoder.spec} ({encoder.library or 'its library'})")
    lines.append(f"output: {output} ({output_state(output, 'bucketed')})")
    return "\n".join(lines + _shard_table(_bucket_rows(options, lengths, ids, exact, scale), BUCKETED_FILES))


def _sample_bucketed(plan, lid, encoder, dtype: np.dtype, batch_docs: int):
    """The sample filtered and tokenized: the drops by reason (bad records included), the kept
    documents' lengths and ids, and the CPU seconds the tokenizer took."""
    from transforms.bucketed.filter import drop_masks
    from transforms.bucketed.tokenize import encode_batch

    drops: dict[str, int] = {}
    lengths, ids, cpu = [], [], 0.0
    for batch in plan.sample:
        masks = drop_masks(batch.table, lid)
        dropped = np.zeros(batch.size, dtype=bool)
        for reason, mask in masks.items():
            drops[reason] = drops.get(reason, 0) + int(mask.sum())
            dropped |= mask
        kept = batch.filter(~dropped)
        if kept.size:
            encoded, seconds = timed(encode_batch, encoder, kept, dtype, batch_docs)
            cpu += seconds
            lengths.append(encoded.lengths)
            ids += encoded.ids
    bad = plan.sampled_records - sum(b.size for b in plan.sample)
    if bad:
        drops["bad records"] = bad
    return drops, (np.concatenate(lengths) if lengths else np.zeros(0, np.int64)), ids, cpu


def _bucket_rows(options, lengths: np.ndarray, ids: list, exact: bool, scale: float) -> list[tuple[str, ...]]:
    """The shard table's rows of the bucketed job: per bucket, the documents, tokens and files."""
    dtype = np.dtype(options.dtype)
    buckets = np.searchsorted(np.asarray(layout.BUCKET_BOUNDS), lengths, side="left")
    rows = [("bucket", "documents", "tokens", "files", "names")]
    for i, name in enumerate(layout.BUCKET_NAMES):
        in_bucket = buckets == i
        docs, bucket_tokens = int(in_bucket.sum()) * scale, float(lengths[in_bucket].sum()) * scale
        if not docs:
            continue
        if exact:
            parts = sorted({layout.partition_of(d, options.partitions)
                            for d, k in zip(ids, in_bucket, strict=True) if k})
            touched, low, high = len(parts), parts[0], parts[-1]
        else:
            touched, low, high = expected_partitions(docs, options.partitions), 0, options.partitions - 1
        per_partition = bucket_tokens * dtype.itemsize / max(touched, 1)
        rolls = max(1, math.ceil(per_partition / options.max_shard_bytes))
        files = max(1.0, touched) * rolls
        first = layout.shard_rel_path(name, low, 0, options.partitions)
        last = layout.shard_rel_path(name, high, rolls - 1, options.partitions)
        rows.append((name, _count(docs, exact), _count(bucket_tokens, exact), _count(files, exact),
                     first if first == last else f"{first} .. {last}"))
    return rows


def _shard_table(rows: list[tuple[str, ...]], other_files: tuple[str, ...]) -> list[str]:
    """The lines of the shards a run would write (``rows``, under their header), and its other files."""
    lines = _table(rows) if len(rows) > 1 else ["  no shard: the sample keeps no document"]
    return lines + [f"  and {', '.join(other_files)}"]


# The files a finished tree has besides its shards (shards.tree's record, the core's checksums, stats
# and description, the bucketed format's manifest).
DESCRIPTION_FILES = (STATS_JSON_NAME, CARD_NAME)
BUCKETED_FILES = (layout.MANIFEST_NAME, layout.CHECKSUMS_NAME, *DESCRIPTION_FILES, layout.STATS_NAME,
                  ownership.RECORD_NAME)
SCAFFOLD_FILES = (layout.CHECKSUMS_NAME, *DESCRIPTION_FILES, layout.STATS_NAME, ownership.RECORD_NAME)


def scaffold(options) -> str:
    """The plan of ``pretokenize scaffold`` with these ScaffoldSettings."""
    from transforms.scaffold.encode import WordEncoder

    output = storage.normalize(options.output)
    scaffold_config = options.scaffold_config()
    encoder = scaffold_config.load()
    words = WordEncoder(encoder, scaffold_config.word_cache_size)
    config = options.read_config()
    plan = plan_and_sample(config)
    drops, per_split, cpu = _sample_scaffold(plan, scaffold_config, words)
    exact, scale = plan.whole, plan.scale
    kept = sum(s[0] for s in per_split.values())
    tokens = sum(s[2] for s in per_split.values()) * scale
    share = 100.0 * kept / plan.sampled_records if plan.sampled_records else 0.0

    lines = ["plan of pretokenize scaffold: nothing was run and nothing written", *input_lines(plan, config)]
    lines.append("estimate:")
    drop_text = ", ".join(f"{r} {_count(n * scale, exact)}" for r, n in drops.items() if n) or "none"
    lines.append(f"  documents kept: {_count(kept * scale, exact)} ({share:.1f}% of the rows); dropped: {drop_text}")
    lines.append(f"  tokens: {_count(tokens, exact)} (countdown, GPT-2 and EOT), {_bytes(tokens * 2)} as uint16")
    lines += cost_lines(tokens, tokens / scale / cpu if cpu else 0.0, exact,
                        f"encoder {encoder.spec} with countdown tokens")
    lines.append(f"output: {output} ({output_state(output, 'scaffold')})")
    return "\n".join(lines + _shard_table(_split_rows(options, per_split, exact, scale), SCAFFOLD_FILES))


def _sample_scaffold(plan, scaffold_config, words):
    """The sample encoded: the drops by reason (bad records included), per split the documents,
    sequences and tokens kept, and the CPU seconds the encoder took."""
    from transforms.scaffold.encode import encode_document

    drops: dict[str, int] = {}
    per_split = {name: [0, 0, 0] for name in llmc.SPLITS}  # documents, sequences, tokens
    cpu = 0.0
    for batch in plan.sample:
        rows = batch.table.column("row").to_pylist()
        for doc_id, text, row in zip(batch.column("id"), batch.column("text"), rows, strict=True):
            result, seconds = timed(encode_document, Document(doc_id, text, batch.source, row), scaffold_config, words)
            cpu += seconds
            if result.drop_reason is not None:
                drops[result.drop_reason] = drops.get(result.drop_reason, 0) + 1
                continue
            split = per_split[result.sequences[0].split]
            split[0] += 1
            split[1] += len(result.sequences)
            split[2] += result.counts.tokens
    bad = plan.sampled_records - sum(b.size for b in plan.sample)
    if bad:
        drops["bad records"] = bad
    return drops, per_split, cpu


def _split_rows(options, per_split: dict, exact: bool, scale: float) -> list[tuple[str, ...]]:
    """The shard table's rows of the scaffold job: per split, the documents, sequences, tokens and files."""
    rows = [("split", "documents", "sequences", "tokens", "files", "names")]
    for name, (docs, sequences, split_tokens) in per_split.items():
        if not docs:
            continue
        files = max(1, math.ceil(split_tokens * scale / options.shard_tokens))
        width = llmc.shard_digits(files)
        rows.append((name, _count(docs * scale, exact), _count(sequences * scale, exact),
                     _count(split_tokens * scale, exact), _count(files, exact),
                     llmc.shard_rel_path(name, 0, width) if files == 1
                     else f"{llmc.shard_rel_path(name, 0, width)} .. {llmc.shard_rel_path(name, files - 1, width)}"))
    return rows
