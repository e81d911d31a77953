"""BucketedSettings: the bucketed job's settings, one typed object.

The CLI fills it from its flags; every step's own typed argument (the filter's, the tokenizer's,
the writer's) and the stats dataset_stats.txt records (BucketedFormat) are built from it.
"""

from __future__ import annotations

import dataclasses

from shards import layout, storage
from transforms.bucketed.filter import LidFilterConfig
from transforms.bucketed.tokenize import TokenizerConfig
from transforms.bucketed.write import ShardConfig
from transforms.core.read import ReadConfig


@dataclasses.dataclass(frozen=True)
class BucketedSettings:
    input: str
    output: str
    language: str = "eng_Latn"
    lid_threshold: float = 0.90
    min_token_count: int = 1
    tokenizer: str = "jet-nemotron"
    eos_token: str | None = None
    tokenizer_backend: str = "auto"
    tokenizer_threads: int = 1
    dtype: str = layout.DEFAULT_DTYPE
    partitions: int = layout.DEFAULT_PARTITIONS
    max_shard_bytes: int = layout.DEFAULT_MAX_SHARD_BYTES
    seed: int = layout.DEFAULT_SEED
    batch_docs: int = 64
    removal_list: str | None = None
    on_bad_record: str = "fail"
    restart: bool = False  # discard saved work (transforms.core.resume); never changes the bytes

    def read_config(self) -> ReadConfig:
        return ReadConfig(storage.normalize(self.input), on_bad_record=self.on_bad_record)

    def lid_filter(self) -> LidFilterConfig:
        return LidFilterConfig(self.language, self.lid_threshold, self.min_token_count)

    def tokenizer_config(self) -> TokenizerConfig:
        return TokenizerConfig(spec=self.tokenizer, dtype=self.dtype, eos_token=self.eos_token,
                               batch_docs=self.batch_docs, backend=self.tokenizer_backend,
                               threads=self.tokenizer_threads)

    def shard_config(self, run_id: str) -> ShardConfig:
        return ShardConfig(output=storage.normalize(self.output), run_id=run_id, partitions=self.partitions,
                           max_shard_bytes=self.max_shard_bytes, seed=self.seed, dtype=self.dtype)
