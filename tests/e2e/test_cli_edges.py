"""The edges of the command line a person meets first: --help, a typo in a job's name, a missing
input. Each answers before Beam is imported (Beam's import alone is over a second), and a missing
input before any tokenizer loads: checked in a fresh interpreter, by what it imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, SAMPLE_PARQUET

from pipelines import cli

# Runs pretokenize's main() on argv, then prints which of the heavy modules the process imported.
PROBE = """
import json, sys
from pipelines.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "imported": [m for m in ("apache_beam", "pyarrow", "quicktok", "tiktoken")
                                            if m in sys.modules]}))
"""


def probe(*argv: str) -> tuple[dict, str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    return json.loads(last), done.stdout, done.stderr


def test_pretokenize_help_imports_no_beam():
    result, out, _ = probe("--help")
    assert result["code"] == 0
    assert "jobs:" in out
    assert result["imported"] == []


@pytest.mark.parametrize("job", sorted(cli.JOBS))
def test_a_jobs_help_imports_no_beam(job):
    result, out, _ = probe(job, "--help")
    assert result["code"] == 0
    assert f"usage: pretokenize {job}" in out
    assert "apache_beam" not in result["imported"], f"pretokenize {job} --help imported Beam"


@pytest.mark.parametrize("job", ["bucketed", "scaffold", "train-bpe"])
def test_a_missing_input_is_said_before_beam_and_the_tokenizer_load(job, tmp_path):
    missing = tmp_path / "no-such-dir" / "*.parquet"
    extra = ["--merges", "10"] if job == "train-bpe" else []
    result, _, err = probe(job, "--input", str(missing), "--output", str(tmp_path / "out"), *extra)
    assert result["code"] == 2
    assert err.strip().splitlines()[-1] == (f"pretokenize {job}: bad input: {missing}: matches no input files; "
                                            "nothing was published")
    assert result["imported"] == [], f"{job} imported {result['imported']} before saying the input is missing"
    assert not (tmp_path / "out").exists()


def test_a_flag_typo_is_still_found_once_the_input_is_there(tmp_path, capsys):
    code = cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"),
                     "--partitons", "4"])
    assert code == 2
    assert "--partitons (did you mean --partitions?)" in capsys.readouterr().err


@pytest.mark.parametrize(("typed", "meant"), [("bucketd", "bucketed"), ("train_bpe", "train-bpe"),
                                              ("verfy", "verify"), ("scafold", "scaffold")])
def test_a_job_name_typo_suggests_the_job(typed, meant, capsys):
    assert cli.main([typed, "--input", "x"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"pretokenize: unknown job {typed!r} (did you mean {meant}?)"


def test_a_name_like_no_job_gets_no_suggestion(capsys):
    assert cli.main(["zzzz"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == "pretokenize: unknown job 'zzzz'"


def test_a_second_run_says_it_rewrites_the_card(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main(argv) == 0  # make demo, again
    err = capsys.readouterr().err
    assert "rewriting README.md for this run's output" in err and "rewriting dataset_stats.json" in err
    assert "removing README.md" not in err


@pytest.mark.parametrize("job", ["bucketed", "scaffold"])
def test_a_missing_remote_input_is_said_before_the_tokenizer_loads(job, tmp_path):
    """A URL is not looked at while the flags are parsed (a template's launcher parses them offline),
    but the job plans its input before it loads the tokenizer: a mistyped bucket path costs no load."""
    missing = "memory://no-such-bucket/docs/*.parquet"
    result, _, err = probe(job, "--input", missing, "--output", str(tmp_path / "out"), "--runner=FnApiRunner")
    assert result["code"] == 2, err
    assert "matches no input files" in err.strip().splitlines()[-1], err
    loaded = {"quicktok", "tiktoken"} & set(result["imported"])
    assert not loaded, f"{job} loaded {sorted(loaded)} before saying the input is missing"
    assert not (tmp_path / "out").exists()
