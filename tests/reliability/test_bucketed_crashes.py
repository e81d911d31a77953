"""Crashes, retries and failing storage: the bucketed job's output is exactly right or absent."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

import apache_beam as beam
import fsspec
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from conftest import REPO, SAMPLE_PARQUET, tree_hashes
from crash_tools import FaultyFileSystem, TreeWatcher, has_files, kill_when
from faults import fail_first

from pipelines import bucketed
from shards import layout, manifest
from transforms.bucketed import write
from transforms.core import spill
from transforms.core.records import BadInputError

FLAGS = ["--partitions", "4", "--max-shard-bytes", "150000"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS])
    return tree_hashes(out)


def test_bundles_that_fail_once_and_are_retried_change_nothing(tmp_path, clean, monkeypatch):
    # The BundleBasedDirectRunner retries a failed bundle; the first two spill and two write
    # attempts in this process fail after doing part of their work.
    injected = collections.Counter()
    fail_first(monkeypatch, spill.SpillTokensFn, "process", 2, injected, "spill")
    fail_first(monkeypatch, write.WriteShardFilesFn, "process", 2, injected, "write")
    out = tmp_path / "out"
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=BundleBasedDirectRunner", *FLAGS])
    assert injected == {"spill": 2, "write": 2}, "the failures were not injected"
    assert tree_hashes(out) == clean
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        ids = [doc_id for _, doc_id, _ in manifest.read_rows(f)]
    assert len(ids) == len(set(ids)), "a retried bundle duplicated documents"


class _Watcher(TreeWatcher):
    """Polls an output tree while a job runs: whenever dataset_stats.txt exists, every file the
    manifest names must be there, whole. Records any moment the tree looked complete but was not."""

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


def _start_job(out, publish_delay: float = 0.0) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "tests" / "faults.py"), "--publish-delay", str(publish_delay), "--",
           "bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)



KILL_POINTS = {
    "spilling": lambda out: has_files(out, os.path.join(layout.TEMP_DIR_NAME, "")) and has_files(out, "spill"),
    "writing_shards": lambda out: has_files(out, "staged"),
    "publishing": lambda out: os.path.isdir(os.path.join(out, "1024")) and os.listdir(os.path.join(out, "1024")),
}


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_job_killed_midway_never_looks_finished_and_a_rerun_matches_a_clean_run(point, tmp_path, clean):
    out = tmp_path / "out"
    watcher = _Watcher(out)
    watcher.start()
    try:
        # A slow publish (50 ms per shard moved) so the kill can land in the middle of it.
        killed = kill_when(_start_job(out, publish_delay=0.05), lambda: KILL_POINTS[point](out))
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
    proc = _start_job(out, publish_delay=0.05)
    # The old output is complete until the new run starts publishing; from then on it is not.
    killed = kill_when(proc, lambda: not (out / layout.STATS_NAME).exists())
    assert killed
    time.sleep(0.2)
    assert not (out / layout.STATS_NAME).exists()
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner", *FLAGS])
    assert tree_hashes(out) == clean



class BucketedFaultyFS(FaultyFileSystem):
    protocol = "faulty"


def test_output_storage_failing_on_write_fails_the_job_and_publishes_nothing():
    fsspec.register_implementation("faulty", BucketedFaultyFS, clobber=True)
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
