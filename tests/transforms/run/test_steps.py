"""RunUnits: each input unit's read and steps, DoFns run by hand in one call (transforms/run/steps.py)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from tests.conftest import fnapi_pipeline
from transforms.inputs.units import InputUnit
from transforms.run.steps import RunUnits, UnitStepsFn

UNITS = [InputUnit("a.pq", "parquet", 0, 0, rows=3, text_bytes=30),
         InputUnit("b.pq", "parquet", 0, 0, rows=2, text_bytes=20)]


class ReadFn(beam.DoFn):
    """A unit's rows, and the number read as a side output."""

    def process(self, unit):
        yield from (f"{unit.path}:{i}" for i in range(unit.rows))
        yield beam.pvalue.TaggedOutput("records", unit.rows)


class DropOddFn(beam.DoFn):
    def process(self, row):
        if int(row.rsplit(":", 1)[1]) % 2:
            yield beam.pvalue.TaggedOutput("dropped", ("odd", 1))
        else:
            yield row


class CountFn(beam.DoFn):
    """Counts its bundle's rows: the count leaves at finish_bundle, as a WindowedValue."""

    def setup(self):
        self.set_up = getattr(self, "set_up", 0) + 1

    def start_bundle(self):
        self._n = 0

    def process(self, row):
        self._n += 1
        yield row.upper()

    def finish_bundle(self):
        yield WindowedValue(("rows", self._n), 0, [GlobalWindow()])
        yield beam.pvalue.TaggedOutput("records", WindowedValue(-1, 0, [GlobalWindow()]))


def test_a_units_outputs_are_its_last_steps_and_every_steps_side_outputs():
    chain = UnitStepsFn([ReadFn(), DropOddFn(), CountFn()])
    chain.setup()
    out = list(chain.unit_outputs(UNITS[0]))
    main = [o for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]
    side = [(o.tag, o.value) for o in out if isinstance(o, beam.pvalue.TaggedOutput)]
    assert main == ["A.PQ:0", "A.PQ:2", ("rows", 2)]  # each unit a bundle: its count alone
    assert side == [("dropped", ("odd", 1)), ("records", 3), ("records", -1)]  # as they come
    list(chain.unit_outputs(UNITS[1]))
    assert chain._fns[2].set_up == 1  # set up once, for the first unit


def test_run_units_runs_every_unit_through_the_steps():
    with fnapi_pipeline() as p:
        out = p | "CountUnits" >> RunUnits(UNITS, ReadFn(), [DropOddFn(), CountFn()], ("records", "dropped"))
        assert_that(out.main | "Rows" >> beam.Filter(lambda x: isinstance(x, str)),
                    equal_to(["A.PQ:0", "A.PQ:2", "B.PQ:0"]), label="CheckRows")
        assert_that(out.main | "Counts" >> beam.Filter(lambda x: isinstance(x, tuple)),
                    equal_to([("rows", 2), ("rows", 1)]), label="CheckCounts")
        assert_that(out["records"], equal_to([3, 2, -1, -1]), label="CheckRecords")
        assert_that(out["dropped"], equal_to([("odd", 1), ("odd", 1)]), label="CheckDropped")
