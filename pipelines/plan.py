"""``--plan``: what a run would read, make and write, from the input's plan and a small sample.

    pretokenize bucketed --input 'data/*.parquet' --output out/ --plan

Nothing runs and nothing is written: the input is planned as a run plans it (every file listed,
every parquet footer read, so a missing column fails here too), the tokenizer is loaded, and
``SAMPLE_DOCS`` documents go through the job's own filter and encoder: ``SAMPLE_UNITS`` draws of an
input unit, half of them each unit's chance its share of the input's bytes, half each unit alike;
in each unit drawn, read whole in one pass, half its records drawn by their text's bytes (for the
tokens, which grow with the bytes: a long document is drawn as often as its bytes say, wherever it
lies) and half alike (for the documents and drops, which grow with the rows). A unit's chance at a
draw is the mean of the two halves' (so a unit of few bytes, which the first half rarely draws,
is still weighed right when the second draws it: the "balance heuristic" of multiple importance
sampling). Each draw estimates the whole (its unit's figure over its chance: Hansen and Hurwitz);
the estimates are the mean of the draws (tokens) or their ratio to the rows (documents, drops),
each with a 95% interval from the draws' spread:

1. rows: exact for parquet (row-group metadata); else as the input format counts them
   (``count_rows``, transforms.inputs.formats): for JSON lines, counted in a sampled file up to
   ``transforms.inputs.jsonl.SAMPLE_BYTES`` of it (all of a smaller one), a JSON text file up to
   ``transforms.inputs.json_text.COUNT_BYTES`` read whole, and for the rest the rows per stored byte
   of the sampled files (compressed alike) times the other files' bytes;
2. documents and drops: the draws' kept (dropped) share of their rows, times the rows; tokens: the
   mean of the draws' estimates of the whole;
3. core-hours: the tokens over the tokens per CPU second measured while encoding the sample (the
   encoder's own work; reading and writing add to it, and a first call pays warm-up);
4. output files: per bucket (or split), the files the estimated bytes fill, at most one open
   file per partition (a document's partition is a hash of its id, so few documents touch
   few partitions).

A sample is no census: the interval says how far its figures may be from the run's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow.compute as pc

from shards import layout, llmc, storage
from shards import tree as ownership
from shards.card import CARD_NAME
from shards.provenance import STATS_JSON_NAME
from transforms.bucketed.filter import batch_masks, keep_tokens
from transforms.bucketed.tokenize import encode_batch
from transforms.core.batches import DocBatch
from transforms.core.records import BadRecord, Document
from transforms.inputs.compression import compression_of
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_input
from transforms.inputs.read import read_batches
from transforms.inputs.registry import format_of
from transforms.inputs.units import InputUnit
from transforms.scaffold.encode import WordEncoder, encode_document

SAMPLE_DOCS = 256  # rows in the sample
SAMPLE_UNITS = 32  # draws of an input unit
# Text read of a drawn unit at most (a JSON lines file is one unit, however large): a larger unit's
# rows are drawn from its first SCAN_TEXT_BYTES, taken to stand for the rest.
SCAN_TEXT_BYTES = 64 << 20
# Student's t at 97.5% by degrees of freedom (the draws less one), for a 95% interval; 1.96 beyond.
_T95 = ((1, 12.71), (2, 4.30), (3, 3.18), (4, 2.78), (5, 2.57), (6, 2.45), (7, 2.36), (8, 2.31), (9, 2.26),
        (10, 2.23), (12, 2.18), (15, 2.13), (20, 2.09), (30, 2.04), (60, 2.00))


@dataclasses.dataclass(eq=False)  # a draw is itself: the same unit may be drawn again
class Draw:
    """One draw of the sample: ``unit``, of ``rows`` rows (known or estimated), drawn with
    ``chance`` at each draw, its records drawn ``by`` (BY_BYTES, BY_UNITS: alike, or WHOLE in a census);
    ``records`` of it drawn from the whole unit (_take; all of it in a census), ``batches`` the
    documents among them, and ``factors`` (one array a batch) what each of those stands for against
    a record drawn alike: 1, or for a draw by bytes the unit's mean weight over the record's."""

    unit: InputUnit
    rows: float
    chance: float
    by: str
    batches: list[DocBatch]
    records: int
    factors: list[np.ndarray]

    @property
    def bad_records(self) -> int:
        """The bad records drawn: by bytes none (a bad record has no text, so no chance)."""
        return 0 if self.by == BY_BYTES else self.records - sum(b.size for b in self.batches)


BY_BYTES, BY_UNITS, WHOLE = "bytes", "units", "whole"


@dataclasses.dataclass
class InputPlan:
    """The input as a run would plan it, and the sample drawn from it (``draws``)."""

    files: int
    units: list[InputUnit]
    rows: int  # known or estimated
    rows_exact: bool
    draws: list[Draw]
    whole: bool  # the sample is the input: every unit read once, whole

    @property
    def sample(self) -> list[DocBatch]:
        return [b for d in self.draws for b in d.batches]

    @property
    def sampled_records(self) -> int:
        return sum(d.records for d in self.draws)

    @property
    def sampled_units(self) -> int:
        return len({d.unit for d in self.draws})

    @property
    def scale(self) -> float:
        return self.rows / self.sampled_records if self.sampled_records else 0.0

    def half(self, in_rows: bool) -> list[Draw]:
        """The draws that estimate a figure counted in rows (documents, drops: those drawn alike),
        or one that grows with the bytes (tokens: those drawn by bytes); every draw of a census."""
        return [d for d in self.draws if d.by in (WHOLE, BY_UNITS if in_rows else BY_BYTES)]

    def weight(self, draw: Draw, in_rows: bool = False) -> float:
        """What a record of ``draw`` stands for in the input's figure of that kind (0 for a draw of
        the other half): each draw estimates the whole (its unit's figure over its chance: Hansen
        and Hurwitz) and the estimate is their mean; in rows, scaled so that the half's records
        stand for the input's rows (a ratio estimate)."""
        half = self.half(in_rows)
        if draw not in half or not draw.records:
            return 0.0
        weight = draw.rows / draw.records / draw.chance / len(half)
        if not in_rows:
            return weight
        rows = sum(d.rows / d.chance / len(half) for d in half if d.records)
        return weight * self.rows / rows if rows else 0.0


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A figure of the input estimated from the draws: ``value`` and a 95% interval (``low``,
    ``high``); all three the same when the sample is the whole input."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, plan: InputPlan, per_draw: Sequence[float], in_rows: bool = False) -> Estimate:
        """From the figure counted in each draw's records (``per_draw``, in the order of
        ``plan.draws``); ``in_rows``: a figure counted in rows, estimated as a ratio to them."""
        half = plan.half(in_rows)
        k = len(half)
        each = np.array([q * d.rows / d.records / d.chance if d.records else 0.0
                         for q, d in zip(per_draw, plan.draws, strict=True) if d in half])
        value = float(each.mean()) if k else 0.0
        if in_rows:  # the ratio to the rows each draw estimates, times the input's rows; its residuals
            rows = np.array([d.rows / d.chance if d.records else 0.0 for d in half])
            ratio = value / float(rows.mean()) if rows.sum() else 0.0
            value, each = ratio * plan.rows, (each - ratio * rows) * (plan.rows / float(rows.mean() or 1))
        if plan.whole or k < 2:
            return cls(value, value, value)
        t = 1.96 if k - 1 > _T95[-1][0] else next((t for df, t in reversed(_T95) if k - 1 >= df), _T95[0][1])
        half = t * float(each.std(ddof=1)) / math.sqrt(k)
        return cls(value, max(value - half, 0.0), value + half)

    def text(self, exact: bool) -> str:
        if exact:
            return _count(self.value, True)
        return f"{_count(self.value, False)} (95%: {_sig(self.low, whole=True)} .. {_sig(self.high, whole=True)})"


