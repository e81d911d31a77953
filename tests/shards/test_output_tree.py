"""OutputTree: which kind of tree, whether it is finished, what its stats say."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_FILTER

from shards import layout, llmc, manifest
from shards.tree import (
    RECORD_NAME,
    IncompleteTreeError,
    NotOurTreeError,
    OutputTree,
    TreeRecord,
    UnreadableStatsError,
)

BUCKETED_STATS = manifest.DatasetStats(
    raw_documents=3, filter=DEFAULT_FILTER, tokenizer="test", eos_id=2,
    vocab_size=100, dtype="uint16", partitions=2, seed=0,
    buckets={"1024": manifest.BucketStats(documents=2, tokens=9, files=1)}, drops={"lid_score": 1},
)
SCAFFOLD_STATS = llmc.ScaffoldStats(
    raw_documents=2, tokenizer="gpt2", annotate=False, long_docs="drop", max_word_chars=100, val_fraction=0.0,
    seed=0, shard_tokens=1000, countdown_mismatches=0,
    splits={"train": llmc.SplitStats(documents=2, sequences=2, words=5, tokens=12, files=1)}, drops={},
)


def make_tree(root, *, record: str | None = None, stats: str | bytes | None = None, manifest_file=False,
              splits=()) -> str:
    root.mkdir(parents=True, exist_ok=True)
    if record is not None:
        (root / RECORD_NAME).write_text(TreeRecord(record).to_json())
    if isinstance(stats, str):
        (root / layout.STATS_NAME).write_text(stats, encoding="utf-8")
    elif stats is not None:
        (root / layout.STATS_NAME).write_bytes(stats)
    if manifest_file:
        (root / layout.MANIFEST_NAME).write_text(manifest.MANIFEST_HEADER + "\n")
    for split in splits:
        (root / split).mkdir()
    return str(root)


def test_a_finished_bucketed_tree(tmp_path):
    out = OutputTree.open(make_tree(tmp_path / "b", record="bucketed", stats=BUCKETED_STATS.to_text()))
    assert (out.kind, out.finished) == ("bucketed", True)
    assert out.record == TreeRecord("bucketed")
    assert out.stats_text == BUCKETED_STATS.to_text()
    stats = out.stats()
    assert isinstance(stats, manifest.DatasetStats) and stats.to_text() == BUCKETED_STATS.to_text()
    assert out.require_finished() is out


def test_a_finished_scaffold_tree(tmp_path):
    out = OutputTree.open(make_tree(tmp_path / "s", record="scaffold", stats=SCAFFOLD_STATS.to_text()))
    assert (out.kind, out.finished) == ("scaffold", True)
    stats = out.stats()
    assert isinstance(stats, llmc.ScaffoldStats) and stats.to_text() == SCAFFOLD_STATS.to_text()


def test_an_unfinished_tree_says_so_naming_it(tmp_path):
    url = make_tree(tmp_path / "u", record="bucketed", manifest_file=True)
    out = OutputTree.open(url)
    assert (out.kind, out.finished, out.stats_text) == ("bucketed", False, None)
    with pytest.raises(IncompleteTreeError, match=rf"^{url} has no dataset_stats\.txt, so it is not a finished "
                                                  r"output tree: .*commit point"):
        out.require_finished()
    with pytest.raises(IncompleteTreeError) as e:
        out.stats()
    assert e.value.problem == ("dataset_stats.txt: missing: the tree is not finished "
                               "(a job died or is still publishing)")
    assert isinstance(e.value, FileNotFoundError)


@pytest.mark.parametrize(
    ("files", "kind"),
    [
        (dict(stats=SCAFFOLD_STATS.to_text(), splits=["train"]), "scaffold"),  # the stats say it
        (dict(stats=SCAFFOLD_STATS.to_text()), "scaffold"),
        (dict(stats=BUCKETED_STATS.to_text(), manifest_file=True), "bucketed"),  # the manifest says it
        (dict(stats="scaffold test tree\n", splits=["train", "val"]), "scaffold"),  # the splits say it
        (dict(manifest_file=True), "bucketed"),  # unfinished, told by its files
        (dict(stats=BUCKETED_STATS.to_text()), None),  # nothing says which
        ({}, None),
    ],
)
def test_a_tree_without_a_record_is_told_by_its_stats_then_its_files(tmp_path, files, kind):
    out = OutputTree.open(make_tree(tmp_path / "legacy", **files))
    assert out.record is None and out.kind == kind


def test_the_record_decides_the_kind(tmp_path):
    # A scaffold record with stats that are not the scaffold format: the stats are damaged, the kind is not.
    out = OutputTree.open(make_tree(tmp_path / "r", record="scaffold", stats=BUCKETED_STATS.to_text(),
                                    manifest_file=True))
    assert out.kind == "scaffold"
    with pytest.raises(UnreadableStatsError, match="not scaffold dataset stats"):
        out.stats()


@pytest.mark.parametrize(
    ("stats", "reason"),
    [
        (BUCKETED_STATS.to_text().replace("dtype: uint16\n", ""), "dataset stats lack the setting 'dtype'"),
        (BUCKETED_STATS.to_text().replace("total_tokens: 9", "total_tokens: 10"),
         "dataset stats say total_tokens 10, but the tables sum to 9"),
        (BUCKETED_STATS.to_text().replace("1024 | 2 | 9 | 1", "1024 | 2 | 9"), "not enough values to unpack"),
        (BUCKETED_STATS.to_text().encode().replace(b"eng_Latn", b"eng\xffLatn"), "it is not UTF-8 text"),
        ("", "dataset stats lack the setting 'raw_documents'"),
    ],
)
def test_damaged_stats_are_an_error_naming_the_file(tmp_path, stats, reason):
    url = make_tree(tmp_path / "d", record="bucketed", stats=stats)
    out = OutputTree.open(url)
    assert out.finished
    with pytest.raises(UnreadableStatsError) as e:
        out.stats()
    assert str(e.value).startswith(f"{url}/dataset_stats.txt is unreadable: ")
    assert reason in str(e.value)
    assert e.value.problem.startswith("dataset_stats.txt: unreadable: ") and reason in e.value.problem


def test_a_damaged_record_or_a_missing_directory_is_refused(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / RECORD_NAME).write_text('{"tool": "someone-else"}')
    with pytest.raises(NotOurTreeError, match="is damaged"):
        OutputTree.open(str(tmp_path / "r"))
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        OutputTree.open(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        OutputTree.open(str(tmp_path / "file"))
