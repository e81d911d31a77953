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
