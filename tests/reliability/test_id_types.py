"""Issue 35, case 9b: an ``id`` column that is not a string. An integer column (parquet int64, or
an integer in JSONL) is accepted, as docs/inputs.md says: each id is its decimal text, and the tree
is the one a string column holding that text gives. Any other type (a float, a boolean) stops at
launch in one line naming the file and the column."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import REPO, tree_hashes

from pipelines import cli
from shards import layout, manifest

RUNNER = "--runner=FnApiRunner"
TEXTS = [f"Document number {i} speaks of integer ids. " * (2 + i % 5) for i in range(24)]
DESCRIPTION = ("dataset_stats.json", "README.md", ".pretokenize-tree.json")


def _parquet(path, ids) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": pa.array(TEXTS, pa.string())}), path)
    return str(path)


def _bucketed(source: str, out) -> int:
    return cli.main(["bucketed", "--input", source, "--output", str(out), "--partitions", "2", "--language", "none",
                     "--token-count-field", "none", RUNNER])


def test_an_int64_id_column_is_read_as_its_decimal_text(tmp_path):
    numbers = [10 ** 12 + 7 * i for i in range(len(TEXTS))]
    assert _bucketed(_parquet(tmp_path / "int" / "docs.parquet", pa.array(numbers, pa.int64())), tmp_path / "a") == 0
    assert _bucketed(_parquet(tmp_path / "str" / "docs.parquet", pa.array([str(n) for n in numbers], pa.string())),
                     tmp_path / "b") == 0
    assert tree_hashes(tmp_path / "a", DESCRIPTION) == tree_hashes(tmp_path / "b", DESCRIPTION)
    with open(tmp_path / "a" / layout.MANIFEST_NAME, encoding="utf-8") as f:
        assert sorted(doc_id for _, doc_id, _ in manifest.read_rows(f)) == sorted(map(str, numbers))


def test_an_id_column_of_another_type_stops_at_launch_naming_the_file_and_column(tmp_path, capsys):
    source = _parquet(tmp_path / "float" / "docs.parquet", pa.array([float(i) for i in range(len(TEXTS))]))
    assert _bucketed(source, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert source in err[0] and "column 'id' has type double, expected a string or an integer" in err[0], err
    assert not (tmp_path / "out" / layout.STATS_NAME).exists()


def test_inputs_md_says_an_integer_id_is_accepted():
    text = (REPO / "docs" / "inputs.md").read_text(encoding="utf-8")
    assert "an integer `id` column" in text and "its decimal text" in text
