"""Removal lists: every non-blank line is an id (no comment syntax), a BOM is ignored; a file is always a
list (whatever it is called or holds) and a directory a tree whose removals.txt is read strictly as its
audit log; then both jobs that take ``--removal-list`` through the CLI, with ids that start with ``#`` and
a list that is called removals.txt."""

from __future__ import annotations

import errno
import shutil

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import finepdfs_row, fnapi_pipeline, stored_ids
from doc_batches import doc_batches, documents_of

from pipelines import cli, summary
from shards import layout
from shards.removal.lists import REMOVALS_HEADER, REMOVALS_NAME, format_removal_line, read_removal_list
from transforms.core.records import DROPPED, Document
from transforms.removal import DropRemoved, matched_key

RUNNER = "--runner=FnApiRunner"
# Ids the job accepts: '#' is an ordinary character of an id.
ROWS = [
    finepdfs_row("#tag-1", "The first tagged document, about removal requests. " * 4),
    finepdfs_row("#tag-2", "The second tagged document, also to be taken out. " * 5),
    finepdfs_row("doc-3", "An ordinary document that is flagged by name. " * 6),
    *(finepdfs_row(f"keep-{i}", f"Document {i} stays where it is written. " * (3 + i)) for i in range(6)),
]
LOG_LINES = [
    format_removal_line("2025-01-02T03:04:05Z", "0123456789ab", "#tag-1", "0128/00000_0000.bin", 42),
    format_removal_line("2025-01-02T03:04:05Z", "0123456789ab", "doc-3", "0256/00001_0000.bin", 61),
    format_removal_line("2025-02-03T04:05:06Z", "ba9876543210", "#tag-1", "0128/00000_0001.bin", 42),
]


def drop_removed_ids(url: str) -> list[str]:
    """The ids the bucketed job's DropRemoved reads from ``url`` at launch."""
    return DropRemoved(url).ids


# Every reader of a removal list: `remove` and `verify` call read_removal_list, `bucketed` DropRemoved.
READERS = [read_removal_list, drop_removed_ids]


def write(path, text: str, encoding: str = "utf-8") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return str(path)


# --- Parsing --------------------------------------------------------------------------------------------------


def test_every_non_blank_line_stripped_is_an_id_and_hash_is_no_comment(tmp_path):
    text = "#tag-1\n\n   \n  #tag-2\t\n# not a comment\nid-3\n#tag-1\n\t\n"
    assert read_removal_list(write(tmp_path / "list.txt", text)) == ["#tag-1", "#tag-2", "# not a comment", "id-3"]


def test_a_bom_is_not_part_of_the_first_id_and_any_line_end_ends_a_line(tmp_path):
    assert read_removal_list(write(tmp_path / "bom.txt", "\ufeffid-1\r\n#tag-2\r\n")) == ["id-1", "#tag-2"]
    assert read_removal_list(write(tmp_path / "cr.txt", "\ufeffid-1\r#tag-2\rid-3")) == ["id-1", "#tag-2", "id-3"]
    assert read_removal_list(write(tmp_path / "sig.txt", "#tag-1\n", encoding="utf-8-sig")) == ["#tag-1"]


@pytest.mark.parametrize("ids", [["doc-1"], ["doc-1", "id-2"], ["#tag-1", "#tag-2"]], ids=["one", "two", "hash"])
def test_a_list_named_removals_txt_is_a_list(ids, tmp_path):
    path = write(tmp_path / "requests" / REMOVALS_NAME, "".join(f"{i}\n" for i in ids))
    assert {read.__name__: read(path) for read in READERS} == {read.__name__: ids for read in READERS}


@pytest.mark.parametrize("bom", ["", "\ufeff"], ids=["plain", "bom"])
def test_a_tree_given_as_the_list_means_its_audit_log(bom, tmp_path):
    write(tmp_path / "tree" / REMOVALS_NAME, bom + REMOVALS_HEADER + "\n" + "".join(LOG_LINES) + "\n")
    expected = ["#tag-1", "doc-3"]
    path = str(tmp_path / "tree")
    assert {read.__name__: read(path) for read in READERS} == {read.__name__: expected for read in READERS}


@pytest.mark.parametrize("name", [REMOVALS_NAME, "audit-copy.txt"])
def test_a_file_holding_an_audit_log_is_refused_as_a_list_naming_the_line(name, tmp_path):
    path = write(tmp_path / name, REMOVALS_HEADER + "\n" + "".join(LOG_LINES))
    for read in READERS:
        with pytest.raises(ValueError, match=f"{name} line 1 holds '\\|'.*give the tree's directory"):
            read(path)


def test_a_list_that_only_mentions_the_header_later_is_refused(tmp_path):
    path = write(tmp_path / "list.txt", "#tag-1\n" + REMOVALS_HEADER + "\n")
    with pytest.raises(ValueError, match="list.txt line 2 holds"):
        read_removal_list(path)


def test_an_audit_log_with_a_broken_line_names_the_file_and_line(tmp_path):
    write(tmp_path / "tree" / REMOVALS_NAME, REMOVALS_HEADER + "\n" + LOG_LINES[0] + "#tag-2\n")
    with pytest.raises(ValueError, match=r"removals.txt line 3: removals.txt line does not have 5"):
        read_removal_list(str(tmp_path / "tree"))


