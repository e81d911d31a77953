"""Resume on s3:// (moto's S3 server): no rename there, so a unit's completion marker is one put,
written after its spill files' uploads completed. A job killed (SIGKILL) with some units done, then
run again, redoes only the others and publishes the bytes of a clean local run."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import REPO, SAMPLE_PARQUET, tree_hashes
from test_object_storage import DESCRIPTION, s3, s3_endpoint, s3_tree_hashes  # noqa: F401 - fixtures

from shards import layout
from transforms.run import resume

FILES = 5
JOBS = {
    "bucketed": ["--partitions", "4", "--max-shard-bytes", "150000"],
    "scaffold": ["--annotate", "--tokenizer", "gpt2", "--shard-tokens", "20000"],
}


def _inputs(directory):
    rows = pq.read_table(SAMPLE_PARQUET).to_pylist()
    directory.mkdir()
    for i in range(FILES):
        with open(directory / f"part-{i}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows[i::FILES])
    return directory


def _command(job, inputs, out, *faults):
    return [sys.executable, str(REPO / "tests" / "faults.py"), *faults, "--", job, "--input", str(inputs),
            "--output", out, *JOBS[job], "--runner=FnApiRunner"]


def _notes(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_when(proc, condition, timeout=300.0):
    import os
    import signal
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.01)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return False


@pytest.mark.parametrize("job", sorted(JOBS))
def test_killed_on_s3_then_resumed_matches_a_clean_local_run(job, s3, tmp_path):  # noqa: F811 - the fixture
    fs, bucket = s3
    inputs = _inputs(tmp_path / "in")
    clean = tmp_path / "clean"
    subprocess.run(_command(job, inputs, str(clean)), cwd=REPO, check=True, capture_output=True, timeout=600)

    out, note = f"s3://{bucket}/out", tmp_path / "note.txt"
    proc = subprocess.Popen(_command(job, inputs, out, "--marker-delay", "0.5", "--marker-note", str(note)),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # A note is written before each marker: at the third, two markers are on S3 and the third
    # unit's files are uploaded but its marker is not.
    assert _kill_when(proc, lambda: _notes(note) >= 3), "the job ended before two units were done"
    fs.invalidate_cache()
    found = [p for p in fs.find(f"{bucket}/out/{layout.TEMP_DIR_NAME}") if p.endswith(resume.MARKER_SUFFIX)]
    assert len(found) == 2
    assert not fs.exists(f"{bucket}/out/{layout.STATS_NAME}")

    again = tmp_path / "again.txt"
    rerun = subprocess.run(_command(job, inputs, out, "--marker-note", str(again)), cwd=REPO, capture_output=True,
                           text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming: 2 of {FILES} input units" in rerun.stderr
    assert _notes(again) == FILES - 2
    # The description names the input's URL, which differs: every other file is compared.
    assert s3_tree_hashes(fs, f"{bucket}/out", tmp_path) == tree_hashes(clean, skip=DESCRIPTION)
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/out/{layout.TEMP_DIR_NAME}"), "the saved work outlived the publish"
