"""The run mode (run, dry run, submit only) is an argument: RunMode, and cli.main's ``wait``."""

from __future__ import annotations

import os
import tempfile

import pytest

from pipelines import cli
from pipelines.run_mode import RUN, RunMode, Workers, building


def test_a_dry_runs_scratch_exists_only_while_the_job_is_built():
    with building(RunMode(dry_run=True)) as mode:
        assert mode.dry_run and mode.wait and os.path.isdir(mode.scratch)
        scratch = mode.scratch
    assert not os.path.exists(scratch)
    with building(RUN) as mode:
        assert mode == RUN and mode.scratch is None


def test_only_the_writing_jobs_can_be_submitted_without_waiting(tmp_path, capsys):
    assert cli.main(["verify", "--output", str(tmp_path)], wait=False) == 2
    assert capsys.readouterr().err.strip() == (
        "pretokenize verify: only bucketed and scaffold can be submitted without waiting")


def test_a_launch_that_fails_leaves_no_beam_temporary_directory(tmp_path, monkeypatch, capsys):
    # Beam makes a directory for every Pipeline and removes it only in run(): a launch check that
    # fails after the Pipeline exists (here: an input without the text column) must remove it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    source = tmp_path / "no-text.parquet"
    pq.write_table(pa.table({"id": ["a"], "body": ["x"]}), source)
    code = cli.main(["bucketed", "--input", str(source), "--output", str(tmp_path / "out"), "--runner=FnApiRunner"])
    assert code == 2, capsys.readouterr()
    assert "text" in capsys.readouterr().err
    assert [p.name for p in scratch.iterdir() if p.name.startswith("beam-pipeline-temp")] == []


@pytest.mark.parametrize("args", [
    [],
    ["--runner=FnApiRunner"],
    ["--runner", "DataflowRunner", "--project=p"],
    ["--runner=FnApiRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=3"],
    ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"],
    ["--direct_num_workers=2", "--direct_num_workers=4", "--direct_running_mode=multi_threading"],
    ["--runner=PrismRunner", "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"],
    ["--runner=FlinkRunner", "--flink_master=[local]"],
    ["--job_name=--runner", "--direct_num_workers=0"],
    ["--runner="],
    ["--direct_num_workers=+2"],
    ["--direct_num_workers", " 3 "],
    # int() reads these as Beam's parser does; a str.isdigit() says otherwise of both
    ["--direct_running_mode=multi_processing", "--direct_num_workers=1_6"],
    ["--direct_running_mode=multi_processing", "--direct_num_workers= 2 "],
], ids=lambda args: " ".join(args) or "none")
def test_where_the_workers_run_is_read_off_the_flags_as_beam_reads_them(args):
    """The display comes up before Beam is imported (pipelines/job.py), from the flags as given: it
    must see the runner and the workers Beam's options will."""
    from apache_beam.options.pipeline_options import PipelineOptions

    assert Workers.of_args(args) == Workers.of_options(PipelineOptions(args))


@pytest.mark.parametrize("count", ["²", "2.0", "2.5", "", "two"])
def test_a_worker_count_beam_refuses_counts_as_its_default_until_beam_refuses_it(count):
    """Read before Beam is, outside the launch's error handling: a traceback here would come
    before the one line Beam's check says (flags.BeamArgs.options)."""
    assert Workers.of_args([f"--direct_num_workers={count}"]).count == 1


@pytest.mark.parametrize("runner, local", [
    ("direct", True), ("Direct", True), ("directrunner", True), ("fnapirunner", True), ("FnApi", True),
    ("prism", True), ("DirectRunner", True), ("apache_beam.runners.direct.direct_runner.DirectRunner", True),
    ("dataflow", False), ("Dataflow", False), ("flink", False), ("DataflowRunner", False),
])
def test_a_runner_is_named_as_beam_names_it(runner, local):
    """Beam takes a runner's name in any case, with or without its "Runner" (runners/runner.py
    create_runner): --runner=direct runs here, so it has the display, and refuses --dry_run."""
    from pipelines.run_mode import is_local_runner

    assert is_local_runner(runner) is local


def test_a_dry_run_on_a_local_runner_named_in_lower_case_is_refused_and_writes_nothing(tmp_path, capsys):
    """--runner=direct would ignore --dry_run and run the whole job, into an output never claimed."""
    from conftest import SAMPLE_PARQUET

    out = tmp_path / "out"
    code = cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=direct",
                     "--dry_run=True"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dry_run is for a remote runner" in err[0], err
    assert not out.exists()


def test_the_runners_named_are_those_beam_knows():
    from apache_beam.options.pipeline_options import StandardOptions

    from pipelines.run_mode import KNOWN_RUNNERS, LOCAL_RUNNERS

    assert sorted(KNOWN_RUNNERS) == sorted(StandardOptions.KNOWN_RUNNER_NAMES)
    assert set(StandardOptions.LOCAL_RUNNERS) <= set(LOCAL_RUNNERS)
