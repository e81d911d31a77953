"""Issue 35, case 9c: a run that fails (a full disk: ENOSPC from the spill writer, injected by
tests/faults.py) deletes every spill file but the finished units' work, says so in one line, and
the same command, run again, resumes from that work to the tree a clean run writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, SAMPLE_PARQUET, tree_hashes

from pipelines import cli
from shards import layout

RUNNER = "--runner=FnApiRunner"


def _args(out) -> list[str]:
    return ["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--partitions", "2", RUNNER]


def _spill_files_and_marked(out) -> tuple[set[str], set[str]]:
    """Every file under the saved work's spill directories, and those its finished units' markers name."""
    temp = out / layout.TEMP_DIR_NAME
    present, marked = set(), set()
    for work in temp.iterdir():
        if not work.name.startswith("work-"):
            continue
        for dirpath, _, names in os.walk(work / "spill"):
            present |= {os.path.join(dirpath, n) for n in names}
        for marker in (work / "units").glob("*.done"):
            marked |= {str(work / name) for name in json.loads(marker.read_text())["files"]}
    return present, marked


def test_a_full_disk_keeps_only_the_finished_units_work(tmp_path, capsys):
    out = tmp_path / "out"
    failed = subprocess.run([sys.executable, str(REPO / "tests" / "faults.py"), "--spill-full-disk", "2", "--",
                             *_args(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert failed.returncode == 2, failed.stderr[-3000:]
    lines = [line for line in failed.stderr.strip().splitlines() if line.startswith("pretokenize")]
    assert len(lines) == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert "no space left on device" in lines[0] and "the work of 1 finished input unit is kept" in lines[0]
    present, marked = _spill_files_and_marked(out)
    assert marked and present == marked, (sorted(present - marked), sorted(marked))

    assert cli.main(_args(out)) == 0
    assert not (out / layout.TEMP_DIR_NAME).exists()
    reference = tmp_path / "reference"
    assert cli.main(_args(reference)) == 0
    skip = ("dataset_stats.json", "README.md")
    assert tree_hashes(out, skip) == tree_hashes(reference, skip)
