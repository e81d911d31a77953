"""The job ETA before a run's own figures say enough (issue 37): the kept runs of the same kind
(pipelines/progress_prior.py), their median scaled by this run's speed, shown marked ``~`` until
this run's figures give a rate, then weighed against it."""

from __future__ import annotations

import dataclasses
import logging
import re
import time

import pytest
from conftest import TerminalStream

from pipelines import progress_prior
from pipelines.progress_display import JobDisplay, stage_kind
from pipelines.progress_prior import PRIOR_WEIGHT, SPEED_TRUST, Prior, load_prior, measured_prior, save_prior
from transforms.core import progress
from transforms.core.progress import Progress, Stage, announce_stages

pytestmark = pytest.mark.unit

KIND = "tokenizer gpt2, 2 workers"
STAGES = [Stage("read and tokenize", "read", ("documents",), "rows", total=100, work_keys=("bytes",),
                work_total=1_000_000),
          Stage("write", "write", ("tokens",), "tokens", total_step="tokenize", total_keys=("tokens",))]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_prior.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_estimate_is_the_rest_of_the_start_up_then_all_the_work_then_the_rest():
    # 10 s to the first figure, then 20 s a million bytes, then 5 s more
    prior = Prior(launch=1.5, startup=10.0, per_work=2e-5, tail=5e-6)
    assert prior.seconds_left(1_000_000, 4.0, 1.0) == pytest.approx(6.0 + 20.0 + 5.0)
    assert prior.seconds_left(1_000_000, 15.0, 1.0) == pytest.approx(25.0)  # late: the work is all still to do
    assert prior.seconds_left(1_000_000, 4.0, 2.0) == pytest.approx(16.0 + 50.0)  # twice as slow a run


def test_while_it_launches_the_estimate_is_the_kept_runs_with_the_rest_of_their_launch():
    """The display is up before Beam is imported (the input planned): until the launch has ended,
    the kept runs' times as they are, the rest of their launch first."""
    prior = Prior(launch=1.5, startup=10.0, per_work=2e-5, tail=5e-6)
    assert prior.launching_left(1_000_000, 0.5) == pytest.approx(1.0 + 10.0 + 25.0)
    assert prior.launching_left(1_000_000, 3.0) == pytest.approx(10.0 + 25.0)  # late: no launch left
    assert prior.launching_left(1_000_000, None) == pytest.approx(10.0 + 25.0)  # a run from Python


def test_a_run_from_python_after_a_command_in_the_same_process_times_no_launch(capsys):
    """A command's start is the process's until the command ends: a run from Python after it (a
    notebook that ran the CLI's main first) must not be timed from it, as a launch many times too long."""
    from pipelines import cli

    assert cli.main(["--version"]) == 0
    assert progress_prior.launch_seconds(time.monotonic()) is None


def test_the_speed_is_the_launch_or_how_late_the_run_is_then_its_start_up():
    prior = Prior(launch=1.5, startup=10.0, per_work=2e-5, tail=5e-6)
    assert prior.speed(None, None, 4.0) == 1.0  # nothing says yet
    assert prior.speed(3.0, None, 4.0) == pytest.approx(2.0 ** SPEED_TRUST)  # launched twice as slowly
    assert prior.speed(0.75, None, 4.0) == pytest.approx(0.5 ** SPEED_TRUST)  # in half the time
    assert prior.speed(1.8, None, 4.0) == 1.0  # 20% slower: within what quiet launches differ by
    assert prior.speed(0.75, None, 15.0) == pytest.approx(1.5)  # but no figure at 15 s: at least that slow
    assert prior.speed(None, None, 45.0) == 3.0  # within the limits
    assert prior.speed(3.0, 5.0, 6.0) == pytest.approx(0.5 ** SPEED_TRUST)  # the first figure in half the time
    assert prior.speed(None, 20.0, 21.0) == pytest.approx(2.0 ** SPEED_TRUST)
    assert prior.speed(None, 500.0, 501.0) == pytest.approx(3.0 ** SPEED_TRUST)
    assert Prior(0.0, 0.0, 1e-5, 0.0).speed(4.0, 5.0, 6.0) == 1.0  # no launch or start-up kept to compare with


