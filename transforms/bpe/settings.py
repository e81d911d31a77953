"""TrainBpeSettings: the train-bpe job's settings, one typed object.

The CLI fills it from its flags; the reader's, the language filter's and the counter's typed
arguments are built from it, and tokenizer_info.json records its flags.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shards.conditions import TOKENS
from transforms.bpe import pretokenize
from transforms.bucketed.settings import InputFields, document_filter
from transforms.core.settings import setting, shared
from transforms.tokenizers.vocabularies import ENDOFTEXT

if TYPE_CHECKING:  # imported where it is built: --help imports no Beam
    from transforms.bpe.count import CountConfig


@dataclasses.dataclass(frozen=True)
class TrainBpeSettings(InputFields):
    input: str
    output: str
    vocab_size: int | None = None  # every id, the EOS included
    merges: int | None = None
    pattern: str = setting("qwen2", "pre-tokenization: Qwen2's regex, GPT-2's, or chars (a space goes with the word "
                           "after it)", choices=pretokenize.PATTERNS)
    alphabet: str = setting("bytes", "base symbols: the 256 byte values, or the corpus's characters in code-point "
                            "order", choices=pretokenize.ALPHABETS)
    min_count: int = setting(1, "leave out words seen fewer times than this")
    max_words: int = setting(0, "keep only this many of the most frequent words (ties: by UTF-8 bytes); 0: all")
    count_shards: int = setting(16, "pieces the word table is counted in (each summed on one worker); never changes "
                                "the result")
    eos_token: str = setting(ENDOFTEXT, "the EOS, added as a special token right after the ranks")
    language: str = document_filter("language")
    lid_threshold: float = document_filter("lid_threshold")
    min_token_count: int = document_filter("min_token_count")
    on_bad_record: str = shared("on_bad_record")
    id_field: str = document_filter("id_field")
    text_field: str = document_filter("text_field")
    language_fields: str = document_filter("language_fields")
    lid_score_field: str = document_filter("lid_score_field")
    token_count_field: str = document_filter("token_count_field")
    keep: tuple[str, ...] = document_filter("keep")
    # ids to leave out (a list, or an output tree: its removals.txt)
    removal_list: str | None = setting(None, "ids to leave out, one a line, no comments; or an output tree (its "
                                       "removals.txt)")

    def __post_init__(self):
        if (self.vocab_size is None) == (self.merges is None):
            raise ValueError("give exactly one of --vocab-size and --merges")
        if self.merges is not None and self.merges < 0:
            raise ValueError(f"--merges must be 0 or more, got {self.merges}")
        base = 256 if self.alphabet == "bytes" else 1
        if self.vocab_size is not None and self.vocab_size < base + 1:
            raise ValueError(f"--vocab-size must be at least {base + 1} (the base symbols and the EOS), "
                             f"got {self.vocab_size}")
        if self.alphabet not in pretokenize.ALPHABETS:
            raise ValueError(f"unknown --alphabet {self.alphabet!r}; use one of {', '.join(pretokenize.ALPHABETS)}")
        if not self.eos_token:
            raise ValueError("--eos-token must not be empty")
        self.check_fields()
        for c in self.conditions():
            if c.column == TOKENS:
                raise ValueError(f"{c.flag}: train-bpe counts words of documents it does not tokenize; {TOKENS} "
                                 "is for the bucketed job")

    def merges_for(self, base_size: int) -> int:
        """How many merges to learn over ``base_size`` base symbols."""
        if self.merges is not None:
            return self.merges
        n = self.vocab_size - 1 - base_size
        if n < 0:
            raise ValueError(f"--vocab-size {self.vocab_size} is below the {base_size} base symbols and the EOS")
        return n

    def count_config(self, run_url: str) -> CountConfig:
        from transforms.bpe.count import CountConfig

        return CountConfig(self.pattern, run_url, shards=self.count_shards, min_count=self.min_count,
                           max_words=self.max_words)
