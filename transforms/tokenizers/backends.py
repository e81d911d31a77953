"""The tokenizer backends (``--tokenizer-backend``): the libraries a BpeVocabulary is encoded with.

    tiktoken   the reference (REFERENCE): jet-nemotron, gpt2, tiktoken:PATH and trained:DIR
    quicktok   quicktok over the same ranks file, for jet-nemotron only (transforms/tokenizers/quicktok_backend.py)
    auto       the first backend of REGISTRY that encodes the spec exactly at its pinned version, else the reference

hf: tokenizers are Hugging Face's own (transforms/tokenizers/hf.py) whatever the backend says. A backend
is a module with ``NAME``, ``version()``, ``pinned()``, ``encodes(spec)``, ``refusal(spec)`` and
``build(vocabulary, threads)`` (the Backend protocol); every one but the reference is checked against the
reference by the probe when it loads (load.py). A new backend is one such module, listed in REGISTRY.
"""

from __future__ import annotations

from types import ModuleType
from typing import Protocol

from shards.tokenizer_spec import TokenizerSpec, parse_spec
from transforms.tokenizers import quicktok_backend, tiktoken_backend
from transforms.tokenizers.encoder import BpeVocabulary, Encoder


class Backend(Protocol):
    NAME: str

    def version(self) -> str | None: ...  # the installed library's version; None when it is not installed
    def pinned(self) -> bool: ...  # whether auto may choose it (the release whose ids were proven equal)
    def encodes(self, spec: TokenizerSpec) -> bool: ...  # whether it encodes the spec exactly
    def refusal(self, spec: TokenizerSpec) -> str | None: ...  # why it cannot be asked for with spec
    def build(self, vocabulary: BpeVocabulary, threads: int = 1) -> Encoder: ...


# In the order auto tries them; the reference last.
REGISTRY: dict[str, ModuleType] = {m.NAME: m for m in (quicktok_backend, tiktoken_backend)}
REFERENCE = tiktoken_backend.NAME
BACKENDS = ("auto", *sorted(REGISTRY))


def resolve_backend(spec: str | TokenizerSpec, backend: str) -> str:
    """The name of the backend of REGISTRY that ``backend`` (a name or ``auto``) means for ``spec`` here."""
    check_backend(backend)
    spec = parse_spec(spec)
    if backend == "auto":
        return next(name for name, b in REGISTRY.items() if name == REFERENCE or (b.encodes(spec) and b.pinned()))
    refusal = REGISTRY[backend].refusal(spec)
    if refusal:
        raise ValueError(refusal)
    return backend


def check_backend(backend: str) -> None:
    """A ValueError naming the flag when ``backend`` is not one of BACKENDS."""
    if backend not in BACKENDS:
        raise ValueError(f"--tokenizer-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def other_backend(recorded: str | None) -> str:
    """The backend to check a tree with: not the one its stats record (``quicktok 0.4.0``), where its
    tokenizer has two (``auto`` is quicktok where it can be); old stats record none (tiktoken wrote
    those trees)."""
    name = recorded.split()[0] if recorded else REFERENCE
    if name in REGISTRY and name != REFERENCE:
        return REFERENCE
    return "auto"