def test_once_figures_come_this_runs_rate_outweighs_the_kept_runs_with_the_work_done():
    prior = Prior(launch=1.5, startup=10.0, per_work=2e-5, tail=5e-6)  # 20 s a million bytes, then 5 s
    # Just after the first figure: the kept runs' rate for the rest, then the rest.
    assert prior.blended_left(1_000_000, 100_000, 0.0, 0, 1.0) == pytest.approx(0.9 * 20.0 + 5.0)
    # This run goes at 10 s a million bytes: after a tenth of the work, the estimate is between the two
    # rates; after most of it, near this run's.
    early = prior.blended_left(1_000_000, 200_000, 1.0, 100_000, 1.0)
    weight = PRIOR_WEIGHT * 1_000_000
    assert early == pytest.approx((2e-5 * weight + 1.0) / (weight + 100_000) * 800_000 + 5.0)
    late = prior.blended_left(1_000_000, 900_000, 8.0, 800_000, 1.0)
    assert abs(late - (1.0 + 5.0)) < abs(late - (2.0 + 5.0))


def test_a_run_leaves_its_launch_start_up_rate_and_rest():
    # launched in 1.5 s; display at 100, first figure at 110 (100,000 bytes), read to 128, ended at 133
    assert measured_prior(1.5, 100.0, (110.0, 100_000), 128.0, 133.0, 1_000_000) == \
        Prior(1.5, 10.0, 18.0 / 900_000, 5.0 / 1_000_000)
    assert measured_prior(None, 100.0, (110.0, 100_000), None, 128.0, 1_000_000) == \
        Prior(0.0, 10.0, 18.0 / 900_000, 0.0)  # run from Python; one stage
    assert measured_prior(1.5, 100.0, None, 120.0, 128.0, 1_000_000) is None  # no figure ever seen
    assert measured_prior(1.5, 100.0, (110.0, 1_000_000), 120.0, 128.0, 1_000_000) is None


def test_figures_are_kept_per_kind_and_a_bad_file_is_ignored(cache):
    save_prior(KIND, Prior(1.0, 9.5, 1e-5, 1e-6))
    save_prior("tokenizer gpt2, 1 worker", Prior(1.0, 2.0, 2e-5, 1e-6))
    assert load_prior(KIND) == Prior(1.0, 9.5, 1e-5, 1e-6)
    assert load_prior("tokenizer o200k_base, 2 workers") is None
    (cache / progress_prior.FILE_NAME).write_text('{"tokenizer gpt2, 2 workers": [["os.system", -1, 0, 0]]}')
    assert load_prior(KIND) is None
    # the older form: ignored
    (cache / progress_prior.FILE_NAME).write_text('{"tokenizer gpt2, 2 workers": [9.5, 1e-5]}')
    assert load_prior(KIND) is None
    (cache / progress_prior.FILE_NAME).write_text("not json")
    assert load_prior(KIND) is None
    save_prior(KIND, Prior(1.0, 1.0, 1e-6, 0.0))  # replaces what did not parse
    assert load_prior(KIND) == Prior(1.0, 1.0, 1e-6, 0.0)


def test_the_estimate_is_the_median_of_the_last_runs_kept(cache):
    """One run slowed by a cold cache or a busy machine does not make the next run's estimate."""
    for startup in (4.0, 5.0, 40.0, 6.0):
        save_prior(KIND, Prior(1.0, startup, 1e-5 * startup, 0.0))
    assert dataclasses.astuple(load_prior(KIND)) == pytest.approx((1.0, 5.5, 5.5e-5, 0.0))
    for _ in range(progress_prior.KEPT_RUNS):
        save_prior(KIND, Prior(2.0, 8.0, 1e-5, 1e-6))
    assert load_prior(KIND) == Prior(2.0, 8.0, 1e-5, 1e-6)  # the older runs are let go
    text = (cache / progress_prior.FILE_NAME).read_text()
    (cache / progress_prior.FILE_NAME).write_text(text.replace("[2.0, 8.0,", '[true, 8.0,', 1))
    assert load_prior(KIND) == Prior(2.0, 8.0, 1e-5, 1e-6)  # a run's bad figures leave the others


def _job_etas(records) -> list[str]:
    return [r.getMessage().split("job ETA ", 1)[1] for r in records if "job ETA" in r.getMessage()]


