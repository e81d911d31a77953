"""PublishOutput: move a run's staged files into place and write the stats last, for every job.

Runs once, after every file is staged. What differs between jobs is one OutputFormat (the
bucketed layout, llm.c shards); the order, which is what makes the output safe to read, is this:

    1. the job's stats are computed from its settings and what was staged; documents in must
       equal documents written plus documents dropped (check_accounting), or the run fails here
       and publishes nothing; the job prepares its own files in the staging area (the bucketed
       manifest, assembled from the groups' rows in bucket and partition order)
    2. the old commit markers go first (dataset_stats.txt, then the job's markers such as
       processed_spec.txt), so from this moment the tree no longer looks complete
    3. the files the tree's ownership record lists that this run does not write (shards of an
       earlier run, files derived from them) are deleted; nothing the record does not list is
       touched (shards/tree.py)
    4. staged files are moved to their final names (a rename on local disks)
    5. the job's own files (the manifest; the audit lines of a pending removal and of
       --removal-list), checksums.sha256, the tree's description (dataset_stats.json and the
       README.md dataset card, listed in the ownership record first, so step 3 of the next run
       replaces them), then dataset_stats.txt: the stats file is the commit point
    6. the run's temporary directory (staging) and its saved work (spill files, unit markers:
       transforms.core.resume) are removed

A reader that finds dataset_stats.txt may trust every file the tree names. Every step can be
repeated, so a retried publish finishes the job.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Protocol

import apache_beam as beam
from fsspec.asyn import AsyncFileSystem

from shards import layout, storage, tree
from shards.manifest import format_checksums
from transforms.core.drops import CountDrops

log = logging.getLogger(__name__)


# Copies in flight when publishing to an object store: server-side copies (a GCS rewrite within a
# bucket moves no data; an S3 CopyObject copies inside the store), so many at once cost the worker
# nothing but connections. The client's pool is made as large (storage.filesystem).
PUBLISH_CONNECTIONS = 64


class UnaccountedDocumentsError(RuntimeError):
    pass


class RunPaths:
    """What a job's writer config shares: where its run's temporary files go. Needs ``output`` and
    ``run_id``; with a ``work_dir`` (transforms.core.resume: the saved work a re-run resumes from),
    the spill files go there instead of the run's own directory."""

    @property
    def run_url(self) -> str:
        return storage.join(self.output, layout.TEMP_DIR_NAME, self.run_id)

    @property
    def work_url(self) -> str:
        work_dir = getattr(self, "work_dir", None)
        return storage.join(self.output, layout.TEMP_DIR_NAME, work_dir) if work_dir else self.run_url

    @property
    def spill_url(self) -> str:
        return storage.join(self.work_url, "spill")

    @property
    def staged_url(self) -> str:
        return storage.join(self.run_url, "staged")


class OutputFormat(Protocol):
    """What differs between the jobs' outputs at publish time (as Beam's FileSink is to WriteToFiles).

    ``staged`` is the list of what the job's writer staged (ShardGroups, StagedShards), ``extras``
    the job's own side inputs by name. ``compute_stats`` builds the job's stats from its settings
    and checks what only the job can (tokens encoded = tokens written); the document accounting
    and every step of publishing are the core's.
    """

    kind: str  # the tree kind of shards/tree.py
    markers: tuple[str, ...]  # tree files that must go before any shard changes (besides the stats)

    def compute_stats(self, staged: list, raw_documents: int, drops: dict[str, int], extras: dict): ...

    def files(self, staged: list) -> dict[str, str]:
        """rel_path -> sha256 of every file the run publishes."""

    def prepare(self, staged: list, config: RunPaths) -> None:
        """Work in the staging area before the tree changes (bucketed: assemble the manifest)."""

    def finish(self, staged: list, config: RunPaths) -> None:
        """After the files moved in, before the stats (bucketed: the manifest, removal records)."""

    def describe(self, stats) -> dict[str, bytes]:
        """The files that describe the tree (dataset_stats.json, README.md) by name: written after
        the checksums, before the stats."""


def check_accounting(kept: int, dropped: int, raw_documents: int) -> None:
    """Documents read must equal documents written plus documents dropped: the one check every job
    passes before anything is published."""
    if kept + dropped != raw_documents:
        raise UnaccountedDocumentsError(
            f"{raw_documents} documents were read, but {kept} written + {dropped} dropped = {kept + dropped}; "
            "refusing to publish an output that lost or duplicated documents"
        )


def publish(staged: list, raw_documents: int, drops: dict[str, int], extras: dict, fmt: OutputFormat,
            config: RunPaths):
    """Publish a run's staged files as the module docstring says; returns the stats written."""
    stats = fmt.compute_stats(staged, raw_documents, dict(sorted(drops.items())), extras)
    check_accounting(stats.kept_documents, stats.dropped_documents, raw_documents)
    fs, root = storage.filesystem(config.output)
    files = fmt.files(staged)
    # 1. The job's own preparation, in the staging area.
    fmt.prepare(staged, config)
    # 2. From here on the tree does not look complete.
    mark_publishing(config)
    for name in (layout.STATS_NAME, *fmt.markers):
        marker = posixpath.join(root, name)
        if fs.exists(marker):
            fs.rm(marker)
    # 3. and 4. Files of an earlier run this run does not write go; the staged ones move in.
    replace_files(config, fmt.kind, set(files))
    # 5. The job's own files, the checksums, then the stats: the commit point. 6. Temporary files go.
    fmt.finish(staged, config)
    tree.write_file(config.output, layout.CHECKSUMS_NAME, format_checksums(files).encode())
    write_description(config.output, fmt.kind, fmt.describe(stats) if hasattr(fmt, "describe") else {})
    commit(config, stats.to_text())
    log.info("published %d files, %d documents to %s", len(files), stats.kept_documents, config.output)
    return stats


