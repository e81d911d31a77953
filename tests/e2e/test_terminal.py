"""A person at the terminal: --help with every default, --workers, --dry_run refused locally,
progress lines with a share and an ETA."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from conftest import SAMPLE_PARQUET

from pipelines import cli, flags, summary
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
    assert flags, job
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
    parser = flags.job_parser("bucketed", "")
    known, rest = flags.parse_job_args(parser, ["--input", "i", "--output", "o", *argv])
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
    # A temporary directory of this test's own, so that other runs on the machine cannot put
    # progress directories where this test looks for leftovers.
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
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
        assert max(float(s) for _, s in shares) == 100.0
    # Each of the two processes read part of the rows, and a line says how much all of them read.
    own = re.compile(r"\[read pid \d+\] documents (\d+) .*; all workers: (\d+\.\d)%")
    assert any(float(s) > 100 * int(n) / 190 + 1 for n, s in own.findall(multi))
    # The directory where the workers shared their progress is gone.
    assert not list(private.glob("pretokenize-progress-*"))


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


@pytest.mark.parametrize("job", ["verify", "remove"])
def test_the_other_pipeline_jobs_take_workers_too(job, tmp_path, capsys):
    assert "--workers" in optional_flags(help_text(job, capsys))
    flags = ["--removal-list", str(tmp_path / "ids.txt")] if job == "remove" else []
    argv = [job, "--output", str(tmp_path / "none"), *flags, "--workers", "2", "--runner=DataflowRunner"]
    assert cli.main(argv) == 2
    assert "--workers is for a local run" in capsys.readouterr().err


def test_usage_errors_are_one_line():
    with pytest.raises(UsageError, match="give one"):
        flags.worker_flags(2, ["--direct_running_mode=in_memory"])


# --plan


def plan_text(argv, capsys):
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def plan_rows(text, first_column):
    """{name: columns} of the plan's output table (the rows under its header)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:1] == [first_column])
    rows = {}
    for ln in lines[start + 1:]:
        if ln.strip().startswith("and "):
            break
        cells = ln.split()
        rows[cells[0]] = cells[1:]
    return rows


def number(cell):
    return float(cell.lstrip("~").replace(",", ""))


