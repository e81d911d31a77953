"""BucketedSettings: the bucketed job's settings, one typed object.

The CLI fills it from its flags; every step's own typed argument (the filter's conditions, the
tokenizer's, the writer's) and the stats dataset_stats.txt records (BucketedFormat) are built from it.

The filter is a list of conditions (shards/conditions.py): the FinePDFs-Edu card's by default,
edited by the shorthand flags (DOCUMENT_FILTER: the language, the threshold, the fields, ``none``
turning a condition off), and ``--keep 'COLUMN OP VALUE'`` adding one, as often as it is given.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shards import conditions, layout, storage
from transforms.core.settings import setting, shared
from transforms.inputs.fields import ReadConfig, condition_fields
from transforms.tokenizers.backends import BACKENDS
from transforms.tokenizers.encoder import SPECIAL_TOKEN_MODES

if TYPE_CHECKING:  # the steps' own configs are imported where they are built: --help imports no Beam
    from transforms.bucketed.tokenize import TokenizerConfig
    from transforms.bucketed.write import ShardConfig
    from transforms.inputs.fields import ReadConfig, condition_fields

OFF = conditions.OFF  # the value of --language, --lid-score-field or --token-count-field that turns its check off
_D = conditions.SHORTHANDS
# The filter's settings and the input's field names, of every job that reads and filters
# documents as the bucketed job does, in their flags' order: name -> (default, help). The defaults
# are the FinePDFs schema's; FineWeb is --language en --language-fields language --lid-score-field
# language_score --lid-threshold 0.65.
DOCUMENT_FILTER = {
    "language": (_D["language"], f"keep documents whose every --language-fields field equals this; {OFF}: no "
                 "language filter"),
    "lid_threshold": (_D["lid_threshold"], "minimum LID score (--lid-score-field)"),
    "min_token_count": (_D["min_token_count"], "minimum source token count (--token-count-field)"),
    "text_field": ("text", "field of the document text"),
    "id_field": ("id", "field of the document id"),
    "language_fields": (_D["language_fields"], "comma-separated fields that must each equal --language"),
    "lid_score_field": (_D["lid_score_field"], f"field of the LID score compared with --lid-threshold; {OFF}: no "
                        "score check"),
    "token_count_field": (_D["token_count_field"], f"field of the source token count compared with "
                          f"--min-token-count; {OFF}: no count check"),
    "keep": ((), "keep only documents for which COLUMN OP VALUE holds, besides the conditions above (repeatable; "
             "OP: == != >= > <= < in [..]; VALUE: a number, true, false, null or a quoted string; COLUMN: an input "
             f"column, or {conditions.TOKENS}, the length in tokens with the EOS): "
             "--keep 'is_truncated == false' --keep 'full_doc_lid_score >= 0.8'"),
}
DOCUMENT_FILTER_FLAGS = tuple(DOCUMENT_FILTER)
# The field settings, and the value each has unless a flag changes it.
FIELD_DEFAULTS = {name: DOCUMENT_FILTER[name][0] for name in ("id_field", "text_field")}


def document_filter(name: str):
    """The settings field ``name`` of DOCUMENT_FILTER."""
    if name == conditions.KEEP:
        return setting(*DOCUMENT_FILTER[name], flags=("--keep",), metavar="'COLUMN OP VALUE'", repeated=True)
    return setting(*DOCUMENT_FILTER[name])


class InputFields:
    """What a job that reads and filters documents as the bucketed job does gets from its
    settings (see the module docstring): the reader's typed argument and the filter's conditions.
    The dataclass that inherits it has ``input``, ``on_bad_record`` and the DOCUMENT_FILTER
    fields, and calls check_fields() in __post_init__."""

    def check_fields(self) -> None:
        """A bad combination fails here, when the flags are parsed, naming the flag."""
        object.__setattr__(self, "keep", tuple(self.keep))
        default_threshold = type(self).__dataclass_fields__["lid_threshold"].default
        if self.lid_threshold != default_threshold and OFF in (self.language, self.lid_score_field):
            flag = "--language" if self.language == OFF else "--lid-score-field"
            raise ValueError(f"--lid-threshold {self.lid_threshold} would be ignored: {flag} {OFF} checks no LID "
                             "score")
        if self.language != OFF and not self._language_fields():
            raise ValueError(f"--language-fields names no field to check --language {self.language} in "
                             f"(--language {OFF} turns the language filter off)")
        if self.language == "":
            raise ValueError("--language must not be empty")
        if not 0.0 <= self.lid_threshold <= 1.0:  # NaN fails too
            raise ValueError(f"--lid-threshold must be within [0, 1], got {self.lid_threshold}")
        if not 0 <= self.min_token_count <= conditions.EXACT_INT:  # the filter compares it with Arrow
            raise ValueError(f"--min-token-count must be within 0..{conditions.EXACT_INT}, got {self.min_token_count}")
        self.conditions()  # a condition that cannot be read says so here, naming it
        try:
            self.read_config()
        except ValueError as e:
            raise ValueError(f"the field flags: {e}") from None

    def _language_fields(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.language_fields.split(",") if name.strip())

    def filter_settings(self) -> dict[str, object]:
        """The settings that make the filter's conditions, as the stats record them."""
        values = {name: getattr(self, name) for name in conditions.SHORTHANDS}
        values["language_fields"] = ",".join(self._language_fields())
        return {**values, conditions.KEEP: self.keep}

    def conditions(self) -> tuple[conditions.Condition, ...]:
        """The filter's conditions, in the order they are checked."""
        return conditions.conditions(self.filter_settings())

    def field_settings(self) -> dict[str, str]:
        """The field settings that differ from the FinePDFs defaults (what the stats record)."""
        return {k: getattr(self, k) for k in FIELD_DEFAULTS if getattr(self, k) != FIELD_DEFAULTS[k]}

    def read_config(self) -> ReadConfig:
        return ReadConfig(storage.normalize(self.input), id_field=self.id_field, text_field=self.text_field,
                          on_bad_record=self.on_bad_record, columns=condition_fields(self.conditions()))


