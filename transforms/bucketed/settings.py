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
from transforms.core.records import DEFAULT_LANGUAGE_FIELDS, DEFAULT_TOKEN_COUNT, LID_SCORE

if TYPE_CHECKING:  # the steps' own configs are imported where they are built: --help imports no Beam
    from transforms.bucketed.filter import LidFilterConfig
    from transforms.bucketed.tokenize import TokenizerConfig
    from transforms.bucketed.write import ShardConfig
    from transforms.inputs.fields import ReadConfig

OFF = "none"  # the value of --language, --lid-score-field or --token-count-field that turns its check off
# The field settings, and the value each has unless a flag changes it.
FIELD_DEFAULTS = {
    "id_field": "id",
    "text_field": "text",
    "language_fields": ",".join(DEFAULT_LANGUAGE_FIELDS),
    "lid_score_field": LID_SCORE,
    "token_count_field": DEFAULT_TOKEN_COUNT,
}


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
    language: str = "eng_Latn"
    lid_threshold: float = 0.90
    min_token_count: int = 1
    tokenizer: str = "jet-nemotron"
    eos_token: str | None = None
    tokenizer_backend: str = "auto"
    tokenizer_threads: int = 1
    read_connections: int = storage.DEFAULT_CONNECTIONS  # never changes the bytes
    dtype: str = layout.DEFAULT_DTYPE
    partitions: int = layout.DEFAULT_PARTITIONS
    max_shard_bytes: int = layout.DEFAULT_MAX_SHARD_BYTES
    seed: int = layout.DEFAULT_SEED
    batch_docs: int = 64
    removal_list: str | None = None
    on_bad_record: str = "fail"
    special_tokens: str = "text"
    id_field: str = FIELD_DEFAULTS["id_field"]
    text_field: str = FIELD_DEFAULTS["text_field"]
    language_fields: str = FIELD_DEFAULTS["language_fields"]
    lid_score_field: str = FIELD_DEFAULTS["lid_score_field"]
    token_count_field: str = FIELD_DEFAULTS["token_count_field"]
    restart: bool = False  # discard saved work (transforms.core.resume); never changes the bytes
    license: str | None = None  # the card's metadata (transforms.core.provenance.card_metadata)
    source_dataset: str | None = None
    input_sha256: bool = False

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
