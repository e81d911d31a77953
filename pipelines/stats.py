"""The stats job: document lengths per bucket, as a table and a histogram, for choosing mixing weights.

    pretokenize stats --output DIR [--png PATH] [--table PATH] [--split all|train|val] [--val-fraction F] [--json]

Reads only the manifest (an llm.c tree is scanned once for its documents), never the tokens of a
bucketed tree. Prints the table and writes it to ``DIR/length_stats.txt``, and draws
``DIR/length_histogram.png``: the tokens of every bucket (what mixing weights act on; empty
buckets shown) with the cumulative share of tokens, then the tokens by document length on a log
scale with the bucket bounds, then one panel per non-empty bucket with its documents' lengths.
``--png`` and ``--table`` write elsewhere (local or fsspec); ``--png none`` skips the picture;
``--json`` prints the table's figures as one JSON object instead of the table (the file paths
then go to stderr). Plain Python; the picture needs matplotlib (the ``stats`` extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import sys

import numpy as np

from pipelines.flags import add_break_lock_flag, add_setting_flags, parse_plain_settings
from pipelines.help_format import DefaultsHelpFormatter
from shards import layout, lock, storage
from shards import tree as ownership
from shards.card import CARD_NAME
from shards.index import INDEX_NAME
from shards.provenance import STATS_JSON_NAME
from shards.reading.opening import open_tree
from shards.reading.shard_tree import SPLITS, ShardTree
from transforms.core.settings import REQUIRED, setting

PNG_NAME = "length_histogram.png"
TABLE_NAME = "length_stats.txt"
_COLUMNS = ("bucket", "documents", "tokens", "token_share", "min", "p10", "p50", "p90", "max", "mean")


@dataclasses.dataclass(frozen=True)
class StatsSettings:
    """stats' settings, one typed object: its flags are generated from it."""

    output: str = setting(REQUIRED, "the finished output tree (local path or fsspec URL)")
    png: str | None = setting(None, f"where to draw the histogram (default DIR/{PNG_NAME}; 'none': skip)")
    table: str | None = setting(None, f"where to write the table (default DIR/{TABLE_NAME})")
    split: str = setting("all", "documents of this split only", choices=SPLITS)
    val_fraction: float = setting(0.0, "the validation fraction that defines --split for a bucketed tree",
                                  flags=("--val-fraction", "--val_fraction"))
    bins: int = setting(40, "histogram bins per panel")
    json: bool = setting(False, "print the table as one JSON object on stdout (the files are still written)")

    def __post_init__(self):
        object.__setattr__(self, "output", storage.normalize(self.output))
        if self.bins < 1:
            raise ValueError("--bins must be at least 1")
        if not 0.0 <= self.val_fraction < 1.0:  # NaN too: it is no fraction
            raise ValueError(f"--val-fraction must be at least 0 and below 1, got {self.val_fraction}")


@dataclasses.dataclass(frozen=True)
class BucketLengths:
    bucket: str
    lengths: np.ndarray  # int64, one per document

    @property
    def documents(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretokenize stats", description=__doc__.splitlines()[0],
                                formatter_class=DefaultsHelpFormatter)
    add_setting_flags(p, StatsSettings, ("output", "png", "table", "split", "val_fraction", "bins"))
    add_break_lock_flag(p)
    add_setting_flags(p, StatsSettings, ("json",))
    return p


def parse_args(argv: list[str]) -> StatsSettings:
    return parse_plain_settings(make_parser(), argv, StatsSettings)


def bucket_lengths(tree: ShardTree, split: str = "all", val_fraction: float = 0.0) -> list[BucketLengths]:
    """Document lengths of every bucket (empty ones included), in bucket order."""
    rows = tree.select(split, val_fraction)
    lengths = tree.documents.length[rows]
    buckets = tree.documents.bucket[rows]
    return [BucketLengths(name, lengths[buckets == i]) for i, name in enumerate(layout.BUCKET_NAMES)]


