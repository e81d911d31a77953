"""Resume: a job killed (SIGKILL) at any point, then run again, keeps its finished input units and
publishes the same bytes as a clean run; a changed setting or input, or --restart, starts afresh.

The jobs run as a user runs them: the CLI in a subprocess (through tests/faults.py, which can slow
the moment before each unit's completion marker so that a kill lands there), on 6 input files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import REPO, SAMPLE_PARQUET, tree_hashes
from crash_tools import has_files, kill_when

from shards import layout
from transforms.run import resume

FILES = 6
JOBS = {
    "bucketed": ["--partitions", "4", "--max-shard-bytes", "150000"],
    "scaffold": ["--annotate", "--tokenizer", "gpt2", "--shard-tokens", "20000", "--val-fraction", "0.2",
                 "--long-docs", "chunk"],
}
RUNNER = ["--runner=FnApiRunner"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The sample's rows in 6 JSONL files: 6 input units."""
    rows = pq.read_table(SAMPLE_PARQUET).to_pylist()
    directory = tmp_path_factory.mktemp("in")
    for i in range(FILES):
        with open(directory / f"part-{i}.jsonl", "w", encoding="utf-8") as f:
            for row in rows[i::FILES]:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return directory


def command(job: str, inputs, out, *extra: str, faults: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(REPO / "tests" / "faults.py"), *faults, "--", job, "--input", str(inputs),
            "--output", str(out), *JOBS[job], *RUNNER, *extra]


