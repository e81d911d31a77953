"""pretokenize verify as a safety check: it never writes where it reads, and a removed id that is
stored again (a re-run racing a `remove`, say) is never passed."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from conftest import finepdfs_row
from fsspec.implementations.local import LocalFileSystem

from pipelines import verify
from shards import layout, manifest
from shards.removal.lists import REMOVALS_HEADER, REMOVALS_NAME, format_removal_line
from transforms.core.records import UsageError

RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(f"s-{i:02d}", f"A document to keep safe, number {i}. " * (3 + i % 5)) for i in range(12)]


@pytest.fixture(scope="module")
def tree(source, bucketed_tree):
    return source, bucketed_tree


@pytest.fixture
def copy(source, tree_copy):
    return source, tree_copy


def run_verify(out, capsys, *flags) -> tuple[int, str]:
    code = verify.run(["--output", str(out), *flags, *RUNNER])
    return code, capsys.readouterr().out


def snapshot(root) -> dict[str, tuple]:
    """Every file and directory under ``root`` (itself too): mode, size, mtime and the bytes' sha256.
    A file created and deleted again still shows, in its directory's mtime."""
    found = {}
    for dirpath, _, files in os.walk(root):
        for path in [dirpath] + [os.path.join(dirpath, f) for f in files]:
            st = os.lstat(path)
            digest = "" if stat.S_ISDIR(st.st_mode) else hashlib.sha256(open(path, "rb").read()).hexdigest()
            found[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return found


# --- Removed ids -------------------------------------------------------------------------------------


def stored_row(out, k: int) -> tuple[str, str, int]:
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return list(manifest.read_rows(f))[k]


def test_a_stored_id_that_removals_txt_lists_is_reported(copy, capsys):
    """The tree a `bucketed` re-run and a `remove` leave when they run at once: the audit log says
    an id was removed, the re-run wrote it back."""
    src, out = copy
    rel, doc_id, n = stored_row(out, 3)
    (out / REMOVALS_NAME).write_text(
        REMOVALS_HEADER + "\n"
        + format_removal_line("2025-01-01T00:00:00Z", "earlier", "s-removed-for-good", rel, 40)
        + format_removal_line("2025-01-01T00:00:00Z", "race", doc_id, rel, n),
        encoding="utf-8",
    )
    for flags in ([], ["--input", str(src)]):
        code, text = run_verify(out, capsys, *flags)
        assert code == 1, text
        assert f"{rel}: id {doc_id} is stored, but removals.txt lists it as removed" in text
        assert "verify: FAILED, 1 problem in" in text


def test_a_stored_id_on_the_removal_list_given_to_verify_is_reported(copy, capsys, tmp_path):
    src, out = copy
    rel, doc_id, _ = stored_row(out, 2)
    flagged = tmp_path / "flagged.txt"
    flagged.write_text(f"{doc_id}\nan-id-never-stored\n", encoding="utf-8")
    for flags in ([], ["--input", str(src)]):
        code, text = run_verify(out, capsys, "--removal-list", str(flagged), *flags)
        assert code == 1, text
        assert f"{rel}: id {doc_id} is stored, but the --removal-list {flagged} lists it as removed" in text
        assert "verify: FAILED, 1 problem in" in text


def test_a_removals_txt_that_cannot_be_read_is_a_problem_not_a_pass(copy, capsys):
    _, out = copy
    (out / REMOVALS_NAME).write_text("not an audit log\nnor is this\n", encoding="utf-8")
    code, text = run_verify(out, capsys)
    assert code == 1 and "removals.txt: unreadable:" in text


# --- Nothing written where it reads ------------------------------------------------------------------


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores file permissions: test_verify_writes_nothing_under_the_tree covers it")
def test_verify_passes_on_a_read_only_tree_and_leaves_it_as_it_was(copy, capsys):
    src, out = copy
    before = snapshot(out)
    modes = {p: os.stat(p).st_mode for p in [str(out), *(os.path.join(d, n) for d, ds, fs in os.walk(out)
                                                          for n in ds + fs)]}
    for path, mode in modes.items():
        os.chmod(path, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        for flags in ([], ["--input", str(src)]):
            code, text = run_verify(out, capsys, *flags)
            assert code == 0, text
            assert "verify: OK" in text
    finally:
        for path in sorted(modes, key=len):
            os.chmod(path, modes[path])
    assert snapshot(out) == before


def forbid_writes_under(monkeypatch, root) -> None:
    """fsspec's local filesystem raises PermissionError on any write, move or delete under ``root``,
    as a read-only mount would (even for root)."""
    root = os.path.realpath(root)

    def check(args, what):
        for arg in args:
            for path in arg if isinstance(arg, (list, tuple)) else [arg]:
                if isinstance(path, (str, os.PathLike)):
                    p = os.path.realpath(LocalFileSystem._strip_protocol(os.fspath(path)))
                    if p == root or p.startswith(root + os.sep):
                        raise PermissionError(f"read-only in this test: {what} {p}")

    original_open = LocalFileSystem._open

    def _open(self, path, mode="rb", *args, **kwargs):
        if set(mode) & set("wax+"):
            check([path], f"open({mode!r})")
        return original_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "_open", _open)
    for name in ("chmod", "cp_file", "get_file", "link", "makedirs", "mkdir", "mv", "put_file", "rm", "rm_file",
                 "rmdir", "symlink", "touch"):
        original = getattr(LocalFileSystem, name)

        def guarded(self, *args, _original=original, _name=name, **kwargs):
            check(args, _name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LocalFileSystem, name, guarded)


def test_verify_writes_nothing_under_the_tree(copy, capsys, monkeypatch):
    src, out = copy
    before = snapshot(out)
    forbid_writes_under(monkeypatch, out)
    with pytest.raises(PermissionError):  # the guard itself works
        LocalFileSystem().makedirs(str(out / layout.TEMP_DIR_NAME), exist_ok=True)
    for flags in ([], ["--input", str(src)]):
        code, text = run_verify(out, capsys, *flags)
        assert code == 0, text
        assert "verify: OK" in text
    assert snapshot(out) == before


def test_the_report_goes_to_report_or_temp_location_and_a_temporary_one_is_removed(copy, capsys, tmp_path,
                                                                                   monkeypatch):
    _, out = copy
    (out / layout.CHECKSUMS_NAME).unlink()
    kept = tmp_path / "reports" / "report.json"
    code, _ = run_verify(out, capsys, "--report", str(kept))
    assert code == 1
    report = json.loads(kept.read_text())
    assert report["problems"] == 1 and report["sample"][0].startswith("checksums.sha256: missing")

    temp_location = tmp_path / "beam-temp"
    temp_location.mkdir()
    code, _ = run_verify(out, capsys, "--temp_location", str(temp_location))
    assert code == 1 and os.listdir(temp_location) == []

    local_temp = tmp_path / "local-temp"
    local_temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(local_temp))
    code, _ = run_verify(out, capsys)
    assert code == 1 and os.listdir(local_temp) == []


def test_a_runner_on_other_machines_needs_a_report_place_they_can_reach(copy):
    _, out = copy
    with pytest.raises(UsageError, match="--temp_location"):
        verify.run(["--output", str(out), "--runner=DataflowRunner"])