def test_before_any_figure_the_display_shows_the_last_runs_estimate_then_keeps_this_runs(tmp_path, cache, caplog):
    """Nothing shared yet (worker processes still starting): a job ETA all the same, from the last
    run of this kind, marked as an estimate; once the run has ended its own figures are kept."""
    shared = str(tmp_path / "shared")
    announce_stages(shared, STAGES)
    display = JobDisplay(shared, stream=open(tmp_path / "log", "w"), interval=0, kind=KIND)
    with caplog.at_level(logging.INFO, logger="pretokenize.progress"):
        save_prior(_full_kind(), Prior(0.0, 30.0, 2e-5, 0.0))
        with display:
            time.sleep(0.7)
            estimates = _job_etas(caplog.records)
            read = Progress("read", shared_dir=shared)
            _share(read, 50, 500_000, then=0.7)
            _share(read, 50, 500_000, then=0.7)
    assert estimates and all(e.startswith("~") and e.endswith("(from the last runs)") for e in estimates)
    assert int(estimates[0][1:].split("s")[0]) in range(45, 51)  # 30 s of start-up left, then 20 s of work
    kept = load_prior(_full_kind())
    assert kept is not None and kept != Prior(0.0, 30.0, 2e-5, 0.0)  # the median of the two kept
    assert kept.startup == pytest.approx((30.0 + 0.7) / 2, abs=1.0)


def _share(read: Progress, documents: int, text_bytes: int, then: float) -> None:
    """The read step's figures shared, then ``then`` seconds for the display to see them."""
    read.add(documents=documents, bytes=text_bytes)
    progress.flush_all()
    time.sleep(then)


def test_a_run_logged_less_often_than_its_figures_come_keeps_them_all_the_same(tmp_path, cache, caplog):
    """Not in a terminal, the display says a line every ``interval`` (10 s): a run shorter than that
    kept no figures (its first figure was never seen before the end), and a longer one kept its
    start-up rounded up to the next line, which then made a terminal run seem three times faster."""
    shared = str(tmp_path / "shared")
    announce_stages(shared, STAGES)
    display = JobDisplay(shared, stream=open(tmp_path / "log", "w"), interval=60, kind=KIND)
    with caplog.at_level(logging.INFO, logger="pretokenize.progress"), display:
        time.sleep(0.3)
        read = Progress("read", shared_dir=shared)
        _share(read, 10, 100_000, then=1.5)
        _share(read, 90, 900_000, then=0.3)
    assert not _job_etas(caplog.records)  # no line before the end: the interval is a minute
    kept = load_prior(_full_kind())
    assert kept is not None and 0.3 <= kept.startup < 1.5


def test_a_run_later_than_the_kept_ones_for_its_first_figure_is_taken_to_be_slower(tmp_path, cache, caplog):
    """The kept runs had their first figure 0.3 s after the display came up, then 20 s of work; this
    run has none after 0.9 s (a busier machine): its ETA is the kept runs' scaled by how much later it
    already is, not the 20 s they took."""
    shared = str(tmp_path / "shared")
    announce_stages(shared, STAGES)
    save_prior(_full_kind(), Prior(0.0, 0.3, 2e-5, 0.0))
    display = JobDisplay(shared, stream=open(tmp_path / "log", "w"), interval=0, kind=KIND)
    with caplog.at_level(logging.INFO, logger="pretokenize.progress"), display:
        time.sleep(1.2)
    late = [_seconds(e.split(" ")[0].lstrip("~")) for e in _job_etas(caplog.records)][-1]
    # at least 4 times as late as the kept runs: 3 (the limit) times their 20 s
    assert late == pytest.approx(3 * 20, abs=1.5), late


def test_a_command_launched_slower_than_the_kept_ones_is_taken_to_be_slower(tmp_path, cache, caplog):
    """The kept runs' commands planned their input and imported Beam in 0.2 s; this one takes 0.4 s
    (a busier machine: it imports the same modules and plans the same input): once launched, before
    any figure, its ETA is the kept runs' 50 s scaled by that, not 50 s. A run from Python, not timed
    from a command, is not scaled."""
    shared = str(tmp_path / "shared")
    announce_stages(shared, STAGES)
    save_prior(_full_kind(), Prior(0.2, 30.0, 2e-5, 0.0))
    etas = []
    for timed in (True, False):
        progress_prior.command_started()
        if not timed:
            progress_prior.command_ended()
        display = JobDisplay(shared, stream=open(tmp_path / f"log-{timed}", "w"), interval=0, kind=KIND,
                             launching=True)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pretokenize.progress"), display:
            time.sleep(0.4)
            display.launched()
            display.running()
            time.sleep(0.6)
        etas.append(_seconds(_job_etas(caplog.records)[-1].split(" ")[0].lstrip("~")))
    # twice as slow, believed as 2 ** SPEED_TRUST: 50 s become about 84 s; untimed, about 50 s
    assert 72 < etas[0] < 100 and 45 < etas[1] < 52, etas


