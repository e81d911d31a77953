"""The tool touches only what is its own (shards/tree.py), and never loses a removal request.

Each test is a reproduction from issue 11, run the way a user runs it: through ``pretokenize``.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import finepdfs_row, stored_ids, tree_hashes

from pipelines import cli
from shards import layout, manifest, tree
from shards.removal.lists import REMOVALS_NAME

RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(30)]
CONTENT_FF = [{"id": f"s{i}", "content-ff": f"<ff_2> Um <ff_1> texto <ff_0> {i}"} for i in range(20)]


@pytest.fixture(scope="module")
def finished(bucketed_tree):
    """A finished bucketed tree of the source with 2 partitions (OUT in the issue)."""
    return bucketed_tree


def bucketed(source, out, *flags) -> int:
    return cli.main(["bucketed", "--input", str(source), "--output", str(out), *flags, *RUNNER])


def shards_of(out) -> set[str]:
    return {rel for rel in tree_hashes(out) if rel.endswith(layout.SHARD_SUFFIX)}


# 1. Paths are data, never patterns.
@pytest.mark.parametrize("name, victim", [("o[1]", "o1"), ("out*", "out_backup"), ("o?", "oz")])
def test_a_glob_character_in_output_touches_no_other_directory(finished, source, tmp_path, name, victim):
    shutil.copytree(finished, tmp_path / victim)
    shutil.copytree(finished, tmp_path / name)
    before = tree_hashes(tmp_path / victim)
    assert bucketed(source, tmp_path / name, "--partitions", "4") == 0
    assert tree_hashes(tmp_path / victim) == before
    assert {r.split("/")[-1][:3] for r in shards_of(tmp_path / name)} == {"p00", "p01", "p02", "p03"}


# 2. A directory the tool did not write is refused, and nothing in it changes.
def test_a_run_into_a_directory_the_tool_did_not_write_is_refused(source, tmp_path, capsys):
    out = tmp_path / "mine"
    files = {
        "megatron/train.py": "print('user code')\n",
        "length_stats.txt": "mine\n",
        "length_histogram.png": "png\n",
        "1024/p_mydata.npy": "x",
        "1024/pdata.npy": "y",
        layout.STATS_NAME: "not ours\n",
        layout.MANIFEST_NAME: "not ours\n",
        REMOVALS_NAME: "utc_time | removal_run | original_id | rel_path | tokens\n",
    }
    for rel, text in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    before = tree_hashes(out)
    assert bucketed(source, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "is not empty and was not written by pretokenize" in err[-1] and "'1024'" in err[-1]
    assert tree_hashes(out) == before and not (out / tree.RECORD_NAME).exists()


def test_a_scaffold_run_into_a_directory_with_shard_like_files_is_refused(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CONTENT_FF))
    out = tmp_path / "out"
    for rel in ("train/shard_999.bin", "train/shard_notes.bin", "val/shard_x.bin"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(b"mine")
    before = tree_hashes(out)
    assert cli.main(["scaffold", "--input", str(src), "--output", str(out), "--tokenizer", "gpt2", *RUNNER]) == 2
    assert "was not written by pretokenize" in capsys.readouterr().err
    assert tree_hashes(out) == before


def test_in_its_own_tree_the_tool_deletes_only_what_it_recorded(finished, source, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    assert cli.main(["export", "megatron", "--output", str(out)]) == 0
    exported = [rel for rel in tree_hashes(out) if rel.startswith("megatron/")]
    assert exported and all(rel in tree.read_record(str(out)).derived for rel in exported)
    mine = {"megatron/train.py": "user code", "1024/p_mydata.npy": "x", "1024/pdata.npy": "y",
            "1024/p00_00000.npy.bak": "z", "notes/length_stats.txt": "w"}
    for rel, text in mine.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    old_shards = shards_of(finished)
    assert bucketed(source, out, "--partitions", "1") == 0
    hashes = tree_hashes(out)
    for rel in mine:
        assert rel in hashes, f"{rel} is not the tool's and must survive a re-run"
    assert not any(rel.startswith("megatron/") and rel.endswith((".idx", "data_args.txt")) for rel in hashes), \
        "the export is ours: it goes"
    new_shards = shards_of(out) - set(mine)
    assert {r.split("/")[-1][:3] for r in new_shards} == {"p00"}
    assert old_shards - new_shards, "the earlier run's shards that this run does not write are gone"
    assert sorted(tree.read_record(str(out)).files) == sorted(new_shards)


def test_scaffold_reruns_keep_files_that_are_not_the_tools(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CONTENT_FF))
    out = tmp_path / "out"
    flags = ["--tokenizer", "gpt2", "--val-fraction", "0.2", *RUNNER]
    assert cli.main(["scaffold", "--input", str(src), "--output", str(out), "--shard-tokens", "20", *flags]) == 0
    many = {rel for rel in tree_hashes(out) if rel.endswith(".bin")}
    assert len(many) > 3
    for rel in ("train/shard_999.bin", "train/shard_notes.bin", "val/shard_x.bin"):
        (out / rel).write_bytes(b"mine")
    assert cli.main(["scaffold", "--input", str(src), "--output", str(out), "--shard-tokens", "100000", *flags]) == 0
    bins = {rel for rel in tree_hashes(out) if rel.endswith(".bin")}
    assert bins == {"train/shard_000.bin", "val/shard_000.bin", "train/shard_999.bin", "train/shard_notes.bin",
                    "val/shard_x.bin"}


def test_an_input_inside_the_output_is_refused(finished, source, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    (out / "megatron").mkdir()
    shutil.copy(source, out / "megatron" / "corpus.jsonl")
    before = tree_hashes(out)
    assert bucketed(out / "megatron" / "corpus.jsonl", out) == 2
    assert "is inside --output" in capsys.readouterr().err
    assert tree_hashes(out) == before


def test_the_other_jobs_tree_is_refused(finished, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CONTENT_FF))
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = tree_hashes(out)
    assert cli.main(["scaffold", "--input", str(src), "--output", str(out), "--tokenizer", "gpt2", *RUNNER]) == 2
    assert "holds the bucketed job's output, not the scaffold job's" in capsys.readouterr().err
    assert tree_hashes(out) == before


def test_remove_export_and_stats_refuse_a_tree_without_a_record(finished, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    os.remove(out / tree.RECORD_NAME)
    before = tree_hashes(out)
    flagged = tmp_path / "list.txt"
    flagged.write_text(stored_ids(out)[0] + "\n")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(flagged), *RUNNER]) == 2
    assert cli.main(["export", "megatron", "--output", str(out)]) == 2
    assert cli.main(["stats", "--output", str(out), "--png", "none"]) == 2
    assert tree_hashes(out) == before
    assert capsys.readouterr().err.count(tree.RECORD_NAME) == 3


def test_delete_listed_refuses_paths_outside_the_tree_and_never_globs(tmp_path):
    (tmp_path / "t" / "1024").mkdir(parents=True)
    (tmp_path / "t" / "1024" / "p[0]_00000.npy").write_bytes(b"a")
    (tmp_path / "t" / "1024" / "p0_00000.npy").write_bytes(b"b")
    (tmp_path / "outside").write_bytes(b"c")
    assert tree.delete_listed(str(tmp_path / "t"), ["1024/p[0]_00000.npy", "1024/missing.npy"]) == [
        "1024/p[0]_00000.npy"]
    assert (tmp_path / "t" / "1024" / "p0_00000.npy").exists()
    for bad in ("../outside", "/etc/passwd", "1024/../../outside", ""):
        with pytest.raises(ValueError):
            tree.delete_listed(str(tmp_path / "t"), [bad])
    assert (tmp_path / "outside").exists()


# 8. Nothing kept is a finished, empty tree, not a crash.
@pytest.mark.parametrize("case", ["all_filtered", "zero_row_parquet", "empty_jsonl"])
def test_a_run_that_keeps_nothing_publishes_an_empty_tree(tmp_path, case, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if case == "all_filtered":
        src = tmp_path / "in.jsonl"
        src.write_text("".join(json.dumps(finepdfs_row(f"d{i}", "text", language="fra_Latn")) + "\n"
                               for i in range(3)))
    elif case == "zero_row_parquet":
        src = tmp_path / "in.parquet"
        pq.write_table(pa.Table.from_pylist([finepdfs_row("a", "b")]).slice(0, 0), src)
    else:
        src = tmp_path / "in.jsonl"
        src.write_text("")
    out = tmp_path / "out"
    assert bucketed(src, out) == 0
    assert (out / layout.MANIFEST_NAME).read_text() == manifest.MANIFEST_HEADER + "\n"
    assert (out / layout.STATS_NAME).exists() and not (out / layout.TEMP_DIR_NAME).exists()
    assert "Traceback" not in capsys.readouterr().err
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0


def test_a_rerun_after_removing_everything_publishes_an_empty_tree(source, tmp_path):
    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    everything = tmp_path / "all.txt"
    everything.write_text("\n".join(stored_ids(out)) + "\n")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(everything), *RUNNER]) == 0
    assert bucketed(source, out) == 0
    assert stored_ids(out) == [] and shards_of(out) == set()
    assert tree.read_record(str(out)).files == []


def test_a_removal_list_run_records_its_ids_so_later_runs_keep_them_out(source, tmp_path):
    from shards.removal.lists import read_log

    out = tmp_path / "out"
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("doc-03\ndoc-07\nnever-seen\n")
    assert bucketed(source, out, "--removal-list", str(flagged)) == 0
    assert list(read_log(str(out / REMOVALS_NAME)).ids) == ["doc-03", "doc-07", "never-seen"]
    assert bucketed(source, out) == 0  # no flag: the log keeps them out
    assert not {"doc-03", "doc-07"} & set(stored_ids(out))
    assert bucketed(source, out, "--removal-list", str(flagged)) == 0  # again: nothing added twice
    assert list(read_log(str(out / REMOVALS_NAME)).ids) == ["doc-03", "doc-07", "never-seen"]
    assert len((out / REMOVALS_NAME).read_text().splitlines()) == 5  # the header, the id field, three ids
    assert cli.main(["verify", "--output", str(out), "--input", str(source), *RUNNER]) == 0


def test_verify_checks_only_the_tools_files(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    (out / "1024" / "p_mydata.npy").write_bytes(b"mine")
    (out / "1024" / "p00_00099.npy").write_bytes(b"also mine")
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CONTENT_FF))
    scaffold = tmp_path / "scaffold"
    assert cli.main(["scaffold", "--input", str(src), "--output", str(scaffold), "--tokenizer", "gpt2", *RUNNER]) == 0
    (scaffold / "train" / "shard_999.bin").write_bytes(b"mine")
    assert cli.main(["verify", "--output", str(scaffold), *RUNNER]) == 0


def test_bad_input_is_one_line(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(finepdfs_row("a", "text")) + "\n" + "{not json\n")
    assert bucketed(src, tmp_path / "out") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line and " WARNING " not in line]
    assert err == [f"pretokenize bucketed: bad input: {src} line 2: is not JSON (Expecting property name enclosed "
                   "in double quotes); nothing was published"]


def test_a_tree_whose_path_holds_glob_characters_is_read_and_verified_as_it_is(tmp_path):
    """The reader and verify list a scaffold tree's shards, never glob its path; a user's file in
    the tree is left out."""
    from shards.reader import open_tree

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in CONTENT_FF))
    plain, odd = tmp_path / "sc1", tmp_path / "sc[1]"
    flags = ["--tokenizer", "gpt2", "--shard-tokens", "30", *RUNNER]
    for out in (plain, odd):
        assert cli.main(["scaffold", "--input", str(src), "--output", str(out), *flags]) == 0
    (odd / "train" / "shard_notes.bin").write_bytes(b"mine")
    assert cli.main(["verify", "--output", str(odd), *RUNNER]) == 0
    a, b = open_tree(str(plain)), open_tree(str(odd))
    assert b.store.rel_paths == a.store.rel_paths and len(a.store.rel_paths) > 2
