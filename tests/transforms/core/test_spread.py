"""SpreadEvenly: units ranked by cost, every unit out once, and on the FnApiRunner's worker
processes, shares within one unit's cost of each other."""

import os

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from conftest import SAMPLE_PARQUET

from transforms.core.spread import SpreadEvenly, costliest_first
from transforms.inputs.fields import ReadConfig
from transforms.inputs.plan import plan_input
from transforms.inputs.units import unit_cost


def test_costliest_first_ties_keep_their_order():
    assert costliest_first(["a", "bbb", "cc", "dd", "e"], len) == ["bbb", "cc", "dd", "a", "e"]
    assert costliest_first([], len) == []


def test_a_row_group_costs_its_text():
    """The units rank as their row groups' text does, read back (the sample's two differ 3:1)."""
    units = plan_input(ReadConfig(str(SAMPLE_PARQUET)))
    parquet = pq.ParquetFile(SAMPLE_PARQUET)
    text = [sum(len(t.encode()) for t in parquet.read_row_group(u.row_group, columns=["text"]).column(0).to_pylist())
            for u in units]
    assert len(units) == 2 and text[0] > 2 * text[1]
    assert unit_cost(units[0]) > 2 * unit_cost(units[1]) > 0
    # The column chunk's uncompressed size: the text's bytes, give or take the encoding's lengths.
    assert all(abs(unit_cost(u) - t) < 0.01 * t for u, t in zip(units, text, strict=True))


def test_every_item_out_once():
    items = [f"unit-{i}" for i in range(40)]
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        out = p | SpreadEvenly(items, lambda s: int(s.split("-")[1]) % 7)
        assert_that(out, equal_to(items), label="EveryItemOnce")


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_get_even_shares(tmp_path, workers):
    """Four large units and forty small: each worker's total is within the largest cost of every
    other's; with two workers each gets two large units, the same total. (beam.Reshuffle's random
    keys gave one worker 119 and the other 70 in one of three tries here.)"""
    costs = [50, 1] * 4 + [1] * 36
    out = tmp_path / "shares.txt"

    # Defined here, so that the worker processes get them by value (they cannot import this module).
    def pid_and_cost(cost):
        return os.getpid(), cost

    def sum_per_worker(pairs):
        totals = {}
        for pid, cost in pairs:
            totals[pid] = totals.get(pid, 0) + cost
        return sorted(totals.values())

    options = PipelineOptions(["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                               f"--direct_num_workers={workers}"])
    with beam.Pipeline(options=options) as p:
        (p | SpreadEvenly(costs, lambda c: c)
           | beam.Map(pid_and_cost)
           | beam.combiners.ToList()
           | beam.Map(lambda pairs: out.write_text(" ".join(map(str, sum_per_worker(pairs))))))
    shares = [int(s) for s in out.read_text().split()]
    assert sum(shares) == sum(costs)
    assert len(shares) == workers
    assert shares[-1] - shares[0] <= max(costs)
    if workers == 2:
        assert shares == [sum(costs) // 2] * 2