def write_description(output: str, kind: str, files: dict[str, bytes]) -> None:
    """Write the files that describe a tree (dataset_stats.json, README.md), each listed in the
    ownership record as derived before it is written: a later publish deletes them with the other
    files derived from the old shards, and writes its own. A file of that name the record does not
    list (a user's README.md in a tree an older version wrote) is left as it is, and not written."""
    if not files:
        return
    fs, root = storage.filesystem(output)
    record = tree.owned(output, kind)
    theirs = {rel for rel in files if rel not in record.derived and fs.exists(posixpath.join(root, rel))}
    for rel in sorted(theirs):
        log.warning("%s is not the tool's (its record does not list it): left as it is, not rewritten",
                    storage.join(output, rel))
    ours = {rel: data for rel, data in files.items() if rel not in theirs}
    tree.record_files(output, record, add_derived=sorted(ours))
    for rel, data in sorted(ours.items()):
        tree.write_file(output, rel, data)


PUBLISHING_NAME = "publishing"


def mark_publishing(config: RunPaths) -> None:
    """Note in the run's directory that publishing began: from here on, a failure leaves the tree
    unfinished (no dataset_stats.txt) rather than as it was."""
    fs, path = storage.filesystem(storage.join(config.run_url, PUBLISHING_NAME))
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, b"")


def replace_files(config: RunPaths, kind: str, new_files: set[str]) -> None:
    """Delete the files the tree's record lists that this run does not write (and every derived
    file), then move each staged file of ``new_files`` to its name. Both jobs' publish steps 3
    and 4. Only recorded files are ever deleted (shards.tree): never by a pattern.

    The record lists the new files before any of them is moved in, and the deleted ones until
    they are gone, so a crash leaves no file of ours unrecorded. Renames on a local disk; on
    object stores, where a move is a copy and a delete, all copies at once, PUBLISH_CONNECTIONS
    of them in flight (s3fs's pool would otherwise allow 10). A file already moved by an earlier
    attempt is skipped, so a retried publish finishes the job.
    """
    fs, root = storage.filesystem(config.output, connections=PUBLISH_CONNECTIONS)
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
        concurrency = {"batch_size": PUBLISH_CONNECTIONS} if isinstance(fs, AsyncFileSystem) else {}
        fs.copy([s for s, _ in moves], [d for _, d in moves], **concurrency)
        fs.rm([s for s, _ in moves])


def commit(config: RunPaths, stats_text: str) -> None:
    """Write dataset_stats.txt, the commit point, then remove the run's temporary directory (and the
    saved work it spilled to: published, it is no longer needed)."""
    fs, root = storage.filesystem(config.output)
    tree.write_file(config.output, layout.STATS_NAME, stats_text.encode())
    for url in dict.fromkeys((config.run_url, config.work_url)):
        path = storage.filesystem(url)[1]
        if fs.exists(path):
            fs.rm(path, recursive=True)
    temp_root = posixpath.join(root, layout.TEMP_DIR_NAME)
    if fs.isdir(temp_root) and not fs.ls(temp_root):
        fs.rmdir(temp_root)


class PublishFn(beam.DoFn):
    def __init__(self, fmt: OutputFormat, config: RunPaths):
        self._fmt = fmt
        self._config = config

    def process(self, staged: list, raw_documents: int, drops: dict[str, int], **extras):
        yield publish(staged, raw_documents, drops, extras, self._fmt, self._config)


class PublishOutput(beam.PTransform):
    """What a job's writer staged in; publishes once all of it is staged and yields the stats.

    ``raw_documents`` is a PCollection of one count, ``drop_reasons`` a tuple of PCollections of
    ``(reason, n)`` pairs, ``extras`` the job's own side inputs by name (beam.pvalue.AsSingleton,
    AsDict...), given to its OutputFormat's compute_stats.

    Example::

        written.groups | "PublishOutput" >> PublishOutput(BucketedFormat(settings), shards, raw, drops)
    """

    def __init__(self, fmt: OutputFormat, config: RunPaths, raw_documents, drop_reasons, **extras):
        super().__init__()
        self._fmt = fmt
        self._config = config
        self._raw = raw_documents
        self._drops = drop_reasons
        self._extras = extras

    def expand(self, staged):
        drop_counts = tuple(self._drops) | "CountDropReasons" >> CountDrops()
        return (
            staged
            | "CollectStaged" >> beam.combiners.ToList()
            | "PublishFiles"
            >> beam.ParDo(
                PublishFn(self._fmt, self._config),
                raw_documents=beam.pvalue.AsSingleton(self._raw),
                drops=beam.pvalue.AsDict(drop_counts),
                **self._extras,
            )
        )
