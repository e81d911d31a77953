"""shards/removal/idmatch.py: a list longer than the bound matches exactly what the in-memory set matches."""

from __future__ import annotations

import os
import random

import pytest

from shards.removal import idmatch

ODD = ["a\tb", "é€😀", "x y", "#tag", "\x85inside\x0b", "0", "ffff", "\ud7ff"]


def match(listed, logged, rows, scratch, bound, monkeypatch):
    monkeypatch.setenv(idmatch.ID_BOUND_ENV, str(bound))
    matcher = idmatch.match_ids(lambda: iter(listed), lambda: iter(logged), lambda: iter(rows), scratch)
    marks = []
    for first in range(0, len(rows), 7):  # runs of rows, as make_plan asks a file's rows at once
        marks += matcher.hits(first, rows[first:first + 7])
    return marks, matcher.result()


@pytest.mark.parametrize("seed", range(5))
def test_the_partitioned_match_is_the_in_memory_one(seed, tmp_path, monkeypatch):
    rng = random.Random(seed)
    pool = ODD + [f"id-{k}" for k in range(300)]
    rows = rng.sample(pool, 200) + rng.sample(pool, 20)  # some ids stored twice
    listed = [rng.choice(pool + [f"absent-{k}" for k in range(100)]) for _ in range(250)]
    logged = rng.sample(pool, 40) + [f"absent-{k}" for k in range(0, 100, 3)]
    scratch = idmatch.Scratch(None, str(tmp_path / "match"))
    expected = match(listed, logged, rows, scratch, 10_000, monkeypatch)
    assert not (tmp_path / "match").exists()  # held in memory: nothing written
    assert expected[0] == [r in set(listed) for r in rows]
    got = match(listed, logged, rows, scratch, 5, monkeypatch)
    assert got == expected
    assert os.listdir(tmp_path / "match") == []  # every partition file gone


def test_partition_files_hold_no_text_and_any_id_exactly(tmp_path):
    scratch = idmatch.Scratch(None, str(tmp_path))
    idmatch.write_partitions(scratch, "p", 1, ODD)
    data = (tmp_path / "p-0000").read_bytes()
    assert all(b >= 0xE0 for b in data)
    assert list(idmatch.read_numbered(scratch, "p-0000")) == list(enumerate(ODD))


def test_count_distinct_past_the_bound(tmp_path, monkeypatch):
    ids = [f"id-{k % 37}" for k in range(500)] + ODD
    scratch = idmatch.Scratch(None, str(tmp_path / "distinct"))
    monkeypatch.setenv(idmatch.ID_BOUND_ENV, "4")
    assert idmatch.count_distinct(lambda: iter(ids), scratch) == 37 + len(ODD)
    assert os.listdir(tmp_path / "distinct") == []