def test_plan_of_the_sample_runs_nothing_and_matches_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    text = plan_text(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--plan"], capsys)
    assert not out.exists()
    assert "1 file (parquet), 2 units of work, 190 rows" in text
    assert "the whole input" in text and f"output: {out} (does not exist: a run creates it)" in text
    # Core-hours: the tokens over the tokens per CPU second measured on the sample.
    rate = number(re.search(r"(\S+) tokens per CPU second in the sample", text).group(1))
    m = re.search(r"core-hours: ~([0-9.]+) \(([0-9.,]+) CPU seconds\) of encoding for 740,208 tokens", text)
    assert m, text
    assert float(m.group(1)) == pytest.approx(740_208 / rate / 3600, rel=0.02)
    assert number(m.group(2)) == pytest.approx(740_208 / rate, rel=0.02)
    planned = plan_rows(text, "bucket")

    # The run writes what the plan said: per bucket its documents, tokens and files.
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"]) == 0
    capsys.readouterr()
    stats = summary.read_stats(str(out))
    assert "documents kept: 149 (78.4% of the rows)" in text and stats.kept_documents == 149
    written = {name: b for name, b in stats.buckets.items() if b.documents}
    assert set(planned) == set(written)
    for name, b in written.items():
        docs, tokens, files = (int(number(c)) for c in planned[name][:3])
        assert (docs, tokens, files) == (b.documents, b.tokens, b.files), name
        names = sorted(p.relative_to(out).as_posix() for p in (out / name).iterdir())
        assert planned[name][3] == names[0] and planned[name][-1] == names[-1]
    # Planning again over a finished tree leaves it as it is.
    before = tree_bytes(out)
    text = plan_text(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--plan"], capsys)
    assert "holds this job's earlier output" in text and tree_bytes(out) == before


def repeated_sample(path, copies, row_group_size):
    """The sample's rows ``copies`` times over (fresh ids), in row groups of ``row_group_size``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(SAMPLE_PARQUET)
    parts = []
    for k in range(copies):
        ids = pa.array([f"{i}-copy{k}" for i in table.column("id").to_pylist()])
        parts.append(table.set_column(table.schema.get_field_index("id"), "id", ids))
    pq.write_table(pa.concat_tables(parts), path, row_group_size=row_group_size)
    return table.num_rows * copies


def test_plan_from_a_sample_estimates_the_run(tmp_path, capsys):
    src = tmp_path / "big.parquet"
    rows = repeated_sample(src, 8, 40)
    out = tmp_path / "out"
    text = plan_text(["bucketed", "--input", str(src), "--output", str(out), "--plan"], capsys)
    assert not out.exists()
    assert f"1 file (parquet), 38 units of work, {rows:,} rows" in text
    assert "sample: 256 rows at random positions in 32 draws of a unit" in text and "whole input" not in text
    kept = number(re.search(r"documents kept: (\S+)", text).group(1))
    tokens = number(re.search(r"of encoding for (\S+) tokens", text).group(1))
    # Every unit is a slice of the same 190 rows: the sample's shares hold for the whole, roughly.
    assert 0.6 * 149 * 8 < kept < 1.4 * 149 * 8
    assert 0.3 * 740_208 * 8 < tokens < 3 * 740_208 * 8


def test_plan_counts_the_rows_of_json_lines(tmp_path, capsys, monkeypatch):
    import gzip
    import json
    import random

    from conftest import finepdfs_row

    from transforms.inputs import jsonl

    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)]
    lines = [json.dumps(finepdfs_row(f"d{i}", " ".join(rng.choices(words, k=rng.randint(5, 120))))) + "\n"
             for i in range(6000)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(lines[:1000]))  # read whole: counted
    with gzip.open(tmp_path / "in" / "b.jsonl.gz", "wt") as f:  # read in part: estimated
        f.write("".join(lines[1000:]))
    assert (tmp_path / "in" / "b.jsonl.gz").stat().st_size > 4 * 128 * 1024  # past gzip's chunks
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 200_000)
    out = tmp_path / "out"
    text = plan_text(["bucketed", "--input", str(tmp_path / "in"), "--output", str(out), "--tokenizer", "gpt2",
                      "--plan"], capsys)
    assert not out.exists()
    m = re.search(r"2 files \(jsonl\), 2 units of work, ~(\S+) rows \(estimated", text)
    assert m, text
    assert 0.95 * 6000 < number(m.group(1)) < 1.05 * 6000, m.group(1)

    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 10 << 20)  # now both are read whole: counted
    text = plan_text(["bucketed", "--input", str(tmp_path / "in"), "--output", str(out), "--tokenizer", "gpt2",
                      "--plan"], capsys)
    assert "2 files (jsonl), 2 units of work, 6,000 rows" in text


def test_plan_estimates_the_rows_of_json_lines_files_it_does_not_sample(tmp_path, capsys):
    import json

    from conftest import finepdfs_row

    (tmp_path / "in").mkdir()
    for k in range(40):  # 32 are drawn (and counted), 8 are not
        rows = [json.dumps(finepdfs_row(f"d{k}-{i}", f"text {i} of {k}")) + "\n" for i in range(10)]
        (tmp_path / "in" / f"part{k:02d}.jsonl").write_text("".join(rows))
    text = plan_text(["bucketed", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer",
                      "gpt2", "--plan"], capsys)
    m = re.search(r"40 files \(jsonl\), 40 units of work, ~(\S+) rows \(estimated", text)
    assert m and 380 <= number(m.group(1)) <= 420, text
    drawn = re.search(r"sample: 256 rows at random positions in 32 draws of a unit \((\d+) of the 40 units", text)
    assert drawn and 16 <= int(drawn.group(1)) < 40, text


def test_plan_of_the_scaffold_job_matches_its_run(tmp_path, capsys, gpt2_spec):
    out = tmp_path / "out"
    argv = ["scaffold", "--input", str(SAMPLE_PARQUET), "--annotate", "--tokenizer", gpt2_spec, "--output", str(out)]
    text = plan_text([*argv, "--plan"], capsys)
    assert not out.exists()
    planned = plan_rows(text, "split")
    assert cli.main([*argv, "--runner=FnApiRunner"]) == 0
    capsys.readouterr()
    stats = summary.read_stats(str(out))
    for name, split in stats.splits.items():
        if split.documents:
            assert [int(number(c)) for c in planned[name][:4]] == [split.documents, split.sequences, split.tokens,
                                                                    split.files]
            assert planned[name][4] == "train/shard_000.bin" if name == "train" else "val/shard_000.bin"


def test_plan_says_a_run_would_be_refused_and_touches_nothing(tmp_path, capsys):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    text = plan_text(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--plan"], capsys)
    assert "not written by pretokenize: a run would be refused" in text
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_plan_still_checks_the_input(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), bad)
    assert cli.main(["bucketed", "--input", str(bad), "--output", str(tmp_path / "out"), "--plan"]) == 2
    assert "missing column 'language'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


LOG_AFTER_CAPTURE = """
import io, logging, sys
from pipelines import cli

real = sys.stderr
sys.stderr = swapped = io.StringIO()  # as pytest's capture does around a test
cli.main(["verify", "--output", sys.argv[1]])
sys.stderr = real
swapped.close()
# What Beam logs as it stops a runner's service at interpreter exit, long after the test.
logging.getLogger("apache_beam.utils.subprocess_server").warning("Really destroying service")
"""


def test_a_record_logged_after_the_captured_stderr_closed_reaches_the_real_one(tmp_path):
    """main() sets up logging inside a host that swaps stderr and closes what it swapped in (pytest's
    capture): a later record must reach the stderr of that moment, not raise '--- Logging error ---'
    (the tail that followed the test suite's result)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LOG_AFTER_CAPTURE, str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Logging error" not in done.stderr, done.stderr
    assert "I/O operation on closed file" not in done.stderr, done.stderr
    assert "WARNING apache_beam.utils.subprocess_server: Really destroying service" in done.stderr, done.stderr


FREEZE_AT_EXIT = """
import atexit, gc
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))  # runs after every later hook
from pipelines import cli
import apache_beam  # what makes the exit slow
cli.main(["--help"])
"""


def test_the_cli_freezes_the_heap_before_the_interpreter_tears_it_down():
    """A process that imported Beam spent about a second of CPU at exit in the cycle collector (BENCHMARKS.md,
    "Steady-state speed", the fixed cost): the CLI's last exit hook freezes the heap so those passes skip it
    (transforms/core/process_exit.py; a worker process registers it as its first unit is set up)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FREEZE_AT_EXIT], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.rsplit("frozen at exit:", 1)[1])
    assert frozen > 100_000, done.stdout  # Beam's modules alone are hundreds of thousands of objects
