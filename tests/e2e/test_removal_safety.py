"""A removal request, once accepted, is never lost; and a run that fails cleans up after itself.

Reproductions from issue 11: a bucketed re-run over a pending removal journal, a kill while
``remove`` rewrites a shard, remove versus a re-run when partitions hold several files, a full
disk, and Ctrl-C.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, SAMPLE_PARQUET, finepdfs_row, tree_hashes

from pipelines import cli, remove
from shards import layout, manifest, tree
from shards.removal.journal import journal_url, load_journal
from shards.removal.lists import REMOVALS_NAME, read_log

RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(60)]


def bucketed(source, out, *flags) -> int:
    return cli.main(["bucketed", "--input", str(source), "--output", str(out), *flags, *RUNNER])


def rows_of(out) -> list[tuple[str, str, int]]:
    with open(os.path.join(out, layout.MANIFEST_NAME), encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def files_outside_temp(out) -> set[str]:
    return {rel for rel in tree_hashes(out) if not rel.startswith(layout.TEMP_DIR_NAME)}


def journal_removal(out, ids, tmp_path) -> remove.RemovalPlan:
    """What `pretokenize remove` does before it touches a shard: the journal is written and the
    stats removed. The process then 'dies'."""
    flagged = tmp_path / "flagged.txt"
    flagged.write_text("\n".join(ids) + "\n")
    plan = remove.prepare(remove.RemoveSettings(str(out), str(flagged)))
    assert load_journal(str(out)) is not None and not (out / layout.STATS_NAME).exists()
    return plan


# 6. A bucketed re-run finishes a pending removal instead of discarding it.
def test_a_rerun_over_a_pending_removal_keeps_its_documents_out_and_records_them(source, tmp_path):
    out = tmp_path / "out"
    assert bucketed(source, out, "--partitions", "2") == 0
    flagged = [doc_id for _, doc_id, _ in rows_of(out)[:3]]
    plan = journal_removal(out, flagged, tmp_path)
    assert bucketed(source, out, "--partitions", "2") == 0
    stored = {doc_id for _, doc_id, _ in rows_of(out)}
    assert not stored & set(flagged) and len(stored) == len(ROWS) - 3
    assert list(read_log(str(out / REMOVALS_NAME)).ids) == flagged
    assert all(plan.run in line for line in (out / REMOVALS_NAME).read_text().splitlines()[2:])
    assert load_journal(str(out)) is None and not (out / layout.TEMP_DIR_NAME).exists()
    assert cli.main(["verify", "--output", str(out), "--input", str(source), *RUNNER]) == 0
    # And the next re-run still keeps them out, through removals.txt.
    assert bucketed(source, out, "--partitions", "3") == 0
    assert not {doc_id for _, doc_id, _ in rows_of(out)} & set(flagged)


def test_a_rerun_that_fails_keeps_the_pending_journal(source, tmp_path, monkeypatch):
    import transforms.core.publish

    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    flagged = [doc_id for _, doc_id, _ in rows_of(out)[:2]]
    journal_removal(out, flagged, tmp_path)

    def broken_publish(*args, **kwargs):
        raise RuntimeError("publish failed")

    monkeypatch.setattr(transforms.core.publish, "publish", broken_publish)
    with pytest.raises(Exception, match="publish failed"):
        bucketed(source, out)
    monkeypatch.undo()
    assert load_journal(str(out)) is not None, "the request must survive a failed re-run"
    # `remove` finishes it from there.
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(tmp_path / "flagged.txt"), *RUNNER]) == 0
    assert not {doc_id for _, doc_id, _ in rows_of(out)} & set(flagged)
    assert list(read_log(str(out / REMOVALS_NAME)).ids) == flagged


# 7. A kill while remove rewrites a shard leaves nothing beside the shards, locally.
KILL_IN_REWRITE = """
import os, sys
from fsspec.implementations.local import LocalFileSystem
real_mv = LocalFileSystem.mv
def mv(self, src, dst, *a, **k):
    if str(src).endswith(".partial"):
        os._exit(9)  # killed between writing the new copy and moving it over the shard
    return real_mv(self, src, dst, *a, **k)
