"""PublishOutput: move a run's staged shards into place and write the manifest and stats last.

Runs once, after every shard group is staged. The order is what makes the output safe to read:

    1. the manifest is assembled in the staging area from the groups' rows, in bucket and
       partition order, and the stats are computed; documents in must equal documents written
       plus documents dropped, or the run fails here and publishes nothing
    2. the old commit markers go first (dataset_stats.txt, then processed_spec.txt), so from this
       moment the tree no longer looks complete
    3. the files the tree's ownership record lists that this run does not write (shards of an
       earlier run, files derived from them) are deleted; nothing the record does not list is
       touched (shards/tree.py)
    4. staged shards are moved to their final names (a rename on local disks)
    5. processed_spec.txt and checksums.sha256; the audit lines of a removal that was pending
       when the run began (its documents were kept out), and those of the ids of --removal-list
       (so every later run keeps them out); then dataset_stats.txt: the stats file is the commit
       point
    6. the run's temporary directory (spill files, staging) is removed

A reader that finds dataset_stats.txt may trust every file the manifest names. Every step can be
repeated, so a retried publish finishes the job.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import time

import apache_beam as beam

from shards import layout, storage, tree
from shards.manifest import MANIFEST_HEADER, BucketStats, DatasetStats, format_checksums
from transforms.bucketed.write import RunPaths, ShardConfig, ShardGroup
from transforms.core.drops import CountDrops

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StatsSettings:
    """The job settings dataset_stats.txt records beside the counts."""

    language: str
    lid_threshold: float
    min_token_count: int
    tokenizer: str
    eos_id: int
    vocab_size: int
    removal_list_ids: int | None = None


class UnaccountedDocumentsError(RuntimeError):
    pass


def compute_stats(
    groups: list[ShardGroup],
    raw_documents: int,
    drops: dict[str, int],
    settings: StatsSettings,
    config: ShardConfig,
    removal_found: int | None = None,
) -> DatasetStats:
    buckets = {name: BucketStats() for name in layout.BUCKET_NAMES}
    for group in groups:
        b = buckets[group.bucket]
        for f in group.files:
            b.documents += f.documents
            b.tokens += f.tokens
            b.files += 1
    stats = DatasetStats(
        raw_documents=raw_documents,
        language=settings.language,
        lid_threshold=settings.lid_threshold,
        min_token_count=settings.min_token_count,
        tokenizer=settings.tokenizer,
        eos_id=settings.eos_id,
        vocab_size=settings.vocab_size,
        dtype=config.dtype,
        partitions=config.partitions,
        seed=config.seed,
        buckets=buckets,
        drops=dict(sorted(drops.items())),
        removal_list_ids=settings.removal_list_ids,
        removal_ids_not_found=(
            None if settings.removal_list_ids is None else settings.removal_list_ids - (removal_found or 0)
        ),
    )
    if stats.kept_documents + stats.dropped_documents != raw_documents:
        raise UnaccountedDocumentsError(
            f"{raw_documents} documents were read, but {stats.kept_documents} written + "
            f"{stats.dropped_documents} dropped = {stats.kept_documents + stats.dropped_documents}; "
            "refusing to publish an output that lost or duplicated documents"
        )
    return stats


def _group_order(group: ShardGroup) -> tuple[int, int]:
    return layout.BUCKET_NAMES.index(group.bucket), group.partition


def publish(
    groups: list[ShardGroup],
    raw_documents: int,
    drops: dict[str, int],
    settings: StatsSettings,
    config: ShardConfig,
    removal_found: int | None = None,
) -> DatasetStats:
    groups = sorted(groups, key=_group_order)
    stats = compute_stats(groups, raw_documents, drops, settings, config, removal_found)
    fs, root = storage.filesystem(config.output)
    _, staged = storage.filesystem(config.staged_url)

    # 1. The manifest, streamed together from the groups' rows, in the staging area.
    staged_manifest = posixpath.join(staged, layout.MANIFEST_NAME)
    if not fs.exists(staged_manifest):
        tmp = staged_manifest + ".partial"
        fs.makedirs(staged, exist_ok=True)  # no group was staged when no document was kept
        with fs.open(tmp, "wb") as out:
            out.write((MANIFEST_HEADER + "\n").encode())
            for group in groups:
                with fs.open(storage.filesystem(group.manifest_url)[1], "rb") as rows:
                    while chunk := rows.read(1 << 20):
                        out.write(chunk)
        fs.mv(tmp, staged_manifest)

    # 2. From here on the tree does not look complete.
    mark_publishing(config)
    final_stats = posixpath.join(root, layout.STATS_NAME)
    final_manifest = posixpath.join(root, layout.MANIFEST_NAME)
    for marker in (final_stats, final_manifest):
        if fs.exists(marker):
            fs.rm(marker)

    # 3. and 4. Files of an earlier run this run does not write go; the staged ones move in.
    new_files = {f.rel_path for g in groups for f in g.files}
    replace_files(config, "bucketed", new_files)

    # 5. The manifest and the checksums, then the stats: the commit point. 6. Temporary files go.
    if fs.exists(staged_manifest):
        fs.mv(staged_manifest, final_manifest)
    sums = {f.rel_path: f.sha256 for g in groups for f in g.files}
    tree.write_file(config.output, layout.CHECKSUMS_NAME, format_checksums(sums).encode())
    if config.pending_removal is not None:
        finish_pending_removal(config.output, config.pending_removal)
    if config.removal_list is not None:
        from shards.removal import read_removal_list
        from transforms.tools.surgery import record_removal_list

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        record_removal_list(config.output, read_removal_list(config.removal_list), config.run_id, now)
    commit(config, stats.to_text())
    log.info("published %d files, %d documents to %s", stats.total_files, stats.kept_documents, config.output)
    return stats


PUBLISHING_NAME = "publishing"


def mark_publishing(config: RunPaths) -> None:
    """Note in the run's directory that publishing began: from here on, a failure leaves the tree
    unfinished (no dataset_stats.txt) rather than as it was."""
    fs, path = storage.filesystem(storage.join(config.run_url, PUBLISHING_NAME))
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, b"")


def finish_pending_removal(output: str, run: str) -> None:
    """A removal that was interrupted before this run: its documents were kept out of this run
    (its ids were a removal source), so what is left is its audit lines; then its journal goes."""
    from transforms.tools.surgery import append_audit_lines, delete_journal, load_journal

    plan = load_journal(output)
    if plan is None or plan.run != run:
        return
    append_audit_lines(output, plan)
    delete_journal(output)


def replace_files(config: RunPaths, kind: str, new_files: set[str]) -> None:
    """Delete the files the tree's record lists that this run does not write (and every derived
    file), then move each staged file of ``new_files`` to its name. Both jobs' publish steps 3
    and 4. Only recorded files are ever deleted (shards.tree): never by a pattern.

    The record lists the new files before any of them is moved in, and the deleted ones until
    they are gone, so a crash leaves no file of ours unrecorded. Renames on a local disk; on
    object stores, where a move is a copy and a delete, all copies at once (s3fs and gcsfs run
    them concurrently). A file already moved by an earlier attempt is skipped, so a retried
    publish finishes the job.
    """
    fs, root = storage.filesystem(config.output)
    _, staged = storage.filesystem(config.staged_url)
    record = tree.owned(config.output, kind)
    stale_files = set(record.files) - new_files
    stale_derived = set(record.derived)
    tree.record_files(config.output, record, add=new_files)
    for rel in sorted(stale_files):
        log.info("removing %s, written by an earlier run", rel)
    for rel in sorted(stale_derived):
        log.info("removing %s, derived from the earlier output", rel)
    tree.delete_listed(config.output, stale_files | stale_derived)
    tree.record_files(config.output, record, drop=stale_files, drop_derived=stale_derived)
    moves = []
    for rel in sorted(new_files):
        src, dst = posixpath.join(staged, rel), posixpath.join(root, rel)
        if fs.exists(src):
            moves.append((src, dst))
        elif not fs.exists(dst):
            raise FileNotFoundError(f"staged file {src} is missing and was never published")
    if storage.renames_atomically(fs):
        for src, dst in moves:
            fs.makedirs(posixpath.dirname(dst), exist_ok=True)
            fs.mv(src, dst)
    elif moves:
        fs.copy([s for s, _ in moves], [d for _, d in moves])
        fs.rm([s for s, _ in moves])


def commit(config: RunPaths, stats_text: str) -> None:
    """Write dataset_stats.txt, the commit point, then remove the run's temporary directory."""
    fs, root = storage.filesystem(config.output)
    tree.write_file(config.output, layout.STATS_NAME, stats_text.encode())
    fs.rm(storage.filesystem(config.run_url)[1], recursive=True)
    temp_root = posixpath.join(root, layout.TEMP_DIR_NAME)
    if fs.isdir(temp_root) and not fs.ls(temp_root):
        fs.rmdir(temp_root)