@dataclasses.dataclass(frozen=True)
class BucketedSettings(InputFields):
    input: str
    output: str
    language: str = document_filter("language")
    lid_threshold: float = document_filter("lid_threshold")
    min_token_count: int = document_filter("min_token_count")
    tokenizer: str = setting("jet-nemotron", "jet-nemotron | jet-nemotron:PATH | gpt2 | tiktoken:PATH | "
                             "hf:NAME_OR_PATH | trained:DIR")
    eos_token: str | None = setting(None, "for hf: and trained: tokenizers, the token appended as EOS (default: "
                                    "its eos)")
    tokenizer_backend: str = setting("auto", "auto: quicktok where it encodes the tokenizer exactly (jet-nemotron), "
                                     "else tiktoken", choices=BACKENDS)
    tokenizer_threads: int = setting(1, "threads of quicktok's batch call per worker (more only for a local run on "
                                     "a large machine)")
    read_connections: int = setting(storage.DEFAULT_CONNECTIONS, "range requests in flight per writer reading spill "
                                    "files on an object store (never changes the bytes)")
    dtype: str = setting(layout.DEFAULT_DTYPE, "token dtype on disk", choices=sorted(layout.DTYPES))
    partitions: int = setting(layout.DEFAULT_PARTITIONS, "partitions per bucket")
    max_shard_bytes: int = setting(layout.DEFAULT_MAX_SHARD_BYTES, "roll to a new file before this size",
                                   spelled=float)
    seed: int = setting(layout.DEFAULT_SEED, "seed of the order inside each partition")
    batch_docs: int = setting(64, "documents per tokenizer batch")
    removal_list: str | None = setting(None, "ids to leave out, one a line, no comments, or a removals.txt")
    on_bad_record: str = shared("on_bad_record")
    special_tokens: str = setting(
        "text", "text: an added-token string (<|endoftext|>, <tool_call>, ...) in a document is encoded as text; "
        "tokenizer: as its single id, as AutoTokenizer does (EOS may then appear inside a document)",
        choices=SPECIAL_TOKEN_MODES)
    id_field: str = document_filter("id_field")
    text_field: str = document_filter("text_field")
    language_fields: str = document_filter("language_fields")
    lid_score_field: str = document_filter("lid_score_field")
    token_count_field: str = document_filter("token_count_field")
    keep: tuple[str, ...] = document_filter("keep")
    restart: bool = False  # discard saved work (transforms.run.resume); never changes the bytes
    license: str | None = shared("license")  # the card's metadata (transforms.run.provenance.card_metadata)
    source_dataset: str | None = shared("source_dataset")
    input_sha256: bool = shared("input_sha256")

    def __post_init__(self):
        self.check_fields()

    def tokenizer_config(self) -> TokenizerConfig:
        from transforms.bucketed.tokenize import TokenizerConfig

        return TokenizerConfig(spec=self.tokenizer, dtype=self.dtype, eos_token=self.eos_token,
                               batch_docs=self.batch_docs, backend=self.tokenizer_backend,
                               threads=self.tokenizer_threads, special_tokens=self.special_tokens)

    def shard_config(self, run_id: str) -> ShardConfig:
        from transforms.bucketed.write import ShardConfig

        return ShardConfig(output=storage.normalize(self.output), run_id=run_id, partitions=self.partitions,
                           max_shard_bytes=self.max_shard_bytes, seed=self.seed, dtype=self.dtype,
                           read_connections=self.read_connections)
