"""One reader of checksums.sha256 (shards.manifest.read_checksums) for remove and verify: remove
refuses a damaged file, verify reports it, both naming the file and the line."""

from __future__ import annotations

import pytest

from shards import layout, manifest
from transforms.tools.verify import checksum_table

DIGEST = "a" * 64


def test_a_tree_without_checksums_has_none_and_verify_says_so(tmp_path):
    assert manifest.read_checksums(str(tmp_path)) is None
    assert checksum_table(str(tmp_path)) == (
        None, [f"{layout.CHECKSUMS_NAME}: missing: the shards' contents cannot be checked"])


def test_checksums_are_read_as_sha256sum_writes_them(tmp_path):
    (tmp_path / layout.CHECKSUMS_NAME).write_text(f"{DIGEST}  1024/p00_00000.npy\n")
    assert manifest.read_checksums(str(tmp_path)) == {"1024/p00_00000.npy": DIGEST}
    assert checksum_table(str(tmp_path)) == ({"1024/p00_00000.npy": DIGEST}, [])


@pytest.mark.parametrize(("data", "problem"), [
    (f"{DIGEST}  1024/a.npy\ngarbage line\n".encode(), "line 2: not a sha256sum line: 'garbage line'"),
    (b"\xff\xfe", "is not UTF-8"),
])
def test_a_damaged_line_is_named_by_both_readers(tmp_path, data, problem):
    path = tmp_path / layout.CHECKSUMS_NAME
    path.write_bytes(data)
    with pytest.raises(ValueError, match=problem):
        manifest.read_checksums(str(tmp_path))
    table, problems = checksum_table(str(tmp_path))
    assert table is None and problems[0].startswith(f"{layout.CHECKSUMS_NAME}: unreadable: {path}")
    assert problem in problems[0]