class PublishFn(beam.DoFn):
    def __init__(self, config: ShardConfig, settings: StatsSettings):
        self._config = config
        self._settings = settings

    def process(self, groups: list[ShardGroup], raw_documents: int, drops: dict[str, int], removal_found=None):
        yield publish(groups, raw_documents, drops, self._settings, self._config, removal_found)


class PublishOutput(beam.PTransform):
    """ShardGroups in; publishes once all are staged and yields the DatasetStats.

    ``raw_documents`` is a PCollection of one count, ``drop_reasons`` a tuple of PCollections of
    ``(reason, n)`` pairs, ``removal_found`` (optional) one count of the removal-list ids seen.
    """

    def __init__(self, config: ShardConfig, settings: StatsSettings, raw_documents, drop_reasons, removal_found=None):
        super().__init__()
        self._config = config
        self._settings = settings
        self._raw = raw_documents
        self._drops = drop_reasons
        self._removal_found = removal_found

    def expand(self, groups):
        drop_counts = tuple(self._drops) | "CountDropReasons" >> CountDrops()
        side = {}
        if self._removal_found is not None:
            side["removal_found"] = beam.pvalue.AsSingleton(self._removal_found)
        return (
            groups
            | "CollectShardGroups" >> beam.combiners.ToList()
            | "PublishFiles"
            >> beam.ParDo(
                PublishFn(self._config, self._settings),
                raw_documents=beam.pvalue.AsSingleton(self._raw),
                drops=beam.pvalue.AsDict(drop_counts),
                **side,
            )
        )
