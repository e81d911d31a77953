"""Issue 22's defects 1, 2, 3 and 6, through the CLI: the tool writes and deletes only inside its
tree, and follows no symbolic link out of it.

1. a manifest row naming ``../victim/v.bin`` (or an absolute path) made ``remove`` delete or cut
   the outside file;
2. ``.pretokenize-tmp`` a link (scratch on another disk): a re-run, and train-bpe, emptied its target;
3. a bucket directory that is a link: a name that looks inside resolved outside;
6. ``export megatron`` and ``stats`` overwrote user files of the names they write, and export
   wrote through a ``megatron`` link.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import SAMPLE_PARQUET, finepdfs_row, run_cli
from tree_traps import snapshot

from shards import layout, manifest

RUNNER = "--runner=FnApiRunner"
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(40)]




@pytest.fixture
def victim(tmp_path):
    """A user's directory outside the tree, which nothing may change."""
    d = tmp_path / "victim"
    d.mkdir()
    (d / "notes.txt").write_text("the user's own notes\n")
    return d


def rows_of(out) -> list[tuple[str, str, int]]:
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def add_rows(out, rows) -> None:
    with open(out / layout.MANIFEST_NAME, "a", encoding="utf-8") as f:
        for rel, doc_id, n in rows:
            f.write(manifest.format_row(rel, doc_id, n))


def remove(capsys, out, tmp_path, ids):
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("".join(f"{i}\n" for i in ids))
    return run_cli(capsys, ["remove", "--output", str(out), "--removal-list", str(flagged), RUNNER])


# Defect 1: remove and a manifest row that names a file outside the tree.
def test_remove_refuses_a_manifest_row_that_climbs_out_of_the_tree(tree_copy, victim, tmp_path, capsys):
    out = tree_copy
    (victim / "v.bin").write_bytes(np.arange(100, dtype="<u4").tobytes())
    add_rows(out, [("../victim/v.bin", "evil-1", 100)])
    outside, inside = snapshot(victim), snapshot(out)
    line = remove(capsys, out, tmp_path, ["evil-1", rows_of(out)[0][1]]).refusal
    assert "../victim/v.bin" in line and "manifest row" in line
    assert snapshot(victim) == outside, "a file outside the tree changed"
    assert snapshot(out) == inside and (out / layout.STATS_NAME).exists(), "the refusal changed the tree"


def test_remove_refuses_manifest_rows_with_an_absolute_path(tree_copy, victim, tmp_path, capsys):
    out = tree_copy
    target = victim / "v.bin"
    target.write_bytes(np.arange(300, dtype="<u4").tobytes())  # 1,200 bytes, as the two rows say
    add_rows(out, [(str(target), "evil-1", 200), (str(target), "evil-2", 100)])
    outside, inside = snapshot(victim), snapshot(out)
    line = remove(capsys, out, tmp_path, ["evil-2"]).refusal
    assert str(target) in line and "absolute" in line
    assert snapshot(victim) == outside and target.stat().st_size == 1200
    assert snapshot(out) == inside and (out / layout.STATS_NAME).exists()


# Defect 3, through remove: the row's name is inside, but its directory is a link to outside.
def test_remove_refuses_a_row_whose_bucket_directory_is_a_link_out(tree_copy, victim, tmp_path, capsys):
    out = tree_copy
    rel, doc_id, _ = rows_of(out)[0]
    bucket = rel.split("/")[0]
    shutil.move(str(out / bucket), str(victim / bucket))
    os.symlink(victim / bucket, out / bucket)
    outside, inside = snapshot(victim), snapshot(out)
    line = remove(capsys, out, tmp_path, [doc_id]).refusal
    assert str(out / bucket) in line and "link" in line
    assert snapshot(victim) == outside and snapshot(out) == inside


# Defect 3, through a bucketed re-run: its publish deletes the stale shards and moves new ones in.
def test_a_rerun_refuses_a_bucket_directory_that_is_a_link_out(tree_copy, source, victim, capsys):
    out = tree_copy
    bucket = rows_of(out)[0][0].split("/")[0]
    shutil.move(str(out / bucket), str(victim / bucket))
    os.symlink(victim / bucket, out / bucket)
    outside = snapshot(victim)
    result = run_cli(capsys, ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "3", RUNNER])
    assert str(out / bucket) in result.refusal
    assert snapshot(victim) == outside