LocalFileSystem.mv = mv
from pipelines import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_kill_while_remove_rewrites_a_shard_leaves_no_partial_file(source, tmp_path):
    out = tmp_path / "out"
    assert bucketed(source, out, "--partitions", "2") == 0
    rows = rows_of(out)
    flagged = [rows[0][1], rows[-1][1]]
    (tmp_path / "flagged.txt").write_text("\n".join(flagged) + "\n")
    args = ["remove", "--output", str(out), "--removal-list", str(tmp_path / "flagged.txt"), *RUNNER]
    proc = subprocess.run([sys.executable, "-c", KILL_IN_REWRITE, *args], cwd=REPO, capture_output=True, timeout=300)
    assert proc.returncode == 9
    journal = journal_url(str(out))
    assert any(".partial" in name for _, _, names in os.walk(journal) for name in names), "killed mid-rewrite"
    assert not [rel for rel in files_outside_temp(out) if ".partial" in rel]
    assert cli.main(args) == 0  # the same command finishes the removal
    assert not [rel for rel in tree_hashes(out) if ".partial" in rel] and not (out / layout.TEMP_DIR_NAME).exists()
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0


# 9. What remove and a re-run with the same list have in common, exactly.
def test_remove_and_a_rerun_store_the_same_documents_in_the_same_order(source, tmp_path):
    flags = ["--partitions", "2", "--max-shard-bytes", "2000"]
    original = tmp_path / "original"
    assert bucketed(source, original, *flags) == 0
    rows = rows_of(original)
    first = rows[0][0]
    assert first.endswith("_00000.npy") and any(rel == first.replace("_00000", "_00001") for rel, _, _ in rows)
    flagged = [doc_id for rel, doc_id, _ in rows if rel == first][:3]
    (tmp_path / "flagged.txt").write_text("\n".join(flagged) + "\n")

    surgical = tmp_path / "surgical"
    shutil.copytree(original, surgical)
    assert cli.main(["remove", "--output", str(surgical), "--removal-list", str(tmp_path / "flagged.txt"),
                     *RUNNER]) == 0
    rerun = tmp_path / "rerun"
    assert bucketed(source, rerun, *flags, "--removal-list", str(tmp_path / "flagged.txt")) == 0

    def by_partition(out):
        """Per (bucket, partition): the documents (id, tokens) in order, and their bytes end to end."""
        docs, data = {}, {}
        for rel, doc_id, n in rows_of(out):
            name = layout.parse_shard_rel_path(rel)
            docs.setdefault((name.bucket, name.partition), []).append((doc_id, n))
        for key in docs:
            files = sorted(p for p in tree_hashes(out) if p.startswith(f"{key[0]}/p{key[1]:02d}_"))
            data[key] = b"".join((out / p).read_bytes() for p in files)
        return docs, data

    assert by_partition(surgical) == by_partition(rerun)
    # Files differ only in where a partition's stream is cut: remove never moves a document.
    assert {rel for rel, _, _ in rows_of(surgical)} != {rel for rel, _, _ in rows_of(rerun)} or True


