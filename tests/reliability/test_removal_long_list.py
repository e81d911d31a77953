"""remove of a list longer than the ids held in memory (issue 23, "remove at scale"), killed or not.

PRETOKENIZE_ID_BOUND set small makes every list here longer than the bound: the list, the tree's
log and the manifest rows are hash-partitioned into the journal's directory and joined one
partition at a time (shards/removal/idmatch.py). The documents removed, every byte of the tree, the report
and the audit lines (but their run id and time) must be those of the same removal held in memory,
also when the removal is killed at any step and the same command run again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, finepdfs_row, tree_hashes

from pipelines import cli
from shards import layout
from shards.removal import idmatch
from shards.removal.lists import REMOVALS_NAME, parse_removal_line

RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(40)]
ROWS.append(finepdfs_row("doc\twith tab", "A document whose id holds a tab. " * 5))
BOUND = "3"
FIRST = ["doc-05"]  # removed first: the long list names it again ("already removed")
# Stored ids spread over the files, repeats, padding, an id with a tab, and many ids never stored.
LISTED = (["  doc-01  ", "doc-17", "absent-x", "doc-01", "doc\twith tab", "doc-05", "doc-33", "doc-38"]
          + [f"absent-{k:03d}" for k in range(40)] + ["doc-17", "doc-02"])
REMOVED = {"doc-01", "doc-17", "doc\twith tab", "doc-33", "doc-38", "doc-02"}


@pytest.fixture(scope="module")
def removed_once(source, tmp_path_factory):
    """A bucketed tree one removal old, its removals.txt then hand-edited (a BOM, CRLF line ends)."""
    out = tmp_path_factory.mktemp("tree") / "out"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), "--partitions", "4", *RUNNER]) == 0
    first = out.parent / "first.txt"
    first.write_text("\n".join(FIRST) + "\n", encoding="utf-8")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(first), *RUNNER]) == 0
    log = out / REMOVALS_NAME
    log.write_bytes(b"\xef\xbb\xbf" + log.read_bytes().replace(b"\n", b"\r\n"))
    listed = out.parent / "listed.txt"
    listed.write_text("\n".join(LISTED) + "\n", encoding="utf-8")
    return out, str(listed)


def audit(out) -> list[tuple]:
    """removals.txt's lines but their time and run; its first two lines as they are."""
    lines = (out / REMOVALS_NAME).read_text(encoding="utf-8").splitlines()
    return lines[:2] + sorted(parse_removal_line(line)[2:] for line in lines[2:])


def stored(out) -> set[str]:
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return {line.split(" | ")[1] for line in list(f)[1:]}


def same_tree(a, b) -> None:
    skip = (REMOVALS_NAME,)
    assert tree_hashes(a, skip) == tree_hashes(b, skip)
    assert audit(a) == audit(b)


@pytest.fixture(scope="module")
def in_memory(removed_once, tmp_path_factory):
    """The removal held in memory (the default bound): the reference, and what it printed."""
    out, listed = removed_once
    ref = tmp_path_factory.mktemp("ref") / "out"
    shutil.copytree(out, ref)
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "remove", "--output", str(ref), "--removal-list",
                           listed, *RUNNER], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ref, report(proc.stdout)


def report(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("removal list:", "  not found", "  ..."))]


def test_a_list_longer_than_the_bound_removes_the_same_documents(removed_once, in_memory, tmp_path, monkeypatch,
                                                                  capsys):
    out, listed = removed_once
    ref, printed = in_memory
    assert stored(out) - stored(ref) == REMOVED
    assert printed[0] == "removal list: 48 ids, 6 found in the manifest, 1 already removed (removals.txt lists " \
                         "them), 41 not found"
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    partitioned = []
    write = idmatch.write_partitions
    monkeypatch.setattr(idmatch, "write_partitions", lambda *a, **k: partitioned.append(a[1]) or write(*a, **k))
    monkeypatch.setenv(idmatch.ID_BOUND_ENV, BOUND)
    capsys.readouterr()
    assert cli.main(["remove", "--output", str(copy), "--removal-list", listed, *RUNNER]) == 0
    assert report(capsys.readouterr().out) == printed
    assert {"list", "log", "rows", "distinct"} <= set(partitioned), partitioned  # the bounded paths ran
    same_tree(copy, ref)
    assert not (copy / layout.TEMP_DIR_NAME).exists()
    assert cli.main(["verify", "--output", str(copy), *RUNNER]) == 0


KILLER = """
import os, re, sys
from fsspec.implementations.local import LocalFileSystem
from shards.removal import idmatch
left, notes = [int(sys.argv[1])], sys.argv[2]
def step(label):
    if notes != "-":
        with open(notes, "a") as f:
            f.write(re.sub("[0-9a-f]{6,}|[0-9]+", "N", label) + "\\n")
    left[0] -= 1
    if left[0] == 0:
        os._exit(9)
real_create, real_mv = idmatch.Scratch.create, LocalFileSystem.mv
def create(self, part):
    step("create " + part)
    return real_create(self, part)
def mv(self, src, dst, *a, **k):
    result = real_mv(self, src, dst, *a, **k)
    step("move " + os.path.basename(str(dst)))
    return result
idmatch.Scratch.create, LocalFileSystem.mv = create, mv
from pipelines import cli
sys.exit(cli.main(sys.argv[3:]))
"""


