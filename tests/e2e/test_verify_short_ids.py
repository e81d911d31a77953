"""verify's search for removed ids in the tree's other files: ids that are numbers or prefixes of
others (a removed ``3`` is not in the stats' numbers, nor ``1`` in ``10``'s saved work), and the
files a job's saved work or a person may leave holding one, which it still finds."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from conftest import finepdfs_row

from pipelines import cli
from shards import layout
from shards.card import CARD_NAME
from transforms.core.batches import RefBatch
from transforms.core.spill import encode_refs, refs_file_strings
from transforms.tools import verify as verify_tool

RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(str(i), f"Line {i} of a short document. " * (3 + i % 7)) for i in range(40)]
ROWS += [finepdfs_row(f"<urn:uuid:{i:04d}>", f"Another document, {i}. " * 4) for i in range(5)]
ROWS += [finepdfs_row(doc_id, f"A document named {doc_id}. " * 4) for doc_id in ("-1", "total", "tokens")]


def _refs(ids: list[str], source: str = "docs.jsonl", **extra: list[str]) -> bytes:
    n = len(ids)
    ones = np.ones(n, np.int64)
    columns = {name: np.array(values, dtype=object) for name, values in extra.items()}
    return encode_refs(RefBatch("x.bin", source, ids, ones, ones, np.arange(n, dtype=np.int64), ones, columns))


def _verify(out, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["verify", "--output", str(out), *RUNNER])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def removed_tree(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("short") / "out"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), *RUNNER]) == 0
    listed = out.parent / "flagged.txt"
    listed.write_text("3\n1\n-1\ntotal\n<urn:uuid:0002>\n")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(listed), *RUNNER]) == 0
    return out


@pytest.fixture
def tree(removed_tree, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(removed_tree, copy, symlinks=True)
    return copy


def test_a_removed_number_is_not_found_in_the_stats_or_the_card(tree, capsys):
    """Numbers (3, -1) and words inside the stats' own (total in total_tokens) are theirs."""
    stats = (tree / layout.STATS_NAME).read_bytes()
    assert b"3" in stats and b"total" in stats  # the premise: they are in their text
    code, said = _verify(tree, capsys)
    assert code == 0, said


def test_a_fifo_in_the_tree_is_a_problem_never_opened(tree, capsys):
    os.mkfifo(tree / "notes.fifo")
    os.makedirs(tree / layout.TEMP_DIR_NAME / "w")
    os.mkfifo(tree / layout.TEMP_DIR_NAME / "w" / "a.refs")
    code, said = _verify(tree, capsys)
    assert code == 1 and "notes.fifo: not a regular file" in said and "w/a.refs: not a regular file" in said, said


def test_a_removed_id_written_into_the_card_or_the_stats_is_found(tree, capsys):
    with open(tree / CARD_NAME, "a") as f:
        f.write("\nA note: <urn:uuid:0002> was taken out.\n")
    code, said = _verify(tree, capsys)
    assert code == 1 and f"{CARD_NAME}: holds the id <urn:uuid:0002>, which" in said, said


def test_saved_work_is_read_as_what_it_is(tree, capsys):
    saved = tree / layout.TEMP_DIR_NAME / "work-x" / "spill"
    saved.mkdir(parents=True)
    # References naming 10 and 13 are not 1's or 3's; a spill file (beside its references) holds tokens.
    (saved / "a.refs").write_bytes(_refs(["10", "13"]) + _refs(["31"], doc_id=["13"]))
    (saved / "a.bin").write_bytes(np.arange(3, 400, dtype=np.uint32).tobytes() + b"3 1 3")
    code, said = _verify(tree, capsys)
    assert code == 0, said
    # A removed id among a record's ids, in an extra string column (the scaffold's doc_id) or as its
    # source is found; so is one in a .bin that is no spill file (no references file beside it, or
    # only a link named so), and in a file it cannot parse.
    outside = tree.parent / "outside.refs"
    outside.write_bytes(_refs(["10"]))
    os.symlink(outside, saved / "linked.refs")
    cases = {"b.refs": _refs(["12"]) + _refs(["7", "3"]), "c.refs": _refs(["12"], doc_id=["1"]),
             "d.refs": _refs(["12"], source="3"), "notes.bin": b"ids removed: 3\n", "linked.bin": b"3\n",
             "e.refs": b"PTREFS1\n" + (200_000).to_bytes(4, "little") + b"[" * 200_000 + b"3"}
    for name, data in cases.items():
        (saved / name).write_bytes(data)
        code, said = _verify(tree, capsys)
        assert code == 1 and f"work-x/spill/{name}: holds the id " in said and "Traceback" not in said, said
        os.unlink(saved / name)


def test_a_references_file_too_large_to_parse_is_searched_by_its_bytes(tree, capsys, monkeypatch):
    saved = tree / layout.TEMP_DIR_NAME / "work-x" / "spill"
    saved.mkdir(parents=True)
    (saved / "a.refs").write_bytes(_refs(["10", "13"]))
    monkeypatch.setattr(verify_tool, "MAX_PARSED_REFS", 16)
    code, said = _verify(tree, capsys)
    assert code == 1 and "a.refs: holds the id 1" in said, said  # by its bytes: "1" is in "10"


def test_the_strings_of_a_references_file_are_its_records_strings():
    data = _refs(["a", "b\tc"]) + _refs([]) + _refs(["é", "a\0z"], source="s", note=["n1", "n2"])
    assert list(refs_file_strings(data)) == ["docs.jsonl", "a", "b\tc", "docs.jsonl", "s", "note", "é", "a\0z",
                                             "n1", "n2"]
    assert list(refs_file_strings(b"")) == []
    header = b'{"source": "x", "documents": -1, "numbers": [], "strings": []}'
    negative = b"PTREFS1\n" + len(header).to_bytes(4, "little") + header  # would never move on
    for bad in (data[:-1], data + b"x", b"PTREFS1\n" + data, negative):
        with pytest.raises(ValueError):
            list(refs_file_strings(bad))