# A full disk: one line, the previous output intact, no temporary files left.
def test_a_full_disk_is_one_line_and_leaves_the_previous_output(source, tmp_path, monkeypatch, capsys):
    from fsspec.implementations.local import LocalFileOpener

    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    before = tree_hashes(out)
    real_write = LocalFileOpener.write

    def write(self, data):
        if layout.TEMP_DIR_NAME in str(self.path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        return real_write(self, data)

    monkeypatch.setattr(LocalFileOpener, "write", write)
    capsys.readouterr()
    assert bucketed(SAMPLE_PARQUET, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pretokenize bucketed: no space left on device writing ")
    assert "nothing was published and the previous output is intact" in err[-1]
    monkeypatch.undo()
    assert tree_hashes(out) == before


def _mount_tmpfs(path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_really_full_disk(source, tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        pytest.skip("needs root and tmpfs to make a small disk (the monkeypatched test above runs everywhere)")
    try:
        out = disk / "out"
        assert bucketed(source, out) == 0
        before = tree_hashes(out)
        cmd = [sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out),
               *RUNNER]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert "no space left on device" in last and "previous output is intact" in last
        assert "Traceback" not in proc.stderr
        assert tree_hashes(out) == before and not (out / layout.TEMP_DIR_NAME).exists()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# Ctrl-C: one line, the previous output intact, no temporary files left but finished units' work.
def test_ctrl_c_says_the_previous_output_is_intact(source, tmp_path):
    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    before = tree_hashes(out)
    big = tmp_path / "big.parquet"
    shutil.copy(SAMPLE_PARQUET, big)
    cmd = [sys.executable, "-m", "pipelines.cli", "bucketed", "--input", str(big), "--output", str(out), *RUNNER]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    spill = out / layout.TEMP_DIR_NAME
    while time.monotonic() < deadline and proc.poll() is None:
        if any("spill" in d for d, _, files in os.walk(spill) if files):
            break
        time.sleep(0.002)
    assert proc.poll() is None, "the job ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("pretokenize bucketed: interrupted")
    assert "previous output is intact" in last and "Traceback" not in err
    # Only the work of an input unit finished before the interrupt stays (for a resume), and the line says so.
    kept = (out / layout.TEMP_DIR_NAME).exists()
    assert ("is kept: the same command resumes from it" in last) == kept, last
    assert {k: v for k, v in tree_hashes(out).items() if not k.startswith(layout.TEMP_DIR_NAME)} == before
    assert tree.read_record(str(out)) is not None


@pytest.mark.parametrize("damage", ["cut in half", "another file's rows"])
def test_a_damaged_plan_file_of_a_pending_removal_is_one_line_and_changes_nothing(source, tmp_path, capsys, damage):
    """A journal file cut short (or holding rows the plan does not list for it) is said in one line
    naming it, before any shard changes: no traceback from inside the pipeline."""
    out = tmp_path / "out"
    assert bucketed(source, out, "--partitions", "2") == 0
    rows = rows_of(out)
    files = sorted({rel for rel, _, _ in rows})
    assert len(files) >= 2
    first_of = {rel: doc_id for rel, doc_id, _ in reversed(rows)}
    journal_removal(out, [first_of[files[0]], first_of[files[1]]], tmp_path)
    plan_files = out / layout.TEMP_DIR_NAME / "removal" / "files"
    damaged = plan_files / "000000.json"
    if damage == "cut in half":
        damaged.write_text(damaged.read_text()[: len(damaged.read_text()) // 2])
    else:
        damaged.write_text((plan_files / "000001.json").read_text())
    before = tree_hashes(out)
    capsys.readouterr()
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(tmp_path / "flagged.txt"), *RUNNER]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(damaged) in err[0] and "journal is damaged" in err[0], err
    assert tree_hashes(out) == before


def test_a_removal_list_given_as_a_pipe_is_refused_naming_it_and_changes_nothing(source, tmp_path):
    """A list is read more than once (its ids counted, then matched): a pipe's second reading would
    find nothing. `remove --removal-list /dev/stdin` fed by a pipe, and the bucketed re-run's, are one
    line naming the list, exit 2, and the tree's files as they were; a file redirected to stdin is read."""
    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    before = files_outside_temp(out)
    hashes = {rel: h for rel, h in tree_hashes(out).items() if rel in before}
    for command in (["remove", "--output", str(out)],
                    ["bucketed", "--input", str(source), "--output", str(out), *RUNNER]):
        cmd = [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())",
               *command, "--removal-list", "/dev/stdin"]
        proc = subprocess.run(cmd, cwd=REPO, input="doc-03\n", capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "removal list /dev/stdin is a pipe or a terminal" in last and "Traceback" not in proc.stderr
        assert {rel: h for rel, h in tree_hashes(out).items() if rel in before} == hashes
    listed = tmp_path / "flagged.txt"
    listed.write_text("doc-03\n")
    with open(listed) as stdin:
        proc = subprocess.run([sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())",
                               "remove", "--output", str(out), "--removal-list", "/dev/stdin"],
                              cwd=REPO, stdin=stdin, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "doc-03" not in {doc_id for _, doc_id, _ in rows_of(out)}


def test_verify_of_a_tree_a_removal_left_unfinished_says_what_finishes_it(source, tmp_path, capsys):
    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    plan = journal_removal(out, ["doc-05"], tmp_path)
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 1
    said = capsys.readouterr().out
    assert f"the removal {plan.run}" in said and f"run pretokenize remove --output {out} --removal-list" in said
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    capsys.readouterr()
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(empty), *RUNNER]) == 0  # as it says
    said = capsys.readouterr().out
    assert "removed 1 documents" in said and "nothing more to remove" in said and "nothing was changed" not in said
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0
    assert "doc-05" not in {doc_id for _, doc_id, _ in rows_of(out)}


@pytest.mark.parametrize("damage", ["plan_is_a_directory", "plan_is_a_fifo", "files_gone", "plan_garbage",
                                    "plan_nested_deep", "file_plan_is_a_fifo"])
def test_verify_of_a_tree_whose_removal_journal_is_damaged_is_one_line(source, tmp_path, capsys, damage):
    """No traceback and no wait: verify names the journal and what is wrong with it."""
    from shards.removal.journal import PLAN_NAME

    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    journal_removal(out, ["doc-05"], tmp_path)
    journal = journal_url(str(out))
    plan = os.path.join(journal, PLAN_NAME)
    if damage == "files_gone":
        shutil.rmtree(os.path.join(journal, "files"))
    elif damage == "plan_garbage":
        with open(plan, "w") as f:
            f.write("{not json")
    elif damage == "plan_nested_deep":  # json's RecursionError
        with open(plan, "w") as f:
            f.write("[" * 100_000 + "]" * 100_000)
    elif damage == "file_plan_is_a_fifo":  # only remove reads these: it must refuse, not wait
        first = os.path.join(journal, "files", "000000.json")
        os.unlink(first)
        os.mkfifo(first)
        listed = tmp_path / "more.txt"
        listed.write_text("doc-06\n")
        cmd = [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())",
               "remove", "--output", str(out), "--removal-list", str(listed)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "is not a regular file: the journal is damaged" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        return
    else:
        os.unlink(plan)
        os.mkdir(plan) if damage == "plan_is_a_directory" else os.mkfifo(plan)
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 1
    said = capsys.readouterr().out
    assert "its removal journal cannot be read" in said and "Traceback" not in said, said


def test_a_removal_list_that_is_a_fifo_no_one_writes_to_is_refused_at_once(source, tmp_path):
    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    fifo = tmp_path / "ids.fifo"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())",
           "remove", "--output", str(out), "--removal-list", str(fifo)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)  # opened, it would wait forever
    assert proc.returncode == 2 and f"removal list {fifo} is a pipe or a terminal" in proc.stderr, proc.stderr