def _file_size(path: str) -> int:
    fs, fs_path = storage.filesystem(path)
    return int(fs.info(fs_path).get("size") or 0)


def _chances(units: Sequence[InputUnit]) -> list[float]:
    """Each unit's chance at a draw by bytes: its share of the input's bytes (of its text, parquet;
    of the file, JSON)."""
    sizes = np.array([u.text_bytes if u.text_bytes > 0 else max(u.rows, 1) for u in units], dtype=float)
    return list(sizes / sizes.sum())


def _drawn(units: Sequence[InputUnit], weights: Sequence[float], k: int, rng: np.random.Generator) -> list[int]:
    """``k`` draws of a unit, each with a chance its weight's share: systematic (one random start,
    then evenly spaced over the cumulative weights), so a unit of a tenth of the bytes is drawn
    in about a tenth of the draws wherever it lies."""
    cumulative = np.cumsum(np.asarray(weights, dtype=float))
    points = (rng.random() + np.arange(k)) * cumulative[-1] / k
    return [int(i) for i in np.searchsorted(cumulative, points, side="right").clip(0, len(units) - 1)]


def _take(unit: InputUnit, config: ReadConfig, limit: int | None,
          rng: np.random.Generator) -> list[tuple[list[DocBatch], int, list[np.ndarray]]]:
    """Records of ``unit`` drawn from the whole of it (its first SCAN_TEXT_BYTES of text), ``limit``
    by their text's bytes and ``limit`` alike (_Reservoir), in one pass; all of it, once, for None.
    For each way: its DocBatches, the records taken (a bad record counts as one) and per batch what
    each document stands for against a record drawn alike (Draw.factors)."""
    if limit is None:
        items = list(_items(unit, config))
        batches = [b for b in items if not isinstance(b, BadRecord)]
        return [(batches, len(items) - len(batches) + sum(b.size for b in batches), [np.ones(b.size) for b in batches])]
    reservoirs = [_Reservoir(limit, True, rng), _Reservoir(limit, False, rng)]
    for at, item in enumerate(_items(unit, config)):
        for reservoir in reservoirs:
            reservoir.offer(at, item)
        if reservoirs[0].total >= SCAN_TEXT_BYTES:
            break
    return [reservoir.taken() for reservoir in reservoirs]


