"""The llm.c scaffold format helpers: shard layout, stats file, the format checks a verifier runs,
and the placement of documents into exactly filled shards."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from shards import layout, llmc
from shards.llmc import ScaffoldStats, SplitStats, check_llmc_shard, check_llmc_split
from transforms.core.batches import RefBatch, Refs
from transforms.core.publish import UnaccountedDocumentsError, check_accounting, publish
from transforms.scaffold.encode import DocumentCounts, countdown_tokens, sum_counts
from transforms.scaffold.settings import ScaffoldSettings
from transforms.scaffold.write import (
    LlmcShardConfig,
    ScaffoldFormat,
    StagedShard,
    keep_first_copies,
    make_placement,
    place_range,
    write_shard,
)

FF0, EOT = llmc.FF_BASE, llmc.GPT2_EOT


def doc(*word_lengths: int) -> list[int]:
    """A sound document: one countdown per word, each followed by that many BPE ids."""
    return countdown_tokens([[100 + i] * n for i, n in enumerate(word_lengths)]).tolist()


def shard_bytes(tokens) -> bytes:
    return llmc.make_header(len(tokens)) + np.asarray(tokens, dtype="<u2").tobytes()


STREAM = doc(1, 2, 1) + doc(3) + doc(1, 1, 1, 1, 2) + doc(2, 2)


def test_shard_lengths_and_names():
    assert llmc.shard_lengths(25, 10) == [10, 10, 5]
    assert llmc.shard_lengths(20, 10) == [10, 10]
    assert llmc.shard_lengths(0, 10) == []
    assert llmc.shard_rel_path("val", 7) == "val/shard_007.bin"
    assert llmc.shard_digits(1000) == 3 and llmc.shard_digits(1001) == 4
    assert llmc.shard_rel_path("train", 12, llmc.shard_digits(1001)) == "train/shard_0012.bin"
    assert llmc.parse_shard_name("shard_0012.bin") == 12
    with pytest.raises(ValueError):
        llmc.parse_shard_name("shard_12.bin")
    assert llmc.sorted_shard_files(["d/shard_010.bin", "d/x.txt", "d/shard_002.bin"]) == [
        "d/shard_002.bin", "d/shard_010.bin"]


def test_stats_round_trip_and_tables_must_add_up():
    stats = ScaffoldStats(
        raw_documents=10, tokenizer="gpt2", annotate=True, long_docs="chunk", max_word_chars=1000,
        val_fraction=0.05, seed=3, shard_tokens=100, countdown_mismatches=2,
        splits={"train": SplitStats(6, 8, 900, 1200, 12), "val": SplitStats(1, 1, 50, 70, 1)},
        drops={"too_many_words": 1, "no_words": 2},
    )
    text = stats.to_text()
    assert "format: llmc-scaffold" in text and "val | 1 | 1 | 50 | 70 | 1" in text
    assert llmc.is_scaffold_stats(text)
    assert ScaffoldStats.from_text(text) == stats
    with pytest.raises(ValueError, match="total_tokens"):
        ScaffoldStats.from_text(text.replace("total_tokens: 1270", "total_tokens: 1271"))
    with pytest.raises(ValueError, match="not scaffold"):
        ScaffoldStats.from_text("raw_documents: 3\n")


def test_a_sound_stream_passes_whole_and_cut_anywhere():
    assert check_llmc_shard(shard_bytes(STREAM)) == []
    for size in range(1, len(STREAM) + 1):
        parts = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
        names = [llmc.shard_rel_path("train", i) for i in range(len(parts))]
        assert check_llmc_split([shard_bytes(p) for p in parts], names=names, shard_tokens=size) == [], size
        # Each shard on its own, told whether it is its split's first and last.
        for i, part in enumerate(parts):
            assert check_llmc_shard(shard_bytes(part), starts_document=i == 0, ends_document=i == len(parts) - 1) == []
    # Small blocks exercise the state carried between blocks inside one shard.
    assert check_llmc_shard(shard_bytes(STREAM), block_tokens=1) == []


def _one(tokens, **kwargs) -> str:
    problems = check_llmc_shard(shard_bytes(tokens), name="s", **kwargs)
    assert len(problems) == 1, problems
    return problems[0]


@pytest.mark.parametrize(
    "tokens, message",
    [
        (STREAM[:4] + [51257] + STREAM[5:], "1 token ids above 51256 (first at s token 4)"),
        ([EOT] + STREAM, "1 empty documents"),
        (STREAM[:8] + [EOT] + STREAM[8:], "1 empty documents (an EOT right after an EOT, or at the start of the split) "
                                          "(first at s token 8)"),
        ([100] + STREAM, "1 documents that do not start with a countdown token (first at s token 0)"),
        ([FF0 + 1, 7, FF0, EOT], "1 countdown tokens not followed by a BPE token (another countdown or an EOT "
                                 "follows) (first at s token 3)"),
        ([FF0 + 1, FF0, 7, EOT], "countdown tokens not followed by a BPE token"),
        ([FF0 + 2, 7, FF0, 8, EOT], "1 countdown tokens that are not one less than the countdown before them "
                                    "(first at s token 2)"),
        ([FF0 + 1, 7, EOT], "1 documents whose last countdown token is not <ff_0> (first at s token 2)"),
        (STREAM[:-1], "the last document does not end with EOT 50256"),
    ],
)
def test_each_kind_of_damage_is_found(tokens, message):
    assert message in _one(tokens)


def test_damage_across_a_shard_boundary_is_found_by_the_split_check():
    # The countdown skips a value exactly where the shard boundary falls.
    a = [FF0 + 3, 5, FF0 + 2, 5]
    b = [FF0 + 0, 5, EOT]
    problems = check_llmc_split([shard_bytes(a), shard_bytes(b)], names=["v/shard_000.bin", "v/shard_001.bin"])
    assert problems == ["v: 1 countdown tokens that are not one less than the countdown before them "
                        "(first at v/shard_001.bin token 0)"]
    # A countdown token as a shard's last token, followed by EOT in the next shard.
    a = [FF0 + 1, 5, FF0]
    problems = check_llmc_split([shard_bytes(a), shard_bytes([EOT])], names=["v/shard_000.bin", "v/shard_001.bin"],
                                shard_tokens=3)
    assert any("not followed by a BPE token (another countdown or an EOT follows) (first at v/shard_001.bin "
               "token 0)" in p for p in problems)


def test_header_size_names_and_fill_are_checked(tmp_path):
    good = shard_bytes(STREAM)
    bad_magic = bytearray(good)
    bad_magic[0] ^= 1
    assert check_llmc_shard(bytes(bad_magic), name="m") == [f"m: magic number is {llmc.MAGIC ^ 1}, expected 20240520"]
    bad_version = bytearray(good)
    bad_version[4] = 2
    assert check_llmc_shard(bytes(bad_version), name="v") == ["v: version is 2, expected 1"]
    assert check_llmc_shard(good[:-2], name="c") == [
        f"c: the header says {len(STREAM)} tokens, the file holds {2 * len(STREAM) - 2} bytes of tokens",
        "c: the last document does not end with EOT 50256 (c ends inside it)"]
    path = tmp_path / "shard_000.bin"
    path.write_bytes(good)
    assert check_llmc_shard(path) == [] and check_llmc_shard(str(path)) == []
    # A split: the shards must be numbered without gaps and all but the last full.
    parts = [shard_bytes(STREAM[a:b]) for a, b in [(0, 10), (10, 18), (18, 28), (28, None)]]
    names = ["t/shard_000.bin", "t/shard_002.bin", "t/shard_003.bin", "t/shard_004.bin"]
    problems = check_llmc_split(parts, names=names)
    assert problems == [
        "t/shard_002.bin: is shard 2, expected shard 1 here (numbered 0, 1, ... without gaps)",
        "t/shard_003.bin: is shard 3, expected shard 2 here (numbered 0, 1, ... without gaps)",
        "t/shard_004.bin: is shard 4, expected shard 3 here (numbered 0, 1, ... without gaps)",
        "t/shard_002.bin: holds 8 tokens; every shard but the last must hold 10",
    ]
    assert check_llmc_split(parts[:1] + [shard_bytes(STREAM[10:])], names=["t/shard_000.bin", "t/shard_001.bin"],
                            shard_tokens=10) == [f"t/shard_001.bin: the last shard holds {len(STREAM) - 10} tokens, "
                                                 "more than a full shard (10)"]


def _refs(lengths: list[int], offset0: int = 0) -> Refs:
    """Documents d0, d1, ... of one spill file, in that stream order, back to back from ``offset0``."""
    n = len(lengths)
    offsets = offset0 + 2 * (np.cumsum(lengths) - lengths)
    return Refs.concat([RefBatch("spill", "s", [f"d{i}" for i in range(n)], np.arange(n), np.asarray(lengths),
                                 offsets, np.arange(n))])


def _pieces_by_shard(pieces) -> dict[int, list[tuple[int, int, int]]]:
    """{shard: [(position in the shard, tokens, spill offset) of each piece]}."""
    by_shard: dict[int, list[tuple[int, int, int]]] = {}
    for (_, shard), (pos, refs) in pieces:
        for length, offset in zip(refs.lengths.tolist(), refs.offsets.tolist(), strict=True):
            by_shard.setdefault(shard, []).append((pos, length, offset))
            pos += length
    return by_shard


def test_placement_cuts_documents_exactly_at_shard_boundaries():
    # Two ranges of one split: range 0 holds 7 + 5 tokens, range 1 holds 9.
    placement = make_placement([(("train", 1), 9), (("train", 0), 12)])
    assert placement.starts == {("train", 0): 0, ("train", 1): 12} and placement.totals == {"train": 21}
    pieces = list(place_range("train", 0, _refs([7, 5]), placement, 4))
    pieces += list(place_range("train", 1, _refs([9], offset0=1000), placement, 4))
    assert placement.shard_lengths("train", 4) == [4, 4, 4, 4, 4, 1]
    assert _pieces_by_shard(pieces) == {
        0: [(0, 4, 0)],                 # d0 tokens 0..3
        1: [(0, 3, 8), (3, 1, 14)],     # d0 tokens 4..6, d1 token 0
        2: [(0, 4, 16)],                # d1 tokens 1..4
        3: [(0, 4, 1000)],              # range 1: d0 tokens 0..3
        4: [(0, 4, 1008)],
        5: [(0, 1, 1016)],
    }


def test_a_range_is_placed_in_stream_order_whatever_order_its_refs_come_in():
    refs = _refs([7, 5, 3])
    shuffled = refs.take(np.array([2, 0, 1]))
    placement = make_placement([(("val", 0), 15)])
    assert _pieces_by_shard(place_range("val", 0, shuffled, placement, 6)) == _pieces_by_shard(
        place_range("val", 0, refs, placement, 6))


# Sequences of a split (id -> tokens), and their stream order: the sort key of each is its index.
STREAM_DOCS = {f"s{i}": np.arange(100 * i, 100 * i + n, dtype=llmc.TOKEN_DTYPE) for i, n in enumerate([7, 5, 9, 3, 2])}


def test_placed_pieces_written_to_shards_give_the_stream_cut_exactly(tmp_path):
    import hashlib
    import os

    config = LlmcShardConfig(output=str(tmp_path / "out"), run_id="r", shard_tokens=5)
    os.makedirs(config.spill_url)
    # Two spill files, each holding sequences of both ranges, not in stream order.
    files = {"a.bin": ["s3", "s1"], "b.bin": ["s4", "s0", "s2"]}
    ranges = {0: ["s0", "s1"], 1: ["s2", "s3", "s4"]}
    batches = {r: [] for r in ranges}
    for name, ids in files.items():
        path = os.path.join(config.spill_url, name)
        with open(path, "wb") as f:
            offsets = {}
            for i in ids:
                offsets[i] = f.tell()
                f.write(STREAM_DOCS[i].tobytes())
        for r, members in ranges.items():
            mine = [i for i in ids if i in members]
            batches[r].append(RefBatch(path, "in.jsonl", mine, np.array([int(i[1:]) for i in mine]),
                                       np.array([len(STREAM_DOCS[i]) for i in mine]),
                                       np.array([offsets[i] for i in mine]), np.array([int(i[1:]) for i in mine])))
    refs = {r: Refs.concat(b) for r, b in batches.items()}
    placement = make_placement([(("train", r), int(x.lengths.sum())) for r, x in refs.items()])
    stretches: dict[int, list] = {}
    for r, x in refs.items():
        for (_, shard), stretch in place_range("train", r, x, placement, config.shard_tokens):
            stretches.setdefault(shard, []).append(stretch)
    stream = np.concatenate(list(STREAM_DOCS.values()))
    # 26 tokens: 5 full shards and 1 token. Range 1 starts at token 12, inside shard 2.
    assert sorted(stretches) == list(range(6))
    assert [(start, pieces.size) for start, pieces in stretches[2]] == [(0, 1), (2, 1)]
    assert [(start, pieces.size) for start, pieces in stretches[1]] == [(0, 2)]  # s0's end, s1's start
    for shard, parts in stretches.items():
        staged = write_shard("train", shard, parts[::-1], placement, config)
        data = (tmp_path / "out" / layout.TEMP_DIR_NAME / "r" / "staged" / staged.rel_path).read_bytes()
        assert data == llmc.make_header(staged.tokens) + stream[5 * shard:5 * shard + 5].tobytes()
        assert staged.tokens == min(5, len(stream) - 5 * shard) and staged.index == shard
        assert staged.sha256 == hashlib.sha256(data).hexdigest()
    # Stretches that do not tile the shard are refused.
    with pytest.raises(AssertionError, match="pieces hold 2 tokens, expected 5"):
        write_shard("train", 2, stretches[2][:1], placement, config)
    with pytest.raises(AssertionError, match="a stretch starts at 2, expected 0"):
        write_shard("train", 2, stretches[2][1:], placement, config)


class Seq(NamedTuple):
    """A sequence as the literal fixtures give it; _refs_of turns a list of them into Refs."""

    id: str
    source: str
    row: int
    length: int
    words: int
    mismatch: int


def _seq(seq_id: str, source: str, row: int, length: int = 5, words: int = 2, mismatch: int = 0) -> Seq:
    return Seq(seq_id, source, row, length, words, mismatch)


def _refs_of(seqs: list[Seq]) -> Refs:
    """The sequences as the writer gets them: a RefBatch per input file, in the order given."""
    by_source: dict[str, list[Seq]] = {}
    for s in seqs:
        by_source.setdefault(s.source, []).append(s)
    batches = []
    for source, group in by_source.items():
        batches.append(RefBatch(
            f"{source}.spill", source, [s.id for s in group],
            sort_keys=np.array([len(s.id) for s in group]), lengths=np.array([s.length for s in group]),
            offsets=np.array([s.row for s in group]), rows=np.array([s.row for s in group]),
            extra={"words": np.array([s.words for s in group]),
                   "mismatch": np.array([s.mismatch for s in group], np.int8),
                   "doc_id": np.array([s.id.split("#")[0] for s in group], dtype=object),
                   "split": np.zeros(len(group), np.int8)},
        ))
    return Refs.concat(batches)


def _kept(refs: Refs, keep: np.ndarray) -> list[Seq]:
    kept = refs.take(keep)
    return sorted(_seq(i, kept.sources[s], r, n, w, m) for i, s, r, n, w, m in zip(
        kept.ids.tolist(), kept.source.tolist(), kept.rows.tolist(), kept.lengths.tolist(),
        kept.extra["words"].tolist(), kept.extra["mismatch"].tolist(), strict=True))


def test_copies_of_an_id_keep_the_first_by_file_and_row():
    seqs = [_seq("a", "b.jsonl", 0), _seq("x", "b.jsonl", 1), _seq("a", "a.jsonl", 9, length=7, words=3),
            _seq("a", "a.jsonl", 4, length=8, words=4, mismatch=1), _seq("x", "c.jsonl", 0)]
    refs = _refs_of(seqs)
    keep, dropped = keep_first_copies(refs, by_source_id=False)
    assert [(s.id, s.source, s.row) for s in _kept(refs, keep)] == [("a", "a.jsonl", 4), ("x", "b.jsonl", 1)]
    # Each copy left out takes back one document, its sequence, words and tokens.
    assert sorted(dropped) == sorted([DocumentCounts(1, 1, 2, 5, 0), DocumentCounts(1, 1, 3, 7, 0),
                                      DocumentCounts(1, 1, 2, 5, 0)])
    # The same whatever order the runner delivers the refs in.
    for order in (seqs[::-1], seqs[2:] + seqs[:2]):
        again = _refs_of(order)
        keep_again, dropped_again = keep_first_copies(again, by_source_id=False)
        assert _kept(again, keep_again) == _kept(refs, keep) and sorted(dropped_again) == sorted(dropped)
    single = _refs_of(seqs[1:2])
    assert keep_first_copies(single, by_source_id=False)[0].tolist() == [0]
    assert keep_first_copies(single, by_source_id=False)[1] == []


def test_copies_of_a_chunked_document_keep_every_sequence_of_the_first_copy():
    # The first copy (a.jsonl row 3) was cut in two; a later one in three; another is one sequence.
    first = [_seq("d#0", "a.jsonl", 3, length=10, words=4, mismatch=1), _seq("d#1", "a.jsonl", 3, length=4, words=1,
                                                                            mismatch=1)]
    later = [_seq(f"d#{k}", "b.jsonl", 0, length=6, words=2) for k in range(3)]
    whole = [_seq("d", "a.jsonl", 8, length=9, words=3)]
    for order in (first + later + whole, whole + later[::-1] + first[::-1]):
        refs = _refs_of(order)
        keep, dropped = keep_first_copies(refs, by_source_id=True)
        assert _kept(refs, keep) == sorted(first)
        assert sorted(dropped) == [DocumentCounts(1, 1, 3, 9, 0), DocumentCounts(1, 3, 6, 18, 0)]
    refs = _refs_of(later)
    keep, dropped = keep_first_copies(refs, by_source_id=True)
    assert _kept(refs, keep) == sorted(later) and dropped == []


SETTINGS = ScaffoldSettings(input="in", output="/nowhere", tokenizer="gpt2", annotate=False, long_docs="skip",
                            max_word_chars=1000, val_fraction=0.05)
CONFIG = LlmcShardConfig(output="/nowhere", run_id="r", shard_tokens=10)
STAGED = [StagedShard("train", 0, 10, "train/shard_000.bin"), StagedShard("train", 1, 3, "train/shard_001.bin")]


def _stats(staged, raw_documents, drops, counts) -> ScaffoldStats:
    """The stats publish would write, after the checks it makes before touching the tree."""
    stats = ScaffoldFormat(SETTINGS, CONFIG).compute_stats(staged, raw_documents, drops, {"counts": counts})
    check_accounting(stats.kept_documents, stats.dropped_documents, raw_documents)
    return stats


def test_dropped_copies_are_taken_back_from_the_counts():
    encoded = [DocumentCounts(1, 1, 3, 7, 0), DocumentCounts(1, 1, 2, 6, 1), DocumentCounts(1, 1, 2, 6, 1)]
    taken_back = [DocumentCounts(-1, -1, -2, -6, -1)]
    counts = {"train": sum_counts(encoded + taken_back)}
    stats = _stats(STAGED, 3, {"duplicate_id": 1}, counts)
    assert stats.splits["train"] == SplitStats(2, 2, 5, 13, 2) and stats.countdown_mismatches == 1
    assert stats.kept_documents + stats.dropped_documents == stats.raw_documents


def test_publish_refuses_lost_documents_or_tokens():
    counts = {"train": DocumentCounts(2, 2, 5, 13, 0)}
    stats = _stats(STAGED, 3, {"no_words": 1}, counts)
    assert stats.splits["train"] == SplitStats(2, 2, 5, 13, 2)
    assert (stats.tokenizer, stats.val_fraction, stats.shard_tokens) == ("gpt2", 0.05, 10)
    fmt = ScaffoldFormat(SETTINGS, CONFIG)
    # Each refusal comes before publish touches the output (which does not exist here).
    with pytest.raises(UnaccountedDocumentsError, match="refusing to publish"):
        publish(STAGED, 4, {"no_words": 1}, {"counts": counts}, fmt, CONFIG)
    with pytest.raises(UnaccountedDocumentsError, match="13 tokens were encoded but the shards hold 10"):
        publish(STAGED[:1], 3, {"no_words": 1}, {"counts": counts}, fmt, CONFIG)
    with pytest.raises(UnaccountedDocumentsError, match="are not 0..n-1"):
        publish([STAGED[0], STAGED[1]._replace(index=2)], 3, {"no_words": 1}, {"counts": counts}, fmt, CONFIG)


@pytest.mark.parametrize("kwargs", [{"shard_tokens": 0}, {"shard_tokens": 2**31}, {"order_ranges": 3},
                                    {"order_ranges": 0}, {"seed": -1}])
def test_bad_shard_settings_fail_when_configured(kwargs):
    with pytest.raises(ValueError):
        LlmcShardConfig(output="/o", run_id="r", **kwargs)
