"""Removal both ways: re-running the job with a removal list, and the surgical `remove` job."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import finepdfs_row, stored_ids, tree_hashes

from pipelines import bucketed, cli, remove, verify
from shards import layout, manifest, tree
from shards.card import CARD_NAME
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME
from shards.removal.lists import REMOVALS_NAME, parse_removal_line, read_removal_list
from shards.removal.rewrite import rewrite_file
from transforms.core.records import UsageError

RUNNER = ["--runner=FnApiRunner"]
# 40 short documents, and one long enough to sit alone in the 2048 bucket.
ROWS = [finepdfs_row(f"doc-{i:02d}", f"Line {i} of a short document. " * (3 + i % 9)) for i in range(40)]
ROWS.append(finepdfs_row("long-one", "A long document about removal requests. " * 200))


@pytest.fixture(scope="module")
def original(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("orig") / "out"
    bucketed.run(["--input", str(source), "--output", str(out), "--partitions", "4", *RUNNER])
    return out


def flagged_ids(out) -> list[str]:
    """Ids to remove: two documents sharing a file, one from another file, and the long one alone in its file."""
    rows = list(manifest.read_rows(open(os.path.join(out, layout.MANIFEST_NAME), encoding="utf-8")))
    by_file: dict[str, list[str]] = {}
    for rel, doc_id, _ in rows:
        by_file.setdefault(rel, []).append(doc_id)
    shared = next(ids for ids in by_file.values() if len(ids) >= 3)
    other = next(ids for rel, ids in by_file.items() if shared[0] not in ids and len(ids) >= 2)
    assert by_file[next(rel for rel in by_file if rel.startswith("2048/"))] == ["long-one"]
    return [shared[0], shared[2], other[1], "long-one"]


def write_list(path, ids) -> str:
    path.write_text("\n".join(ids) + "\n\nnever-stored-id\n", encoding="utf-8")
    return str(path)


def test_both_ways_give_the_same_shards_and_every_other_document(original, source, tmp_path):
    flagged = flagged_ids(original)
    removal_list = write_list(tmp_path / "flagged.txt", flagged)

    rerun = tmp_path / "rerun"
    stats = bucketed.run(["--input", str(source), "--output", str(rerun), "--partitions", "4",
                          "--removal-list", removal_list, *RUNNER])
    assert stats.drops["removed"] == 4
    assert (stats.removal_list_ids, stats.removal_ids_not_found) == (5, 1)

    surgical = tmp_path / "surgical"
    shutil.copytree(original, surgical)
    before = tree_hashes(surgical)
    plan = remove.run(["--output", str(surgical), "--removal-list", removal_list, *RUNNER])
    assert (plan.matches.missing, plan.matches.sample) == (1, ["never-stored-id"])
    after = tree_hashes(surgical)

    # Both trees record the request in removals.txt: verify needs no list, and re-runs keep them out.
    assert verify.run(["--output", str(surgical), "--input", str(source), *RUNNER]) == 0
    assert verify.run(["--output", str(rerun), "--input", str(source), *RUNNER]) == 0
    logged = [parse_removal_line(line) for line in (rerun / REMOVALS_NAME).read_text().splitlines()[2:]]
    assert sorted(line[2] for line in logged) == sorted([*flagged, "never-stored-id"])
    assert all(line[3] == "-" and line[4] == 0 for line in logged)
    for out in (rerun, surgical):
        assert set(stored_ids(out)) == {r["id"] for r in ROWS} - set(flagged)
    # Only the files that held a flagged id changed; the one left empty is gone.
    touched = {f.rel_path for f in plan.files}
    assert len(touched) == 3
    for rel, digest in before.items():
        if rel.endswith(".npy") and rel not in touched:
            assert after[rel] == digest, f"{rel} changed"
    assert not (surgical / "2048").exists() or not os.listdir(surgical / "2048")
    # Surgery and a re-run agree byte for byte on shards and manifest, and on every count.
    # (The description files differ too: the re-run's flags name the removal list.)
    counts = (layout.STATS_NAME, REMOVALS_NAME, STATS_JSON_NAME, CARD_NAME)
    shard_and_manifest = {k: v for k, v in tree_hashes(rerun).items() if k not in counts}
    assert shard_and_manifest == {k: v for k, v in after.items() if k not in counts}
    a = DatasetStats.from_text((rerun / layout.STATS_NAME).read_text())
    b = DatasetStats.from_text((surgical / layout.STATS_NAME).read_text())
    assert (a.buckets, a.drops, a.raw_documents) == (b.buckets, b.drops, b.raw_documents)
    audit = [parse_removal_line(line) for line in (surgical / REMOVALS_NAME).read_text().splitlines()[2:]]
    assert sorted(line[2] for line in audit) == sorted(flagged)
    assert all(line[1] == plan.run and line[3].endswith(".npy") and line[4] > 0 for line in audit)

    # The same list again changes nothing at all.
    assert remove.run(["--output", str(surgical), "--removal-list", removal_list, *RUNNER]) is None
    assert tree_hashes(surgical) == after


def test_a_removal_interrupted_after_the_first_shard_is_finished_by_a_rerun(original, tmp_path):
    removal_list = write_list(tmp_path / "flagged.txt", flagged_ids(original))
    clean = tmp_path / "clean"
    shutil.copytree(original, clean)
    remove.run(["--output", str(clean), "--removal-list", removal_list, *RUNNER])

    crashed = tmp_path / "crashed"
    shutil.copytree(original, crashed)
    options, _ = remove.parse_args(["--output", str(crashed), "--removal-list", removal_list])
    plan = remove.prepare(options)  # journal written, commit marker removed
    rewrite_file(str(crashed), plan.file_plan(0), itemsize=4)  # ... and the process dies here
    assert not (crashed / layout.STATS_NAME).exists(), "a half-done removal must not look finished"
    assert verify.run(["--output", str(crashed), *RUNNER]) == 1

    resumed = remove.run(["--output", str(crashed), "--removal-list", removal_list, *RUNNER])
    assert resumed.run == plan.run
    strip = lambda h: {k: v for k, v in h.items() if k != REMOVALS_NAME}  # noqa: E731 - run ids differ
    assert strip(tree_hashes(crashed)) == strip(tree_hashes(clean))
    lines = lambda p: sorted(parse_removal_line(x)[2:] for x in p.read_text().splitlines()[2:])  # noqa: E731
    assert lines(crashed / REMOVALS_NAME) == lines(clean / REMOVALS_NAME)
    assert not (crashed / layout.TEMP_DIR_NAME).exists()


def test_removal_list_format(tmp_path):
    path = tmp_path / "list.txt"
    path.write_text("#id-0\n\n  id-1  \nid-2\nid-1\n", encoding="utf-8")  # no comment syntax: '#' is part of an id
    assert read_removal_list(str(path)) == ["#id-0", "id-1", "id-2"]
    with pytest.raises(FileNotFoundError, match="removal list not found"):
        read_removal_list(str(tmp_path / "missing.txt"))


def test_remove_refuses_an_unfinished_tree(original, tmp_path):
    out = tmp_path / "unfinished"
    shutil.copytree(original, out)
    (out / layout.STATS_NAME).unlink()
    with pytest.raises(UsageError, match="not a finished output tree"):
        remove.run(["--output", str(out), "--removal-list", write_list(tmp_path / "l.txt", ["doc-01"]), *RUNNER])


def test_a_rerun_after_surgery_keeps_the_removed_documents_out(original, source, tmp_path):
    flagged = flagged_ids(original)
    out = tmp_path / "out"
    shutil.copytree(original, out)
    remove.run(["--output", str(out), "--removal-list", write_list(tmp_path / "f.txt", flagged), *RUNNER])
    after_surgery = tree_hashes(out)
    from pipelines import export

    assert export.run(["megatron", "--output", str(out)]) == 0  # recorded in the tree: the re-run deletes it
    stats = bucketed.run(["--input", str(source), "--output", str(out), "--partitions", "4", *RUNNER])
    assert set(stored_ids(out)) == {r["id"] for r in ROWS} - set(flagged)
    assert stats.drops == {"removed": 4}
    assert not (out / "megatron").exists(), "an index of the old shards must not survive a re-run"
    rerun = tree_hashes(out)
    # The record lists the export no more; the stats and their description name the removal list.
    skip = {layout.STATS_NAME, tree.RECORD_NAME, STATS_JSON_NAME, CARD_NAME}
    assert {k: v for k, v in rerun.items() if k not in skip} == {
        k: v for k, v in after_surgery.items() if k not in skip}


def test_remove_rewrites_the_manifest_holding_one_affected_files_rows_at_a_time(original, tmp_path, monkeypatch):
    """finish_removal streams: an affected file's rows are read from the plan's directory when the
    manifest reaches that file, never all of them first (which held every removed pair at once)."""
    from shards.removal import journal, rewrite

    out = tmp_path / "out"
    shutil.copytree(original, out)
    events: list[tuple[str, str]] = []
    real_file_plan, real_rows, real_finish = journal.RemovalPlan.file_plan, manifest.read_rows, rewrite.finish_removal

    def file_plan(self, k):
        events.append(("plan", self.files[k].rel_path))
        return real_file_plan(self, k)

    def read_rows(lines):
        for row in real_rows(lines):
            events.append(("row", row[0]))
            yield row

    def finish(*args, **kwargs):
        events.clear()  # only the finish step is watched
        return real_finish(*args, **kwargs)

    monkeypatch.setattr(journal.RemovalPlan, "file_plan", file_plan)
    monkeypatch.setattr(manifest, "read_rows", read_rows)
    monkeypatch.setattr(rewrite, "finish_removal", finish)
    removal_list = write_list(tmp_path / "flagged.txt", flagged_ids(original))
    assert cli.main(["remove", "--output", str(out), "--removal-list", removal_list, *RUNNER]) == 0
    last_row = max(k for k, (kind, _) in enumerate(events) if kind == "row")
    reads = [k for k, (kind, _) in enumerate(events[:last_row]) if kind == "plan"]
    assert len(reads) == 3, events  # three affected files, each read once while the manifest is rewritten
    for k in reads:
        assert events[k - 1] == ("row", events[k][1]), "a file's rows were read before the manifest reached it"
    assert set(stored_ids(out)) == {r["id"] for r in ROWS} - set(flagged_ids(original))


def test_removal_list_ids_is_the_number_of_ids_removals_txt_lists_after_every_command(original, source, tmp_path):
    """dataset_stats.txt's removal_list_ids counts the ids the tree's log records as removed, after
    remove (which left the count of the tree's first run), a re-run with a list, and a re-run that
    finishes a pending removal."""
    from shards.removal.lists import read_log

    def counts(out):
        stats = DatasetStats.from_text((out / layout.STATS_NAME).read_text())
        return stats.removal_list_ids, stats.removal_ids_not_found, len(read_log(str(out / REMOVALS_NAME)).ids)

    flagged = flagged_ids(original)
    out = tmp_path / "out"
    shutil.copytree(original, out)
    (tmp_path / "first.txt").write_text("\n".join(flagged[:2]) + "\n", encoding="utf-8")
    assert cli.main(["remove", "--output", str(out), "--removal-list", str(tmp_path / "first.txt"), *RUNNER]) == 0
    assert counts(out) == (2, 0, 2)
    rerun = ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "4", *RUNNER]
    listed = write_list(tmp_path / "second.txt", [flagged[2]])  # and never-stored-id
    assert cli.main([*rerun, "--removal-list", listed]) == 0
    assert counts(out) == (4, 1, 4)
    (tmp_path / "third.txt").write_text(flagged[3] + "\n", encoding="utf-8")
    assert remove.prepare(remove.RemoveSettings(str(out), str(tmp_path / "third.txt"))) is not None  # then killed
    assert cli.main(rerun) == 0  # finishes the pending removal
    assert counts(out) == (5, 1, 5)
    assert set(stored_ids(out)) == {r["id"] for r in ROWS} - set(flagged)