# Defect 2: .pretokenize-tmp is a link to scratch space elsewhere.
def scratch_with_project(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "project").mkdir(parents=True)
    (scratch / "project" / "results.csv").write_text("a,b\n1,2\n")
    (scratch / "other.txt").write_text("someone else's\n")
    return scratch


def test_a_rerun_never_empties_the_target_of_a_linked_temporary_directory(tree_copy, source, tmp_path, capsys):
    out = tree_copy
    scratch = scratch_with_project(tmp_path)
    os.symlink(scratch, out / layout.TEMP_DIR_NAME)
    outside = snapshot(scratch)
    result = run_cli(capsys, ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", RUNNER])
    assert str(out / layout.TEMP_DIR_NAME) in result.refusal and "link" in result.refusal
    assert snapshot(scratch) == outside
    assert os.path.islink(out / layout.TEMP_DIR_NAME) and (out / layout.STATS_NAME).exists()


def test_train_bpe_never_empties_the_target_of_a_linked_temporary_directory(tmp_path, capsys):
    tok = tmp_path / "tok"
    argv = ["train-bpe", "--input", str(SAMPLE_PARQUET), "--output", str(tok), "--language", "none",
            "--token-count-field", "none", "--vocab-size", "300", RUNNER]
    assert run_cli(capsys, argv).code == 0
    scratch = scratch_with_project(tmp_path)
    os.symlink(scratch, tok / layout.TEMP_DIR_NAME)
    outside, inside = snapshot(scratch), snapshot(tok)
    line = run_cli(capsys, argv).refusal
    assert str(tok / layout.TEMP_DIR_NAME) in line
    assert snapshot(scratch) == outside and snapshot(tok) == inside


# Defect 6: export megatron and stats keep a user's files of the names they write.
@pytest.mark.parametrize("name", ["megatron/data_args.txt", "megatron/1024/p00_00000.idx"])
def test_export_refuses_to_overwrite_a_user_file(tree_copy, source, name, capsys):
    out = tree_copy
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(b"the user's own file\n")
    inside = snapshot(out)
    line = run_cli(capsys, ["export", "megatron", "--output", str(out)]).refusal
    assert str(out / name) in line and "not the tool's" in line
    assert snapshot(out) == inside
    # Not recorded as derived, so the next run of the job leaves it too.
    assert run_cli(capsys, ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2",
                            RUNNER]).code == 0
    assert (out / name).read_bytes() == b"the user's own file\n"


def test_export_through_a_megatron_link_writes_nothing_outside(tree_copy, victim, capsys):
    out = tree_copy
    os.symlink(victim, out / "megatron")
    outside, inside = snapshot(victim), snapshot(out)
    line = run_cli(capsys, ["export", "megatron", "--output", str(out)]).refusal
    assert str(out / "megatron") in line and "link" in line
    assert snapshot(victim) == outside and snapshot(out) == inside


@pytest.mark.parametrize("name", ["length_stats.txt", "length_histogram.png"])
def test_stats_refuses_to_overwrite_a_user_file(tree_copy, name, capsys):
    out = tree_copy
    (out / name).write_bytes(b"the user's own file\n")
    inside = snapshot(out)
    line = run_cli(capsys, ["stats", "--output", str(out)]).refusal
    assert str(out / name) in line and "not the tool's" in line
    assert snapshot(out) == inside


# remove's journal directory: links planted there are never followed, a journal that is a link is
# refused, and a manifest row naming a file the record does not list is refused.
JOURNAL = os.path.join(layout.TEMP_DIR_NAME, "removal")


def shared_file_doc(out) -> str:
    """An id stored in a file that holds other documents too (remove rewrites that file)."""
    rows = rows_of(out)
    counts = {rel: sum(1 for r, _, _ in rows if r == rel) for rel, _, _ in rows}
    return next(doc_id for rel, doc_id, _ in rows if counts[rel] > 1)


def test_remove_never_writes_through_links_planted_in_a_journal_without_a_plan(tree_copy, victim, tmp_path, capsys):
    out = tree_copy
    journal = out / JOURNAL
    journal.mkdir(parents=True)
    os.symlink(victim / "notes.txt", journal / f"{layout.MANIFEST_NAME}.partial")
    os.symlink(victim, journal / "rewrite")
    os.symlink(victim / "notes.txt", journal / "processed_spec.idx.partial")
    outside = snapshot(victim)
    doc = shared_file_doc(out)
    assert remove(capsys, out, tmp_path, [doc]).code == 0
    assert snapshot(victim) == outside
    assert not os.path.islink(out / layout.MANIFEST_NAME)
    assert doc not in {d for _, d, _ in rows_of(out)}
    assert not journal.exists()