def run_job_process(job: str, inputs, out, *extra: str, faults: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(job, inputs, out, *extra, faults=faults), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def clean(inputs, tmp_path_factory):
    """Each job's output from one uninterrupted run."""
    out = {}
    for job in JOBS:
        target = tmp_path_factory.mktemp(f"clean-{job}") / "out"
        run_job_process(job, inputs, target)
        out[job] = tree_hashes(target)
    return out


def markers(out) -> int:
    temp = os.path.join(out, layout.TEMP_DIR_NAME)
    return sum(len([f for f in files if f.endswith(resume.MARKER_SUFFIX)])
               for directory, _, files in os.walk(temp) if os.path.basename(directory) == resume.UNITS_DIR)


def published_shards(out) -> bool:
    """Whether a shard file is in its final place (not under the temporary directory)."""
    for _, dirs, files in os.walk(out):
        dirs[:] = [x for x in dirs if x != layout.TEMP_DIR_NAME]
        if any(f.endswith((".npy", ".bin")) for f in files):
            return True
    return False


def notes(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# When to kill, given the output and the note file (a line per marker about to be written: that
# unit's spill files are closed, its marker not yet written).
KILL_POINTS = {
    # the first unit is spilling: its files are open, no unit is done
    "spilling": lambda out, note: has_files(out, "spill") and notes(note) == 0,
    # the first unit's files are closed, its marker not written yet
    "before_first_marker": lambda out, note: notes(note) >= 1 and markers(out) == 0,
    # some units done, the others not begun or half spilled
    "some_units_done": lambda out, note: markers(out) >= 3,
    # every unit done, shards being written
    "writing_shards": lambda out, note: has_files(out, "staged"),
    # shards being moved into place
    "publishing": lambda out, note: published_shards(out),
}


@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_at_any_point_then_resumed_gives_the_clean_bytes(job, point, inputs, clean, tmp_path):
    out, note = tmp_path / "out", tmp_path / "note.txt"
    faults = ("--marker-delay", "0.4", "--marker-note", str(note), "--publish-delay", "0.05", "--spill-delay", "0.2")
    proc = subprocess.Popen(command(job, inputs, out, faults=faults), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    assert kill_when(proc, lambda: KILL_POINTS[point](out, note)), f"the job finished before {point}"
    assert not (out / layout.STATS_NAME).exists()
    done = markers(out)
    if point in ("spilling", "before_first_marker"):
        assert done == 0
    if point == "some_units_done":
        assert 3 <= done < FILES
    if point in ("writing_shards", "publishing"):
        assert done == FILES

    again = tmp_path / "again.txt"
    rerun = run_job_process(job, inputs, out, faults=("--marker-note", str(again)))
    assert tree_hashes(out) == clean[job]
    assert not (out / layout.TEMP_DIR_NAME).exists(), "the saved work outlived the publish"
    # The finished units were not redone: only the others wrote a marker again.
    assert notes(again) == FILES - done
    if done:
        assert f"resuming: {done} of {FILES} input units were finished by an earlier run" in rerun.stderr
    else:
        assert "resuming" not in rerun.stderr


def _killed_with_units_done(job, inputs, out, note) -> int:
    proc = subprocess.Popen(command(job, inputs, out, faults=("--marker-delay", "0.4", "--marker-note", str(note))),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    assert kill_when(proc, lambda: markers(out) >= 2)
    return markers(out)


def test_a_changed_setting_starts_afresh_and_says_why(inputs, clean, tmp_path):
    out = tmp_path / "out"
    assert _killed_with_units_done("bucketed", inputs, out, tmp_path / "note.txt") >= 2
    again = tmp_path / "again.txt"
    rerun = run_job_process("bucketed", inputs, out, "--lid-threshold", "0.5", faults=("--marker-note", str(again)))
    lines = [line for line in rerun.stderr.splitlines() if "starting afresh" in line]
    assert len(lines) == 1 and "--lid-threshold changed (0.9 -> 0.5)" in lines[0], rerun.stderr[-2000:]
    assert notes(again) == FILES and "resuming" not in rerun.stderr
    assert tree_hashes(out) != clean["bucketed"]


def test_a_changed_input_file_starts_afresh_and_says_why(inputs, tmp_path):
    local_in = tmp_path / "in"
    local_in.mkdir()
    for f in inputs.iterdir():
        (local_in / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "out"
    assert _killed_with_units_done("scaffold", local_in, out, tmp_path / "note.txt") >= 2
    with open(local_in / "part-5.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "added-later", "text": "one more document here"}) + "\n")
    again = tmp_path / "again.txt"
    rerun = run_job_process("scaffold", local_in, out, faults=("--marker-note", str(again)))
    lines = [line for line in rerun.stderr.splitlines() if "starting afresh" in line]
    assert len(lines) == 1 and f"input file {local_in / 'part-5.jsonl'} changed (size=" in lines[0], rerun.stderr
    assert notes(again) == FILES


def test_restart_redoes_every_unit(inputs, clean, tmp_path):
    out = tmp_path / "out"
    assert _killed_with_units_done("scaffold", inputs, out, tmp_path / "note.txt") >= 2
    again = tmp_path / "again.txt"
    rerun = run_job_process("scaffold", inputs, out, "--restart", faults=("--marker-note", str(again)))
    assert "starting afresh (--restart)" in rerun.stderr and "resuming" not in rerun.stderr
    assert notes(again) == FILES
    assert tree_hashes(out) == clean["scaffold"]


def test_a_unit_whose_spill_file_is_gone_is_redone(inputs, clean, tmp_path):
    out = tmp_path / "out"
    done = _killed_with_units_done("bucketed", inputs, out, tmp_path / "note.txt")
    marker = next(os.path.join(d, f) for d, _, files in os.walk(out) if d.endswith(resume.UNITS_DIR)
                  for f in sorted(files) if f.endswith(resume.MARKER_SUFFIX))
    with open(marker, "rb") as f:
        saved = resume.UnitOutputs.from_bytes(f.read(), os.path.dirname(os.path.dirname(marker)))
    spill = next(p for p in saved.files if p.endswith(".bin"))
    os.truncate(spill, os.path.getsize(spill) // 2)
    again = tmp_path / "again.txt"
    rerun = run_job_process("bucketed", inputs, out, faults=("--marker-note", str(again)))
    assert notes(again) == FILES - done + 1
    assert "redoing the unit" in rerun.stderr
    assert tree_hashes(out) == clean["bucketed"]


def test_ctrl_c_keeps_the_finished_units_and_says_so(inputs, clean, tmp_path):
    import signal
    import time

    out, note = tmp_path / "out", tmp_path / "note.txt"
    faults = ("--marker-delay", "0.4", "--marker-note", str(note))
    proc = subprocess.Popen(command("bucketed", inputs, out, faults=faults), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while notes(note) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the job ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("pretokenize bucketed: interrupted; nothing was published and the previous output is "
                           "intact; the work of ") and "Traceback" not in err
    assert "finished input units is kept: the same command resumes from it (--restart discards it)" in last
    done = markers(out)
    assert done >= 2 and not (out / layout.STATS_NAME).exists()
    again = tmp_path / "again.txt"
    run_job_process("bucketed", inputs, out, faults=("--marker-note", str(again)))
    assert notes(again) == FILES - done
    assert tree_hashes(out) == clean["bucketed"]


def test_resumed_with_two_worker_processes_gives_the_clean_bytes(inputs, clean, tmp_path):
    # Killed on one in-process worker, resumed on two worker processes: Beam's flags are not part of
    # the saved work's key, and the bytes do not depend on workers.
    out = tmp_path / "out"
    done = _killed_with_units_done("scaffold", inputs, out, tmp_path / "note.txt")
    cmd = command("scaffold", inputs, out, "--direct_running_mode=multi_processing", "--direct_num_workers=2")
    rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming: {done} of {FILES} input units" in rerun.stderr
    assert tree_hashes(out) == clean["scaffold"]


class _CreatesFile:
    """A planted pickle: unpickling it creates ``path`` (as any code a payload could run)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _marker_files(out) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(out) if d.endswith(resume.UNITS_DIR)
                  for f in files if f.endswith(resume.MARKER_SUFFIX))


def test_planted_markers_and_references_never_run_their_units_are_redone(inputs, clean, tmp_path):
    """Saved work is data: a marker and a references file planted with a pickle payload (the size
    the marker recorded, so only its contents differ) run nothing; their units are redone and the
    bytes are the clean run's."""
    import pickle

    out = tmp_path / "out"
    done = _killed_with_units_done("bucketed", inputs, out, tmp_path / "note.txt")
    planted_marker, other = _marker_files(out)[:2]
    ran = tmp_path / "payload-ran"
    with open(planted_marker, "wb") as f:
        f.write(pickle.dumps(_CreatesFile(ran)))
    # The references file the other marker points to first: its first record becomes the payload.
    with open(other, "rb") as f:
        data = f.read()
    spill = os.path.join(os.path.dirname(os.path.dirname(other)), "spill")
    target = next(os.path.join(spill, name) for name in sorted(os.listdir(spill))
                  if name.endswith(".refs") and name.encode() in data)
    with open(target, "rb") as f:
        original = f.read()
    payload = pickle.dumps(_CreatesFile(ran))
    assert len(payload) < len(original)
    with open(target, "wb") as f:
        f.write(payload + original[len(payload):])
    again = tmp_path / "again.txt"
    rerun = run_job_process("bucketed", inputs, out, faults=("--marker-note", str(again)))
    assert not ran.exists(), "a planted payload ran"
    assert notes(again) == FILES - done + 2, rerun.stderr[-3000:]
    redone = [line for line in rerun.stderr.splitlines() if "redoing the unit" in line]
    assert len(redone) == 2, rerun.stderr[-3000:]
    assert "older format" in redone[0] + redone[1] and "not a references file this tool wrote" in rerun.stderr
    assert tree_hashes(out) == clean["bucketed"]


def test_a_tokenizer_file_changed_between_kill_and_resume_starts_afresh(inputs, tmp_path):
    """Saved work is keyed by the tokenizer files' sha256: two ranks swapped between a kill and the
    resume (a swap the probe text does not see) start afresh, so the tree is the new tokenizer's
    alone, byte for byte what a clean run with it writes, never a mix of two encodings."""
    import shutil

    from tokenizer_swaps import swap_ranks, unseen_by_the_probe

    from transforms.tokenizers.ranks import gpt2_ranks_path

    ranks = tmp_path / "ranks.tiktoken"
    shutil.copyfile(gpt2_ranks_path(), ranks)
    texts = [json.loads(line)["text"] for f in sorted(inputs.iterdir()) for line in f.open(encoding="utf-8")]
    a, b = unseen_by_the_probe(ranks, texts)
    flags = ("--tokenizer", f"tiktoken:{ranks}")
    out, note = tmp_path / "out", tmp_path / "note.txt"
    proc = subprocess.Popen(command("bucketed", inputs, out, *flags, faults=("--marker-delay", "0.4", "--marker-note",
                                                                             str(note))),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    assert kill_when(proc, lambda: markers(out) >= 2)
    swap_ranks(ranks, a, b)
    again = tmp_path / "again.txt"
    rerun = run_job_process("bucketed", inputs, out, *flags, faults=("--marker-note", str(again)))
    lines = [line for line in rerun.stderr.splitlines() if "starting afresh" in line]
    assert len(lines) == 1 and "the tokenizer encodes differently (its files changed)" in lines[0], rerun.stderr
    assert notes(again) == FILES and "resuming" not in rerun.stderr
    fresh = tmp_path / "fresh"
    run_job_process("bucketed", inputs, fresh, *flags)
    assert tree_hashes(out) == tree_hashes(fresh)
