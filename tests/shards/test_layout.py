"""shards.layout and shards.manifest: bucket bounds, names, hashes and the two text formats."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_FILTER

from shards import layout, manifest
from shards.manifest import BucketStats, DatasetStats


@pytest.mark.parametrize(
    "length, bucket",
    [
        (1, "1024"),
        (1024, "1024"),
        (1025, "2048"),
        (2048, "2048"),
        (2049, "4096"),
        (131072, "131072"),
        (131073, "262144"),
        (262144, "262144"),
        (262145, "beyond"),
        (10**9, "beyond"),
    ],
)
def test_bucket_of_length_is_previous_bound_exclusive_upper_inclusive(length, bucket):
    assert layout.bucket_name(length) == bucket


def test_bucket_rejects_an_empty_document():
    with pytest.raises(ValueError, match="at least one token"):
        layout.bucket_name(0)


def test_bucket_ranges_tile_the_lengths():
    assert layout.bucket_range("1024") == (1, 1024)
    assert layout.bucket_range("2048") == (1025, 2048)
    assert layout.bucket_range("beyond") == (262145, None)
    assert len(layout.BUCKET_NAMES) == 10


def test_shard_paths_round_trip():
    assert layout.shard_rel_path("8192", 7, 3) == "8192/p07_00003.npy"
    assert layout.shard_rel_path("beyond", 123, 0, num_partitions=200) == "beyond/p123_00000.npy"
    assert layout.parse_shard_rel_path("8192/p07_00003.npy") == ("8192", 7, 3)
    for bad in ["8192/p07_3.npy", "777/p07_00003.npy", "8192/p07_00003.bin", "p07_00003.npy"]:
        with pytest.raises(ValueError):
            layout.parse_shard_rel_path(bad)


def test_partition_and_shuffle_key_are_pinned():
    # Fixed values: if these change, every existing output tree changes its layout.
    assert layout.partition_of("<urn:uuid:00000000-0000-0000-0000-000000000000>", 32) == 3
    assert layout.partition_of("doc-1", 32) == 27
    assert layout.shuffle_key("doc-1", 0) == 5141533274284215255
    assert layout.shuffle_key("doc-1", 1) == 8857145909548980403


def test_partitions_spread_ids():
    counts = [0] * 32
    for i in range(32_000):
        counts[layout.partition_of(f"id-{i}", 32)] += 1
    assert min(counts) > 800 and max(counts) < 1200


def test_uint16_refused_for_a_vocabulary_that_does_not_fit():
    assert layout.check_dtype("uint16", 50256).itemsize == 2
    with pytest.raises(ValueError, match="use --dtype uint32"):
        layout.check_dtype("uint16", 151935)
    with pytest.raises(ValueError, match="unknown dtype"):
        layout.check_dtype("int8", 10)


def test_manifest_rows_round_trip_and_bad_ids_are_refused():
    row = manifest.format_row("1024/p00_00000.npy", "<urn:uuid:abc>", 691)
    assert row == "1024/p00_00000.npy | <urn:uuid:abc> | 691\n"
    assert manifest.parse_row(row) == ("1024/p00_00000.npy", "<urn:uuid:abc>", 691)
    rows = list(manifest.read_rows([manifest.MANIFEST_HEADER + "\n", row, "\n"]))
    assert rows == [("1024/p00_00000.npy", "<urn:uuid:abc>", 691)]
    for bad in ["", "a|b", "a\nb", " a", "a ", "a\u2028b"]:
        assert manifest.id_problem(bad) is not None
        with pytest.raises(ValueError, match="cannot write id"):
            manifest.format_row("1024/p00_00000.npy", bad, 1)
    with pytest.raises(ValueError, match="header"):
        list(manifest.read_rows(["path | id | count\n"]))


def test_stats_text_round_trips():
    stats = DatasetStats(
        raw_documents=10,
        filter=DEFAULT_FILTER,
        tokenizer="jet-nemotron",
        eos_id=151643,
        vocab_size=151936,
        dtype="uint32",
        partitions=32,
        seed=0,
        buckets={"1024": BucketStats(5, 100, 2), "beyond": BucketStats(1, 300000, 1)},
        drops={"language": 3, "lid_score": 1},
    )
    text = stats.to_text()
    assert "raw_documents: 10" in text and "lid_threshold: 0.9" in text
    back = DatasetStats.from_text(text)
    assert back.kept_documents == 6 and back.total_tokens == 300100 and back.total_files == 3
    assert back.drops == {"language": 3, "lid_score": 1}
    assert back.buckets["1024"] == BucketStats(5, 100, 2)
    assert back.to_text() == text
    with pytest.raises(ValueError, match="kept_documents"):
        DatasetStats.from_text(text.replace("kept_documents: 6", "kept_documents: 7"))


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\x85"])
def test_stats_with_a_line_separator_in_a_value_round_trip(brk):
    """The stats are lines joined by "\\n"; a --keep value (or a field name) holding a character
    str.splitlines breaks at (JSON leaves them as they are) was split there when read: the run that
    published the tree failed reading its own stats, and every command called the tree unreadable."""
    keep = (f'dump != "a{brk}b"',)
    stats = DatasetStats(raw_documents=1, filter={**DEFAULT_FILTER, "keep": keep}, tokenizer="gpt2", eos_id=1,
                         vocab_size=2, dtype="uint32", partitions=1, seed=0, buckets={"1024": BucketStats(1, 2, 1)},
                         drops={f'dump != "a{brk}b"': 0})
    back = DatasetStats.from_text(stats.to_text())
    assert back.filter["keep"] == keep and back.drops == stats.drops
    assert back.to_text() == stats.to_text()