def test_remove_refuses_a_resumed_journal_holding_a_link(tree_copy, victim, tmp_path, capsys):
    from shards.removal import journal

    out = tree_copy
    doc = shared_file_doc(out)
    removal = journal.make_plan(str(out), [doc], run="r1", utc_time="2026-01-01T00:00:00Z")
    journal.write_journal(str(out), removal)  # a removal journalled, as a run killed right after its plan leaves it
    os.symlink(victim, out / JOURNAL / "rewrite")
    outside, inside = snapshot(victim), snapshot(out)
    line = remove(capsys, out, tmp_path, [doc]).refusal
    assert str(out / JOURNAL / "rewrite") in line and "symbolic link" in line
    assert snapshot(victim) == outside and snapshot(out) == inside


def test_remove_refuses_a_journal_directory_that_is_a_link_into_the_tree(tree_copy, tmp_path, capsys):
    out = tree_copy
    (out / "notes" / "files").mkdir(parents=True)
    (out / "notes" / "files" / "mine.txt").write_text("mine\n")
    (out / "notes" / "rewrite").write_text("keep\n")
    (out / layout.TEMP_DIR_NAME).mkdir()
    os.symlink("../notes", out / JOURNAL)
    inside = snapshot(out)
    line = remove(capsys, out, tmp_path, [shared_file_doc(out)]).refusal
    assert str(out / JOURNAL) in line and "symbolic link" in line
    assert snapshot(out) == inside


def test_remove_refuses_a_manifest_row_naming_a_file_the_record_does_not_list(tree_copy, tmp_path, capsys):
    out = tree_copy
    rel = f"{rows_of(out)[0][0].split('/')[0]}/p00_09999.npy"
    (out / rel).write_bytes(os.urandom(40))
    add_rows(out, [(rel, "userdoc", 10)])
    inside = snapshot(out)
    line = remove(capsys, out, tmp_path, ["userdoc"]).refusal
    assert str(out / rel) in line and "does not list it" in line
    assert snapshot(out) == inside


# A record entry naming a fixed file (or anything its kind's tools never list) would have a re-run delete it.
@pytest.fixture
def removed_copy(tree_copy, tmp_path, capsys):
    assert remove(capsys, tree_copy, tmp_path, [rows_of(tree_copy)[0][1]]).code == 0
    assert (tree_copy / "removals.txt").exists()
    return tree_copy


@pytest.mark.parametrize("field,entry", [
    ("files", "removals.txt"), ("derived", "removals.txt"), ("files", "dataset_stats.txt"),
    ("derived", "checksums.sha256"), ("files", ".pretokenize-lock"), ("derived", ".pretokenize-tmp/removal/plan.json"),
    ("files", "notes.txt"), ("files", "megatron/data_args.txt"),
])
def test_a_rerun_refuses_a_record_entry_that_is_not_a_file_of_its_kind(removed_copy, source, field, entry, capsys):
    out = removed_copy
    record = json.loads((out / ".pretokenize-tree.json").read_text())
    record[field].append(entry)
    (out / ".pretokenize-tree.json").write_text(json.dumps(record))
    (out / "notes.txt").write_text("the user's notes\n")
    inside = snapshot(out)
    line = run_cli(capsys, ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2",
                            RUNNER]).refusal
    assert ".pretokenize-tree.json" in line and repr(entry) in line and field in line
    assert snapshot(out) == inside, "the refusal changed the tree"


# The fixed names are checked at launch: a link there is one line, and nothing changes.
@pytest.mark.parametrize("name", [layout.STATS_NAME, layout.MANIFEST_NAME, layout.CHECKSUMS_NAME, "removals.txt"])
def test_a_rerun_refuses_a_fixed_file_that_is_a_link_out_at_launch(removed_copy, source, victim, name, capsys):
    out = removed_copy
    shutil.move(str(out / name), str(victim / name))
    os.symlink(victim / name, out / name)
    outside, inside = snapshot(victim), snapshot(out)
    line = run_cli(capsys, ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2",
                            RUNNER]).refusal
    assert str(out / name) in line and "outside the tree" in line
    assert snapshot(victim) == outside and snapshot(out) == inside


