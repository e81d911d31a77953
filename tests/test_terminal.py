"""A person at the terminal: --help with every default, --workers, --dry_run refused locally,
progress lines with a share and an ETA."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from conftest import SAMPLE_PARQUET

from pipelines import cli, common
from transforms.core import progress
from transforms.core.progress import Planned, Progress, format_duration, share_line
from transforms.core.records import UsageError


def help_text(job, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([job, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def optional_flags(text):
    """{flag: its help} of every flag the usage line shows in [brackets], but -h."""
    usage = text.split("\n\n", 1)[0]
    flags = [f for f in re.findall(r"\[(--[\w-]+)", usage)]
    blocks = {}
    for flag in flags:
        m = re.search(rf"^  {re.escape(flag)}\b.*?(?=^  -|^\S|\Z)", text, flags=re.M | re.S)
        assert m, f"{flag} has no help entry"
        blocks[flag] = " ".join(m.group(0).split())
    return blocks


@pytest.mark.parametrize("job", sorted(cli.JOBS))
def test_help_shows_every_default(job, capsys):
    flags = optional_flags(help_text(job, capsys))
    assert flags or job == "remove", job  # remove has required flags only
    missing = [flag for flag, text in flags.items() if "default" not in text]
    assert not missing, f"pretokenize {job} --help says no default for {missing}"


def test_help_shows_the_values_of_the_defaults(capsys):
    flags = optional_flags(help_text("bucketed", capsys))
    assert "(default: eng_Latn)" in flags["--language"]
    assert "(default: 0.9)" in flags["--lid-threshold"]
    assert "(default: 32)" in flags["--partitions"]
    assert "(default: none)" in flags["--removal-list"]
    assert "(default: off)" in optional_flags(help_text("scaffold", capsys))["--annotate"]


# --workers


@pytest.mark.parametrize(
    ("argv", "beam_args"),
    [
        ([], []),
        (["--workers", "3"], ["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                              "--direct_num_workers=3"]),
        (["--workers=2", "--runner=FnApiRunner"], ["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                                                    "--direct_num_workers=2"]),
        (["--workers=2", "--runner", "DirectRunner"], ["--runner", "DirectRunner", "--runner=FnApiRunner",
                                                        "--direct_running_mode=multi_processing",
                                                        "--direct_num_workers=2"]),
    ],
)
def test_workers_becomes_beams_flags(argv, beam_args):
    parser = common.job_parser("bucketed", "", "files")
    known, rest = common.parse_job_args(parser, ["--input", "i", "--output", "o", *argv])
    assert rest == beam_args
    assert not hasattr(known, "workers")


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "2", "--runner=DataflowRunner"], "--workers is for a local run; --runner=DataflowRunner"),
        (["--workers", "2", "--runner=FlinkRunner"], "--workers is for a local run; --runner=FlinkRunner"),
        (["--workers", "2", "--runner=PrismRunner"], "--workers runs the FnApiRunner"),
        (["--workers", "2", "--direct_num_workers=4"], "--direct_num_workers both say"),
    ],
)
def test_workers_refused(argv, problem, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert problem in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".pretokenize" not in p.name}


def test_two_workers_write_the_same_bytes_and_show_the_share_done(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "0")
    shared_before = set(Path(tempfile.gettempdir()).glob("pretokenize-progress-*"))
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(one), "--runner=FnApiRunner"]) == 0
    single = capsys.readouterr().err
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(two), "--workers", "2"]) == 0
    multi = capsys.readouterr().err
    assert tree_bytes(one) == tree_bytes(two) and "dataset_stats.txt" in tree_bytes(one)

    line = re.compile(r"\[read pid (\d+)\] documents .*; all workers: (\d+\.\d)% of 190 rows, ETA \d+s")
    for err, processes in ((single, 1), (multi, 2)):
        shares = line.findall(err)
        assert shares, err
        assert len({pid for pid, _ in shares}) == processes
        assert shares[-1][1] == "100.0" or max(float(s) for _, s in shares) == 100.0
    # The directory where the workers shared their progress is gone.
    assert set(Path(tempfile.gettempdir()).glob("pretokenize-progress-*")) <= shared_before


# --dry_run


@pytest.mark.parametrize("flags", [["--dry_run=True"], ["--dry_run=True", "--runner=FnApiRunner"],
                                   ["--dry_run", "True", "--runner=DirectRunner"]])
def test_dry_run_on_a_local_runner_is_refused(flags, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert "--dry_run is for a remote runner" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_dry_run_false_is_refused_as_beam_would_read_it_as_true(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--dry_run=False",
                     "--runner=DataflowRunner"]) == 2
    assert "Beam takes any value as true" in capsys.readouterr().err
    assert not out.exists()


# Progress


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (44.6, "45s"), (60, "1m00s"), (725, "12m05s"),
                                                (3599.4, "59m59s"), (11220, "3h07m"),
                                                (86399, "23h59m"), (187200, "2d04h"), (-3, "0s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("done", "total", "elapsed", "text"),
    [
        (0, 1000, 5.0, "0.0% of 1.00k rows, ETA unknown"),
        (250, 1000, 30.0, "25.0% of 1.00k rows, ETA 1m30s"),
        (1000, 1000, 30.0, "100.0% of 1.00k rows, ETA 0s"),
        (1200, 1000, 30.0, "100.0% of 1.00k rows, ETA 0s"),  # more rows than planned (never below 0)
        (1, 2_600_000, 2.0, "0.0% of 2.60M rows, ETA 60d04h"),
    ],
)
def test_share_line(done, total, elapsed, text):
    assert share_line(done, Planned(total), elapsed) == text


def test_progress_sums_the_workers_that_share_a_directory(tmp_path, caplog):
    planned = Planned(400, "rows", ("documents", "bad_records"))
    first = Progress("read", interval=3600, planned=planned, shared_dir=str(tmp_path / "shared"))
    second = Progress("read", interval=3600, planned=planned, shared_dir=str(tmp_path / "shared"))
    other_step = Progress("tokenize", interval=3600, planned=Planned(5), shared_dir=str(tmp_path / "shared"))
    first.add(documents=90, bad_records=10)
    other_step.add(documents=5)
    with caplog.at_level("INFO", logger="pretokenize.progress"):
        first.report()
        other_step.report()
        second.add(documents=100)
        second.report()
    lines = [r.getMessage() for r in caplog.records]
    assert "all workers: 25.0% of 400 rows" in lines[0]  # the first alone: 100 of 400
    assert "all workers: 100.0% of 5 rows" in lines[1]  # its own step only
    assert "all workers: 50.0% of 400 rows" in lines[2]  # both: 200 of 400
    assert lines[2].startswith("[read pid ") and "documents 100 (" in lines[2]


def test_progress_of_one_worker_without_a_plan_shows_rates_only(caplog):
    p = Progress("write", interval=3600)
    p.add(files=2, tokens=3000)
    with caplog.at_level("INFO", logger="pretokenize.progress"):
        p.report()
    (line,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"\[write pid \d+\] files 2 \(\S+/s\), tokens 3.00k \(\S+/s\)", line), line


def test_a_worker_record_is_shown_as_its_own_message():
    import logging

    keep = progress._WorkerRecords()

    def record(text, level=logging.INFO):
        return logging.LogRecord(progress.WORKER_LOGGER, level, __file__, 1, text, (), None)

    ours = record('Worker: severity: INFO timestamp {   seconds: 1 } message: "[read pid 7] documents 5 '
                  '\\"q\\" caf\\303\\251" log_location: "/x/transforms/core/progress.py:93" thread: "T"')
    assert keep.filter(ours) and ours.getMessage() == '[read pid 7] documents 5 "q" café'
    beams = record('Worker: severity: INFO message: "Creating state cache" log_location: '
                   '"/venv/apache_beam/runners/worker/sdk_worker.py:1"')
    assert not keep.filter(beams)
    assert not keep.filter(record("Starting worker"))
    assert keep.filter(record("worker lost", logging.WARNING))


def test_usage_errors_are_one_line():
    with pytest.raises(UsageError, match="give one"):
        common.worker_flags(2, ["--direct_running_mode=in_memory"])
