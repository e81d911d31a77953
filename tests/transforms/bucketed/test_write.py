"""WriteShards and PublishOutput: rolling files, order, manifest, stats, atomic publish."""

from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pytest
from conftest import fnapi_pipeline, tree_hashes
from doc_batches import token_batch

from shards import layout, manifest, tree
from shards.manifest import DatasetStats
from transforms.bucketed.format import BucketedFormat
from transforms.bucketed.settings import BucketedSettings
from transforms.bucketed.write import ShardConfig, WriteShards, bucketed_keys, write_partition
from transforms.core.batches import RefBatch
from transforms.core.publish import PublishOutput, UnaccountedDocumentsError, publish

EOS = 9
SETTINGS = BucketedSettings(input="in", output="out", language="eng_Latn", lid_threshold=0.9, min_token_count=1,
                            tokenizer="test")


def fmt(config: ShardConfig) -> BucketedFormat:
    return BucketedFormat(SETTINGS, EOS, vocab_size=100, config=config)


def tokenized(doc_id: str, n: int) -> tuple[str, np.ndarray]:
    tokens = np.full(n, 1 + (len(doc_id) % 5), dtype="<u4")
    tokens[-1] = EOS
    return doc_id, tokens


DOCS = [tokenized(f"doc-{i}", 5 + i % 7) for i in range(40)] + [tokenized("long", 1500), tokenized("huge", 300_000)]
TOKENS = dict(DOCS)
DROPS = {"language": 2, "lid_score": 1}


def batches(docs=DOCS, per_batch: int = 16) -> list:
    """The documents as TokenBatches of one input file, rows in order."""
    return [token_batch("src", docs[i:i + per_batch], rows=range(i, min(i + per_batch, len(docs))))
            for i in range(0, len(docs), per_batch)]


def run_write(config: ShardConfig, docs=DOCS, drops=DROPS):
    tree.claim(config.output, "bucketed")  # what the job's launch does (pipelines.launch.prepare_output)
    with fnapi_pipeline() as p:
        groups = (p | "Docs" >> beam.Create(batches(docs)) | WriteShards(config)).groups
        raw = p | "Raw" >> beam.Create([len(docs) + sum(drops.values())])
        reasons = p | "Drops" >> beam.Create(sorted(drops.items()))
        groups | PublishOutput(fmt(config), config, raw, (reasons,))


