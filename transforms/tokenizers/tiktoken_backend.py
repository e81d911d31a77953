"""The reference backend: tiktoken over a BpeVocabulary, long texts cut by the vocabulary's CutRules.

Every other backend is checked against this one by the probe when it loads (transforms/tokenizers/probe.py).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

from shards.tokenizer_spec import TokenizerSpec
from transforms.tokenizers.encoder import BpeVocabulary, Encoder, library_version, replace_surrogates
from transforms.tokenizers.long_text import LongTextSplitter
from transforms.tokenizers.ranks import ranks_token_bytes
from transforms.tokenizers.vocabularies import ENDOFTEXT

NAME = "tiktoken"


def version() -> str | None:
    """The installed tiktoken's version (it is a dependency: always installed)."""
    return library_version("tiktoken").partition(" ")[2] or None


def encodes(spec: TokenizerSpec) -> bool:
    """The reference encodes every BPE vocabulary exactly, by definition."""
    return True


def pinned() -> bool:
    """``auto`` may always choose the reference."""
    return True


def refusal(spec: TokenizerSpec) -> str | None:
    """Why ``--tokenizer-backend tiktoken`` cannot be used with ``spec``: never."""
    return None


def build(vocabulary: BpeVocabulary, threads: int = 1) -> Encoder:
    """A tiktoken Encoding over the vocabulary (``threads`` unused: tiktoken's call is per text)."""
    import tiktoken

    v = vocabulary
    enc = tiktoken.Encoding(v.name, pat_str=v.pattern, mergeable_ranks=v.ranks, special_tokens={ENDOFTEXT: v.eos_id})
    splitter = LongTextSplitter(v.cuts, ranks_token_bytes(v.ranks))
    return _from_tiktoken(v.spec, enc, v.eos_id, v.vocab_size, v.nfc, splitter, v.files)


def _from_tiktoken(spec: str, enc, eos_id: int, vocab_size: int, nfc: bool, splitter: LongTextSplitter,
                   files: tuple[tuple[str, str], ...]) -> Encoder:
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
            return splitter.encode(replace_surrogates(text), encode_one)

    def encode_arrays(texts: Sequence[str]) -> list[np.ndarray]:
        return [encode_text(t) for t in texts]

    return Encoder(spec, eos_id, vocab_size, encode_arrays, backend=enc, splitter=splitter,
                   library=library_version("tiktoken"), files=files)
