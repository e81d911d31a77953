"""The tokenizer spec (``--tokenizer``, and the ``tokenizer:`` a tree's stats record), parsed in one place.

    jet-nemotron[:RANKS]   the Qwen2.5 vocabulary of Jet-Nemotron-2B (``qwen2.5`` is another name for it)
    gpt2                   GPT-2's encoding over the ranks shipped in the package
    tiktoken:RANKS         GPT-2's pattern and EOS over a ranks file
    hf:NAME_OR_PATH        a Hugging Face fast tokenizer
    trained:DIR            a tokenizer ``pretokenize train-bpe`` wrote

Every consumer asks a TokenizerSpec (its kind, its argument, whether its files ship with a package)
rather than cutting the string again: the loader (transforms/tokenizers), the launch's provenance, the
card's decode snippet and ``decode``. ``text`` is the spec as it was typed, which is what a tree records.
It lives in shards/ because a tree's stats and card name it; nothing here imports Beam or a tokenizer.

    spec = parse_spec("qwen2.5:/data/qwen.tiktoken")
    spec.kind, spec.arg, spec.packaged  # ("jet-nemotron", "/data/qwen.tiktoken", False)
"""

from __future__ import annotations

import dataclasses
import difflib


@dataclasses.dataclass(frozen=True)
class SpecKind:
    """One kind of spec. ``arg``: "none" (``gpt2``), "optional" (``jet-nemotron[:RANKS]``: without it,
    packaged files) or "required"; ``usage``: how the kind is written, as an error lists it;
    ``fixed_eos``: its EOS is the vocabulary's own (``--eos-token`` does not apply)."""

    name: str
    arg: str
    usage: tuple[str, ...]
    fixed_eos: bool = True


KINDS: dict[str, SpecKind] = {
    kind.name: kind
    for kind in (
        SpecKind("jet-nemotron", "optional", ("jet-nemotron", "jet-nemotron:RANKS")),
        SpecKind("gpt2", "none", ("gpt2",)),
        SpecKind("tiktoken", "required", ("tiktoken:RANKS",)),
        SpecKind("hf", "required", ("hf:NAME_OR_PATH",), fixed_eos=False),
        SpecKind("trained", "required", ("trained:DIR",), fixed_eos=False),
    )
}
# Other names of a kind: Jet-Nemotron-2B's tokenizer is Qwen2.5's (docs/tokenizers.md).
ALIASES = {"qwen2.5": "jet-nemotron"}


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """A parsed spec: ``kind`` (a key of KINDS, an alias resolved), ``arg`` (a path, URL, name or
    directory; "" for none) and ``text``, the spec as typed."""

    text: str
    kind: str
    arg: str = ""

    def __str__(self) -> str:
        return self.text

    @property
    def packaged(self) -> bool:
        """Whether its files ship with an installed package (``jet-nemotron``, ``gpt2``)."""
        return not self.arg and KINDS[self.kind].arg != "required"

    @property
    def fixed_eos(self) -> bool:
        return KINDS[self.kind].fixed_eos

    @property
    def where(self) -> str:
        """What an unreachable store's error names: the URL argument, else the spec."""
        return self.arg if "://" in self.arg else self.text


def _did_you_mean(name: str, kind: SpecKind | None) -> str:
    """The hint for a name a typo away from a kind or an alias (" (did you mean gpt2?)"), when it names none."""
    if kind is not None:
        return ""
    close = difflib.get_close_matches(name, [*KINDS, *ALIASES], n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_spec(text: str | TokenizerSpec) -> TokenizerSpec:
    """The TokenizerSpec ``text`` names; a ValueError listing the kinds for anything else."""
    if isinstance(text, TokenizerSpec):
        return text
    name, _, arg = text.partition(":")
    kind = KINDS.get(ALIASES.get(name, name))
    if kind is None or (kind.arg == "none" and arg) or (kind.arg == "required" and not arg):
        usages = [u for k in KINDS.values() for u in k.usage]
        raise ValueError(f"unknown tokenizer {text!r}{_did_you_mean(name, kind)}; "
                         f"use {', '.join(usages[:-1])} or {usages[-1]}")
    return TokenizerSpec(text, kind.name, arg)