def read_manifest(out) -> list[tuple[str, str, int]]:
    with open(os.path.join(out, layout.MANIFEST_NAME), encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def test_files_roll_and_every_document_is_stored_whole_in_seeded_order(tmp_path):
    out = str(tmp_path / "out")
    config = ShardConfig(output=out, run_id="t1", partitions=2, max_shard_bytes=60)
    run_write(config)
    rows = read_manifest(out)
    assert sorted(r[1] for r in rows) == sorted(TOKENS)
    files: dict[str, list[tuple[str, int]]] = {}
    for rel, doc_id, n in rows:
        files.setdefault(rel, []).append((doc_id, n))
    for rel, docs in files.items():
        name = layout.parse_shard_rel_path(rel)
        data = np.fromfile(os.path.join(out, rel), dtype="<u4")
        assert len(data) == sum(n for _, n in docs)
        offset = 0
        for doc_id, n in docs:
            assert layout.bucket_name(n) == name.bucket
            assert layout.partition_of(doc_id, 2) == name.partition
            np.testing.assert_array_equal(data[offset:offset + n], TOKENS[doc_id])
            offset += n
        # A file passes max_shard_bytes only when it holds a single document.
        assert len(data) * 4 <= 60 or len(docs) == 1
    # Inside one (bucket, partition), the files in index order hold the documents in shuffle-key order.
    for bucket in ("1024", "2048"):
        for part in range(2):
            ids = [doc_id for rel, doc_id, _ in rows if rel.startswith(f"{bucket}/p{part:02d}_")]
            assert ids == sorted(ids, key=lambda i: layout.shuffle_key(i, 0))
    assert any(rel.endswith("_00001.npy") for rel in files), "nothing rolled over"
    assert {layout.parse_shard_rel_path(r).bucket for r in files} == {"1024", "2048", "beyond"}
    assert not os.path.exists(os.path.join(out, layout.TEMP_DIR_NAME)), "spill and staging must be removed"

    with open(os.path.join(out, layout.STATS_NAME), encoding="utf-8") as f:
        stats = DatasetStats.from_text(f.read())
    assert stats.raw_documents == 45 and stats.kept_documents == 42
    assert stats.drops == {"language": 2, "lid_score": 1}
    assert stats.buckets["beyond"].documents == 1 and stats.buckets["beyond"].tokens == 300_000
    assert stats.total_files == len(files)


def test_a_rerun_replaces_files_the_new_run_does_not_write(tmp_path):
    out = str(tmp_path / "out")
    run_write(ShardConfig(output=out, run_id="a", partitions=4, max_shard_bytes=40))
    before = {p for p in os.listdir(os.path.join(out, "1024"))}
    run_write(ShardConfig(output=out, run_id="b", partitions=1))
    after = set(os.listdir(os.path.join(out, "1024")))
    assert len(before) > 1 and after == {"p00_00000.npy"}
    assert {r[0] for r in read_manifest(out)} == {"1024/p00_00000.npy", "2048/p00_00000.npy", "beyond/p00_00000.npy"}


def test_publish_refuses_when_documents_are_unaccounted_for():
    config = ShardConfig(output="/nowhere", run_id="x")
    with pytest.raises(UnaccountedDocumentsError, match="refusing to publish"):
        publish([], raw_documents=3, drops={"language": 1}, extras={}, fmt=fmt(config), config=config)


@pytest.mark.parametrize("kwargs", [{"partitions": 0}, {"max_shard_bytes": 2}, {"seed": -1}, {"dtype": "f4"}])
def test_bad_shard_settings_fail_when_configured(kwargs):
    with pytest.raises(ValueError):
        ShardConfig(output="/o", run_id="r", **kwargs)


def _stage_by_hand(out: str, run_id: str, docs=DOCS) -> tuple[ShardConfig, list]:
    """Spill and stage DOCS with the plain functions the DoFns call, without a pipeline."""
    config = ShardConfig(output=out, run_id=run_id, partitions=2, max_shard_bytes=60)
    tree.claim(out, "bucketed")
    os.makedirs(config.spill_url)
    spill = os.path.join(config.spill_url, "by-hand.bin")
    [batch] = batches(docs, per_batch=len(docs))
    with open(spill, "wb") as f:
        f.write(batch.tokens.tobytes())
    offsets = (np.cumsum(batch.lengths) - batch.lengths) * batch.tokens.itemsize
    partitions, sort_keys = bucketed_keys(batch, config)
    partitions = np.asarray(partitions)
    staged = []
    for p in sorted(set(partitions.tolist())):
        mine = np.flatnonzero(partitions == p)
        refs = RefBatch(spill, batch.source, [batch.ids[i] for i in mine], sort_keys[mine], batch.lengths[mine],
                        offsets[mine], batch.rows[mine])
        groups, duplicates = write_partition(p, [refs], config)
        assert duplicates == 0
        staged.extend(groups)
    return config, staged


def test_a_publish_that_dies_midway_looks_unfinished_and_a_retry_completes_it(tmp_path, monkeypatch):
    from fsspec.implementations.local import LocalFileSystem

    clean_config, clean_groups = _stage_by_hand(str(tmp_path / "clean"), "r")
    publish(clean_groups, len(DOCS), {}, {}, fmt(clean_config), clean_config)

    out = str(tmp_path / "crash")
    run_write(ShardConfig(output=out, run_id="old", partitions=3))  # an earlier, complete output
    config, groups = _stage_by_hand(out, "new")
    real_mv = LocalFileSystem.mv
    calls = {"n": 0}

    def dying_mv(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("simulated crash while moving shards into place")
        return real_mv(self, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "mv", dying_mv)
    with pytest.raises(OSError, match="simulated crash"):
        publish(groups, len(DOCS), {}, {}, fmt(config), config)
    # No commit marker: nothing here may be taken for a finished output.
    assert not os.path.exists(os.path.join(out, layout.STATS_NAME))
    assert not os.path.exists(os.path.join(out, layout.MANIFEST_NAME))
    monkeypatch.setattr(LocalFileSystem, "mv", real_mv)
    publish(groups, len(DOCS), {}, {}, fmt(config), config)  # the retry finishes the job
    assert tree_hashes(out) == tree_hashes(str(tmp_path / "clean"))


# Copies of ids in two input files: (id, file, row, tokens). The first copy of "x" by (file, row)
# is a.parquet row 5, long enough for another bucket than the other copies.
COPIES = [("x", "b.parquet", 0, 3), ("y", "b.parquet", 1, 6), ("x", "a.parquet", 7, 4), ("x", "a.parquet", 5, 1500)]


def _stage_copies(out: str, copies) -> tuple[ShardConfig, list, int]:
    """COPIES spilled one file per input file, as RefBatches in the order given, then written as
    one partition."""
    config = ShardConfig(output=out, run_id="r", partitions=1)
    os.makedirs(config.spill_url)
    by_source: dict[str, list] = {}
    for c in copies:
        by_source.setdefault(c[1], []).append(c)
    refs = []
    for source, group in by_source.items():
        spill = os.path.join(config.spill_url, f"{source}.bin")
        docs = [(i, np.append(np.full(n - 1, row + 100, "<u4"), np.uint32(EOS))) for i, _, row, n in group]
        batch = token_batch(source, docs, rows=[row for _, _, row, _ in group])
        with open(spill, "wb") as f:
            f.write(batch.tokens.tobytes())
        _, sort_keys = bucketed_keys(batch, config)
        refs.append(RefBatch(spill, source, batch.ids, sort_keys, batch.lengths,
                             (np.cumsum(batch.lengths) - batch.lengths) * 4, batch.rows))
    groups, duplicates = write_partition(0, refs, config)
    return config, groups, duplicates


def test_a_partition_keeps_the_first_copy_of_an_id_by_file_and_row(tmp_path):
    config, groups, duplicates = _stage_copies(str(tmp_path / "one"), COPIES)
    assert duplicates == 2
    staged = {}
    for g in groups:
        with open(g.manifest_url, encoding="utf-8") as f:
            rows = [line.split(" | ") for line in f.read().splitlines()]
        for f in g.files:
            staged[g.bucket] = ([r[1] for r in rows if r[0] == f.rel_path],
                                np.fromfile(os.path.join(config.staged_url, f.rel_path), dtype="<u4"))
    assert sorted(staged) == ["1024", "2048"]
    ids, data = staged["2048"]
    assert ids == ["x"] and len(data) == 1500 and set(data[:-1].tolist()) == {105}  # a.parquet row 5
    ids, data = staged["1024"]
    assert ids == ["y"] and data.tolist() == [101] * 5 + [EOS]
    # The same files whatever order the copies come in.
    _, again, _ = _stage_copies(str(tmp_path / "two"), COPIES[::-1])
    assert [f for g in again for f in g.files] == [f for g in groups for f in g.files]


@pytest.mark.e2e  # a whole job
def test_the_write_stage_has_one_work_item_per_bucket_and_partition_that_holds_documents(tmp_path, monkeypatch):
    """The sample through the CLI (32 partitions): WriteShardFiles gets one element per (bucket,
    partition) group the manifest has rows for, each once, not one per partition; the bytes are
    those recorded before the split."""
    from conftest import SAMPLE_PARQUET
    from test_no_byte_changes import DESCRIPTION, SAMPLE_HASHES

    from pipelines import cli
    from transforms.bucketed import write

    items = []
    original = write.WriteShardFilesFn.process

    def process(self, planned):
        items.append((planned.bucket, planned.partition))
        yield from original(self, planned)

    monkeypatch.setattr(write.WriteShardFilesFn, "process", process)
    out = tmp_path / "out"
    assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", str(out), "--runner=FnApiRunner"]) == 0
    groups = {(path.split("/")[0], int(path.split("/")[1][1:3])) for path, _, _ in read_manifest(out)}
    assert sorted(items) == sorted(groups)
    assert len(items) > len({p for _, p in groups}) > 1  # more work items than partitions
    assert tree_hashes(out, skip=DESCRIPTION) == SAMPLE_HASHES


def _memory_hashes(fs, root: str, skip=()) -> dict[str, str]:
    import hashlib

    return {rel: hashlib.sha256(fs.cat(path)).hexdigest() for path in fs.find(root)
            if (rel := path[len(root) + 1:]) not in skip}


def test_on_an_object_store_groups_are_written_side_by_side_with_the_bytes_unchanged():
    """memory:// has no atomic rename, so WriteShardFiles takes its object-store path: a bundle's
    groups written GROUPS_IN_FLIGHT at a time by threads. The sample's 84 groups (more than are in
    flight, so results come out while others are written) give the bytes recorded for a local run."""
    import fsspec
    from conftest import SAMPLE_PARQUET
    from test_no_byte_changes import DESCRIPTION, SAMPLE_HASHES

    from pipelines import cli
    from transforms.bucketed import write

    fs = fsspec.filesystem("memory")
    try:
        assert cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", "memory://groups/out",
                         "--runner=FnApiRunner"]) == 0
        hashes = _memory_hashes(fs, "/groups/out", skip=DESCRIPTION)
        assert hashes == SAMPLE_HASHES
        assert len({rel.split("_")[0] for rel in hashes if rel.endswith(".npy")}) > write.GROUPS_IN_FLIGHT
    finally:
        fs.rm("/groups", recursive=True)


