"""How text is cut into words before BPE, and how words become the learner's symbols.

Patterns (``--pattern``):

    qwen2   the pre-tokenization regex of Qwen2 / Qwen2.5 (digits one at a time)
    gpt2    GPT-2's pre-tokenization regex
    chars   a word is a run of characters other than whitespace together with the one space before
            it, if there is one; every other whitespace character is a word of its own. So a space
            goes with the word that follows it, as in the data-and-tokenisation chapter: "the cat"
            is "the", " cat"; "a  b\\n" is "a", " ", " b", "\\n".

Alphabets (``--alphabet``):

    bytes   symbols are the UTF-8 bytes of a word; ids 0-255 are the byte values (GPT-2, Qwen)
    chars   symbols are characters; ids 0..A-1 are the corpus's A distinct characters in code-point order

Nothing here imports Beam.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import regex

from transforms.tokenizers.vocabularies import GPT2_PATTERN, QWEN2_PATTERN

CHARS_PATTERN = r" ?\S+|\s"
PATTERNS = {"qwen2": QWEN2_PATTERN, "gpt2": GPT2_PATTERN, "chars": CHARS_PATTERN}
ALPHABETS = ("bytes", "chars")

_COMPILED: dict[str, regex.Pattern] = {}


def compiled(pattern: str) -> regex.Pattern:
    """The compiled regex of a pattern name."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; use one of {', '.join(PATTERNS)}")
    if pattern not in _COMPILED:
        _COMPILED[pattern] = regex.compile(PATTERNS[pattern])
    return _COMPILED[pattern]


def pre_tokens(text: str, pattern: str) -> list[str]:
    """The words of ``text`` under ``pattern``, in order; joined, they give ``text`` back."""
    return compiled(pattern).findall(text)


def count_words(texts: Iterable[str], pattern: str, counts: Counter | None = None) -> Counter:
    """How often each word occurs in ``texts`` (added to ``counts`` when given)."""
    counts = Counter() if counts is None else counts
    findall = compiled(pattern).findall
    for text in texts:
        counts.update(findall(text))
    return counts


def alphabet_of(words: Iterable[str], alphabet: str) -> list[str] | None:
    """The base symbols: None for ``bytes`` (the 256 byte values), else the distinct characters of
    ``words`` in code-point order."""
    if alphabet == "bytes":
        return None
    if alphabet != "chars":
        raise ValueError(f"unknown alphabet {alphabet!r}; use one of {', '.join(ALPHABETS)}")
    chars: set[str] = set()
    for w in words:
        chars.update(w)
    return sorted(chars)


def word_symbols(word: str, chars: dict[str, int] | None) -> list[int]:
    """A word as base ids: its UTF-8 bytes, or its characters' ids in ``chars``."""
    if chars is None:
        try:
            return list(word.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate (a JSON "\\ud800"): U+FFFD, as tiktoken encodes it
            return list(word.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8"))
    return [chars[c] for c in word]
