"""A FIFO where a tree's file should be, and a damaged checksums file: every command says so in one
line, naming the file, and changes nothing; none waits forever for a writer that never comes.

Found by a review: a FIFO at the ownership record, the stats, the manifest or the checksums hung
remove, verify, export, stats, decode and bucketed at the open (remove after it had deleted a shard),
and a damaged checksums.sha256 stopped remove only once the shards and the manifest had changed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, finepdfs_row, run_cli
from tree_traps import snapshot

from shards import layout, manifest

RUNNER = "--runner=FnApiRunner"
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(20)]
CLI = "import sys; from pipelines.cli import main; sys.exit(main())"
# Long enough for a command on a busy machine, short of forever: a hang fails, never stalls the suite.
TIMEOUT = 240


def run_apart(argv: list[str], cwd) -> subprocess.CompletedProcess:
    """``pretokenize ARGV`` in a process of its own: a command that hangs is killed and fails the test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        return subprocess.run([sys.executable, "-c", CLI, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pretokenize {' '.join(argv)} still waiting after {TIMEOUT} s")


def first_doc(out) -> str:
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return next(manifest.read_rows(f))[1]


def fifo_at(out, name: str) -> None:
    os.remove(out / name)
    os.mkfifo(out / name)


def refused(result: subprocess.CompletedProcess, path, kind: str = "a FIFO") -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    last = [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert "Traceback" not in result.stderr and f"{path} is {kind}, not a regular file" in last, last


@pytest.mark.parametrize("name", [layout.RECORD_NAME, layout.STATS_NAME, layout.MANIFEST_NAME, layout.CHECKSUMS_NAME])
def test_remove_refuses_a_fifo_in_the_tree_and_changes_nothing(tree_copy, tmp_path, name):
    out = tree_copy
    flagged = tmp_path / "flagged.txt"
    flagged.write_text(first_doc(out) + "\n")
    fifo_at(out, name)
    before = snapshot(out)
    refused(run_apart(["remove", "--output", str(out), "--removal-list", str(flagged), RUNNER], tmp_path), out / name)
    assert snapshot(out) == before


@pytest.mark.parametrize("argv", [
    ["verify", "--output", "{out}", RUNNER],
    ["export", "megatron", "--output", "{out}"],
    ["stats", "--output", "{out}", "--png", "none"],
    ["decode", "{out}", "--docs", "1"],
], ids=lambda argv: argv[0])
@pytest.mark.parametrize("name", [layout.RECORD_NAME, layout.STATS_NAME, layout.MANIFEST_NAME])
def test_every_command_refuses_a_fifo_at_a_tree_file(tree_copy, tmp_path, argv, name):
    out = tree_copy
    fifo_at(out, name)
    before = snapshot(out)
    refused(run_apart([a.format(out=out) for a in argv], tmp_path), out / name)
    assert snapshot(out) == before


def test_remove_refuses_damaged_checksums_before_it_changes_anything(tree_copy, tmp_path, capsys):
    out = tree_copy
    flagged = tmp_path / "flagged.txt"
    flagged.write_text(first_doc(out) + "\n")
    lines = (out / layout.CHECKSUMS_NAME).read_text().splitlines()
    (out / layout.CHECKSUMS_NAME).write_text("\n".join([lines[0], "garbage line", *lines[1:]]) + "\n")
    before = snapshot(out)
    line = run_cli(capsys, ["remove", "--output", str(out), "--removal-list", str(flagged), RUNNER]).refusal
    assert f"{out / layout.CHECKSUMS_NAME} line 2: not a sha256sum line: 'garbage line'" in line
    assert "a bucketed re-run writes them again" in line
    assert snapshot(out) == before  # the shards, the manifest, the stats and the temporary directory alike


def test_verify_counts_a_fifo_shard_as_a_problem(tree_copy, tmp_path):
    out = tree_copy
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        rel = next(manifest.read_rows(f))[0]
    fifo_at(out, rel)
    result = run_apart(["verify", "--output", str(out), RUNNER], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"  {rel}: {out / rel} is a FIFO, not a regular file" in result.stdout


def test_remove_names_a_directory_where_the_checksums_should_be(tree_copy, tmp_path):
    out = tree_copy
    flagged = tmp_path / "flagged.txt"
    flagged.write_text(first_doc(out) + "\n")
    os.remove(out / layout.CHECKSUMS_NAME)
    os.mkdir(out / layout.CHECKSUMS_NAME)
    before = snapshot(out)
    result = run_apart(["remove", "--output", str(out), "--removal-list", str(flagged), RUNNER], tmp_path)
    refused(result, out / layout.CHECKSUMS_NAME, "a directory")
    assert "bucketed re-run writes them again" not in result.stderr
    assert snapshot(out) == before