# --- DropRemoved on the job's batches ---------------------------------------------------------------------------


def test_drop_removed_takes_listed_ids_out_of_each_batch_and_says_which(tmp_path):
    listed = write(tmp_path / "list.txt", "#tag-1\n#tag-2\ndoc-3\nnever-seen\n")
    write(tmp_path / "out" / REMOVALS_NAME, REMOVALS_HEADER + "\n" + LOG_LINES[0])  # an output's own audit log
    also = str(tmp_path / "out")
    docs = [Document(r["id"], r["text"], "docs.parquet", i) for i, r in enumerate(ROWS)]
    # Batches of 2: the first loses both its documents, the second one, the others none.
    with fnapi_pipeline() as p:
        result = p | beam.Create(doc_batches(docs, per_batch=2, with_lid=False)) | DropRemoved(listed, also)
        assert_that(result.kept | beam.FlatMap(lambda b: [(d.id, d.row) for d in documents_of(b)]),
                    equal_to([(r["id"], i) for i, r in enumerate(ROWS) if r["id"] not in FLAGGED]), label="Kept")
        assert_that(result[DROPPED] | beam.CombinePerKey(sum), equal_to([("removed", 3)]), label="Dropped")
        assert_that(result.matched, equal_to([matched_key(i) for i in FLAGGED]), label="Matched")


# --- Both jobs, through the CLI ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


@pytest.fixture(scope="module")
def original(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("orig") / "out"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", RUNNER]) == 0
    assert set(stored_ids(out)) == {r["id"] for r in ROWS}
    return out


# A removal list called removals.txt, outside the tree: three stored ids, two starting with '#', and one
# never stored; a BOM first and a blank line, as an editor may leave them.
REQUEST = "\ufeff#tag-1\n#tag-2\n\ndoc-3\nnever-stored\n"
FLAGGED = {"#tag-1", "#tag-2", "doc-3"}


@pytest.mark.e2e  # a whole job
def test_remove_takes_out_ids_that_start_with_hash_from_a_list_named_removals_txt(original, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(original, out)
    listed = write(tmp_path / "requests" / REMOVALS_NAME, REQUEST)
    capsys.readouterr()
    assert cli.main(["remove", "--output", str(out), "--removal-list", listed, RUNNER]) == 0
    printed = capsys.readouterr().out
    assert "removal list: 4 ids, 3 found in the manifest, 0 already removed (removals.txt lists them), 1 not found" \
        in printed
    assert "not found: never-stored" in printed
    assert set(stored_ids(out)) == {r["id"] for r in ROWS} - FLAGGED
    log = (out / REMOVALS_NAME).read_text(encoding="utf-8").splitlines()
    assert log[:2] == [REMOVALS_HEADER, "# id_field: \"id\""]
    assert sorted(line.split(" | ")[2] for line in log[2:]) == sorted(FLAGGED)
    # The tree itself given as the list (its audit log) names documents already gone: nothing changes.
    before = (out / layout.MANIFEST_NAME).read_bytes()
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(out), RUNNER]) == 0
    assert "removal list: 3 ids, 0 found in the manifest, 3 already removed (removals.txt lists them), 0 not found" \
        in capsys.readouterr().out
    assert (out / layout.MANIFEST_NAME).read_bytes() == before


@pytest.mark.e2e  # a whole job
def test_bucketed_leaves_out_ids_that_start_with_hash_from_a_list_named_removals_txt(source, tmp_path, capsys):
    out = tmp_path / "out"
    listed = write(tmp_path / "requests" / REMOVALS_NAME, REQUEST)
    capsys.readouterr()
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), "--removal-list", listed,
                     "--partitions", "2", RUNNER]) == 0
    assert "removal list: 4 ids, 1 of them not in the input" in capsys.readouterr().out
    assert set(stored_ids(out)) == {r["id"] for r in ROWS} - FLAGGED
    stats = summary.read_stats(str(out))
    assert (stats.removal_list_ids, stats.removal_ids_not_found, stats.drops.get("removed")) == (4, 1, 3)


def test_a_failed_rerun_with_a_list_keeps_no_listed_id_in_its_saved_work(source, tmp_path, monkeypatch, capsys):
    """A bucketed run that stops after its units are done keeps their saved work for a resume; the
    ids its list (and the tree's log) named must not be in it: a unit's completion marker held the
    ids it matched (found by tests/reliability/test_removal_property.py, seed 2325)."""
    from transforms.bucketed.format import BucketedFormat

    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", RUNNER]) == 0
    listed = write(tmp_path / "flagged.txt", "\n".join(sorted(FLAGGED)) + "\n")

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device (injected while publishing)")

    monkeypatch.setattr(BucketedFormat, "compute_stats", fail)
    assert cli.main(["bucketed", "--input", str(source), "--output", str(out), "--removal-list", listed,
                     "--partitions", "2", RUNNER]) != 0
    temp = out / layout.TEMP_DIR_NAME
    markers = [p for p in temp.rglob("*.done")]
    assert markers, "the failed run kept no saved work: nothing was checked"
    holding = [f"{p.relative_to(out)}: {i}" for p in temp.rglob("*") if p.is_file() and not p.is_symlink()
               for i in FLAGGED if i.encode() in p.read_bytes()]
    assert holding == []
