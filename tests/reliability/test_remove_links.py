"""Issue 35, case 8: ``remove`` checks every file it will read or rewrite (links included) before it
changes a byte. A tree file that is a link out of the tree (the manifest, the card, the checksums,
the stats, the record, an affected shard) is refused in one line: every byte of the tree, and the
file the link points to, stay as they were, and the lock is freed."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from conftest import finepdfs_row, tree_hashes

from pipelines import cli
from shards import layout, manifest

RUNNER = "--runner=FnApiRunner"
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a document about links out of a tree. " * (3 + i % 7))
        for i in range(30)]
LOCK_NAME = ".pretokenize-lock"


def _rows(out):
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def _shard_of_first_id(out) -> str:
    return _rows(out)[0][0]


NAMES = [layout.MANIFEST_NAME, "README.md", layout.CHECKSUMS_NAME, layout.STATS_NAME, "dataset_stats.json",
         ".pretokenize-tree.json", "shard"]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", NAMES)
def test_a_link_out_of_the_tree_is_refused_before_any_byte_changes(tree_copy, tmp_path, capsys, name):
    out = tree_copy
    first_id = _rows(out)[0][1]
    if name == "shard":
        name = _shard_of_first_id(out)
    assert (out / name).is_file()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / os.path.basename(name)
    shutil.move(str(out / name), str(target))
    os.symlink(target, out / name)
    (tmp_path / "ids.txt").write_text(f"{first_id}\n", encoding="utf-8")
    before, target_before = tree_hashes(out), _digest(target)
    listing = sorted(os.path.relpath(os.path.join(d, f), out) for d, ds, fs in os.walk(out) for f in fs + ds)

    code = cli.main(["remove", "--output", str(out), "--removal-list", str(tmp_path / "ids.txt"), RUNNER])

    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("pretokenize remove: ") and name in lines[0] and "outside the tree" in lines[0]
    assert tree_hashes(out) == before and _digest(target) == target_before
    after = sorted(os.path.relpath(os.path.join(d, f), out) for d, ds, fs in os.walk(out) for f in fs + ds)
    assert after == listing  # nothing made, nothing deleted (no journal, no lock left)
    assert os.path.islink(out / name) and not (out / LOCK_NAME).exists()
