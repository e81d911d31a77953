"""The registry of tree kinds (shards/kinds.py) and the layers that ask it: the record, the claim
rule and the dry-run plan, the reader's openers, the card's templates, verify (a kind's parts, named in
its entry), and the jobs that write them (pipelines/jobs.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines import cli, jobs
from pipelines import verify as verify_job
from shards import card, kinds, llmc, lock, reader, scaffold_verify, tree
from shards.layout import RECORD_NAME
from shards.reading import opening

REPO = Path(__file__).resolve().parents[2]
SAMPLE_PARQUET = REPO / "tests" / "data" / "finepdfs_sample.parquet"


@pytest.mark.parametrize(
    ("kind", "name", "is_data"),
    [
        ("bucketed", "1024/p00_00000.npy", True),
        ("bucketed", "train/shard_000.bin", False),
        ("scaffold", "train/shard_000.bin", True),
        ("scaffold", "val/shard_012.bin", True),
        ("scaffold", "test/shard_000.bin", False),
        ("scaffold", "1024/p00_00000.npy", False),
        ("tokenizer", "tokenizer.json", True),
        ("tokenizer", "1024/p00_00000.npy", False),
    ],
)
def test_each_kind_says_which_names_are_its_data_files(kind, name, is_data):
    assert kinds.get(kind).is_data_file(name) is is_data


def test_an_unknown_kind_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown tree kind 'megatron'$"):
        kinds.get("megatron")
    with pytest.raises(ValueError, match=r"^unknown tree kind 'megatron'$"):
        tree.claim("/nonexistent/never-made", "megatron", write=False)


def test_a_record_of_a_kind_no_job_writes_is_not_ours(tmp_path):
    (tmp_path / RECORD_NAME).write_text(json.dumps({"tool": tree.TOOL, "kind": "llmc", "files": []}))
    with pytest.raises(tree.NotOurTreeError, match="is damaged"):
        tree.read_record(str(tmp_path))


def test_each_kind_names_its_parts_and_they_load():
    readable = {k.name for k in kinds.REGISTRY.values() if k.stats_type is not None}
    assert {k.name for k in kinds.REGISTRY.values() if k.part("opener")} == readable == {"bucketed", "scaffold"}
    assert {k.name for k in kinds.REGISTRY.values() if k.part("card")} == readable
    assert kinds.BUCKETED.part("opener") is opening.open_bucketed_tree
    assert kinds.SCAFFOLD.part("checks") is scaffold_verify.check_scaffold_tree and kinds.BUCKETED.checks is None
    assert not kinds.TOKENIZER.derives and kinds.SCAFFOLD.own_splits and not kinds.BUCKETED.own_splits
    assert [k.name for k in kinds.REGISTRY.values() if k.removes_in_place] == ["bucketed"]


def toy_card(doc: dict) -> list[str]:
    return [f"# {doc['job']}", f"{doc['documents']} documents"]


def toy_checks(url: str) -> list[str]:
    return [f"{url}: a toy tree has no shards"]


def test_a_new_kind_is_its_entry_and_its_own_modules(tmp_path, monkeypatch, capsys):
    """A kind nothing else names: its entry alone gives it a card and verify's checks (and a job in
    pipelines/jobs.py, the layer above, would give it its command)."""
    toy = kinds.TreeKind(name="toy", is_data_file=lambda name: name.endswith(".toy"), card=f"{__name__}:toy_card",
                         checks=f"{__name__}:toy_checks", checked_as="toy files")
    monkeypatch.setitem(kinds.REGISTRY, "toy", toy)
    assert card.render({"job": "toy", "documents": 3}) == "# toy\n3 documents\n"
    monkeypatch.setattr(tree.OutputTree, "tree_kind", property(lambda self: toy))
    verdict = verify_job.check(verify_job.VerifySettings(output=str(tmp_path)), None)
    assert (verdict.problems, verdict.shown, verdict.checked) == (1, (f"{tmp_path}: a toy tree has no shards",),
                                                                  "toy files")


def test_each_kind_a_job_writes_is_declared_and_each_declared_kind_has_its_job():
    assert {job.publishes for job in jobs.JOBS.values()} - {None} == set(kinds.NAMES)


def _llmc_file(path: Path, tokens: list[int]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(llmc.make_header(len(tokens)) + np.asarray(tokens, "<u2").tobytes())
    return str(path)


def test_a_scaffold_tree_is_of_kind_scaffold_and_keeps_its_fingerprint(tmp_path):
    ff, eot = llmc.FF_BASE, llmc.GPT2_EOT
    train = _llmc_file(tmp_path / "train" / "shard_000.bin", [ff + 1, 10, ff, 11, eot, ff, 12, eot])
    val = _llmc_file(tmp_path / "val" / "shard_000.bin", [ff, 13, eot])
    opened = reader.open_llmc({"train": [train], "val": [val]})
    assert opened.kind == "scaffold"
    assert opened.select("val").tolist() == [2]  # the tree's own split
    with pytest.raises(ValueError, match="carries its own split"):
        opened.select("train", val_fraction=0.1)
    # The fingerprint hashes the word the scaffold kind always had there ("llmc"), so that a sampler
    # state saved before the kind had one name still resumes.
    h = hashlib.blake2b(digest_size=16, person=b"tree")
    h.update(b"llmc\n\n")
    for i, rel in enumerate(opened.store.rel_paths):
        h.update(f"{rel} {opened.store.count(i)}\n".encode())
    h.update(np.asarray([5, 3, 3], dtype="<i8").tobytes())
    assert opened.fingerprint == h.hexdigest()


def test_find_says_what_claim_would_do(tmp_path):
    assert tree.find(str(tmp_path / "new"), "bucketed").state == "missing"
    (tmp_path / "file").write_text("x")
    assert tree.find(str(tmp_path / "file"), "bucketed").state == "file"
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    found = tree.find(str(tmp_path / "user"), "bucketed")
    assert (found.state, found.entry, found.claimable) == ("foreign", "notes.txt", False)
    tree.claim(str(tmp_path / "ours"), "scaffold")
    assert tree.find(str(tmp_path / "ours"), "scaffold").state == "ours"
    assert tree.find(str(tmp_path / "ours"), "bucketed").state == "other kind"
    with pytest.raises(tree.NotOurTreeError, match="holds the scaffold job's output, not the bucketed job's"):
        tree.claim(str(tmp_path / "ours"), "bucketed", write=False)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_the_plan_and_the_run_agree_on_a_directory_holding_only_a_left_lock(tmp_path, capsys):
    # A directory whose only entry is the lock a dead run of this tool left: the claim rule takes it
    # as empty (the lock is the tool's), and the dry-run plan, asking the same rule, says so.
    out = tmp_path / "out"
    out.mkdir()
    holder = dataclasses.replace(lock.Holder.new("pretokenize bucketed"), pid=_dead_pid())
    (out / lock.LOCK_NAME).write_bytes(holder.to_json())
    assert tree.find(str(out), "bucketed").state == "empty"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--plan"]) == 0
    text = capsys.readouterr().out
    assert f"output: {out} (is empty: a run fills it)" in text
    assert sorted(p.name for p in out.iterdir()) == [lock.LOCK_NAME]  # the plan changed nothing


def test_remove_refuses_a_scaffold_tree_in_one_line(tmp_path, capsys):
    out = tmp_path / "scaffold"
    tree.claim(str(out), "scaffold")
    ff, eot = llmc.FF_BASE, llmc.GPT2_EOT
    _llmc_file(out / "train" / "shard_000.bin", [ff, 10, eot])
    stats = llmc.ScaffoldStats(raw_documents=1, tokenizer="gpt2", annotate=False, long_docs="skip", max_word_chars=0,
                               val_fraction=0.0, seed=0, shard_tokens=3, countdown_mismatches=0,
                               splits={"train": llmc.SplitStats(1, 1, 1, 3, 1)}, drops={})
    (out / "dataset_stats.txt").write_text(stats.to_text())
    ids = tmp_path / "ids.txt"
    ids.write_text("a\n")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(ids)]) == 2
    err = capsys.readouterr().err
    assert err == f"pretokenize remove: {out} is a scaffold tree, not a bucketed tree; nothing was published\n"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    from shards.removal import journal  # the removal's own check asks the kind too

    with pytest.raises(ValueError, match="is a scaffold tree; documents are removed from bucketed trees only"):
        journal.make_plan(str(out), ["a"], "run-x", "2026-01-01T00:00:00Z", plan_url=str(tmp_path / "plan"))