def test_a_group_that_fails_on_an_object_store_fails_the_run_and_publishes_nothing(monkeypatch):
    import fsspec
    from conftest import SAMPLE_PARQUET

    from pipelines import cli
    from transforms.bucketed import write

    original = write.write_planned

    def write_planned(group, config, fs=None, scratch=None):
        if (group.bucket, group.partition) == ("2048", 3):
            raise OSError("the store went away while writing 2048/p03")
        return original(group, config, fs, scratch)

    monkeypatch.setattr(write, "write_planned", write_planned)
    fs = fsspec.filesystem("memory")
    try:
        with pytest.raises(OSError, match="the store went away while writing 2048/p03"):
            cli.main(["bucketed", "--input", str(SAMPLE_PARQUET), "--output", "memory://failing/out",
                      "--runner=FnApiRunner"])
        assert not fs.exists(f"/failing/out/{layout.STATS_NAME}")
        assert not fs.exists(f"/failing/out/{layout.MANIFEST_NAME}")
    finally:
        if fs.exists("/failing"):
            fs.rm("/failing", recursive=True)


def test_groups_written_at_once_hold_at_most_the_scratch_budget_between_them():
    """Each thread takes its group's bytes before writing; a group larger than the budget waits
    until it is alone, and then holds all of it."""
    import threading
    import time

    from transforms.bucketed.write import ScratchBudget

    budget, peak, lock = ScratchBudget(100), [0], threading.Lock()

    def group(size):
        with budget.hold(size):
            with lock:
                peak[0] = max(peak[0], budget.used)
            time.sleep(0.02)

    threads = [threading.Thread(target=group, args=(n,)) for n in (40, 30, 500, 20, 60, 10, 70)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert peak[0] <= 100 and budget.used == 0


@pytest.mark.parametrize("seed", [-1, 1 << 64, 99999999999999999999999])
def test_a_seed_the_shuffle_key_cannot_take_is_refused_at_launch(tmp_path, seed):
    """The seed is 8 bytes of the shuffle hash's key (layout.shuffle_key): --seed 99999999999999999999999
    passed the launch and failed in every worker with OverflowError's traceback."""
    from transforms.scaffold.write import LlmcShardConfig

    for make in (ShardConfig, LlmcShardConfig):
        with pytest.raises(ValueError, match="seed must be within 0"):
            make(output=str(tmp_path), run_id="t", seed=seed)


def test_a_min_token_count_the_filter_cannot_compare_is_refused_at_launch():
    """--min-token-count 99999999999999999999999 passed the launch and failed in every worker with
    Arrow's OverflowError traceback (the token count column is compared as int64)."""
    with pytest.raises(ValueError, match="--min-token-count must be within 0"):
        BucketedSettings(input="in", output="out", min_token_count=99999999999999999999999)
