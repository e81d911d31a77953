"""What every backend builds and what it is built from: an Encoder, from a BpeVocabulary.

An Encoder encodes text without special tokens by default (``special_tokens="text"``): a literal
``<|endoftext|>`` inside a document is encoded as ordinary text, never as the EOS id, so that a reader
that finds documents by splitting on EOS finds them all. The caller appends the one EOS a stored
document ends with. ``special_tokens="tokenizer"`` gives each added-token string its id instead
(transforms/tokenizers/added_tokens.py).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable, Sequence

import numpy as np

from transforms.tokenizers.long_text import CutRules, LongTextSplitter

EncodeFlat = Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]

# What an added-token string inside a text becomes: text (the default), or its id, as the tokenizer's
# Hugging Face release encodes it (see transforms/tokenizers/added_tokens.py).
SPECIAL_TOKEN_MODES = ("text", "tokenizer")


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


@dataclasses.dataclass(frozen=True)
class BpeVocabulary:
    """A byte-level BPE a backend builds an Encoder from: its ranks (token bytes -> rank, a
    transforms.tokenizers.ranks.Ranks when read from a file), the pre-tokenization ``pattern`` and
    where it can be cut (``cuts``), the EOS id and vocabulary size, and whether texts are NFC-normalized
    first. ``name`` names the encoding inside the library (``jet-nemotron``, ``gpt2-file``, ``trained``)."""

    spec: str
    name: str
    pattern: str
    cuts: CutRules
    ranks: dict[bytes, int]
    eos_id: int
    vocab_size: int
    nfc: bool

    @property
    def files(self) -> tuple[tuple[str, str], ...]:
        """(name, sha256) of the ranks file the ranks were parsed from, when they were."""
        return getattr(self.ranks, "files", ())


def library_version(name: str) -> str:
    """``name version`` of an installed distribution (``tiktoken 0.14.0``), as the stats record it."""
    try:
        return f"{name} {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def replace_surrogates(text: str) -> str:
    """Lone surrogates (a JSON "\\ud800" escape) replaced by U+FFFD, as tiktoken's encode_ordinary does."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
