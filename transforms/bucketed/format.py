"""BucketedFormat: what the bucketed (FinePDFs-Edu) layout adds to the core's publish step.

Its stats (dataset_stats.txt) are built from the job's settings and the staged groups; its own
files are the manifest (processed_spec.txt, assembled in the staging area, moved in after the
shards), its reader index (processed_spec.idx, built from the staged manifest: shards.index)
and the removal records: the audit lines of a removal that was pending when the run began,
and those of the ids of --removal-list, so that every later run keeps them out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import posixpath

from fsspec.asyn import AsyncFileSystem

from shards import index as reader_index
from shards import layout, storage, tree
from shards.card import description_files
from shards.manifest import MANIFEST_HEADER, BucketStats, DatasetStats
from shards.provenance import Provenance, bucketed_document
from shards.removal import audit
from transforms.bucketed.settings import BucketedSettings
from transforms.bucketed.write import ShardConfig, ShardGroup, index_part_url

# Groups' manifest parts fetched at once when assembling the manifest on an object store: each part
# is ~60 bytes a document (a few MB for a group of the full corpus), so a batch holds ~100 MB at most.
MANIFEST_PARTS_IN_FLIGHT = 32


@dataclasses.dataclass(frozen=True)
class BucketedFormat:
    """The layout's publish steps, and its stats: the job's settings, what the tokenizer it loaded
    says (EOS, vocabulary size) and what was written."""

    settings: BucketedSettings
    eos_id: int
    vocab_size: int
    config: ShardConfig
    removal_list_ids: int | None = None
    tokenizer_backend: str | None = None  # the library that encoded, as the launcher loaded it
    # What made the run (versions, tokenizer files, flags, inputs): dataset_stats.json and README.md
    # are written from it and the stats; None writes neither.
    provenance: Provenance | None = None

    kind = "bucketed"
    markers = (layout.MANIFEST_NAME,)

    def compute_stats(self, groups: list[ShardGroup], raw_documents: int, drops: dict[str, int],
                      extras: dict) -> DatasetStats:
        buckets = {name: BucketStats() for name in layout.BUCKET_NAMES}
        for group in groups:
            b = buckets[group.bucket]
            for f in group.files:
                b.documents += f.documents
                b.tokens += f.tokens
                b.files += 1
        found = extras.get("removal_found") or 0
        return DatasetStats(
            raw_documents=raw_documents,
            filter=self.settings.filter_settings(),
            tokenizer=self.settings.tokenizer,
            tokenizer_backend=self.tokenizer_backend,
            eos_id=self.eos_id,
            vocab_size=self.vocab_size,
            dtype=self.config.dtype,
            partitions=self.config.partitions,
            seed=self.config.seed,
            buckets=buckets,
            drops=drops,
            removal_list_ids=self.removal_list_ids,
            removal_ids_not_found=None if self.removal_list_ids is None else self.removal_list_ids - found,
            special_tokens=self.settings.special_tokens,
            field_settings=self.settings.field_settings(),
        )

    def describe(self, stats: DatasetStats) -> dict[str, bytes]:
        """dataset_stats.json and the dataset card (README.md), by name."""
        if self.provenance is None:
            return {}
        return description_files(bucketed_document(self.provenance, stats))

    def files(self, groups: list[ShardGroup]) -> dict[str, str]:
        return {f.rel_path: f.sha256 for g in groups for f in g.files}

    def prepare(self, groups: list[ShardGroup], config: ShardConfig) -> None:
        """The manifest, streamed together from the groups' rows in bucket and partition order,
        then its reader index: from the groups' index parts (no step per document), or, when the
        manifest was assembled by an earlier attempt or a part is missing, by parsing the manifest."""
        fs, _ = storage.filesystem(config.output)
        _, staged = storage.filesystem(config.staged_url)
        staged_manifest = posixpath.join(staged, layout.MANIFEST_NAME)
        groups = sorted(groups, key=_group_order)
        assembled = None
        if not fs.exists(staged_manifest):
            assembled = self._assemble_manifest(fs, staged, staged_manifest, groups)
        staged_index = posixpath.join(staged, reader_index.INDEX_NAME)
        if not fs.exists(staged_index):
            build = None if assembled is None else _parts_builder(fs, groups, *assembled)
            # The reader index (shards.index), put in place whole.
            reader_index.write_index_file(fs, staged, staged_index, staged_index + ".partial", build)

    def _assemble_manifest(self, fs, staged: str, staged_manifest: str,
                           groups: list[ShardGroup]) -> tuple[int, bytes]:
        """The groups' rows end to end under the header; its size and sha256, taken as it is
        written. On an object store the parts are fetched MANIFEST_PARTS_IN_FLIGHT at a time (one
        after another, each request waited for in turn, this was the sample's slowest step), and
        only those are held: the manifest is streamed."""
        tmp = staged_manifest + ".partial"
        fs.makedirs(staged, exist_ok=True)  # no group was staged when no document was kept
        parts = [storage.filesystem(g.manifest_url)[1] for g in groups]
        digest = hashlib.sha256()
        size = 0
        with fs.open(tmp, "wb") as out:
            for data in itertools.chain([(MANIFEST_HEADER + "\n").encode()], _fetched(fs, parts)):
                digest.update(data)
                size += len(data)
                out.write(data)
        fs.mv(tmp, staged_manifest)
        return size, digest.digest()

    def finish(self, groups: list[ShardGroup], config: ShardConfig) -> None:
        out = tree.Tree(config.output)
        staged_manifest = tree.Tree.temp_name(config.run_id, tree.Tree.STAGED_DIR, layout.MANIFEST_NAME)
        staged_index = tree.Tree.temp_name(config.run_id, tree.Tree.STAGED_DIR, reader_index.INDEX_NAME)
        if out.lexists(staged_index):
            # Listed before it is there, as every derived file is (shards.tree): the next publish
            # deletes it with the shards it describes.
            record = tree.owned(config.output, self.kind)
            tree.record_files(config.output, record, add_derived=[reader_index.INDEX_NAME])
        if out.lexists(staged_manifest):
            out.rename(staged_manifest, layout.MANIFEST_NAME)
        if out.lexists(staged_index):
            out.rename(staged_index, reader_index.INDEX_NAME)
        audit.record_published_run(config.output, config.pending_removal, config.removal_list, config.run_id,
                                   self.settings.id_field)


def _group_order(group: ShardGroup) -> tuple[int, int]:
    return layout.BUCKET_NAMES.index(group.bucket), group.partition


def _fetched(fs, paths: list[str]):
    """The bytes of each file of ``paths`` in turn, whole (a group's manifest rows or index part: a
    few MB at most): on an object store fetched MANIFEST_PARTS_IN_FLIGHT at once, so a batch holds
    ~100 MB at most."""
    if storage.renames_atomically(fs):
        for path in paths:
            with fs.open(path, "rb") as f:
                yield f.read()
        return
    concurrency = {"batch_size": MANIFEST_PARTS_IN_FLIGHT} if isinstance(fs, AsyncFileSystem) else {}
    for first in range(0, len(paths), MANIFEST_PARTS_IN_FLIGHT):
        batch = paths[first:first + MANIFEST_PARTS_IN_FLIGHT]
        none = [None] * len(batch)
        # cat_ranges, not cat: a path is data, never a pattern to expand.
        yield from fs.cat_ranges(batch, none, none, on_error="raise", **concurrency)


def _all_there(fs, paths: list[str]) -> bool:
    """Whether every file of ``paths`` exists (on an object store: one listing of their directory)."""
    if not paths:
        return True
    if storage.renames_atomically(fs):
        return all(fs.exists(p) for p in paths)
    directory = posixpath.commonpath(paths)
    fs.invalidate_cache(directory)
    return set(paths) <= set(fs.find(directory))


def _parts_builder(fs, groups: list[ShardGroup], manifest_bytes: int, manifest_sha256: bytes):
    """What builds the index from the groups' index parts (write_index_from_parts), or None when a
    part is missing (a group staged by an older version): the manifest is parsed then."""
    parts = [storage.filesystem(index_part_url(g.manifest_url))[1] for g in groups]
    if not _all_there(fs, parts):
        return None

    def build(out) -> int:
        files = ([(f.rel_path, f.documents, f.tokens) for f in g.files] for g in groups)
        return reader_index.write_index_from_parts(zip(files, _fetched(fs, parts), strict=True), manifest_bytes,
                                                   out, manifest_sha256)

    return build