def test_remove_refuses_a_removal_log_linked_out_of_the_tree_before_changing_a_byte(tree_copy, victim, tmp_path,
                                                                                    capsys):
    """removals.txt moved out of the tree and linked back: remove used to see it only in its last
    step, after rewriting the shards and deleting dataset_stats.txt; it is refused before any change."""
    out = tree_copy
    first, second = rows_of(out)[0][1], rows_of(out)[-1][1]
    assert remove(capsys, out, tmp_path, [first]).code == 0
    shutil.move(str(out / "removals.txt"), str(victim / "removals.txt"))
    os.symlink(victim / "removals.txt", out / "removals.txt")
    outside, inside = snapshot(victim), snapshot(out)
    line = remove(capsys, out, tmp_path, [second]).refusal
    assert "removals.txt" in line and "outside the tree" in line
    assert snapshot(victim) == outside, "a file outside the tree changed"
    assert snapshot(out) == inside and (out / layout.STATS_NAME).exists(), "the refusal changed the tree"


# The tree reached another way: through a linked parent directory, or spelt file://. Each spelling
# names the same tree, so what the tool writes there is the tree's, locked and recorded, or refused.
def spellings(out, tmp_path) -> dict[str, str]:
    alias = tmp_path / "alias"
    os.symlink(out, alias)
    return {"linked parent": str(alias), "file URL": f"file://{out}"}


@pytest.mark.parametrize("how", ["linked parent", "file URL"])
def test_stats_knows_the_tree_however_a_path_into_it_is_spelt(tree_copy, tmp_path, how, capsys):
    out = tree_copy
    (out / "notes.txt").write_text("the user's own notes\n")
    inside = snapshot(out)
    spelt = spellings(out, tmp_path)[how]
    for name, why in (("notes.txt", "not the tool's"), (layout.MANIFEST_NAME, "never writes"),
                      ("README.md", "never writes"), (layout.RECORD_NAME, "never writes"),
                      ("1024/t.txt", "never writes")):
        line = run_cli(capsys, ["stats", "--output", str(out), "--png", "none", "--table", f"{spelt}/{name}"]).refusal
        assert name in line and why in line
    assert snapshot(out) == inside
    # A new file there is written as the tree's (recorded, so that a re-run removes it), not beside it.
    for table in (f"{spelt}/lengths.txt", f"{spelt}/reports/lengths.txt"):  # a directory of the user's is fine
        assert run_cli(capsys, ["stats", "--output", str(out), "--png", "none", "--table", table]).code == 0
    record = json.loads((out / layout.RECORD_NAME).read_text())
    assert {"lengths.txt", "reports/lengths.txt"} <= set(record["derived"])


def test_stats_through_an_alias_of_the_tree_waits_for_its_lock(tree_copy, tmp_path, capsys):
    from shards import lock

    out = tree_copy
    alias = spellings(out, tmp_path)["linked parent"]
    with lock.scope(f"pretokenize bucketed --output {out}"):
        lock.take(str(out))
        line = run_cli(capsys, ["stats", "--output", str(out), "--png", "none", "--table", f"{alias}/t.txt"]).refusal
    assert "locked" in line
    assert not (out / "t.txt").exists()


@pytest.mark.parametrize("flag", ["--report", "--temp_location"])
@pytest.mark.parametrize("how", ["as given", "linked parent", "file URL"])
def test_verify_writes_nothing_in_the_tree_it_checks(tree_copy, tmp_path, flag, how, capsys):
    out = tree_copy
    inside = snapshot(out)
    spelt = str(out) if how == "as given" else spellings(out, tmp_path)[how]
    place = f"{spelt}/README.md" if flag == "--report" else f"{spelt}/scratch"
    line = run_cli(capsys, ["verify", "--output", str(out), f"{flag}={place}", RUNNER]).refusal
    assert flag in line and "inside the tree being checked" in line
    assert snapshot(out) == inside


def test_an_input_inside_the_output_is_refused_through_a_linked_parent(tree_copy, tmp_path, capsys):
    out = tree_copy
    alias = spellings(out, tmp_path)["linked parent"]
    shutil.copy(SAMPLE_PARQUET, out / "input.parquet")
    line = run_cli(capsys, ["bucketed", "--input", f"{alias}/input.parquet", "--output", str(out), RUNNER]).refusal
    assert "is inside --output" in line
