"""load_encoder: the Encoder a tokenizer spec names, with a backend and a special-token mode.

    encoder = load_encoder("jet-nemotron", backend="auto")   # quicktok when it is pinned, else tiktoken
    tokens, offsets = encoder.encode_tokens(["Hello world"])

The spec (shards/tokenizer_spec.py) says which vocabulary: the BPE kinds (jet-nemotron, gpt2,
tiktoken:PATH) give a BpeVocabulary that the chosen backend (backends.py) builds; a backend other than the
reference is probed against it (probe.py) when it loads. hf: (hf.py) and trained:DIR (trained.py) load
their own way. Encoders built from local files are kept in an EncoderCache (ENCODERS, or the ``cache``
given; None builds afresh).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shards import storage
from shards.tokenizer_spec import TokenizerSpec, parse_spec
from transforms.core.records import BadInputError
from transforms.tokenizers import hf, trained
from transforms.tokenizers.added_tokens import AddedTokens, added_tokens
from transforms.tokenizers.backends import REFERENCE, REGISTRY, check_backend, resolve_backend
from transforms.tokenizers.cache import EncoderCache
from transforms.tokenizers.encoder import SPECIAL_TOKEN_MODES, BpeVocabulary, Encoder
from transforms.tokenizers.long_text import GPT2_CUTS, QWEN2_CUTS
from transforms.tokenizers.probe import probe
from transforms.tokenizers.ranks import gpt2_ranks_path, load_ranks, qwen2_ranks, qwen_ranks_path
from transforms.tokenizers.vocabularies import GPT2_EOS, JET_NEMOTRON_VOCAB_SIZE, QWEN2_PATTERN, QWEN2_SPECIAL_START

log = logging.getLogger(__name__)

# The process's encoders: the launch's and an in-process worker's are the same object.
ENCODERS = EncoderCache()


def load_encoder(spec: str | TokenizerSpec, eos_token: str | None = None, backend: str = "tiktoken",
                 threads: int = 1, special_tokens: str = "text", cache: EncoderCache | None = ENCODERS) -> Encoder:
    """Build the tokenizer ``spec`` names with ``backend`` (``threads``: the quicktok batch call's),
    encoding added-token strings as ``special_tokens`` says (SPECIAL_TOKEN_MODES); a ValueError for a bad
    spec, BackendMismatch when the probe fails."""
    check_options(backend, threads, special_tokens)

    spec = parse_spec(spec)
    # A tokenizer's files on a store out of reach: one line naming the URL (storage.Unreachable).
    with storage.reaching(spec.where):
        if spec.kind == "hf":
            # HF itself is the reference for its added tokens (their flags may be anything): it matches them.
            return _load_text_encoder(spec, eos_token, backend, threads, cache, special_tokens)
        encoder = _load_text_encoder(spec, eos_token, backend, threads, cache)
    if special_tokens == "text":
        return encoder
    return AddedTokens(added_tokens(spec, encoder.eos_id)).wrap(encoder)


def check_options(backend: str, threads: int, special_tokens: str) -> None:
    """The one check of load_encoder's options (TokenizerConfig's too): a ValueError naming the flag."""
    check_backend(backend)
    if threads < 1:
        raise ValueError(f"--tokenizer-threads must be at least 1, got {threads}")
    if special_tokens not in SPECIAL_TOKEN_MODES:
        raise ValueError(f"--special-tokens must be one of {', '.join(SPECIAL_TOKEN_MODES)}, got {special_tokens!r}")


def _load_text_encoder(spec: TokenizerSpec, eos_token: str | None, backend: str, threads: int,
                       cache: EncoderCache | None, special_tokens: str = "text") -> Encoder:
    if eos_token is not None and spec.fixed_eos:
        raise ValueError("--eos-token applies to hf: and trained: tokenizers only; the others have a fixed EOS")
    name = resolve_backend(spec, backend)
    if spec.kind == "hf":
        return hf.load(spec, eos_token, special_tokens)
    if spec.kind == "trained":
        return trained.load(spec, eos_token, cache)
    path, vocabulary = BPE_KINDS[spec.kind](spec)
    if name == REFERENCE:
        return EncoderCache.through(cache, spec.text, path, lambda: REGISTRY[name].build(vocabulary()))

    def build() -> Encoder:
        # Both backends from the same ranks, read once; the reference kept as if loaded on its own.
        vocab = vocabulary()
        encoder = REGISTRY[name].build(vocab, threads)
        reference = EncoderCache.through(cache, spec.text, path, lambda: REGISTRY[REFERENCE].build(vocab))
        seconds = probe(encoder, reference)
        log.info("%s: %s agrees with %s on the probe (%.1f ms)", spec, encoder.library, reference.library,
                 seconds * 1e3)
        return encoder

    return EncoderCache.through(cache, f"{spec}|{name}|{threads}", path, build)


# --- The BPE kinds: the ranks file each is read from, and the vocabulary it makes ----------------------------


def _jet_nemotron(spec: TokenizerSpec) -> tuple[str, Callable[[], BpeVocabulary]]:
    path = spec.arg or qwen_ranks_path()
    return path, lambda: BpeVocabulary(spec.text, "jet-nemotron", QWEN2_PATTERN, QWEN2_CUTS, qwen2_ranks(path),
                                       QWEN2_SPECIAL_START, JET_NEMOTRON_VOCAB_SIZE, nfc=True)


def _gpt2(spec: TokenizerSpec) -> tuple[str, Callable[[], BpeVocabulary]]:
    """``gpt2`` (the packaged ranks, checked to be GPT-2's count) or ``tiktoken:PATH``: GPT-2's pattern,
    EOS numbered right after the ranks."""
    packaged = spec.packaged
    path = gpt2_ranks_path() if packaged else spec.arg

    def vocabulary() -> BpeVocabulary:
        # tiktoken's "gpt2" encoding is this pattern and <|endoftext|> over GPT-2's ranks; importing the
        # pattern downloads nothing.
        from tiktoken_ext.openai_public import r50k_pat_str

        ranks = load_ranks(path)
        if packaged and len(ranks) != GPT2_EOS:
            raise ValueError(f"{path} holds {len(ranks)} ranks, GPT-2 has {GPT2_EOS}: reinstall beam-pretokenize")
        eos_id = len(ranks)
        return BpeVocabulary(spec.text, "gpt2-file", r50k_pat_str, GPT2_CUTS, ranks, eos_id, eos_id + 1, nfc=False)

    return path, vocabulary


BPE_KINDS: dict[str, Callable[[TokenizerSpec], tuple[str, Callable[[], BpeVocabulary]]]] = {
    "jet-nemotron": _jet_nemotron,
    "gpt2": _gpt2,
    "tiktoken": _gpt2,
}


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
