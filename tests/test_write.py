"""WriteShards and PublishOutput: rolling files, order, manifest, stats, atomic publish."""

from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pytest
from conftest import fnapi_pipeline, tree_hashes

from shards import layout, manifest, tree
from shards.manifest import DatasetStats
from transforms.bucketed.write import ShardConfig, WriteShards
from transforms.core.publish import PublishOutput, StatsSettings, UnaccountedDocumentsError, compute_stats
from transforms.core.records import TokenizedDocument

EOS = 9
SETTINGS = StatsSettings("eng_Latn", 0.9, 1, "test", EOS, vocab_size=100)


def tokenized(doc_id: str, n: int) -> TokenizedDocument:
    tokens = np.full(n, 1 + (len(doc_id) % 5), dtype="<u4")
    tokens[-1] = EOS
    return TokenizedDocument(doc_id, tokens, "src", 0)


DOCS = [tokenized(f"doc-{i}", 5 + i % 7) for i in range(40)] + [tokenized("long", 1500), tokenized("huge", 300_000)]


def run_write(config: ShardConfig, docs=DOCS, drops=("language", "language", "lid_score")):
    tree.claim(config.output, "bucketed")  # what the job's launch does (pipelines.common.prepare_output)
    with fnapi_pipeline() as p:
        groups = (p | "Docs" >> beam.Create(docs) | WriteShards(config)).groups
        raw = p | "Raw" >> beam.Create([len(docs) + len(drops)])
        reasons = p | "Drops" >> beam.Create(list(drops))
        groups | PublishOutput(config, SETTINGS, raw, reasons)


def read_manifest(out) -> list[tuple[str, str, int]]:
    with open(os.path.join(out, layout.MANIFEST_NAME), encoding="utf-8") as f:
        return list(manifest.read_rows(f))


def test_files_roll_and_every_document_is_stored_whole_in_seeded_order(tmp_path):
    out = str(tmp_path / "out")
    config = ShardConfig(output=out, run_id="t1", partitions=2, max_shard_bytes=60)
    run_write(config)
    rows = read_manifest(out)
    assert sorted(r[1] for r in rows) == sorted(d.id for d in DOCS)
    by_id = {d.id: d for d in DOCS}
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
            np.testing.assert_array_equal(data[offset:offset + n], by_id[doc_id].tokens)
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
        compute_stats([], raw_documents=3, drops={"language": 1}, settings=SETTINGS, config=config)


@pytest.mark.parametrize("kwargs", [{"partitions": 0}, {"max_shard_bytes": 2}, {"seed": -1}, {"dtype": "f4"}])
def test_bad_shard_settings_fail_when_configured(kwargs):
    with pytest.raises(ValueError):
        ShardConfig(output="/o", run_id="r", **kwargs)


def _stage_by_hand(out: str, run_id: str, docs=DOCS) -> tuple[ShardConfig, list]:
    """Spill and stage DOCS with the plain functions the DoFns call, without a pipeline."""
    from transforms.bucketed.write import shard_key, write_group
    from transforms.core.records import DocRef

    config = ShardConfig(output=out, run_id=run_id, partitions=2, max_shard_bytes=60)
    tree.claim(out, "bucketed")
    os.makedirs(config.spill_url)
    spill = os.path.join(config.spill_url, "by-hand.bin")
    groups: dict[tuple[str, int], list[DocRef]] = {}
    offset = 0
    with open(spill, "wb") as f:
        for d in docs:
            f.write(d.tokens.tobytes())
            ref = DocRef(layout.shuffle_key(d.id, 0), d.id, len(d.tokens), spill, offset, d.source, d.row)
            groups.setdefault(shard_key(d, config), []).append(ref)
            offset += d.tokens.nbytes
    staged = [write_group(b, p, refs, config) for (b, p), refs in sorted(groups.items())]
    return config, staged


def test_a_publish_that_dies_midway_looks_unfinished_and_a_retry_completes_it(tmp_path, monkeypatch):
    from fsspec.implementations.local import LocalFileSystem

    from transforms.core.publish import publish

    clean_config, clean_groups = _stage_by_hand(str(tmp_path / "clean"), "r")
    publish(clean_groups, len(DOCS), {}, SETTINGS, clean_config)

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
        publish(groups, len(DOCS), {}, SETTINGS, config)
    # No commit marker: nothing here may be taken for a finished output.
    assert not os.path.exists(os.path.join(out, layout.STATS_NAME))
    assert not os.path.exists(os.path.join(out, layout.MANIFEST_NAME))
    monkeypatch.setattr(LocalFileSystem, "mv", real_mv)
    publish(groups, len(DOCS), {}, SETTINGS, config)  # the retry finishes the job
    assert tree_hashes(out) == tree_hashes(str(tmp_path / "clean"))
