"""BucketedSettings: the bucketed job's settings, one typed object.

The CLI fills it from its flags; every step's own typed argument (the filter's, the tokenizer's,
the writer's) and the stats dataset_stats.txt records (BucketedFormat) are built from it.

The field settings say which input fields are read, as the flags spell them: ``language_fields``
is a comma-separated list, and ``none`` turns a check off (``language="none"``: no language field
and no score is read or checked; ``lid_score_field="none"``: no score; ``token_count_field="none"``:
no count). The defaults are the FinePDFs schema's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from shards import layout, storage
from transforms.core.records import (
    DEFAULT_LANGUAGE,
    DEFAULT_LANGUAGE_FIELDS,
    DEFAULT_LID_THRESHOLD,
    DEFAULT_TOKEN_COUNT,
    LID_SCORE,
)
from transforms.core.settings import setting, shared
from transforms.tokenizers.backends import BACKENDS
from transforms.tokenizers.encoder import SPECIAL_TOKEN_MODES

if TYPE_CHECKING:  # the steps' own configs are imported where they are built: --help imports no Beam
    from transforms.bucketed.filter import LidFilterConfig
    from transforms.bucketed.tokenize import TokenizerConfig
    from transforms.bucketed.write import ShardConfig
    from transforms.inputs.fields import ReadConfig

OFF = "none"  # the value of --language, --lid-score-field or --token-count-field that turns its check off
# The language filter's settings and the input's field names, of every job that reads and filters
# documents as the bucketed job does, in their flags' order: name -> (default, help). The defaults
# are the FinePDFs schema's; FineWeb is --language en --language-fields language --lid-score-field
# language_score --lid-threshold 0.65.
DOCUMENT_FILTER = {
    "language": (DEFAULT_LANGUAGE, f"keep documents whose every --language-fields field equals this; {OFF}: no "
                 "language filter"),
    "lid_threshold": (DEFAULT_LID_THRESHOLD, "minimum LID score (--lid-score-field)"),
    "min_token_count": (1, "minimum source token count (--token-count-field)"),
    "text_field": ("text", "field of the document text"),
    "id_field": ("id", "field of the document id"),
    "language_fields": (",".join(DEFAULT_LANGUAGE_FIELDS), "comma-separated fields that must each equal --language"),
    "lid_score_field": (LID_SCORE, f"field of the LID score compared with --lid-threshold; {OFF}: no score check"),
    "token_count_field": (DEFAULT_TOKEN_COUNT, f"field of the source token count compared with --min-token-count; "
                          f"{OFF}: no count check"),
}
DOCUMENT_FILTER_FLAGS = tuple(DOCUMENT_FILTER)
# The field settings, and the value each has unless a flag changes it.
FIELD_DEFAULTS = {name: DOCUMENT_FILTER[name][0]
                  for name in ("id_field", "text_field", "language_fields", "lid_score_field", "token_count_field")}


def document_filter(name: str):
    """The settings field ``name`` of DOCUMENT_FILTER."""
    return setting(*DOCUMENT_FILTER[name])


class InputFields:
    """What a job that reads and filters documents as the bucketed job does gets from its field
    settings (see the module docstring): the reader's and the language filter's typed arguments.
    The dataclass that inherits it has ``input``, ``on_bad_record``, ``language``, ``lid_threshold``,
    ``min_token_count`` and the FIELD_DEFAULTS fields, and calls check_fields() in __post_init__."""

    def check_fields(self) -> None:
        """A bad combination fails here, when the flags are parsed, naming the flag."""
        default_threshold = type(self).__dataclass_fields__["lid_threshold"].default
        if self.lid_threshold != default_threshold and OFF in (self.language, self.lid_score_field):
            flag = "--language" if self.language == OFF else "--lid-score-field"
            raise ValueError(f"--lid-threshold {self.lid_threshold} would be ignored: {flag} {OFF} checks no LID "
                             "score")
        if self.language != OFF and not self._language_fields():
            raise ValueError(f"--language-fields names no field to check --language {self.language} in "
                             f"(--language {OFF} turns the language filter off)")
        try:
            self.lid_filter()
            self.read_config()
        except ValueError as e:
            raise ValueError(f"the field flags: {e}") from None

    def _language_fields(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.language_fields.split(",") if name.strip())

    def _filter_fields(self) -> tuple[str | None, tuple[str, ...], str | None, str | None]:
        """(the language or None, its fields, the score's field or None, the count's or None)."""
        if self.language == OFF:
            language, fields, score = None, (), None
        else:
            language, fields = self.language, self._language_fields()
            score = None if self.lid_score_field == OFF else self.lid_score_field
        count = None if self.token_count_field == OFF else self.token_count_field
        return language, fields, score, count

    def field_settings(self) -> dict[str, str]:
        """The field settings that differ from the FinePDFs defaults (what the stats record)."""
        given = {k: getattr(self, k) for k in FIELD_DEFAULTS}
        given["language_fields"] = ",".join(self._language_fields())
        return {k: v for k, v in given.items() if v != FIELD_DEFAULTS[k]}

    def read_config(self) -> ReadConfig:
        from transforms.inputs.fields import ReadConfig

        _, fields, score, count = self._filter_fields()
        return ReadConfig(storage.normalize(self.input), id_field=self.id_field, text_field=self.text_field,
                          on_bad_record=self.on_bad_record, language_fields=fields, lid_score_field=score,
                          token_count_field=count)

    def lid_filter(self) -> LidFilterConfig:
        from transforms.bucketed.filter import LidFilterConfig

        language, fields, score, count = self._filter_fields()
        return LidFilterConfig(language, self.lid_threshold, self.min_token_count, language_fields=fields,
                               score_field=score, token_count_field=count)


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
    restart: bool = False  # discard saved work (transforms.core.resume); never changes the bytes
    license: str | None = shared("license")  # the card's metadata (transforms.core.provenance.card_metadata)
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
