"""Crashes, retries and failing storage: the bucketed job's output is exactly right or absent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import apache_beam as beam
import fsspec
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from conftest import REPO, SAMPLE_PARQUET, tree_hashes
from fsspec.implementations.memory import MemoryFileSystem

from pipelines import bucketed
from shards import layout, manifest
from transforms import write
from transforms.records import BadInputError

FLAGS = ["--partitions", "4", "--max-shard-bytes", "150000"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS])
    return tree_hashes(out)


def test_bundles_that_fail_once_and_are_retried_change_nothing(tmp_path, clean):
    # The BundleBasedDirectRunner retries a failed bundle; the first two spill and two write
    # attempts in this process fail after doing part of their work.
    write._INJECTED.clear()
    out = tmp_path / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=BundleBasedDirectRunner",
                  "--test-fail-first-attempts", "2", *FLAGS])
    assert write._INJECTED == {"spill": 2, "write": 2}, "the failures were not injected"
    assert tree_hashes(out) == clean
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        ids = [doc_id for _, doc_id, _ in manifest.read_rows(f)]
    assert len(ids) == len(set(ids)), "a retried bundle duplicated documents"


class _Watcher(threading.Thread):
    """Polls an output tree while a job runs: whenever dataset_stats.txt exists, every file the
    manifest names must be there, whole. Records any moment the tree looked complete but was not."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root = root
        self.violations: list[str] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.check()
            time.sleep(0.005)

    def check(self):
        stats = os.path.join(self.root, layout.STATS_NAME)
        if not os.path.exists(stats):
            return
        try:
            with open(os.path.join(self.root, layout.MANIFEST_NAME), encoding="utf-8") as f:
                rows = list(manifest.read_rows(f))
        except FileNotFoundError:
            if os.path.exists(stats):
                self.violations.append("stats without a manifest")
            return
        sizes: dict[str, int] = {}
        for rel, _, n in rows:
            sizes[rel] = sizes.get(rel, 0) + 4 * n
        for rel, size in sizes.items():
            path = os.path.join(self.root, rel)
            if not os.path.exists(path) or os.path.getsize(path) != size:
                if os.path.exists(stats):  # still claimed complete after the look
                    self.violations.append(f"{rel} incomplete while {layout.STATS_NAME} existed")


def _start_job(out, *extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out),
           "--runner=FnApiRunner", *FLAGS, *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _kill_when(proc: subprocess.Popen, condition, timeout: float = 60.0) -> bool:
    """SIGKILL the job's process group as soon as ``condition()`` holds; False if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if condition():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the job neither reached the kill point nor ended")


def _has_files(root, part: str) -> bool:
    for dirpath, _, files in os.walk(root):
        if part in dirpath and any(f.endswith((".bin", ".npy")) for f in files):
            return True
    return False


KILL_POINTS = {
    "spilling": lambda out: _has_files(out, os.path.join(layout.TEMP_DIR_NAME, "")) and _has_files(out, "spill"),
    "writing_shards": lambda out: _has_files(out, "staged"),
    "publishing": lambda out: os.path.isdir(os.path.join(out, "1024")) and os.listdir(os.path.join(out, "1024")),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_job_killed_midway_never_looks_finished_and_a_rerun_matches_a_clean_run(point, tmp_path, clean):
    out = tmp_path / "out"
    watcher = _Watcher(out)
    watcher.start()
    try:
        # A slow publish (50 ms per shard moved) so the kill can land in the middle of it.
        killed = _kill_when(_start_job(out, "--test-publish-delay", "0.05"), lambda: KILL_POINTS[point](out))
        assert killed, f"the job finished before reaching {point}"
        assert not (out / layout.STATS_NAME).exists(), f"killed while {point}, yet the tree looks finished"
        bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS])
    finally:
        watcher.stop.set()
        watcher.join()
    assert watcher.violations == []
    assert tree_hashes(out) == clean


def test_a_rerun_killed_while_publishing_over_a_finished_output(tmp_path, clean):
    out = tmp_path / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS])
    proc = _start_job(out, "--test-publish-delay", "0.05")
    # The old output is complete until the new run starts publishing; from then on it is not.
    killed = _kill_when(proc, lambda: not (out / layout.STATS_NAME).exists())
    assert killed
    time.sleep(0.2)
    assert not (out / layout.STATS_NAME).exists()
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS])
    assert tree_hashes(out) == clean


class FaultyFileSystem(MemoryFileSystem):
    """An in-memory filesystem whose writes fail once a given number of files have been opened for
    writing under a path that contains ``FAIL_UNDER``."""

    protocol = "faulty"
    FAIL_UNDER = "/staged/"
    FAIL_AFTER = 3
    opened = 0

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode and self.FAIL_UNDER in path:
            FaultyFileSystem.opened += 1
            if FaultyFileSystem.opened > self.FAIL_AFTER:
                raise OSError(f"injected storage failure writing {path}")
        return super()._open(path, mode, **kwargs)


def test_output_storage_failing_on_write_fails_the_job_and_publishes_nothing():
    fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
    FaultyFileSystem.opened = 0
    with pytest.raises(Exception, match="injected storage failure writing"):
        bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", "faulty://failing-out", "--runner=FnApiRunner",
                      *FLAGS])
    fs = fsspec.filesystem("faulty")
    assert not fs.exists("/failing-out/" + layout.STATS_NAME)
    assert not fs.exists("/failing-out/" + layout.MANIFEST_NAME)
    assert not fs.exists("/failing-out/1024")


def test_an_input_file_changed_while_the_job_runs_is_reported(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "first version", "language": "eng_Latn", "page_average_lid": "eng_Latn", '
                   '"page_average_lid_score": 0.95, "token_count": 2}\n')
    options, _ = bucketed.parse_args(["--input", str(src), "--output", str(tmp_path / "out")])
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    bucketed.build(pipeline, options)  # the input is planned (and fingerprinted) here
    with open(src, "a", encoding="utf-8") as f:
        f.write('{"id": "b", "text": "added later", "language": "eng_Latn", "page_average_lid": "eng_Latn", '
                '"page_average_lid_score": 0.95, "token_count": 2}\n')
    with pytest.raises(Exception, match=r"in\.jsonl: changed while the job ran") as info:
        pipeline.run().wait_until_finish()
    assert BadInputError.PREFIX in str(info.value)
    assert not (tmp_path / "out" / layout.STATS_NAME).exists()
