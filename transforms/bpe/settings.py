"""TrainBpeSettings: the train-bpe job's settings, one typed object.

The CLI fills it from its flags; the reader's, the language filter's and the counter's typed
arguments are built from it, and tokenizer_info.json records its flags.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from transforms.bpe import pretokenize
from transforms.bucketed.settings import FIELD_DEFAULTS, InputFields
from transforms.tokenizers.vocabularies import ENDOFTEXT

if TYPE_CHECKING:  # imported where it is built: --help imports no Beam
    from transforms.bpe.count import CountConfig


@dataclasses.dataclass(frozen=True)
class TrainBpeSettings(InputFields):
    input: str
    output: str
    vocab_size: int | None = None  # every id, the EOS included
    merges: int | None = None
    pattern: str = "qwen2"
    alphabet: str = "bytes"
    min_count: int = 1
    max_words: int = 0
    count_shards: int = 16
    eos_token: str = ENDOFTEXT
    language: str = "eng_Latn"
    lid_threshold: float = 0.90
    min_token_count: int = 1
    on_bad_record: str = "fail"
    id_field: str = FIELD_DEFAULTS["id_field"]
    text_field: str = FIELD_DEFAULTS["text_field"]
    language_fields: str = FIELD_DEFAULTS["language_fields"]
    lid_score_field: str = FIELD_DEFAULTS["lid_score_field"]
    token_count_field: str = FIELD_DEFAULTS["token_count_field"]
    removal_list: str | None = None  # ids to leave out (a list, or an output tree: its removals.txt)

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
