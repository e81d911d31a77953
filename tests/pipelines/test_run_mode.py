"""The run mode (run, dry run, submit only) is an argument: RunMode, and cli.main's ``wait``."""

from __future__ import annotations

import os
import tempfile

from pipelines import cli
from pipelines.run_mode import RUN, RunMode, building


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
