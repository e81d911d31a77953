"""ScaffoldSettings: the scaffold job's settings, one typed object.

The CLI fills it from its flags; the encoder's, the reader's and the writer's typed arguments and
the stats dataset_stats.txt records (ScaffoldFormat) are built from it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shards import layout, llmc, storage
from transforms.core.settings import setting, shared
from transforms.inputs.fields import ReadConfig
from transforms.scaffold.defaults import DEFAULT_MAX_WORD_CHARS, DEFAULT_ORDER_RANGES, LONG_DOC_POLICIES

if TYPE_CHECKING:  # the steps' own configs are imported where they are built: --help imports no Beam
    from transforms.inputs.fields import ReadConfig
    from transforms.scaffold.encode import ScaffoldConfig
    from transforms.scaffold.write import LlmcShardConfig

ANNOTATED_FIELD = "content-ff"
PLAIN_FIELD = "text"


@dataclasses.dataclass(frozen=True)
class ScaffoldSettings:
    input: str
    output: str
    annotate: bool = setting(False, "the input is plain text (id, text): split it into words here")
    id_field: str = setting("id", "field of the document id")
    text_field: str | None = setting(None, f"field of the text (default {ANNOTATED_FIELD}, or {PLAIN_FIELD} with "
                                     "--annotate)")
    tokenizer: str = setting("gpt2", "gpt2 | tiktoken:PATH (GPT-2 ranks) | hf:NAME_OR_PATH")
    long_docs: str = setting("skip", "documents over 1,000 words: skip (drop, counted) or chunk (1,000-word "
                             "documents)", choices=LONG_DOC_POLICIES)
    max_word_chars: int = setting(DEFAULT_MAX_WORD_CHARS, "drop (counted) a document with a word longer than this "
                                  "many characters; 0: no limit")
    val_fraction: float = setting(llmc.DEFAULT_VAL_FRACTION, "share of documents in val/, by id hash")
    shard_tokens: int = setting(llmc.DEFAULT_SHARD_TOKENS, "tokens in every shard but the last", spelled=float)
    seed: int = setting(layout.DEFAULT_SEED, "seed of the document order")
    order_ranges: int = setting(DEFAULT_ORDER_RANGES, "pieces (a power of two) each split's ordering is cut into; "
                                "changes memory, never the bytes")
    on_bad_record: str = shared("on_bad_record")
    restart: bool = False  # discard saved work (transforms.run.resume); never changes the bytes
    license: str | None = shared("license")  # the card's metadata (transforms.run.provenance.card_metadata)
    source_dataset: str | None = shared("source_dataset")
    input_sha256: bool = shared("input_sha256")

    @property
    def field(self) -> str:
        return self.text_field or (PLAIN_FIELD if self.annotate else ANNOTATED_FIELD)

    def scaffold_config(self) -> ScaffoldConfig:
        from transforms.scaffold.encode import ScaffoldConfig

        return ScaffoldConfig(tokenizer=self.tokenizer, annotate=self.annotate, long_docs=self.long_docs,
                              val_fraction=self.val_fraction, max_word_chars=self.max_word_chars)

    def shard_config(self, run_id: str) -> LlmcShardConfig:
        from transforms.scaffold.write import LlmcShardConfig

        return LlmcShardConfig(output=storage.normalize(self.output), run_id=run_id, shard_tokens=self.shard_tokens,
                               seed=self.seed, order_ranges=self.order_ranges,
                               chunked_documents=self.long_docs == "chunk")

    def read_config(self) -> ReadConfig:
        return ReadConfig(storage.normalize(self.input), id_field=self.id_field, text_field=self.field,
                          with_lid=False, json_values=True, on_bad_record=self.on_bad_record)
