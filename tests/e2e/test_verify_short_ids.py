"""verify's search for removed ids in the tree's other files, with ids that are short or prefixes of
others (numbers, say): a removed ``3`` is not in the stats' numbers, nor ``1`` in ``10``'s saved work."""

from __future__ import annotations

import numpy as np
from conftest import finepdfs_row

from pipelines import cli
from shards import layout
from transforms.core.batches import RefBatch
from transforms.core.spill import encode_refs, refs_file_ids

RUNNER = ["--runner=FnApiRunner"]
ROWS = [finepdfs_row(str(i), f"Line {i} of a short document. " * (3 + i % 7)) for i in range(40)]


def _refs(ids: list[str]) -> bytes:
    n = len(ids)
    ones = np.ones(n, np.int64)
    return encode_refs(RefBatch("x.bin", "docs.jsonl", ids, ones, ones, np.arange(n, dtype=np.int64), ones))


def _verify(out, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["verify", "--output", str(out), *RUNNER])
    return code, capsys.readouterr().out


def test_a_removed_number_is_not_found_in_the_stats_or_the_card(source, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), *RUNNER]) == 0
    listed = tmp_path / "flagged.txt"
    listed.write_text("3\n1\n")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(listed), *RUNNER]) == 0
    assert b"3" in (out / layout.STATS_NAME).read_bytes()  # the premise: the number is in their text
    code, said = _verify(out, capsys)
    assert code == 0, said
    # Saved work put in the temporary directory: references naming 10 and 13 are not 1's or 3's, a
    # spill file's tokens hold no id; references naming 3 are found, by their ids, not their bytes.
    saved = out / layout.TEMP_DIR_NAME / "work-x" / "spill"
    saved.mkdir(parents=True)
    (saved / "a.refs").write_bytes(_refs(["10", "13"]) + _refs(["31"]))
    (saved / "a.bin").write_bytes(np.arange(3, 400, dtype=np.uint32).tobytes() + b"3 1 3")
    code, said = _verify(out, capsys)
    assert code == 0, said
    (saved / "b.refs").write_bytes(_refs(["12"]) + _refs(["7", "3"]))
    code, said = _verify(out, capsys)
    assert code == 1 and f"{layout.TEMP_DIR_NAME}/work-x/spill/b.refs: holds the id 3, which" in said, said
    assert "a.refs" not in said and "a.bin" not in said
    # A file that is not a references file under that name is searched byte by byte, as before.
    (saved / "b.refs").write_bytes(b"not references: 3")
    code, said = _verify(out, capsys)
    assert code == 1 and "b.refs: holds the id 3" in said


def test_the_ids_of_a_references_file_are_its_records_id_columns():
    data = _refs(["a", "b\tc"]) + _refs([]) + _refs(["é", "a"])
    assert list(refs_file_ids(data)) == ["a", "b\tc", "é", "a"]
    assert list(refs_file_ids(b"")) == []
    header = b'{"source": "x", "documents": -1, "numbers": [], "strings": []}'
    negative = b"PTREFS1\n" + len(header).to_bytes(4, "little") + header  # would never move on
    for bad in (data[:-1], data + b"x", b"PTREFS1\n" + data, negative):
        try:
            list(refs_file_ids(bad))
        except ValueError:
            continue
        raise AssertionError(f"{bad[:20]!r}... was read as a references file")
