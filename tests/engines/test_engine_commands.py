"""The commands that run a Beam pipeline over a finished tree or a corpus (remove, verify,
train-bpe; bucketed and scaffold are in test_engines.py) on Flink and Spark, run as a user runs
them: through the CLI with ``--runner=FlinkRunner`` or ``--runner=SparkRunner`` and no other
flag (pipelines/engines.py adds the rest). Each writes the same files, byte for byte, as the same
command on the in-process FnApiRunner; verify gives the same report.

A good run prints no traceback (the end-of-job hang-up of SDK 2.77's harness is filtered:
pipelines/engines.py); a job that fails on the engine still says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from conftest import SAMPLE_PARQUET, bucketed_sample, run_cli
from engine_setup import ENGINES, tree_hashes

from pipelines import cli
from shards import layout, manifest
from shards.removal.lists import REMOVALS_NAME

pytestmark = pytest.mark.engines

FNAPI = "--runner=FnApiRunner"
RUNNERS = {"flink": "--runner=FlinkRunner", "spark": "--runner=SparkRunner"}


@pytest.fixture(scope="module", params=["flink", "spark"])
def engine(request) -> str:
    next(e for e in ENGINES if e.name == request.param).flags()  # skips (or fails) when not set up
    return request.param


@pytest.fixture(scope="module")
def sample_tree(tmp_path_factory):
    """The bucketed tree of the sample, built on the FnApiRunner: what remove and verify work on."""
    return bucketed_sample(tmp_path_factory.mktemp("tree") / "out", "--partitions", "2", FNAPI)


@pytest.fixture(scope="module")
def removal_list(sample_tree, tmp_path_factory) -> str:
    """Three stored ids, from two files, and one the tree never stored."""
    with open(os.path.join(sample_tree, layout.MANIFEST_NAME), encoding="utf-8") as f:
        rows = list(manifest.read_rows(f))
    first_file = [doc_id for rel, doc_id, _ in rows if rel == rows[0][0]]
    other = next(doc_id for rel, doc_id, _ in rows if rel != rows[0][0])
    path = tmp_path_factory.mktemp("list") / "flagged.txt"
    path.write_text("\n".join([*first_file[:2], other, "never-stored-id"]) + "\n", encoding="utf-8")
    return str(path)


def run_ok(argv: list[str], capfd) -> str:
    """Run the command through the CLI; its stderr, which must hold no traceback."""
    done = run_cli(capfd, argv)
    assert done.code == 0, done.err
    assert "Traceback" not in done.err, done.err
    return done.err


def removed(sample_tree, removal_list, out, runner, capfd) -> tuple[dict[str, str], list[str]]:
    """The sha256 of every file after the removal, but the audit log's, and the audit log's lines
    without their first two fields: the time and the removal's id, which differ from run to run."""
    shutil.copytree(sample_tree, out, symlinks=True)
    run_ok(["remove", "--output", str(out), "--removal-list", removal_list, runner], capfd)
    log = (out / REMOVALS_NAME).read_text(encoding="utf-8").splitlines()
    return tree_hashes(out, skip=(REMOVALS_NAME,)), [line.split(" | ", 2)[-1] for line in log]


def test_remove_writes_the_same_bytes(engine, sample_tree, removal_list, tmp_path, capfd):
    expected, expected_log = removed(sample_tree, removal_list, tmp_path / "fnapi", FNAPI, capfd)
    assert expected != tree_hashes(sample_tree), "the removal changed nothing: nothing to compare"
    got, got_log = removed(sample_tree, removal_list, tmp_path / engine, RUNNERS[engine], capfd)
    assert got == expected
    assert got_log == expected_log


def test_verify_gives_the_same_report(engine, sample_tree, tmp_path, capfd):
    reports = {}
    for name, runner in (("fnapi", FNAPI), (engine, RUNNERS[engine])):
        report = tmp_path / f"{name}.json"
        err = run_ok(["verify", "--output", str(sample_tree), "--input", str(SAMPLE_PARQUET),
                       "--report", str(report), runner], capfd)
        reports[name] = json.loads(report.read_text(encoding="utf-8"))
    assert reports[engine] == reports["fnapi"]
    assert reports["fnapi"], "an empty report: nothing was checked"
    if engine == "flink":
        assert "--runner=FlinkRunner: embedded Flink 1.19, every port bound to 127.0.0.1; added" in err
        assert "--flink_version=1.19 --flink_master=[local]" in err


def normalized_tokenizer(out, runner: str) -> dict[str, str]:
    """sha256 of each file train-bpe wrote to ``out``, with its --output and --runner (the command
    line merges.txt, tokenizer_info.json and training_stats.txt record) replaced by placeholders;
    tokenizer_info.json's own sha256 of each file is checked against the file, then replaced by the
    normalized file's."""
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    raw = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    files = {rel: data.replace(str(out).encode(), b"OUT").replace(runner.encode(), b"RUNNER")
             for rel, data in raw.items()}
    info = json.loads(files["tokenizer_info.json"])
    for rel, recorded in info["sha256"].items():
        assert recorded == sha(raw[rel]), rel
        info["sha256"][rel] = sha(files[rel])
    files["tokenizer_info.json"] = json.dumps(info, sort_keys=True).encode()
    return {rel: sha(data) for rel, data in files.items()}


def test_train_bpe_writes_the_same_bytes(engine, tmp_path, capfd):
    """The same files; three of them record the command line, whose --output and --runner differ
    here, so those two are replaced by placeholders before the bytes are compared."""
    trees = {}
    for name, runner in (("fnapi", FNAPI), (engine, RUNNERS[engine])):
        out = tmp_path / name
        run_ok(["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--vocab-size", "300", runner],
                capfd)
        trees[name] = normalized_tokenizer(out, runner)
    assert trees[engine] == trees["fnapi"]
    assert "merges.txt" in trees["fnapi"] and "tokenizer.json" in trees["fnapi"]


def test_a_job_that_fails_on_the_engine_still_says_why(engine, sample_tree, tmp_path, capfd):
    """The hang-up filter hides nothing else: remove over a shard cut short fails in its worker, and
    the command ends saying which file, without publishing."""
    out = tmp_path / "tree"
    shutil.copytree(sample_tree, out, symlinks=True)
    with open(os.path.join(out, layout.MANIFEST_NAME), encoding="utf-8") as f:
        rel, doc_id, _ = next(manifest.read_rows(f))
    shard = out / rel
    shard.write_bytes(shard.read_bytes()[:-8])
    ids = tmp_path / "ids.txt"
    ids.write_text(doc_id + "\n", encoding="utf-8")
    capfd.readouterr()
    code = cli.main(["remove", "--output", str(out), "--removal-list", str(ids), RUNNERS[engine]])
    err = capfd.readouterr().err
    assert code == 2, err
    assert f"{shard} holds " in err and "does not match its manifest rows" in err, err
