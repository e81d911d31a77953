"""Long texts encoded in pieces cut where the ids cannot change: LongTextSplitter and each pattern's CutRules.

A multi-MB document without whitespace then costs about what ordinary text of its size costs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np

# What a splitter is given to encode one piece: the backend's own call on one text.
EncodeOne = Callable[[str], np.ndarray]

# These tokenizers split text with a regex into pre-tokens and run BPE inside each pre-token alone, so a
# text cut where a pre-token ends encodes, piece by piece, to the same ids as whole, provided the regex
# scan of each piece finds the same pre-tokens. That holds at a "safe cut": between two ASCII characters,
# neither of them whitespace, whose classes no alternative of the pattern joins. The only constructs of
# these patterns that look past a match, (?!\S) and $, follow whitespace, which a safe cut never does;
# nothing looks behind; both characters are ASCII, so the Unicode tables of Python's and the tokenizer's
# regex engines do not come into it, and NFC composes nothing across the cut.
#
# One pre-token cannot be cut like that: a run of letters (a gene sequence, a base64 blob without digits
# or slashes) or of punctuation is a single pre-token however long, and BPE over it gets slower per byte
# as it grows (tiktoken: 0.1 us/char over 4 KB of letters, 0.8 us/char over 20 MB). It can be cut at a
# token, though. Let y be a token with bytes Y. If the BPE of X+Y ends with y and the BPE of Y+Z begins
# with y, the BPE of X+Y+Z is the first without its y followed by the second. BPE merges the adjacent pair
# of lowest rank (the leftmost on a tie) until none is a token. Until some merge crosses an edge of Y, the
# merges inside X, Y and Z happen in the same order as they do in X+Y and in Y+Z alone, so the first merge
# across Y's left edge would, at that moment, be the leftmost lowest pair of X+Y as well, where Y ends as
# one token; likewise for its right edge in Y+Z. (None of these strings is short enough to be a token
# itself, so the tokenizers' whole-piece shortcut never applies.)
#
# So a long ASCII run is encoded in chunks of about run_chunk_chars: each chunk restarts at the start of
# one of the previous chunk's last tokens (RESTARTS) and stands only if it begins with that token; if no
# restart holds, the text from the last safe cut to the next is encoded whole. Chunks end at least a
# token's length plus a margin inside the run, so every re-scan starts inside the same pre-token.

_LETTERS, _DIGITS, _PUNCT = "A-Za-z", "0-9", "!-/:-@\\[-`{-~"  # ASCII letters, digits, punctuation


@dataclasses.dataclass(frozen=True)
class CutRules:
    """Where one pre-tokenization pattern can be cut: ``cut`` matches the character before a safe
    cut; ``runs`` are character classes a run of which is one pre-token."""

    name: str
    cut: re.Pattern
    runs: tuple[str, ...]


# Qwen2: digits are pre-tokens of one digit; a letter run ends at anything else; a punctuation run ends at
# a letter or a digit, but the punctuation character before a letter may instead begin that letter run,
# so punctuation is cut from what follows only before a digit.
QWEN2_CUTS = CutRules(
    "qwen2",
    re.compile(f"[{_LETTERS}](?=[{_PUNCT}{_DIGITS}])|[{_DIGITS}](?=[!-~])|[{_PUNCT}](?=[{_DIGITS}])"),
    (_LETTERS, _PUNCT),
)
# GPT-2: letters, digits and punctuation each form their own runs, except that an apostrophe followed by
# a letter may start a contraction ('s, 't, 're, ...).
GPT2_CUTS = CutRules(
    "gpt2",
    re.compile(
        f"[{_LETTERS}](?=[{_PUNCT}{_DIGITS}])|[{_DIGITS}](?=[{_PUNCT}{_LETTERS}])"
        f"|[!-&(-/:-@\\[-`{{-~](?=[{_DIGITS}{_LETTERS}])|'(?=[{_DIGITS}])"
    ),
    (_LETTERS, _DIGITS, _PUNCT),
)


class LongTextSplitter:
    """Encodes a long text in pieces that give exactly the ids of encoding it whole (see above).

    Texts up to ``chunk_chars + window_chars`` are encoded in one call. Longer ones are cut at the
    first safe cut after every ``chunk_chars`` characters (looking ``window_chars`` ahead); a window
    holding one ASCII run of a ``runs`` class is a long pre-token, encoded in chunks of ``run_chunk_chars``.
    ``token_bytes[id]`` is the length in bytes of token ``id``.
    """

    # Which of the previous chunk's last tokens to restart at, in the order tried. The tokens nearest a
    # chunk's end are the ones its cut may have changed, so the first try is a few tokens back.
    RESTARTS = (8, 16, 32, 4, 2, 1)

    def __init__(
        self,
        rules: CutRules,
        token_bytes: np.ndarray,
        chunk_chars: int = 1 << 16,
        window_chars: int = 1 << 12,
        run_chunk_chars: int = 1 << 11,
    ):
        self.rules = rules
        self.token_bytes = token_bytes
        self.chunk_chars = chunk_chars
        self.window_chars = window_chars
        self.run_chunk_chars = run_chunk_chars
        # A chunk edge stays this far inside a run: a restart at a token's start is still inside it.
        self.margin = int(token_bytes.max()) + 16
        self._runs = [re.compile(f"[{cls}]*") for cls in rules.runs]

    def is_long(self, text: str) -> bool:
        """Whether ``encode`` would cut ``text`` at all."""
        return len(text) > self.chunk_chars + self.window_chars

    def _run_end(self, text: str, start: int, end: int) -> int | None:
        """The end of the run, when text[start:end] is one ASCII run of a single-pre-token class."""
        for run in self._runs:
            if run.fullmatch(text, start, end):
                return run.match(text, start).end()
        return None

    def plan(self, text: str) -> list[tuple[int, int]]:
        """Cut positions, in order: (position, -1) for a safe cut, (position, run start) inside a run."""
        plan: list[tuple[int, int]] = []
        n, pos = len(text), 0
        if not self.is_long(text):
            return plan
        while n - pos > self.chunk_chars + self.window_chars:
            at = pos + self.chunk_chars
            while True:
                if at + self.window_chars >= n:
                    return plan
                found = self.rules.cut.search(text, at, at + self.window_chars)
                if found:
                    pos = found.end()
                    plan.append((pos, -1))
                    break
                run_end = self._run_end(text, at, at + self.window_chars)
                if run_end is not None:
                    points = range(at + self.run_chunk_chars, run_end - self.margin, self.run_chunk_chars)
                    plan.extend((p, at) for p in points)
                    pos = run_end
                    break
                at += self.window_chars  # no cut here (say, CJK text or a long URL-safe mix): look further
        return plan

    def encode(self, text: str, encode_one: EncodeOne) -> np.ndarray:
        """The ids of ``text``, given ``encode_one``, the backend's encoding of one whole string."""
        plan = self.plan(text)
        if not plan:
            return encode_one(text)
        plan.append((len(text), -1))
        # Chunks inside a run of one repeated character or pattern (dot leaders, rules of dashes) are
        # often the same string: encode each distinct one once.
        seen: dict[str, np.ndarray] = {}

        def encode_chunk(chunk: str) -> np.ndarray:
            if len(chunk) > 2 * self.run_chunk_chars:
                return encode_one(chunk)
            ids = seen.get(chunk)
            if ids is None:
                if len(seen) >= 64:
                    seen.clear()
                ids = seen[chunk] = encode_one(chunk)
            return ids

        parts: list[np.ndarray] = []
        safe_parts, safe_pos = 0, 0  # parts[:safe_parts] are the ids of text[:safe_pos]
        prev: np.ndarray | None = None  # ids of the last chunk when it ended inside a run (not yet in parts)
        prev_end = prev_run = 0
        i = 0
        while i < len(plan):
            pos, run = plan[i]
            if prev is None:
                ids = encode_one(text[safe_pos:pos])
            else:
                joined = self._continue(text, prev, prev_end, prev_run, pos, encode_chunk)
                if joined is None:
                    # No restart point was certified: encode from the last safe cut to the next one, whole.
                    del parts[safe_parts:]
                    while plan[i][1] >= 0:
                        i += 1
                    pos = plan[i][0]
                    parts.append(encode_one(text[safe_pos:pos]))
                    safe_parts, safe_pos, prev = len(parts), pos, None
                    i += 1
                    continue
                keep, ids = joined
                parts.append(prev[:keep])
            if run >= 0:
                prev, prev_end, prev_run = ids, pos, run
            else:
                parts.append(ids)
                safe_parts, safe_pos, prev = len(parts), pos, None
            i += 1
        return np.concatenate(parts)

    def _continue(
        self, text: str, prev: np.ndarray, prev_end: int, run_start: int, pos: int, encode_one: EncodeOne
    ) -> tuple[int, np.ndarray] | None:
        """Encode text from the start of one of prev's last tokens (inside a run) to ``pos``: how many of
        prev's ids stand and the new ids, which begin with the token they restart at; None if none held."""
        tail = prev[-max(self.RESTARTS, default=1) :]
        starts = prev_end - np.cumsum(self.token_bytes[tail[::-1]])  # start of the 1st, 2nd, ... last token
        for back in self.RESTARTS:
            if back > len(tail):
                continue
            start = int(starts[back - 1])  # the run is ASCII: a byte is a character
            if start < run_start + 3:
                continue
            token = int(tail[-back])
            ids = encode_one(text[start:pos])
            if len(ids) and ids[0] == token:
                return len(prev) - back, ids
        return None


# A pattern whose cuts are unknown (train-bpe's chars pattern " ?\S+|\s" joins any run of non-whitespace
# into one pre-token: no cut is safe, and no ASCII class is known to stay one pre-token to its end): such
# texts are encoded whole.
NO_CUTS = CutRules("none", re.compile(r"(?!)"), ())