def _seconds(shown: str) -> int:
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+)([hms])", shown))


def _full_kind() -> str:
    return " / ".join([KIND, *map(stage_kind, STAGES)])


@pytest.mark.parametrize("entry", ["[[0, 1e308, 0, 0]]", "[[0, 0, 1e300, 0]]", "[[1e300, 0, 0, 0]]",
                                   "[[0, 0, 0, 1e300]]"])
def test_figures_too_large_to_be_a_runs_are_ignored(cache, entry):
    """A hand-edited file's huge figures made the estimate infinite: the display's thread died on
    it (OverflowError formatting the ETA), and the run showed no progress at all after."""
    save_prior(KIND, Prior(1.0, 1.0, 1e-6, 0.0))
    (cache / progress_prior.FILE_NAME).write_text(f'{{"{KIND}": {entry}}}')
    prior = load_prior(KIND)
    assert prior is None or progress.format_duration(prior.seconds_left(10**12, 0.0, 3.0))


def test_an_integer_too_large_for_a_float_is_ignored_not_raised(cache):
    """JSON has integers of any size, and math.isfinite raises OverflowError on one beyond a
    float's range: the display's thread died on it, and the run's end (keeping its figures) raised.
    NaN and Infinity, which json reads too, are no run's either."""
    save_prior(KIND, Prior(0.5, 1.0, 1e-6, 0.0))
    runs = f"[[0.5, 1, {10**400}, 0], [0.5, NaN, 0, 0], [0.5, 1, Infinity, 0], [0.5, 2.0, 1e-6, 0]]"
    (cache / progress_prior.FILE_NAME).write_text(f'{{"{KIND}": {runs}}}')
    assert load_prior(KIND) == Prior(0.5, 2.0, 1e-6, 0.0)
    save_prior(KIND, Prior(0.5, 4.0, 1e-6, 0.0))
    assert load_prior(KIND) == Prior(0.5, 3.0, 1e-6, 0.0)


def _loaded_within(seconds: float):
    """load_prior(KIND) run on a thread: (whether it returned in ``seconds``, what it returned)."""
    import threading

    out = []
    thread = threading.Thread(target=lambda: out.append(load_prior(KIND)), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), out


def test_a_file_nested_too_deep_for_json_is_ignored_then_replaced(cache):
    """json raises RecursionError (no ValueError) on nesting deeper than the interpreter's stack."""
    cache.mkdir()
    (cache / progress_prior.FILE_NAME).write_text("[" * 100_000)
    assert load_prior(KIND) is None
    save_prior(KIND, Prior(0.5, 1.0, 1e-6, 0.0))
    assert load_prior(KIND) == Prior(0.5, 1.0, 1e-6, 0.0)


@pytest.mark.parametrize("planted", ["fifo", "oversized"])
def test_only_a_regular_file_of_a_bounded_size_is_read(cache, planted):
    """A FIFO in the file's place (a shared cache directory) hung the display's thread on open,
    and with it the run's end, which waits for that thread; a symlink to /dev/zero (not tried here:
    before the fix it fills the memory) read without end, as a file of any size was read whole."""
    import os

    cache.mkdir()
    path = cache / progress_prior.FILE_NAME
    if planted == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(f'{{"{KIND}": [[0.5, 1.0, 1e-6, 0.0]], "junk": [{", ".join(["[1, 2, 3, 4]"] * 160_000)}]}}')
    assert _loaded_within(5.0) == (True, [None])
    save_prior(KIND, Prior(0.5, 1.0, 1e-6, 0.0))
    assert load_prior(KIND) == Prior(0.5, 1.0, 1e-6, 0.0)


def test_the_cache_is_written_through_no_symlink(cache, tmp_path):
    """A temporary file's name is predictable (the pid): one planted as a symlink in a shared cache
    directory ($PRETOKENIZE_PROGRESS_CACHE=/tmp/...) must not be written through."""
    import os

    cache.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, cache / f"{progress_prior.FILE_NAME}.{os.getpid()}.tmp")
    save_prior(KIND, Prior(1.0, 1.0, 1e-6, 0.0))
    assert victim.read_text() == "keep me"


