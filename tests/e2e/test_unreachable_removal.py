"""Every URL a removal-aware command takes, on a store out of reach, is one line and exit 2 (issue 23,
defect 8): removal lists, the output of remove and verify, tokenizer specs on a store, decode's input.
They were 131-164-line tracebacks. Each runs the console script in a fresh process against an S3
endpoint on a closed port of this machine, as tests/e2e/test_unreachable_storage.py does."""

from __future__ import annotations

import json

import pytest
from conftest import finepdfs_row
from test_unreachable_storage import closed_port, run_cli_process, s3_env


@pytest.fixture
def local(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps(finepdfs_row(f"d{i}", f"Some words of document {i}. " * 5)) + "\n"
                           for i in range(4)))
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("d1\n")
    return src, flagged, tmp_path / "out"


CASES = {
    "bucketed --removal-list": lambda src, flagged, out: (
        ["bucketed", "--input", str(src), "--output", str(out), "--tokenizer", "gpt2", "--removal-list",
         "s3://corpus/flagged.txt", "--runner=FnApiRunner"], "s3://corpus/flagged.txt"),
    "train-bpe --removal-list": lambda src, flagged, out: (
        ["train-bpe", "--input", str(src), "--output", str(out), "--merges", "5", "--removal-list",
         "s3://corpus/flagged.txt", "--runner=FnApiRunner"], "s3://corpus/flagged.txt"),
    "remove --output": lambda src, flagged, out: (
        ["remove", "--output", "s3://corpus/out", "--removal-list", str(flagged), "--runner=FnApiRunner"],
        "s3://corpus/out"),
    "remove --removal-list": lambda src, flagged, out: (
        ["remove", "--output", str(out), "--removal-list", "s3://corpus/flagged.txt", "--runner=FnApiRunner"],
        "s3://corpus/flagged.txt"),
    "verify --output": lambda src, flagged, out: (
        ["verify", "--output", "s3://corpus/out", "--runner=FnApiRunner"], "s3://corpus/out"),
    "verify --removal-list": lambda src, flagged, out: (
        ["verify", "--output", str(out), "--removal-list", "s3://corpus/flagged.txt", "--runner=FnApiRunner"],
        "s3://corpus/flagged.txt"),
    "--tokenizer trained:s3://": lambda src, flagged, out: (
        ["bucketed", "--input", str(src), "--output", str(out), "--tokenizer", "trained:s3://corpus/tok",
         "--runner=FnApiRunner"], "s3://corpus/tok"),
    "--tokenizer tiktoken:s3://": lambda src, flagged, out: (
        ["bucketed", "--input", str(src), "--output", str(out), "--tokenizer", "tiktoken:s3://corpus/ranks.tiktoken",
         "--runner=FnApiRunner"], "s3://corpus/ranks.tiktoken"),
    "decode s3://": lambda src, flagged, out: (["decode", "s3://corpus/out/train/shard_000.bin"],
                                               "s3://corpus/out/train/shard_000.bin"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unreachable_store_is_one_line(case, local, tmp_path):
    src, flagged, out = local
    if case.startswith(("remove --removal-list", "verify --removal-list")):
        from pipelines import cli

        assert cli.main(["bucketed", "--input", str(src), "--output", str(out), "--tokenizer", "gpt2",
                         "--runner=FnApiRunner"]) == 0
    args, url = CASES[case](src, flagged, out)
    result = run_cli_process(args, s3_env(closed_port()))
    said = [line for line in result.stderr.strip().splitlines() if " INFO " not in line and " WARNING " not in line]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(said) == 1, result.stderr[-3000:]
    assert said[0].startswith(f"pretokenize {args[0]}: cannot reach {url}"), said[0]
    assert "connection failed" in said[0]