class _Reservoir:
    """``limit`` records of a unit, drawn with replacement, each alike or (``by_bytes``) with a
    chance its share of the unit's text bytes (_record_weights), in one pass: each of the
    ``limit`` places holds a record with a chance its weight's share of the weights read so far,
    so at the end its share of the unit's. A long document is drawn as often as its bytes say,
    wherever it lies in the unit; drawn by bytes, it is one document standing for every time it
    was drawn (so it is tokenized once)."""

    def __init__(self, limit: int, by_bytes: bool, rng: np.random.Generator):
        self.limit, self.by_bytes, self.rng = limit, by_bytes, rng
        self.held: list[tuple[tuple[int, int], DocBatch | None, float]] = [((-1, -1), None, 0.0)] * limit
        self.total, self.seen = 0.0, 0

    def offer(self, at: int, item) -> None:
        """Read ``item``, the unit's ``at``-th (a DocBatch or a BadRecord)."""
        weights = _record_weights(item, self.by_bytes)
        self.seen, batch_total = self.seen + len(weights), float(weights.sum())
        if not batch_total:
            return
        self.total += batch_total
        places = np.flatnonzero(self.rng.random(self.limit) < batch_total / self.total)
        picks = self.rng.choice(len(weights), len(places), p=weights / batch_total)
        for place, pick in zip(places.tolist(), picks.tolist(), strict=True):
            record = None if isinstance(item, BadRecord) else DocBatch(item.source, item.table.slice(pick, 1))
            self.held[place] = ((at, pick), record, float(weights[pick]))

    def taken(self) -> tuple[list[DocBatch], int, list[np.ndarray]]:
        """The documents drawn, the records drawn, and the documents' factors: drawn alike, each
        as drawn (1); by bytes, each once, the unit's mean weight over its own times its draws."""
        records = self.limit if self.total else 0
        if not self.by_bytes:
            docs = [record for _, record, _ in self.held if record is not None]
            return docs, records, [np.ones(1) for _ in docs]
        mean, times = self.total / self.seen if self.seen else 0.0, {}
        for where, record, weight in self.held:
            if record is not None:
                times.setdefault(where, [record, weight, 0])[2] += 1
        return [r for r, _, _ in times.values()], records, [np.full(1, k * mean / w) for _, w, k in times.values()]


def _items(unit: InputUnit, config: ReadConfig) -> Iterator:
    """The unit's DocBatches and BadRecords, as a run reads them, its reader closed at the end."""
    items: Iterator = read_batches(unit, config)
    try:
        yield from items
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _record_weights(item, by_bytes: bool) -> np.ndarray:
    """The weight of each record of ``item`` at a draw: 1 alike; by bytes its text's UTF-8 bytes
    plus one (its EOS: an empty text still makes a token), and 0 for a bad record, which makes none."""
    if isinstance(item, BadRecord):
        return np.zeros(1) if by_bytes else np.ones(1)
    if not by_bytes:
        return np.ones(item.size)
    return pc.binary_length(item.table.column("text")).fill_null(0).to_numpy(zero_copy_only=False) + 1.0


