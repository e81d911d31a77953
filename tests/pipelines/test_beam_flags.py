"""A flag neither the job nor Beam knows is refused before Beam is imported (pipelines/beam_flags.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, SAMPLE_PARQUET

from pipelines import cli
from pipelines.beam_flags import surely_unknown

pytestmark = pytest.mark.unit

# A fresh interpreter: whether Beam was imported is a fact of the process, not of this test session.
TYPO = """
import sys
from pipelines.cli import main
code = main(sys.argv[1:])
print(code, "apache_beam" in sys.modules)
"""


@pytest.mark.parametrize(("job", "flags", "said"), [
    ("bucketed", ["--input", str(SAMPLE_PARQUET), "--tokenzier", "gpt2"],
     "--tokenzier (did you mean --tokenizer?); see --help; nothing was published"),
    # the tools' Beam graphs (pipelines/remove_graph.py, verify_graph.py) are imported only once they run
    ("remove", ["--removal-list", "ids.txt", "--removal-lsit", "ids.txt"],
     "--removal-lsit (did you mean --removal-list?); see --help; nothing was published"),
    ("verify", ["--smaple", "0.5"], "--smaple (did you mean --sample?); see --help"),
], ids=("bucketed", "remove", "verify"))
def test_a_typo_is_refused_with_its_did_you_mean_and_no_beam_imported(job, flags, said, tmp_path):
    done = subprocess.run([sys.executable, "-c", TYPO, job, "--output", str(tmp_path / "out"), *flags], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["2", "False"]
    assert done.stderr.strip() == f"pretokenize {job}: unknown flag or argument: {said}"
    assert not (tmp_path / "out").exists()


def test_only_flags_no_beam_source_spells_are_sure():
    args = ["--runner=FnApiRunner", "--temp_location", "/tmp/x", "--direct_num_workers=2", "--tokenzier", "gpt2",
            "--experiments=use_runner_v2", "--nonsense_flag=1", "--", "--after-the-end"]
    assert surely_unknown(args) == ["--tokenzier", "--nonsense_flag=1"]


@pytest.mark.parametrize(("flag", "said"), [
    ("--direct_num_workers=x", "argument --direct_num_workers: invalid int value: 'x'"),
    ("--direct_running_mode=threads", "argument --direct_running_mode: invalid choice: 'threads' (choose from "
                                      "'in_memory', 'multi_threading', 'multi_processing')"),
])
def test_a_value_beam_refuses_is_one_line(flag, said, tmp_path, capsys):
    """Beam's parser judges these once the input is planned, when the bars may be up: its refusal is
    the command's one line, not argparse's usage of every Beam flag and an exit."""
    argv = ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(tmp_path / "out"), "--runner=FnApiRunner", flag]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"pretokenize bucketed: {said}; see --help; nothing was published"
    assert not (tmp_path / "out").exists()