def table(per_bucket: list[BucketLengths]) -> str:
    """A fixed-width table: per bucket, documents, tokens, share of tokens and length percentiles."""
    total_tokens = sum(b.tokens for b in per_bucket)
    rows = [_COLUMNS]
    everything = [b.lengths for b in per_bucket]
    for name, lengths in [(b.bucket, b.lengths) for b in per_bucket] + [("total", np.concatenate(everything))]:
        if len(lengths) == 0:
            rows.append((name, "0", "0", "0.0%") + ("-",) * 6)
            continue
        p10, p50, p90 = (int(v) for v in np.percentile(lengths, [10, 50, 90], method="lower"))
        tokens = int(lengths.sum())
        rows.append((
            name,
            f"{len(lengths):,}",
            f"{tokens:,}",
            f"{100.0 * tokens / total_tokens:.1f}%" if total_tokens else "-",
            f"{int(lengths.min()):,}",
            f"{p10:,}",
            f"{p50:,}",
            f"{p90:,}",
            f"{int(lengths.max()):,}",
            f"{lengths.mean():,.0f}",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def length_summary(name: str, lengths: np.ndarray, total_tokens: int) -> dict:
    """The table's row for one bucket (or the total) as numbers: percentiles are lengths some
    document has (numpy's "lower"); the length figures are None for an empty bucket."""
    tokens = int(lengths.sum())
    row = {"bucket": name, "documents": len(lengths), "tokens": tokens,
           "token_share": tokens / total_tokens if total_tokens else None}
    if len(lengths):
        p10, p50, p90 = (int(v) for v in np.percentile(lengths, [10, 50, 90], method="lower"))
        row.update(min=int(lengths.min()), p10=p10, p50=p50, p90=p90, max=int(lengths.max()),
                   mean=float(lengths.mean()))
    else:
        row.update(dict.fromkeys(("min", "p10", "p50", "p90", "max", "mean")))
    return row


def summary_json(per_bucket: list[BucketLengths], url: str, split: str, val_fraction: float) -> dict:
    """What ``--json`` prints: the table's figures per bucket and in total, with what was measured."""
    total_tokens = sum(b.tokens for b in per_bucket)
    everything = np.concatenate([b.lengths for b in per_bucket]) if per_bucket else np.zeros(0, np.int64)
    return {
        "tree": url,
        "split": split,
        "val_fraction": val_fraction,
        "buckets": [length_summary(b.bucket, b.lengths, total_tokens) for b in per_bucket],
        "total": length_summary("total", everything, total_tokens),
    }


def _log_bins(low: float, high: float, bins: int) -> np.ndarray:
    high = max(high, low + 1)
    return np.unique(np.geomspace(low, high + 1, bins + 1).round().astype(np.int64))


@dataclasses.dataclass(frozen=True)
class TokenShares:
    """What the picture's first panel shows: per bucket (every one, empty ones too, in bucket
    order) its documents, its tokens (what mixing weights act on), its share of all tokens and the
    cumulative share up to it, in percent."""

    buckets: tuple[str, ...]
    documents: tuple[int, ...]
    tokens: tuple[int, ...]
    share: tuple[float, ...]
    cumulative: tuple[float, ...]


def token_shares(per_bucket: list[BucketLengths]) -> TokenShares:
    tokens = [b.tokens for b in per_bucket]
    total = sum(tokens)
    running = np.cumsum(tokens, dtype=np.int64)
    return TokenShares(
        buckets=tuple(b.bucket for b in per_bucket),
        documents=tuple(b.documents for b in per_bucket),
        tokens=tuple(tokens),
        share=tuple(100.0 * t / total if total else 0.0 for t in tokens),
        cumulative=tuple(100.0 * int(r) / total if total else 0.0 for r in running),
    )


def _matplotlib():
    """matplotlib's pyplot and ticker, drawing off screen: imported only when a picture is drawn, as
    matplotlib is an extra (``stats``) that the table and --png none do without."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "the histogram needs matplotlib: pip install 'beam-pretokenize[stats]' (or pass --png none)"
        ) from None
    matplotlib.use("Agg")
    from matplotlib import pyplot, ticker

    return pyplot, ticker


def figure(per_bucket: list[BucketLengths], title: str, bins: int = 40):
    """The matplotlib figure: tokens per bucket with the cumulative token share; where the tokens
    lie by document length; then the lengths inside each non-empty bucket."""
    plt, _ = _matplotlib()
    shares = token_shares(per_bucket)
    shown = [b for b in per_bucket if b.documents]
    cols = 3
    panel_rows = max(1, -(-len(shown) // cols))
    fig = plt.figure(figsize=(13, 7.4 + 2.8 * panel_rows), layout="constrained")
    grid = fig.add_gridspec(2 + panel_rows, cols, height_ratios=[1.3, 1.1] + [1] * panel_rows)
    colors = plt.get_cmap("tab10")
    _draw_bucket_tokens(fig.add_subplot(grid[0, :]), shares, colors, title)
    _draw_token_lengths(fig.add_subplot(grid[1, :]), shown, colors, bins)
    total_tokens = sum(shares.tokens)
    for k, b in enumerate(shown):
        _draw_bucket_lengths(fig.add_subplot(grid[2 + k // cols, k % cols]), b, colors, bins, total_tokens)
    return fig


def _draw_bucket_tokens(bars, shares: TokenShares, colors, title: str) -> None:
    """Tokens per bucket, every bucket on the axis (an empty one as a bar of 0), and the share of
    all tokens in the buckets up to each one."""
    total_docs, total_tokens = sum(shares.documents), sum(shares.tokens)
    positions = np.arange(len(shares.buckets))
    bars.bar(positions, shares.tokens, color=[colors(i) for i in range(len(shares.buckets))])
    bars.set_xticks(positions, [f"{name}\n{share:.1f}% of tokens\n{docs:,} docs" for name, share, docs
                                in zip(shares.buckets, shares.share, shares.documents, strict=True)], fontsize=8)
    bars.set_xlabel("bucket (document length up to, in tokens, EOS included)")
    bars.set_ylabel("tokens")
    bars.set_title(f"{title}: {total_docs:,} documents, {total_tokens:,} tokens")
    cumulative = bars.twinx()
    cumulative.plot(positions, shares.cumulative, color="black", marker="o", linewidth=1.2,
                    label="cumulative share of tokens")
    cumulative.set_ylim(0, 105)
    cumulative.yaxis.set_major_formatter(_matplotlib()[1].PercentFormatter())
    cumulative.set_ylabel("cumulative share of tokens")
    cumulative.legend(loc="upper left", fontsize=8)


def _draw_token_lengths(overall, shown: list[BucketLengths], colors, bins: int) -> None:
    """Where the tokens lie by document length: each document weighs its length."""
    if shown:
        all_lengths = np.concatenate([b.lengths for b in shown])
        edges = _log_bins(int(all_lengths.min()), int(all_lengths.max()), bins * 2)
        overall.hist([b.lengths for b in shown], bins=edges, stacked=True, weights=[b.lengths for b in shown],
                     color=[colors(layout.BUCKET_NAMES.index(b.bucket)) for b in shown],
                     label=[b.bucket for b in shown])
        for bound in layout.BUCKET_BOUNDS:
            if bound <= edges[-1]:
                overall.axvline(bound, color="grey", linewidth=0.6, linestyle=":")
        overall.legend(title="bucket", ncols=min(len(shown), 5), fontsize=8)
    overall.set_xscale("log")
    overall.set_xlabel("document length (tokens, EOS included)")
    overall.set_ylabel("tokens")


def _draw_bucket_lengths(ax, b: BucketLengths, colors, bins: int, total_tokens: int) -> None:
    """The lengths inside one bucket. A bucket spans a factor of two (beyond: whatever it holds),
    so a linear axis reads best."""
    low, high = layout.bucket_range(b.bucket)
    hi = high if high is not None else int(b.lengths.max())
    edges = np.unique(np.linspace(low, hi + 1, bins + 1).round().astype(np.int64))
    ax.hist(b.lengths, bins=edges, color=colors(layout.BUCKET_NAMES.index(b.bucket)))
    ax.yaxis.set_major_locator(_matplotlib()[1].MaxNLocator(integer=True))
    share = 100.0 * b.tokens / total_tokens if total_tokens else 0.0
    ax.set_title(f"{b.bucket}: {b.documents:,} docs, {b.tokens:,} tokens ({share:.1f}%)", fontsize=9)
    ax.set_xlabel("length", fontsize=8)
    ax.set_ylabel("documents", fontsize=8)
    ax.tick_params(labelsize=7)


def draw(per_bucket: list[BucketLengths], title: str, bins: int = 40) -> bytes:
    """The picture as PNG bytes."""
    fig = figure(per_bucket, title, bins)
    plt, _ = _matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


@lock.command("stats")
def run(argv: list[str] | None = None) -> int:
    """0 when the table (and picture) are written; 2 when the tree is not a finished one (or is damaged)."""
    options = parse_args(argv or [])
    try:
        written = write_stats(options)
    except (FileNotFoundError, ValueError) as e:  # missing, unfinished, damaged, locked, not ours
        print(f"pretokenize stats: {e}", file=sys.stderr, flush=True)
        return 2
    # With --json, stdout is the JSON alone (for a pipe into jq); where the files went, on stderr.
    where = sys.stderr if options.json else sys.stdout
    if options.json:
        print(json.dumps(written.summary, indent=1), flush=True)
    else:
        print(written.text, end="", flush=True)
    print(f"table: {written.table}", file=where, flush=True)
    if written.png is not None:
        print(f"histogram: {written.png}", file=where, flush=True)
    return 0


@dataclasses.dataclass(frozen=True)
class StatsWritten:
    """What stats wrote: the ``table``'s URL and its ``text``, the ``png``'s URL (None: not drawn),
    and the figures (``summary``: what --json prints)."""

    table: str
    png: str | None
    text: str
    summary: dict


def write_stats(options: StatsSettings) -> StatsWritten:
    """The table and the picture of the finished tree ``options.output``, written; a ValueError or
    FileNotFoundError, one line, when the tree is missing, unfinished, damaged, held, or not ours
    to write in."""
    table_url = storage.normalize(options.table or storage.join(options.output, TABLE_NAME))
    png_url = (None if options.png == "none"
               else storage.normalize(options.png or storage.join(options.output, PNG_NAME)))
    if any(u is not None and ownership.inside(u, options.output) for u in (table_url, png_url)) and (
            ownership.read_record(options.output) is not None):
        lock.take(options.output)  # one writer at a time: before the tree is read for what is written in it
    tree = open_tree(options.output)
    per_bucket = bucket_lengths(tree, options.split, options.val_fraction)
    # The table and the picture may ship with the dataset: they name the tree by its own name, never
    # by where it lies on this machine.
    name = tree_name(tree.url)
    heading = f"# document lengths of {name} (split {options.split}"
    heading += f", val_fraction {options.val_fraction})\n" if options.val_fraction else ")\n"
    # Files written inside the tree are listed in its ownership record first, so the next run of a
    # job deletes exactly these (shards/tree.py); a tree without a record gets nothing written in it.
    inside = [u for u in (table_url, png_url) if u is not None and ownership.inside(u, tree.url)]
    if inside:
        try:
            record = ownership.owned(tree.url)
        except ownership.NotOurTreeError as e:
            raise ValueError(f"{e}; pass --table and --png paths outside it") from e
        names = [ownership.name_in(u, tree.url) for u in inside]
        # A file of those names that the record does not list is the user's: never overwritten.
        _check_not_the_jobs(names, record, tree.url)
        ownership.Tree(tree.url).check_ours(names, record, "stats file")
        ownership.record_files(tree.url, record, add_derived=names)
    text = heading + table(per_bucket)
    _write(tree.url, table_url, text.encode())
    if png_url is not None:
        _write(tree.url, png_url, draw(per_bucket, name, options.bins))
    return StatsWritten(table_url, png_url, text, summary_json(per_bucket, tree.url, options.split,
                                                               options.val_fraction))


def tree_name(url: str) -> str:
    """The tree's own name (the last part of its path or URL), as the files written about it say it."""
    return url.rstrip("/").rsplit("/", 1)[-1] or url


def _check_not_the_jobs(names: list[str], record: ownership.TreeRecord, tree_url: str) -> None:
    """None of ``names`` is a file the job wrote (its shards, manifest, stats, card, index) or one
    of the tool's own (the record, the lock, the temporary directory), nor lies in a directory of
    theirs (a bucket, a split, megatron/): stats adds files, never replaces the tree's."""
    theirs = {layout.MANIFEST_NAME, layout.CHECKSUMS_NAME, layout.STATS_NAME, layout.REMOVALS_NAME, CARD_NAME,
              STATS_JSON_NAME, INDEX_NAME, layout.RECORD_NAME, lock.LOCK_NAME, layout.TEMP_DIR_NAME,
              *layout.BUCKET_NAMES, *SPLITS, "megatron"}
    for name in names:
        if name in record.files or name.split("/", 1)[0] in theirs:
            raise ValueError(f"{storage.join(tree_url, name)} is the tree's own place, where stats never writes; "
                             "pass --table and --png names of other places, in the tree or outside it")


def _write(tree_url: str, url: str, data: bytes) -> None:
    """A file inside the tree is written by the tree (shards.tree.Tree, through its temporary
    directory); elsewhere beside itself."""
    name = ownership.name_in(url, tree_url)
    if name is None:
        storage.write_atomic(url, data)
        return
    out = ownership.Tree(tree_url)
    out.write(name, data)
    out.remove_temp_if_empty()
