"""A job's workers use the tokenizer files the launch loaded: a file rewritten while the job runs
fails it in one line, and nothing is published."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pyarrow.parquet as pq
from conftest import REPO, SAMPLE_PARQUET
from tokenizer_swaps import swap_ranks, unseen_by_the_probe

from pipelines import bucketed, cli
from shards import layout
from transforms.run.resume import PROBE_TEXT
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.ranks import gpt2_ranks_path

FNAPI = "--runner=FnApiRunner"


def test_a_tokenizer_file_rewritten_while_the_job_runs_fails_it_in_one_line(tmp_path, monkeypatch, capsys):
    ranks = tmp_path / "ranks.tiktoken"
    shutil.copyfile(gpt2_ranks_path(), ranks)
    texts = pq.read_table(SAMPLE_PARQUET, columns=["text"]).column("text").to_pylist()
    a, b = unseen_by_the_probe(ranks, texts)
    before = load_encoder(f"tiktoken:{ranks}").encode_batch([PROBE_TEXT])

    launch = bucketed.build

    def build_then_rewrite(pipeline, options, run_id=None, *mode, **planned):
        # the launch has loaded the tokenizer and recorded its files
        built = launch(pipeline, options, run_id, *mode, **planned)
        swap_ranks(ranks, a, b)  # before any worker loads it
        return built

    monkeypatch.setattr(bucketed, "build", build_then_rewrite)
    out = tmp_path / "out"
    capsys.readouterr()
    code = cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--tokenizer",
                     f"tiktoken:{ranks}", "--dtype", "uint16", FNAPI])
    err = capsys.readouterr().err.strip()
    assert code == 2, err[-3000:]
    last = err.splitlines()[-1]
    assert "Traceback" not in err and last.startswith("pretokenize bucketed: bad input: --tokenizer tiktoken:")
    assert "ranks.tiktoken has sha256" in last and "the tokenizer changed while the job ran" in last, last
    assert last.endswith("nothing was published")
    assert not (out / layout.STATS_NAME).exists() and not list(out.rglob("*.npy"))
    # The swap is one the probe text alone does not see.
    assert load_encoder(f"tiktoken:{ranks}").encode_batch([PROBE_TEXT]) == before


# The launch of a two-worker run, its tokenizer's ranks swapped once the launch has recorded them:
# argv is the ranks file, the two ranks, then the command's arguments.
SWAPPING_LAUNCH = """
import sys
sys.path.insert(0, "tests")
from tokenizer_swaps import swap_ranks
from pipelines import bucketed, cli
ranks, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
launch = bucketed.build
def build_then_rewrite(pipeline, options, run_id=None, *mode, **planned):
    built = launch(pipeline, options, run_id, *mode, **planned)
    swap_ranks(__import__("pathlib").Path(ranks), a, b)
    return built
bucketed.build = build_then_rewrite
sys.exit(cli.main(sys.argv[4:]))
"""


def test_a_tokenizer_rewritten_under_two_workers_is_one_line_and_no_traceback(tmp_path):
    """The path a user takes: --workers 2, each worker finding the change in its own process; the
    workers' reports of the failed step are Beam's harness speaking, not the command."""
    ranks = tmp_path / "ranks.tiktoken"
    shutil.copyfile(gpt2_ranks_path(), ranks)
    texts = pq.read_table(SAMPLE_PARQUET, columns=["text"]).column("text").to_pylist()
    a, b = unseen_by_the_probe(ranks, texts)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", SWAPPING_LAUNCH, str(ranks), str(a), str(b), "bucketed", "--input",
                           str(SAMPLE_PARQUET), "--output", str(out), "--tokenizer", f"tiktoken:{ranks}", "--dtype",
                           "uint16", FNAPI, "--workers", "2"], cwd=REPO, capture_output=True, text=True, timeout=600)
    err = done.stderr.strip()
    assert done.returncode == 2, err[-3000:]
    assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
    last = err.splitlines()[-1]
    assert last.startswith("pretokenize bucketed: bad input: --tokenizer tiktoken:"), last
    assert "the tokenizer changed while the job ran" in last and last.endswith("nothing was published")
    assert not (out / layout.STATS_NAME).exists() and not list(out.rglob("*.npy"))
