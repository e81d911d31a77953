"""--plan on a length-skewed corpus (issue 37: 64% low on 240 units with a few long documents): the
sample is drawn across the whole input, units by their bytes and alike, and in each unit drawn its
rows by their bytes (for the tokens) and alike (for the documents), and every estimate is printed
with a 95% interval that holds the true figure."""

from __future__ import annotations

import functools
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLE_PARQUET

from pipelines import cli, plan

UNITS, ROWS_PER_UNIT, LONG = 60, 40, (7, 23, 41, 52)  # units holding one very long document each


def skewed_corpus(path) -> None:
    """The sample's rows again and again (fresh ids) in ``UNITS`` row groups, and in the units LONG
    one kept document made thirty times longer: a few documents hold most of the tokens."""
    table = pq.read_table(SAMPLE_PARQUET)
    longest = max(range(table.num_rows), key=lambda i: len(table.column("text")[i].as_py()))
    rows = []
    for unit in range(UNITS):
        for k in range(ROWS_PER_UNIT):
            row = {name: table.column(name)[(unit * ROWS_PER_UNIT + k) % table.num_rows].as_py()
                   for name in table.column_names}
            if unit in LONG and k == ROWS_PER_UNIT // 2:
                row = {name: table.column(name)[longest].as_py() for name in table.column_names}
                row["text"] = row["text"] * 30
            row["id"] = f"u{unit}-r{k}"
            rows.append(row)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, row_group_size=ROWS_PER_UNIT)


def figure(text: str, label: str) -> tuple[float, float, float]:
    """The estimate after ``label`` and its interval: (value, low, high)."""
    m = re.search(re.escape(label) + r" ~([\d,.]+) \(95%: ([\d,.]+) \.\. ([\d,.]+)\)", text)
    assert m, text
    return tuple(float(g.replace(",", "")) for g in m.groups())


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    path = tmp_path_factory.mktemp("skewed") / "skewed.parquet"
    skewed_corpus(path)
    return path


def plan_of(path, out, capsys) -> str:
    capsys.readouterr()
    assert cli.main(["bucketed", "--input", str(path), "--output", str(out), "--plan"]) == 0
    return capsys.readouterr().out


def test_the_true_figures_are_within_the_printed_intervals(skewed, tmp_path, capsys, monkeypatch):
    text = plan_of(skewed, tmp_path / "out", capsys)
    assert f"{UNITS} units of work, {UNITS * ROWS_PER_UNIT:,} rows" in text
    assert "rows at random positions in 32 draws of a unit" in text
    tokens, kept = figure(text, "tokens:"), figure(text, "documents kept:")
    low_hours = re.search(r"core-hours: ~\S+ \(95%: \S+ \.\. \S+\)", text)
    assert low_hours, text
    for reason in re.findall(r"(\w+) ~[\d,.]+ (?!\(95%)", text.split("dropped: ", 1)[1].splitlines()[0]):
        pytest.fail(f"the drop {reason} has no interval: {text}")
    # The truth: the same plan over every row (its census, which test_terminal checks against a run).
    monkeypatch.setattr(plan, "plan_and_sample", functools.partial(plan.plan_and_sample, sample_docs=10**9))
    census = plan_of(skewed, tmp_path / "out", capsys)
    assert "sample: the whole input" in census
    true_tokens = float(re.search(r"tokens: ([\d,]+) ", census).group(1).replace(",", ""))
    true_kept = float(re.search(r"documents kept: ([\d,]+) ", census).group(1).replace(",", ""))
    assert tokens[1] <= true_tokens <= tokens[2], (tokens, true_tokens)
    # Rows drawn by their bytes inside a unit find its long document: the interval is not the
    # 3.97M .. 132M around 52.7M of the rows drawn alike among a unit's first 2,048.
    assert tokens[2] - tokens[1] < 0.8 * true_tokens, (tokens, true_tokens)
    assert kept[1] <= true_kept <= kept[2], (kept, true_kept)
