"""Added tokens (``special_tokens="tokenizer"``): each added-token string in a text becomes its id.

Hugging Face's tokenizers find added tokens before anything else touches the text: a token with
normalized=false is matched in the raw text, leftmost first and the longest at a position, and each
stretch of text between two matches is then normalized, pre-tokenized and BPE-encoded on its own. So
here the raw text is split on the added tokens first and each stretch goes through the backend's
ordinary (text-mode) encoding, NFC included. Splitting first is what makes it exact: tiktoken's
allowed_special (or quicktok's own special matching) would see the text after our NFC, which can fuse a
token's last ">" with a combining mark after it (">" + U+0338 is "≯") and lose the match HF finds.
The stretches hold no added-token string, so cutting long ones (LongTextSplitter) stays exact.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from shards.tokenizer_spec import TokenizerSpec
from transforms.tokenizers import trained
from transforms.tokenizers.encoder import Encoder
from transforms.tokenizers.vocabularies import ENDOFTEXT, QWEN2_SPECIAL_START, QWEN25_ADDED_TOKENS


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


def added_tokens(spec: TokenizerSpec, eos_id: int) -> dict[str, int]:
    """The added tokens of a tiktoken-built spec: Qwen2.5's 22 for jet-nemotron, <|endoftext|> (EOS) for
    GPT-2's pattern (gpt2, tiktoken:PATH), the EOS it was trained with for trained:DIR."""
    if spec.kind == "jet-nemotron":
        return {token: QWEN2_SPECIAL_START + i for i, token in enumerate(QWEN25_ADDED_TOKENS)}
    if spec.kind == "trained":
        return {trained.read_info(spec)["eos_token"]: eos_id}
    return {ENDOFTEXT: eos_id}