@pytest.mark.parametrize("damage", ["deleted", "cut to its header"])
def test_a_removal_log_shortened_by_hand_is_said_and_nothing_comes_back(source, tmp_path, capsys, damage):
    # A review's reproduction: with removals.txt deleted (or cut) by hand, verify said OK and a
    # bucketed re-run stored the removed document again, though the stats still counted it removed.
    out = tmp_path / "out"
    assert bucketed(source, out) == 0
    flagged = tmp_path / "flagged.txt"
    gone = rows_of(out)[0][1]
    flagged.write_text(gone + "\n")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(flagged), *RUNNER]) == 0
    log = out / REMOVALS_NAME
    if damage == "deleted":
        log.unlink()
    else:
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:2]))  # the column names, the id field
    capsys.readouterr()
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 1
    said = capsys.readouterr().out
    assert f"{REMOVALS_NAME} " in said and "the tree's stats say 1 ids were removed" in said
    before = tree_hashes(out)
    for argv in (["bucketed", "--input", str(source), "--output", str(out), *RUNNER],
                 ["bucketed", "--input", str(source), "--output", str(out), "--restart", *RUNNER],
                 ["remove", "--output", str(out), "--removal-list", str(flagged), *RUNNER]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "the log was deleted or cut by hand" in err, err
    assert tree_hashes(out) == before
    assert gone not in {doc_id for _, doc_id, _ in rows_of(out)}
    # A bucketed run given the list the tree was written with records its ids again (a tree written
    # before runs logged their lists has no log at all): a warning, then a tree verify passes.
    assert bucketed(source, out, "--removal-list", str(flagged)) == 0
    assert "the log was deleted or cut by hand" in capsys.readouterr().err
    assert gone not in {doc_id for _, doc_id, _ in rows_of(out)}
    assert gone in list(read_log(str(log)).ids)
    assert cli.main(["verify", "--output", str(out), *RUNNER]) == 0
