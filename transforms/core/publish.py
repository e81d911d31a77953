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
       transforms.run.resume) are removed

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
from shards.card import DESCRIPTION_NAMES, write_description
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
    ``run_id``; with a ``work_dir`` (transforms.run.resume: the saved work a re-run resumes from),
    the spill files go there instead of the run's own directory."""

    @property
    def run_url(self) -> str:
        return storage.join(self.output, tree.Tree.temp_name(self.run_id))

    @property
    def work_url(self) -> str:
        work_dir = getattr(self, "work_dir", None)
        return storage.join(self.output, tree.Tree.temp_name(work_dir)) if work_dir else self.run_url

    @property
    def spill_url(self) -> str:
        return storage.join(self.work_url, tree.Tree.SPILL_DIR)

    @property
    def staged_url(self) -> str:
        return storage.join(self.run_url, tree.Tree.STAGED_DIR)


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
    out = tree.Tree(config.output)
    files = fmt.files(staged)
    # Every name this publish writes or deletes is checked before the tree changes (shards.tree).
    out.check_writable([*files, layout.STATS_NAME, *fmt.markers], "published file")
    # 1. The job's own preparation, in the staging area.
    fmt.prepare(staged, config)
    # 2. From here on the tree does not look complete.
    mark_publishing(config)
    for name in (layout.STATS_NAME, *fmt.markers):
        out.remove_file(name)
    # 3. and 4. Files of an earlier run this run does not write go; the staged ones move in.
    replace_files(config, fmt.kind, set(files))
    # 5. The job's own files, the checksums, then the stats: the commit point. 6. Temporary files go.
    fmt.finish(staged, config)
    tree.write_file(config.output, layout.CHECKSUMS_NAME, format_checksums(files).encode())
    write_description(config.output, fmt.kind, fmt.describe(stats) if hasattr(fmt, "describe") else {})
    commit(config, stats.to_text())
    log.info("published %d files, %d documents to %s", len(files), stats.kept_documents, config.output)
    return stats


PUBLISHING_NAME = tree.Tree.PUBLISHING_MARK


def mark_publishing(config: RunPaths) -> None:
    """Note in the run's directory that publishing began: from here on, a failure leaves the tree
    unfinished (no dataset_stats.txt) rather than as it was."""
    tree.Tree(config.output).write(tree.Tree.temp_name(config.run_id, PUBLISHING_NAME), b"")


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
    out = tree.Tree(config.output)
    fs = out.fs
    staged = tree.Tree.temp_name(config.run_id, tree.Tree.STAGED_DIR)
    record = tree.owned(config.output, kind)
    stale_files = set(record.files) - new_files
    stale_derived = set(record.derived)
    out.check_writable(sorted(stale_files | stale_derived | new_files), "recorded file")
    tree.record_files(config.output, record, add=new_files)
    for rel in sorted(stale_files):
        log.info("removing %s, written by an earlier run", rel)
    for rel in sorted(stale_derived):
        if rel in DESCRIPTION_NAMES:  # written again below (write_description), from this run's figures
            log.info("rewriting %s for this run's output", rel)
        else:
            log.info("removing %s, derived from the earlier output", rel)
    out.remove_files(stale_files | stale_derived)
    tree.record_files(config.output, record, drop=stale_files, drop_derived=stale_derived)
    listed = _listed(fs, out.writable(staged, "staged directory")) if not out.local else None
    moves = []
    for rel in sorted(new_files):
        src = posixpath.join(staged, rel)
        path = out.writable(src, "staged file")
        if (path in listed) if listed is not None else fs.exists(path):
            moves.append((src, rel))
        elif not fs.exists(out.writable(rel, "published file")):
            raise FileNotFoundError(f"staged file {out.url_of(src)} is missing and was never published")
    if out.local:
        for src, dst in moves:
            out.rename(src, dst)
    elif moves:
        # Copies through a client whose pool holds PUBLISH_CONNECTIONS (s3fs's would otherwise allow 10).
        copier = storage.filesystem(config.output, connections=PUBLISH_CONNECTIONS)[0]
        concurrency = {"batch_size": PUBLISH_CONNECTIONS} if isinstance(copier, AsyncFileSystem) else {}
        copier.copy([out.writable(s) for s, _ in moves], [out.writable(d) for _, d in moves], **concurrency)
        copier.rm([out.writable(s) for s, _ in moves])


def _listed(fs, directory: str) -> set[str]:
    """Every file under ``directory`` of an object store, listed afresh: a few LIST requests for
    what would be a HEAD request per staged file, waited for one after another."""
    fs.invalidate_cache(directory)
    return set(fs.find(directory))


def commit(config: RunPaths, stats_text: str) -> None:
    """Write dataset_stats.txt, the commit point, then remove the run's temporary directory (and the
    saved work it spilled to: published, it is no longer needed)."""
    out = tree.Tree(config.output)
    out.write(layout.STATS_NAME, stats_text.encode())
    work_dir = getattr(config, "work_dir", None) or config.run_id
    for name in dict.fromkeys((config.run_id, work_dir)):
        out.remove_dir(tree.Tree.temp_name(name), "temporary entry")
    out.remove_temp_if_empty()


class PublishFn(beam.DoFn):
    def __init__(self, fmt: OutputFormat, config: RunPaths):
        self._fmt = fmt
        self._config = config

    def process(self, staged: list, raw_documents: int, drops: dict[str, int], **extras):
        with storage.reaching(self._config.output):  # a store that fails: one line naming the tree
            stats = publish(staged, raw_documents, drops, extras, self._fmt, self._config)
        yield stats


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
