"""Crashes, retries and failing storage: the scaffold job's output is exactly right or absent."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import fsspec
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from conftest import REPO, tree_hashes
from crash_tools import FaultyFileSystem, TreeWatcher, has_files, kill_when
from faults import fail_first

from pipelines import scaffold
from shards import layout, llmc, scaffold_verify
from shards.llmc import ScaffoldStats
from transforms.core import spill
from transforms.core.records import BadInputError
from transforms.scaffold import write as write_llmc

PLAIN = REPO / "tests" / "data" / "scaffold" / "por_plain.jsonl"
FLAGS = ["--annotate", "--shard-tokens", "700", "--val-fraction", "0.2"]


@pytest.fixture(scope="module")
def with_copies(tmp_path_factory) -> Path:
    """The Portuguese sample, and a second file repeating some of its ids (one copy with other
    text, one long enough to be cut under --long-docs chunk), so that dropping copies is retried too."""
    d = tmp_path_factory.mktemp("input")
    records = [json.loads(line) for line in PLAIN.read_text(encoding="utf-8").splitlines()]
    (d / "a.jsonl").write_text(PLAIN.read_text(encoding="utf-8"), encoding="utf-8")
    copies = records[3:9] + [dict(records[10], text="outra versão " * 700), dict(records[12], text="curto")]
    (d / "b.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in copies), encoding="utf-8")
    return d


def run_job(input_path, output, gpt2_spec, *flags) -> ScaffoldStats:
    return scaffold.run(["--input", str(input_path), "--output", str(output), "--tokenizer", gpt2_spec, *FLAGS,
                         *flags])


@pytest.mark.parametrize("long_docs", ["skip", "chunk"])
def test_bundles_that_fail_once_and_are_retried_change_nothing(long_docs, tmp_path, gpt2_spec, with_copies,
                                                               monkeypatch):
    clean = run_job(with_copies, tmp_path / "clean", gpt2_spec, "--long-docs", long_docs, "--runner=FnApiRunner")
    assert clean.drops.get("duplicate_id", 0) >= 7
    # The BundleBasedDirectRunner retries a failed bundle; the first two spill, dedupe and write
    # attempts in this process fail after doing part of their work (a spill file written, a shard
    # file staged).
    injected = collections.Counter()
    fail_first(monkeypatch, spill.SpillTokensFn, "process", 2, injected, "spill")
    dedupe = write_llmc.KeepFirstCopiesFn if long_docs == "chunk" else write_llmc.DropDuplicateIdsFn
    fail_first(monkeypatch, dedupe, "process", 2, injected, "dedupe")
    fail_first(monkeypatch, write_llmc.WriteShardFileFn, "process", 2, injected, "write")
    run_job(with_copies, tmp_path / "retried", gpt2_spec, "--long-docs", long_docs,
            "--runner=BundleBasedDirectRunner")
    assert injected == {"spill": 2, "dedupe": 2, "write": 2}, "the failures were not injected"
    retried = tree_hashes(tmp_path / "retried")
    assert retried == tree_hashes(tmp_path / "clean")
    assert len([k for k in retried if k.startswith("train/")]) > 10
    assert scaffold_verify.check_scaffold_tree(str(tmp_path / "retried")) == []


class _Watcher(TreeWatcher):
    """Polls an output tree while a job runs: whenever dataset_stats.txt exists, every shard it
    counts must be there, whole. Records any moment the tree looked complete but was not."""

    def check(self):
        stats_path = self.root / layout.STATS_NAME
        try:
            stats = ScaffoldStats.from_text(stats_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        for split, s in stats.splits.items():
            for i, n in enumerate(llmc.shard_lengths(s.tokens, stats.shard_tokens)):
                path = self.root / llmc.shard_rel_path(split, i)
                size = path.stat().st_size if path.exists() else -1
                if size != llmc.HEADER_BYTES + 2 * n and stats_path.exists():  # still claimed complete
                    self.violations.append(f"{path.name} incomplete while {layout.STATS_NAME} existed")


def _start_job(out, gpt2_spec, publish_delay: float = 0.0) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "tests" / "faults.py"), "--publish-delay", str(publish_delay), "--",
           "scaffold", "--input", str(PLAIN), "--output", str(out), "--tokenizer", gpt2_spec, "--runner=FnApiRunner",
           *FLAGS]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)



KILL_POINTS = {
    "spilling": lambda out: has_files(out, os.path.join(layout.TEMP_DIR_NAME, "")) and has_files(out, "spill"),
    "writing_shards": lambda out: has_files(out, "staged"),
    "publishing": lambda out: (out / "train").is_dir() and any((out / "train").iterdir()),
}


@pytest.fixture(scope="module")
def clean_plain(tmp_path_factory, gpt2_spec) -> dict[str, str]:
    out = tmp_path_factory.mktemp("clean") / "out"
    run_job(PLAIN, out, gpt2_spec, "--runner=FnApiRunner")
    return tree_hashes(out)


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_job_killed_midway_never_looks_finished_and_a_rerun_matches_a_clean_run(point, tmp_path, gpt2_spec,
                                                                                  clean_plain):
    out = tmp_path / "out"
    watcher = _Watcher(out)
    watcher.start()
    try:
        # A slow publish (50 ms per shard moved) so the kill can land in the middle of it.
        killed = kill_when(_start_job(out, gpt2_spec, publish_delay=0.05),
                            lambda: KILL_POINTS[point](out))
        assert killed, f"the job finished before reaching {point}"
        assert not (out / layout.STATS_NAME).exists(), f"killed while {point}, yet the tree looks finished"
        run_job(PLAIN, out, gpt2_spec, "--runner=FnApiRunner")
    finally:
        watcher.stop.set()
        watcher.join()
    assert watcher.violations == []
    assert tree_hashes(out) == clean_plain


def test_a_rerun_killed_while_publishing_over_a_finished_output(tmp_path, gpt2_spec, clean_plain):
    out = tmp_path / "out"
    # A finished output with other shard sizes: the re-run must remove what it does not write.
    run_job(PLAIN, out, gpt2_spec, "--runner=FnApiRunner", "--shard-tokens", "300")
    proc = _start_job(out, gpt2_spec, publish_delay=0.05)
    # The old output is complete until the new run starts publishing; from then on it is not.
    assert kill_when(proc, lambda: not (out / layout.STATS_NAME).exists())
    time.sleep(0.2)
    assert not (out / layout.STATS_NAME).exists()
    run_job(PLAIN, out, gpt2_spec, "--runner=FnApiRunner")
    assert tree_hashes(out) == clean_plain



class ScaffoldFaultyFS(FaultyFileSystem):
    protocol = "faulty-scaffold"


def test_output_storage_failing_on_write_fails_the_job_and_publishes_nothing(gpt2_spec):
    fsspec.register_implementation("faulty-scaffold", ScaffoldFaultyFS, clobber=True)
    FaultyFileSystem.opened = 0
    with pytest.raises(Exception, match="injected storage failure writing"):
        run_job(PLAIN, "faulty-scaffold://failing-out", gpt2_spec, "--runner=FnApiRunner")
    assert FaultyFileSystem.opened > FaultyFileSystem.FAIL_AFTER
    fs = fsspec.filesystem("faulty-scaffold")
    assert not fs.exists("/failing-out/" + layout.STATS_NAME)
    assert not fs.exists("/failing-out/train") and not fs.exists("/failing-out/val")


def test_an_input_file_changed_while_the_job_runs_is_reported(tmp_path, gpt2_spec):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "content-ff": "<ff_1> primeira <ff_0> versão"}\n', encoding="utf-8")
    options, _ = scaffold.parse_args(["--input", str(src), "--output", str(tmp_path / "out"),
                                      "--tokenizer", gpt2_spec])
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    scaffold.build(pipeline, options)  # the input is planned (and fingerprinted) here
    with open(src, "a", encoding="utf-8") as f:
        f.write('{"id": "b", "content-ff": "<ff_0> depois"}\n')
    with pytest.raises(Exception, match=r"in\.jsonl: changed while the job ran") as info:
        pipeline.run().wait_until_finish()
    assert BadInputError.PREFIX in str(info.value)
    assert not (tmp_path / "out" / layout.STATS_NAME).exists()
