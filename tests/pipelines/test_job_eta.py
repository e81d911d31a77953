"""The ETA to the end of the whole job (pipelines/progress_display.job_seconds_left), a pure function."""

from __future__ import annotations

import pytest

from pipelines.progress_display import LATER_STAGE_SHARE, job_seconds_left

pytestmark = pytest.mark.unit


def test_nothing_done_is_no_eta():
    assert job_seconds_left([(0, 1000), (0, None)], [3.0, None]) is None


def test_while_reading_the_writing_to_come_is_counted_too():
    # A quarter of the rows in 10 s: 30 s more of reading, then a third of the 40 s reading takes.
    left = job_seconds_left([(250, 1000), (0, 5_000)], [10.0, None])
    assert left == pytest.approx(30.0 + 40.0 * LATER_STAGE_SHARE)


def test_once_writing_runs_its_own_rate_counts():
    assert job_seconds_left([(1000, 1000), (2_500, 10_000)], [40.0, 5.0]) == pytest.approx(15.0)
    # Begun, nothing written yet: the first stage's measured time times the share.
    assert job_seconds_left([(1000, 1000), (0, 10_000)], [40.0, 1.0]) == pytest.approx(40.0 * LATER_STAGE_SHARE)


def test_a_finished_job_has_nothing_left():
    assert job_seconds_left([(1000, 1000), (10_000, 10_000)], [40.0, 12.0]) == 0.0


@pytest.mark.parametrize("write_seconds", [6.0, 10.0, 20.0, 27.0])
def test_the_eta_at_half_the_run_is_within_30_percent(write_seconds):
    """A run that reads 1,000 rows in 60 s then writes 10,000 tokens in ``write_seconds``, each at a
    steady rate: at half the run the ETA is within 30% of the time really left, for writing that
    takes from a tenth to 45% of the time reading does (the guess before writing begins is a
    quarter); once writing runs, its own rate."""
    read_seconds = 60.0
    run = read_seconds + write_seconds
    for t in (0.5 * run, read_seconds + 0.5 * write_seconds):
        if t < read_seconds:
            figures, elapsed = [(int(1000 * t / read_seconds), 1000), (0, None)], [t, None]
        else:
            w = t - read_seconds
            figures, elapsed = [(1000, 1000), (int(10_000 * w / write_seconds), 10_000)], [read_seconds, w]
        left = job_seconds_left(figures, elapsed)
        assert abs(left - (run - t)) <= 0.3 * (run - t), (t, left, run - t)


def test_the_eta_goes_by_the_bytes_read_where_the_stage_says(tmp_path):
    """Units are worked largest first: the first rows take longer than the rest, so the ETA goes by
    the text bytes read, out of those planned (Stage.work_keys), while the bar counts rows."""
    from pipelines.progress_display import stage_figures, work_figures
    from transforms.core import progress
    from transforms.core.progress import Progress, Stage

    stages = [Stage("read and tokenize", "read", ("documents",), "rows", total=100, work_keys=("bytes",),
                    work_total=10_000),
              Stage("write", "write", ("tokens",), "tokens", total_step="tokenize", total_keys=("tokens",))]
    read, tok = Progress("read", shared_dir=str(tmp_path)), Progress("tokenize", shared_dir=str(tmp_path))
    read.add(documents=10, bytes=8_000)  # a tenth of the rows, most of the bytes
    tok.add(tokens=2_000)
    progress.flush_all()
    assert stage_figures(str(tmp_path), stages) == [(10, 100), (0, 2_000)]
    assert work_figures(str(tmp_path), stages) == [(8_000, 10_000), (0, 2_000)]


def test_a_stage_goes_at_its_rate_from_its_first_work_not_from_the_launch():
    """The first share (a tenth of the work) seen 20 s after the launch, another tenth 10 s later:
    80 s to go at that rate, where counting from the launch (20% in 30 s) says 120 s."""
    from pipelines.progress_display import from_first_work

    figure, since = from_first_work((2_000, 10_000), (20.0, 1_000), 0.0, 30.0)
    assert (figure, since) == ((1_000, 9_000), 10.0)
    assert job_seconds_left([figure], [since]) == pytest.approx(80.0)
    assert job_seconds_left([(2_000, 10_000)], [30.0]) == pytest.approx(120.0)
    # Nothing seen yet, or not begun: as it was.
    assert from_first_work((0, 10_000), None, 0.0, 5.0) == ((0, 10_000), 5.0)
    assert from_first_work((0, None), None, None, 5.0) == ((0, None), None)


def test_json_files_go_by_their_bytes_as_stored(tmp_path):
    """A JSON file's rows are not planned, and a unit is a whole file: the stage counts files, and
    its ETA goes by the bytes of the files as stored, read so far (transforms.inputs.read), so one
    large file shows its share while it is read."""
    from pipelines.progress import announce_write_stages
    from pipelines.progress_display import work_figures
    from transforms.core import progress
    from transforms.core.progress import Progress, announced_stages
    from transforms.inputs.units import InputUnit

    units = [InputUnit(f"/in/{name}.jsonl.gz", "jsonl", -1, 0, text_bytes=size)
             for name, size in (("big", 9_000), ("small", 1_000))]
    announce_write_stages(str(tmp_path), units, set(), "tokenize", "tokenize")
    stages = announced_stages(str(tmp_path))
    assert (stages[0].unit, stages[0].total) == ("input units", 2)
    assert (stages[0].work_keys, stages[0].work_total) == (("stored_bytes",), 10_000)
    read = Progress("read", shared_dir=str(tmp_path))
    read.add(documents=500, stored_bytes=4_500)  # half of the big file, no unit done
    progress.flush_all()
    assert work_figures(str(tmp_path), stages)[0] == (4_500, 10_000)
    # Done units are not announced again: the files left, by their bytes.
    announce_write_stages(str(tmp_path), units, {0}, "tokenize", "tokenize")
    assert announced_stages(str(tmp_path))[0].work_total == 1_000
