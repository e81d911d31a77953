"""How a job composes its steps: one input unit's work (its read, then the job's DoFns) run by hand
in one call, each unit a bundle of its own as far as the DoFns can tell.

Every job runs its per-document work this way. A writing job's last step spills tokens, and its
units are saved work (transforms.run.resume.ProcessUnits: a marker per finished unit); train-bpe's
units are counted, not saved (RunUnits), and its word tables are summed after them.

    counted = pipeline | "CountInputUnits" >> RunUnits(read.units, ReadUnitFn(read_config),
                                                        [FilterDocumentsFn(conds), CountWordsFn(counting)],
                                                        tags=(DROPPED, RECORDS, STATS))
    tables, drops, records = counted.main, counted[DROPPED], counted[RECORDS]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import apache_beam as beam
from apache_beam.utils.windowed_value import WindowedValue

from transforms.core.process_exit import freeze_at_exit
from transforms.core.spread import SpreadEvenly
from transforms.inputs.units import unit_cost


class UnitStepsFn(beam.DoFn):
    """The chain of DoFns ``fns``, run by hand: each takes the previous one's main outputs; a side
    output (TaggedOutput) of any of them is the chain's side output, the last one's main outputs
    its main output. Their setup waits for the first unit that needs them (``unit_outputs``)."""

    def __init__(self, fns: Sequence[beam.DoFn]):
        self._fns = tuple(fns)

    def setup(self):
        # A worker process of its own (multi-process runners) exits as quickly as the launcher.
        freeze_at_exit()
        self._ready = False

    def teardown(self):
        if self._ready:
            for fn in self._fns:
                fn.teardown()

    def unit_outputs(self, unit) -> Iterator:
        """One unit through the chain as one bundle: its main outputs and its side outputs (as
        TaggedOutputs) as they come, the steps' finish_bundle outputs last."""
        if not self._ready:
            for fn in self._fns:
                fn.setup()
            self._ready = True
        for fn in self._fns:
            fn.start_bundle()
        yield from self._through(0, unit)
        for step, fn in enumerate(self._fns):
            for out in fn.finish_bundle() or ():
                yield from self._routed(step, out)

    def _through(self, step: int, element) -> Iterator:
        for out in self._fns[step].process(element) or ():
            yield from self._routed(step, out)

    def _routed(self, step: int, out) -> Iterator:
        """One output of step ``step``: a side output, the unit's output (the last step's), or
        given to the next step."""
        if isinstance(out, beam.pvalue.TaggedOutput):
            if isinstance(out.value, WindowedValue):
                out = beam.pvalue.TaggedOutput(out.tag, out.value.value)
            yield out
            return
        out = out.value if isinstance(out, WindowedValue) else out
        if step == len(self._fns) - 1:
            yield out
        else:
            yield from self._through(step + 1, out)


class RunUnitsFn(UnitStepsFn):
    """An InputUnit in; what its read and steps give out, as they give it."""

    def process(self, unit):
        yield from self.unit_outputs(unit)


class RunUnits(beam.PTransform):
    """Input units in (planned at launch); the last step's outputs (``main``) and every step's
    side outputs by tag out. ``read`` is a DoFn taking an InputUnit, ``steps`` DoFns each taking
    the previous one's main outputs."""

    def __init__(self, units: Sequence, read: beam.DoFn, steps: Sequence[beam.DoFn], tags: Sequence[str]):
        super().__init__()
        self._units = list(units)
        self._fn = RunUnitsFn((read, *steps))
        self._tags = tuple(tags)

    def expand(self, pbegin):
        return (
            pbegin
            | "SpreadInputUnits" >> SpreadEvenly(self._units, unit_cost)
            | "RunUnits" >> beam.ParDo(self._fn).with_outputs(*self._tags, main="main")
        )