class _Log(TerminalStream):
    def isatty(self):
        return False


def _launch_then_fail(tmp_path, monkeypatch, stream, wait_for_text: str | None) -> list[str]:
    """run_job of a job whose input's plan announces STAGES, then whose build fails as a tokenizer
    that will not load does; what ``stream`` (the display's) held while the build waited for
    ``wait_for_text``."""
    from types import SimpleNamespace

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import job, progress_display
    from pipelines.errors import UsageError
    from pipelines.flags import BeamArgs

    monkeypatch.setattr(progress_display.sys, "stderr", stream)
    seen = []

    def plan_input(settings, shared):
        announce_stages(shared, STAGES)
        return []

    def build(pipeline, options, run_id, mode, units):
        deadline = time.monotonic() + 5
        while wait_for_text and wait_for_text not in stream.text and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(stream.text)
        raise OSError("tokenizer gpt2 would not load")

    settings = SimpleNamespace(output=str(tmp_path / "out"), tokenizer="gpt2")
    with pytest.raises(UsageError, match="would not load"):
        job.run_job([], lambda argv: (settings, BeamArgs(built=PipelineOptions(["--runner=FnApiRunner"]))),
                    plan_input, build, lambda *a: "")
    return seen


def test_the_bars_and_the_estimate_are_drawn_while_the_job_is_built(tmp_path, cache, monkeypatch):
    """The launcher loads the tokenizer and claims the output after the input is planned: seconds
    (a fifth of a two-worker run of the bench corpus) in which the display is already up, with the
    kept runs' estimate, once the build has announced the planned work (issue 37)."""
    save_prior(" / ".join(["tokenizer gpt2, 1 worker", *map(stage_kind, STAGES)]),
               Prior(0.0, 3.0, 2e-5, 0.0))
    terminal = TerminalStream()
    (during,) = _launch_then_fail(tmp_path, monkeypatch, terminal, "job ETA ~")
    # 3 s of start-up, then 20 s for the planned million bytes: from the kept run's figures
    assert "read and tokenize" in during and re.search(r"job ETA ~2[0-3]s", during), during
    # The launch failed: its bars are cleared, and the error is said from the start of the first one's line.
    cleared = terminal.text.rsplit("]", 1)[-1]  # after the last bar's last frame
    assert not cleared.replace("\x1b[A", "").strip() and cleared.endswith("\r"), repr(terminal.text[-300:])


def test_a_launch_error_leaves_no_progress_line_in_a_log(tmp_path, cache, monkeypatch, caplog):
    monkeypatch.setenv(progress.INTERVAL_ENV, "0")
    with caplog.at_level(logging.INFO, logger="pretokenize.progress"):
        _launch_then_fail(tmp_path, monkeypatch, _Log(), None)
        time.sleep(0.1)
    assert not [r for r in caplog.records if "progress:" in r.getMessage()]


def test_stages_announced_again_before_any_work_take_the_new_totals(tmp_path):
    """A job announces its planned work, then the work left once an interrupted run's finished
    units are known: the display's bars take the second totals."""
    terminal = TerminalStream()
    announce_stages(str(tmp_path), STAGES)
    with JobDisplay(str(tmp_path), stream=terminal) as display:
        time.sleep(0.3)
        announce_stages(str(tmp_path), [dataclasses.replace(STAGES[0], total=60, work_total=600_000), STAGES[1]])
        time.sleep(0.3)
        totals = [bar.total for bar in display._tqdm]
    assert totals == [60, None]


def test_stages_announced_again_take_the_new_totals_in_a_log_too(tmp_path, caplog):
    """Without bars (a log), the second announcement (a resumed run's work left) once stopped the
    display's thread: it zipped the bars, none, against the stages."""
    announce_stages(str(tmp_path), STAGES)
    with caplog.at_level(logging.INFO, logger="pretokenize.progress"), \
            JobDisplay(str(tmp_path), stream=open(tmp_path / "log", "w"), interval=0):
        time.sleep(0.7)
        announce_stages(str(tmp_path), [dataclasses.replace(STAGES[0], total=60, work_total=600_000), STAGES[1]])
        time.sleep(0.7)
        read = Progress("read", shared_dir=str(tmp_path))
        read.add(documents=30, bytes=300_000)
        progress.flush_all()
        time.sleep(0.7)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress:")]
    assert any("50.0% of 60 rows" in line for line in lines), lines
