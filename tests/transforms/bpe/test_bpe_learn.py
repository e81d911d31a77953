"""The merge learner against the chapter's loop, written plainly: recount every pair each step.

The bundled text is the first volume of Jane Austen's Persuasion (tests/data/README.md).
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

import pytest

from transforms.bpe import pretokenize as pt
from transforms.bpe.learn import learn_merges

TEXT = (Path(__file__).resolve().parents[2] / "data" / "persuasion_vol1.txt").read_text(encoding="utf-8")


def reference_merges(word_counts: list[tuple[list[int], int]], base_size: int, n_merges: int):
    """The chapter's training loop: count the pairs over all words, weighted by the words' counts;
    merge the most frequent, ties to the smaller pair of ids; merge k gets id base_size + k; words
    that become equal are combined. Returns the merges and the corpus's symbols at the end."""
    words = dict((tuple(w), 0) for w, _ in word_counts)
    for w, n in word_counts:
        words[tuple(w)] += n
    merges = []
    for step in range(n_merges):
        pairs: dict[tuple[int, int], int] = {}
        for w, n in words.items():
            for i in range(len(w) - 1):
                pairs[(w[i], w[i + 1])] = pairs.get((w[i], w[i + 1]), 0) + n
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        new_id = base_size + step
        merges.append((a, b))
        merged: dict[tuple[int, ...], int] = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return merges, sum(len(w) * n for w, n in words.items())


def table(text: str, pattern: str, alphabet: str) -> tuple[list[tuple[list[int], int]], int, list[str] | None]:
    counts = pt.count_words([text], pattern)
    chars = pt.alphabet_of(counts, alphabet)
    ids = None if chars is None else {c: i for i, c in enumerate(chars)}
    items = sorted(counts.items())
    return [(pt.word_symbols(w, ids), n) for w, n in items], (256 if chars is None else len(chars)), chars


@functools.cache
def reference_500(alphabet: str, pattern: str):
    word_counts, base, chars = table(TEXT, pattern, alphabet)
    return word_counts, base, chars, *reference_merges(word_counts, base, 500)


@pytest.mark.parametrize("alphabet,pattern", [("chars", "chars"), ("bytes", "chars"), ("bytes", "qwen2")])
def test_500_merges_equal_the_chapter_loop(alphabet, pattern):
    word_counts, base, _, want, want_symbols = reference_500(alphabet, pattern)
    got = learn_merges([w for w, _ in word_counts], [n for _, n in word_counts], base, 500)
    assert len(want) == 500
    assert got.merges == want
    assert got.symbols_after == want_symbols
    assert got.symbols_before == len(TEXT.encode()) if alphabet == "bytes" else len(TEXT)


def test_chars_first_merges_are_the_language_commonest_fragments():
    # The chapter's Alice, lower-cased, gives " t", "he", " a", " s", "in", then " the", and 64 merges make
    # 1.66 characters a token; Persuasion, lower-cased, the same fragments and about the same ratio.
    word_counts, base, chars = table(TEXT.lower(), "chars", "chars")
    got = learn_merges([w for w, _ in word_counts], [n for _, n in word_counts], base, 64)
    strings = list(chars)
    for a, b in got.merges:
        strings.append(strings[a] + strings[b])
    assert strings[base:base + 8] == ["he", " t", " a", "in", " w", " s", " o", " the"]
    assert (got.symbols_before, got.symbols_after) == (215_527, 133_298)  # 1.62 characters a token


@pytest.mark.parametrize(
    "words,counts,n,want",
    [
        # Ties go to the smaller pair of ids: (0, 1) and (1, 2) both count 1.
        ([[0, 1, 2]], [1], 1, [(0, 1)]),
        # Counts weigh: (1, 2) occurs in a word seen 3 times.
        ([[0, 1], [1, 2]], [1, 3], 1, [(1, 2)]),
        # "a a a" holds (a, a) twice and merges left to right into [x, a]; then (x, a).
        ([[0, 0, 0]], [1], 2, [(0, 0), (1, 0)]),
        # "a a a a" -> [x, x] -> [y].
        ([[0, 0, 0, 0]], [1], 3, [(0, 0), (1, 1)]),
        # a b a b: (a, b) twice, then the new (x, x).
        ([[0, 1, 0, 1]], [2], 2, [(0, 1), (2, 2)]),
        # Learning stops when no word has two symbols left.
        ([[0, 1], [1]], [5, 5], 10, [(0, 1)]),
    ],
)
def test_rule_on_small_tables(words, counts, n, want):
    base = 1 + max(max(w) for w in words)
    got = learn_merges(words, counts, base, n)
    assert got.merges == want
    assert got.merges == reference_merges(list(zip(words, counts, strict=True)), base, n)[0]


@pytest.mark.parametrize(
    "pattern,text,want",
    [
        ("chars", "the cat  sat\non\tit ", ["the", " cat", " ", " sat", "\n", "on", "\t", "it", " "]),
        ("gpt2", "Don't stop 123", ["Don", "'t", " stop", " 123"]),
        ("qwen2", "Don't stop 123", ["Don", "'t", " stop", " ", "1", "2", "3"]),
    ],
)
def test_patterns_cut_text_into_words(pattern, text, want):
    assert pt.pre_tokens(text, pattern) == want
    assert "".join(pt.pre_tokens(text, pattern)) == text


def test_chars_alphabet_is_the_corpus_characters_in_code_point_order():
    assert pt.alphabet_of(["ba", " c", "é"], "chars") == [" ", "a", "b", "c", "é"]
    assert pt.word_symbols("é", None) == [0xC3, 0xA9]
    assert pt.word_symbols("\ud800", None) == list("\ufffd".encode())


@pytest.mark.parametrize("alphabet,pattern", [("chars", "chars"), ("bytes", "qwen2")])
@pytest.mark.e2e  # a whole job
def test_the_job_writes_the_chapter_loop_merges(tmp_path, alphabet, pattern):
    """Through the CLI (read, count on Beam, learn, write): rank base + k of tokenizer.tiktoken is the
    reference loop's merge k, for 500 merges."""
    from pipelines import cli

    _, base, chars, want, _ = reference_500(alphabet, pattern)
    corpus = tmp_path / "persuasion.jsonl"
    corpus.write_text(json.dumps({"id": "persuasion-1", "text": TEXT}) + "\n")
    out = tmp_path / "tok"
    assert cli.main(["train-bpe", "--input", str(corpus), "--output", str(out), "--language", "none",
                     "--token-count-field", "none", "--alphabet", alphabet, "--pattern", pattern, "--merges", "500",
                     "--runner=FnApiRunner"]) == 0
    lines = (out / "tokenizer.tiktoken").read_text().splitlines()
    tokens = [base64.b64decode(line.split()[0]) for line in lines]
    strings = [bytes([b]) for b in range(256)] if chars is None else [c.encode() for c in chars]
    for a, b in want:
        strings.append(strings[a] + strings[b])
    assert len(tokens) == base + 500
    assert tokens == strings