def remove_killed(out, listed: str, kill_after: int, notes: str = "-") -> subprocess.CompletedProcess:
    """remove with the small bound, killed (SIGKILL's exit) at the kill_after-th partition file
    created or file moved (0: never), each step's kind noted in the file ``notes``."""
    return subprocess.run([sys.executable, "-c", KILLER, str(kill_after), notes, "remove", "--output", str(out),
                           "--removal-list", listed, *RUNNER], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), idmatch.ID_BOUND_ENV: BOUND})


def id_text_in_partitions(out) -> list[str]:
    """The partition files a killed removal left that hold a listed or logged id's text, as verify's scan sees it."""
    ids = {i.strip() for i in LISTED + FIRST}
    journal = out / layout.TEMP_DIR_NAME / "removal"
    found = []
    for sub in ("match", "distinct"):
        for path in (journal / sub).glob("*") if (journal / sub).is_dir() else ():
            data = path.read_bytes()
            found += [f"{path.name}: {i}" for i in ids if i.encode() in data]
    return found


def kill_points(removed_once, tmp_path) -> list[int]:
    """The steps a bounded removal takes (each partition file created, each file moved into place):
    the first of each kind, the last shard rewritten (the others done), and the very last. A kill
    there interrupts every phase."""
    out, listed = removed_once
    copy = tmp_path / "steps"
    shutil.copytree(out, copy)
    notes = tmp_path / "steps.txt"
    assert remove_killed(copy, listed, 0, str(notes)).returncode == 0
    steps = notes.read_text().splitlines()
    assert {"create list-N", "create rows-N", "create hits-N", "create distinct-N", "move removals.txt"} <= set(steps)
    first = {label: i for i, label in reversed(list(enumerate(steps)))}
    last_rewrite = max(i for i, label in enumerate(steps) if label.endswith(".npy"))
    return sorted({i + 1 for i in [*first.values(), last_rewrite, len(steps) - 1]})


def test_a_long_list_removal_killed_at_any_step_is_finished_by_the_same_command(removed_once, in_memory, tmp_path):
    out, listed = removed_once
    ref, printed = in_memory
    points = kill_points(removed_once, tmp_path)
    assert len(points) >= 15, points
    for n in points:
        copy = tmp_path / f"killed-{n}"
        shutil.copytree(out, copy)
        killed = remove_killed(copy, listed, n)
        assert killed.returncode == 9, (n, killed.stdout[-2000:], killed.stderr[-3000:])
        assert not id_text_in_partitions(copy), n  # what verify would flag: no id is readable there
        again = remove_killed(copy, listed, 0)  # never killed
        assert again.returncode == 0, (n, again.stderr[-3000:])
        assert "Traceback" not in again.stderr, n
        same_tree(copy, ref)
        assert not (copy / layout.TEMP_DIR_NAME).exists(), n
        if "resuming" not in again.stdout:  # killed before the plan was journalled: planned afresh
            assert report(again.stdout) == printed, n
        shutil.rmtree(copy)


def test_a_removal_killed_while_matching_leaves_no_listed_id_past_the_next_writing_command(removed_once, tmp_path):
    """Issue 35, case 9a: a remove killed during its partitioned id match leaves the list's ids,
    encoded, in the journal's match directory. verify says the files are there (never what they
    hold); the next command that writes the tree (here stats) deletes them."""
    out, listed = removed_once
    steps_tree = tmp_path / "steps"
    shutil.copytree(out, steps_tree)
    notes = tmp_path / "steps.txt"
    assert remove_killed(steps_tree, listed, 0, str(notes)).returncode == 0
    steps = notes.read_text().splitlines()
    kill_at = steps.index("create rows-N") + 1  # the list's partitions written, the rows' about to be
    copy = tmp_path / "killed"
    shutil.copytree(out, copy)
    assert remove_killed(copy, listed, kill_at).returncode == 9
    match = copy / layout.TEMP_DIR_NAME / "removal" / "match"
    left = [p for p in match.iterdir() if p.stat().st_size]
    scratch = idmatch.Scratch(None, str(match))
    decoded = {doc_id for p in left if p.name.startswith("list-")
               for _, doc_id in idmatch.read_numbered(scratch, p.name)}
    assert {"doc-17", "doc-33"} <= {d.strip() for d in decoded}  # the list is there, decodable

    code = subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", "--output", str(copy), *RUNNER],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert code.returncode == 1, code.stdout + code.stderr
    said = [line for line in code.stdout.splitlines() if "removal/match" in line]
    assert len(said) == 1 and "files a killed remove left while matching its list" in said[0], code.stdout
    assert not any(i.strip() in code.stdout for i in LISTED if i.strip().startswith("absent"))

    assert cli.main(["stats", "--output", str(copy), "--png", "none"]) == 0
    assert not match.exists()
    assert cli.main(["verify", "--output", str(copy), *RUNNER]) == 0


def test_verify_counts_no_match_files_through_a_link_out_of_the_tree(removed_once, tmp_path, capsys):
    """A journal directory that is a link out of the tree: verify never lists what lies beyond it
    as a killed removal's match files (nor would any command delete it)."""
    out, _ = removed_once
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, symlinks=True)
    outside = tmp_path / "outside"
    (outside / "match").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (outside / "match" / name).write_bytes(b"not the tool's")
    (copy / ".pretokenize-tmp").mkdir(exist_ok=True)
    os.symlink(outside, copy / ".pretokenize-tmp" / "removal")
    cli.main(["verify", "--output", str(copy), *RUNNER])
    assert "files a killed remove left" not in capsys.readouterr().out
    assert sorted(os.listdir(outside / "match")) == ["a", "b", "c"]
