"""`pretokenize stats`: the table's numbers against the manifest, and a real PNG beside it."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import SAMPLE_PARQUET
from test_reader import doc_tokens, manifest_view, write_bucketed_tree

from pipelines import bucketed, stats
from shards import layout
from shards import tree as ownership
from shards.reader import open_tree


@pytest.fixture(scope="module")
def sample_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("stats") / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"])
    return out


def table_rows(text):
    """{bucket: [column values]} of the table (header and rule skipped)."""
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines[0].split() == list(stats._COLUMNS)
    return {ln.split()[0]: ln.split()[1:] for ln in lines[2:]}


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_the_table_and_histogram_of_the_sample(sample_out, capsys):
    pytest.importorskip("matplotlib", reason="the histogram needs matplotlib (the 'stats' extra)")
    assert stats.run(["--output", str(sample_out)]) == 0
    printed = capsys.readouterr().out
    text = (sample_out / stats.TABLE_NAME).read_text()
    assert text in printed
    rows = table_rows(text)
    by_bucket = {}
    for _, rel, _, tokens in manifest_view(sample_out):
        by_bucket.setdefault(rel.split("/")[0], []).append(len(tokens))
    total = sum(sum(v) for v in by_bucket.values())
    for name in layout.BUCKET_NAMES:
        lengths = sorted(by_bucket.get(name, []))
        docs, tokens, share, low, p10, p50, p90, high, mean = rows[name]
        assert int(docs.replace(",", "")) == len(lengths) and int(tokens.replace(",", "")) == sum(lengths)
        if lengths:
            assert share == f"{100 * sum(lengths) / total:.1f}%"
            assert int(low.replace(",", "")) == lengths[0] and int(high.replace(",", "")) == lengths[-1]
            # "lower" percentiles: a length some document really has.
            assert int(p50.replace(",", "")) == lengths[int(np.floor(0.5 * (len(lengths) - 1)))]
        else:
            assert (share, p50) == ("0.0%", "-")
    assert int(rows["total"][0].replace(",", "")) == sum(len(v) for v in by_bucket.values())
    width, height = png_size((sample_out / stats.PNG_NAME).read_bytes())
    assert width > 800 and height > 600
    assert f"histogram: {sample_out / stats.PNG_NAME}" in printed


def test_elsewhere_without_a_picture_and_by_split(sample_out, tmp_path):
    table = tmp_path / "t.txt"
    stats.run(["--output", str(sample_out), "--table", str(table), "--png", "none", "--split", "val",
               "--val-fraction", "0.2"])
    val_docs = int(table_rows(table.read_text())["total"][0])
    stats.run(["--output", str(sample_out), "--table", str(table), "--png", "none", "--split", "train",
               "--val-fraction", "0.2"])
    train_docs = int(table_rows(table.read_text())["total"][0])
    assert val_docs + train_docs == len(open_tree(str(sample_out))) and 0 < val_docs < train_docs
    assert "val_fraction 0.2" in table.read_text()


def test_an_empty_bucket_and_a_tree_with_one_document(tmp_path):
    pytest.importorskip("matplotlib", reason="the histogram needs matplotlib (the 'stats' extra)")
    rng = np.random.default_rng(0)
    write_bucketed_tree(tmp_path, {"2048/p00_00000.npy": [("only", doc_tokens(rng, 1500))]})
    (tmp_path / ownership.RECORD_NAME).write_text(ownership.TreeRecord("bucketed", ["2048/p00_00000.npy"]).to_json())
    assert stats.run(["--output", str(tmp_path)]) == 0
    rows = table_rows((tmp_path / stats.TABLE_NAME).read_text())
    assert rows["2048"][:3] == ["1", "1,500", "100.0%"] and rows["1024"][:4] == ["0", "0", "0.0%", "-"]
    png_size((tmp_path / stats.PNG_NAME).read_bytes())


def test_stats_need_a_finished_tree(tmp_path, capsys):
    rng = np.random.default_rng(0)
    write_bucketed_tree(tmp_path, {"1024/p00_00000.npy": [("a", doc_tokens(rng, 4))]}, marker=False)
    assert stats.run(["--output", str(tmp_path)]) == 2
    assert "has no dataset_stats.txt" in capsys.readouterr().err
    assert not (tmp_path / stats.TABLE_NAME).exists()


def test_the_token_shares_of_the_sample(sample_out):
    """What the first panel plots: tokens per bucket (all ten, empty ones as 0) and the cumulative
    share, against the manifest; the `beyond` bucket, one document, holds about half the tokens."""
    by_bucket = {}
    for _, rel, _, tokens in manifest_view(sample_out):
        by_bucket.setdefault(rel.split("/")[0], []).append(len(tokens))
    total = sum(sum(v) for v in by_bucket.values())
    shares = stats.token_shares(stats.bucket_lengths(open_tree(str(sample_out))))
    assert shares.buckets == layout.BUCKET_NAMES
    assert shares.tokens == tuple(sum(by_bucket.get(name, [])) for name in layout.BUCKET_NAMES)
    assert shares.documents == tuple(len(by_bucket.get(name, [])) for name in layout.BUCKET_NAMES)
    assert 0 in shares.tokens  # the sample leaves some buckets empty, and they are still there
    running = 0
    for name, share, cumulative in zip(shares.buckets, shares.share, shares.cumulative, strict=True):
        running += sum(by_bucket.get(name, []))
        assert share == pytest.approx(100 * sum(by_bucket.get(name, [])) / total)
        assert cumulative == pytest.approx(100 * running / total)
    assert shares.cumulative[-1] == pytest.approx(100.0)
    assert shares.documents[-1] == 1 and shares.share[-1] > 40


def test_the_picture_plots_tokens_per_bucket_and_the_cumulative_share(sample_out):
    pytest.importorskip("matplotlib", reason="the histogram needs matplotlib (the 'stats' extra)")
    from matplotlib import pyplot as plt

    per_bucket = stats.bucket_lengths(open_tree(str(sample_out)))
    shares = stats.token_shares(per_bucket)
    fig = stats.figure(per_bucket, "sample")
    try:
        bars = fig.axes[0]
        (cumulative,) = [ax for ax in fig.axes if ax.get_ylabel() == "cumulative share of tokens"]
        assert [p.get_height() for p in bars.patches] == list(shares.tokens)
        ticks = [t.get_text().split("\n") for t in bars.get_xticklabels()]
        assert [t[0] for t in ticks] == list(layout.BUCKET_NAMES)
        assert ticks[-1][1:] == [f"{shares.share[-1]:.1f}% of tokens", "1 docs"]
        assert bars.get_ylabel() == "tokens"
        (line,) = cumulative.get_lines()
        assert list(line.get_ydata()) == pytest.approx(list(shares.cumulative))
        # The length histogram below weighs each document by its tokens.
        (overall,) = [ax for ax in fig.axes if ax.get_xscale() == "log"]
        assert overall.get_ylabel() == "tokens"
        assert sum(p.get_height() for p in overall.patches if p.get_height()) > 0
    finally:
        plt.close(fig)


def test_token_shares_of_an_empty_selection():
    empty = [stats.BucketLengths(name, np.zeros(0, dtype=np.int64)) for name in layout.BUCKET_NAMES]
    shares = stats.token_shares(empty)
    assert shares.tokens == (0,) * 10 and shares.share == (0.0,) * 10 and shares.cumulative == (0.0,) * 10


def test_the_files_in_the_tree_name_it_by_its_own_name(sample_out, monkeypatch):
    """The table and the picture ship with the dataset: neither says where the tree lay on this
    machine (issue 37), only the tree's own name."""
    pytest.importorskip("matplotlib", reason="the histogram needs matplotlib (the 'stats' extra)")
    titles = []
    real_figure = stats.figure
    monkeypatch.setattr(stats, "figure", lambda per_bucket, title, bins=40: (
        titles.append(title), real_figure(per_bucket, title, bins))[1])
    assert stats.run(["--output", str(sample_out)]) == 0
    first = (sample_out / stats.TABLE_NAME).read_text().splitlines()[0]
    assert first == f"# document lengths of {sample_out.name} (split all)"
    assert titles == [sample_out.name]
    assert str(sample_out.parent) not in first