def _unit_rows(units: list[InputUnit], config: ReadConfig, drawn: set[InputUnit]) -> tuple[dict[InputUnit, float],
                                                                                           bool]:
    """Each unit's rows (parquet: exact; else as its format counts them, those ``drawn`` further
    in, or estimated per stored byte) and whether all are exact."""
    counted: dict[InputUnit, float] = {u: float(u.rows) for u in units if u.rows >= 0}
    exact = True
    density: dict[str, list[int]] = {}  # compression -> [records, stored bytes] of the counted files
    unknown = []
    for unit in sorted({u for u in units if u.rows < 0}):
        count = format_of(unit.kind).count_rows(unit, config, sampled=unit in drawn)
        if count is None:
            unknown.append(unit)
            continue
        if count.whole:
            counted[unit] = float(count.records)
        else:
            counted[unit] = count.records * _file_size(unit.path) / count.stored_bytes
            exact = False
        if count.pooled:
            pooled = density.setdefault(compression_of(unit.path), [0, 0])
            pooled[0], pooled[1] = pooled[0] + count.records, pooled[1] + count.stored_bytes
    for unit in unknown:  # the rows per stored byte of files compressed alike (or of any)
        exact = False
        alike = density.get(compression_of(unit.path))
        records, used = alike or [sum(v) for v in zip(*density.values(), strict=True)] or [0, 0]
        counted[unit] = _file_size(unit.path) * records / used if used else 0.0
    return counted, exact


def plan_and_sample(config: ReadConfig, sample_docs: int = SAMPLE_DOCS, sample_units: int = SAMPLE_UNITS) -> InputPlan:
    """Plan the input as a run does, and draw the sample: every unit whole when the input has no
    more rows than the sample; else ``sample_units`` draws of a unit, half by the units' bytes
    (_chances), half alike, and in each unit drawn records by their bytes and alike (_take): two
    Draws, for the tokens (BY_BYTES) and for the rows (BY_UNITS)."""
    units = plan_input(config)
    files = len({u.path for u in units})
    rng = np.random.default_rng(0)  # the same plan each time it is asked
    chances = {BY_BYTES: _chances(units), BY_UNITS: [1 / len(units)] * len(units)}
    chosen = [(by, i) for by in (BY_BYTES, BY_UNITS) for i in _drawn(units, chances[by], sample_units // 2, rng)]
    rows_of, exact = _unit_rows(units, config, {units[i] for _, i in chosen})
    rows = round(sum(rows_of.values()))
    if exact and rows <= sample_docs:
        draws = [Draw(u, rows_of[u], 1 / len(units), WHOLE, *_take(u, config, None, rng)[0]) for u in units]
        return InputPlan(files, units, rows, exact, draws, whole=True)
    per_way = max(1, -(-sample_docs // (2 * len(chosen) or 1)))
    draws = []
    for _, i in chosen:  # a unit's chance at a draw: the mean of the two halves' (see the module's docstring)
        chance = (chances[BY_BYTES][i] + chances[BY_UNITS][i]) / 2
        by_bytes, alike = _take(units[i], config, per_way, rng)
        draws += [Draw(units[i], rows_of[units[i]], chance, BY_BYTES, *by_bytes),
                  Draw(units[i], rows_of[units[i]], chance, BY_UNITS, *alike)]
    return InputPlan(files, units, rows, exact, draws, whole=False)


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
        (f"  sample: the whole input, {plan.sampled_records:,} rows: the figures below are its own" if plan.whole
         else f"  sample: {plan.sampled_records:,} rows at random positions in {len(plan.draws) // 2} draws of a unit "
              f"({plan.sampled_units} of the {len(plan.units):,} units), half by their bytes and half alike, "
              "in each draw half its rows by their bytes, half alike; 95% intervals in brackets"),
    ]


def cost_lines(tokens: Estimate, tokens_per_cpu_second: float, exact: bool, what: str) -> list[str]:
    hours = [t / tokens_per_cpu_second / 3600 if tokens_per_cpu_second else float("nan")
             for t in (tokens.value, tokens.low, tokens.high)]
    interval = "" if exact else f" (95%: {_sig(hours[1])} .. {_sig(hours[2])})"
    return [
        f"  {what}: {_sig(tokens_per_cpu_second)} tokens per CPU second in the sample",
        f"  core-hours: ~{_sig(hours[0])}{interval} ({_sig(hours[0] * 3600)} CPU seconds) of encoding for "
        f"{_count(tokens.value, exact)} tokens (reading and writing add to it)",
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
    config = options.read_config()
    plan = plan_and_sample(config)
    dtype = np.dtype(options.dtype)
    per_draw, made, cpu = _sample_bucketed(plan, options.conditions(), encoder, dtype, tokenizer.batch_docs)
    exact = plan.whole
    lengths = np.concatenate([d[1] for d in per_draw]) if per_draw else np.zeros(0, np.int64)
    drawn = list(zip(per_draw, plan.draws, strict=True))
    weights = (np.concatenate([np.full(len(d[1]), plan.weight(draw, in_rows=True)) for d, draw in drawn]),
               np.concatenate([plan.weight(draw) * d[3] for d, draw in drawn]))
    kept = Estimate.of(plan, [len(d[1]) for d in per_draw], in_rows=True)
    tokens = Estimate.of(plan, [float(d[1] @ d[3]) for d in per_draw])
    reasons = sorted({r for d in per_draw for r, n in d[0].items() if n})
    share = 100.0 * kept.value / plan.rows if plan.rows else 0.0

    lines = ["plan of pretokenize bucketed: nothing was run and nothing written", *input_lines(plan, config)]
    lines.append("estimate:")
    drop_text = ", ".join(f"{r} {Estimate.of(plan, [d[0].get(r, 0) for d in per_draw], True).text(exact)}"
                          for r in reasons) or "none"
    lines.append(f"  documents kept: {kept.text(exact)} ({share:.1f}% of the rows); dropped: {drop_text}")
    if options.removal_list:
        lines.append("  (the ids of --removal-list are not taken out of these figures)")
    lines.append(f"  tokens: {tokens.text(exact)} (one EOS per document), {_bytes(tokens.value * dtype.itemsize)} "
                 f"as {options.dtype}")
    lines += cost_lines(tokens, made / cpu if cpu else 0.0, exact,
                        f"tokenizer {encoder.spec} ({encoder.library or 'its library'})")
    lines.append(f"output: {output} ({output_state(output, 'bucketed')})")
    ids = [i for d in per_draw for i in d[2]]
    return "\n".join(lines + _shard_table(_bucket_rows(options, lengths, ids, exact, weights), BUCKETED_FILES))


def _sample_bucketed(plan, conditions, encoder, dtype: np.dtype, batch_docs: int):
    """Each draw's records filtered and tokenized: per draw, the drops by reason (bad records
    included), the kept documents' lengths, ids and factors (Draw.factors); and the tokens the
    tokenizer made and the CPU seconds it took."""

    per_draw, cpu, made, memo = [], 0.0, 0, {}
    for draw in plan.draws:
        drops: dict[str, int] = {}
        lengths, ids, factors = [], [], []
        for batch, stands in zip(draw.batches, draw.factors, strict=True):
            dropped = _count_masks(batch_masks(batch, conditions), drops, batch.size)
            kept = batch.filter(~dropped)
            if kept.size:
                encoded, seconds = _encoded(kept, memo, lambda b: encode_batch(encoder, b, dtype, batch_docs))
                cpu, made = cpu + seconds, made + (int(encoded.lengths.sum()) if seconds else 0)
                short = _count_masks(batch_masks(encoded, conditions), drops, encoded.size)
                encoded = keep_tokens(encoded, ~short)
                lengths.append(encoded.lengths)
                ids += encoded.ids
                factors.append(stands[~dropped][~short])
        if draw.bad_records:
            drops["bad records"] = draw.bad_records
        per_draw.append((drops, np.concatenate(lengths) if lengths else np.zeros(0, np.int64), ids,
                         np.concatenate(factors) if factors else np.zeros(0)))
    return per_draw, made, cpu


def _encoded(kept: DocBatch, memo: dict, encode):
    """``kept`` encoded, and the seconds it took (0 when ``memo`` had it): a document drawn alone
    (by bytes) is encoded once, however many draws of its unit hold it."""
    key = (kept.source, kept.table.column("row")[0].as_py()) if kept.size == 1 else None
    if key is not None and key in memo:
        return memo[key], 0.0
    encoded, seconds = timed(encode, kept)
    if key is not None:
        memo[key] = encoded
    return encoded, seconds


def _count_masks(masks: dict, drops: dict[str, int], size: int) -> np.ndarray:
    """The documents ``masks`` drop, each counted into ``drops`` under its reason."""
    dropped = np.zeros(size, dtype=bool)
    for reason, mask in masks.items():
        drops[reason] = drops.get(reason, 0) + int(mask.sum())
        dropped |= mask
    return dropped


def _bucket_rows(options, lengths: np.ndarray, ids: list, exact: bool,
                 weights: tuple[np.ndarray, np.ndarray]) -> list[tuple[str, ...]]:
    """The shard table's rows of the bucketed job: per bucket, the documents, tokens and files
    (``weights``: what each sampled document stands for in documents, and in tokens)."""
    dtype = np.dtype(options.dtype)
    buckets = np.searchsorted(np.asarray(layout.BUCKET_BOUNDS), lengths, side="left")
    rows = [("bucket", "documents", "tokens", "files", "names")]
    for i, name in enumerate(layout.BUCKET_NAMES):
        in_bucket = buckets == i
        docs, bucket_tokens = float(weights[0][in_bucket].sum()), float((lengths * weights[1])[in_bucket].sum())
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
    output = storage.normalize(options.output)
    scaffold_config = options.scaffold_config()
    encoder = scaffold_config.load()
    words = WordEncoder(encoder, scaffold_config.word_cache_size)
    config = options.read_config()
    plan = plan_and_sample(config)
    per_draw, per_split, cpu = _sample_scaffold(plan, scaffold_config, words)
    exact = plan.whole
    kept = Estimate.of(plan, [sum(d.get(name, 0) for name in llmc.SPLITS) for d, _, _, _ in per_draw], in_rows=True)
    tokens = Estimate.of(plan, [t for _, _, t, _ in per_draw])
    share = 100.0 * kept.value / plan.rows if plan.rows else 0.0
    reasons = sorted({r for _, d, _, _ in per_draw for r, n in d.items() if n})

    lines = ["plan of pretokenize scaffold: nothing was run and nothing written", *input_lines(plan, config)]
    lines.append("estimate:")
    drop_text = ", ".join(f"{r} {Estimate.of(plan, [d.get(r, 0) for _, d, _, _ in per_draw], True).text(exact)}"
                          for r in reasons) or "none"
    lines.append(f"  documents kept: {kept.text(exact)} ({share:.1f}% of the rows); dropped: {drop_text}")
    lines.append(f"  tokens: {tokens.text(exact)} (countdown, GPT-2 and EOT), {_bytes(tokens.value * 2)} as uint16")
    sampled_tokens = sum(t for _, _, _, t in per_draw)
    lines += cost_lines(tokens, sampled_tokens / cpu if cpu else 0.0, exact,
                        f"encoder {encoder.spec} with countdown tokens")
    lines.append(f"output: {output} ({output_state(output, 'scaffold')})")
    return "\n".join(lines + _shard_table(_split_rows(options, per_split, exact, 1.0), SCAFFOLD_FILES))


def _sample_scaffold(plan, scaffold_config, words):
    """Each draw's records encoded: per draw, its documents kept per split, its drops by reason
    (bad records included), its tokens weighted by their factors (Draw.factors) and as made; per
    split the documents, sequences and tokens kept, each weighted by what its draw's records stand
    for; and the CPU seconds the encoder took."""

    per_split = {name: [0.0, 0.0, 0.0] for name in llmc.SPLITS}  # documents, sequences, tokens
    per_draw, cpu = [], 0.0
    for draw in plan.draws:
        kept: dict[str, int] = {}
        drops: dict[str, int] = {}
        tokens, made, weight, row_weight = 0.0, 0, plan.weight(draw), plan.weight(draw, in_rows=True)
        for batch, stands in zip(draw.batches, draw.factors, strict=True):
            rows = batch.table.column("row").to_pylist()
            for doc_id, text, row, factor in zip(batch.column("id"), batch.column("text"), rows, stands.tolist(),
                                                 strict=True):
                result, seconds = timed(encode_document, Document(doc_id, text, batch.source, row), scaffold_config,
                                        words)
                cpu += seconds
                if result.drop_reason is not None:
                    drops[result.drop_reason] = drops.get(result.drop_reason, 0) + 1
                    continue
                split = result.sequences[0].split
                kept[split] = kept.get(split, 0) + 1
                tokens += factor * result.counts.tokens
                made += result.counts.tokens
                figures = per_split[split]
                figures[0] += row_weight
                figures[1] += row_weight * len(result.sequences)
                figures[2] += weight * factor * result.counts.tokens
        if draw.bad_records:
            drops["bad records"] = draw.bad_records
        per_draw.append((kept, drops, tokens, made))
    return per_draw, per_split, cpu


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
