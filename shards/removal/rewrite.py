"""A removal carried out: one affected shard file rewritten without its removed documents (the
new copy written in the journal's directory, then renamed over the old), and, once every file is
done, the removal finished: manifest, index, checksums, record, audit log, stats and card, then
the journal goes. Each step is safe to repeat: a crash anywhere is finished by running again."""

from __future__ import annotations

import hashlib
import logging
import posixpath
from collections.abc import Iterable, Iterator

from shards import index as reader_index
from shards import layout, manifest, storage, tree
from shards.card import CARD_NAME, description_files, write_description
from shards.manifest import DatasetStats
from shards.provenance import STATS_JSON_NAME, Provenance, bucketed_document, read_document
from shards.removal import journal
from shards.removal.audit import append_audit_lines, logged_count
from shards.removal.journal import FilePlan, RemovalPlan, delete_journal, shard_path, write_streamed

log = logging.getLogger(__name__)

COPY_CHUNK = 16 << 20


def _sha256_of(fs, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def rewrite_file(output: str, plan: FilePlan, itemsize: int) -> tuple[str, str | None]:
    """Rewrite one affected file without its removed documents.

    Returns what was done (for the log) and the new file's sha256 (None when it was deleted).
    """
    fs, _ = storage.filesystem(output)
    path = shard_path(output, plan.rel_path)
    before, after = plan.tokens_before * itemsize, plan.tokens_after * itemsize
    if not fs.exists(path):
        if after == 0:
            return "deleted earlier", None
        raise FileNotFoundError(f"{plan.rel_path} is missing, but {plan.tokens_after} of its tokens must stay")
    size = fs.size(path)
    if size == after and after != before:
        return "rewritten earlier", _sha256_of(fs, path)
    if size != before:
        raise ValueError(
            f"{plan.rel_path} holds {size} bytes; the manifest says {before} before removal and {after} after; "
            "the file does not match its manifest rows (run pretokenize verify)"
        )
    if after == 0:
        fs.rm(path)
        return "deleted", None
    # The new copy is written in the journal's directory, never beside the shard: a crash leaves
    # it where the finished removal deletes it.
    tmp, dst = journal.open_partial(output, posixpath.join(tree.Tree.REWRITE_DIR, posixpath.basename(plan.rel_path)))
    digest = hashlib.sha256()
    try:
        with fs.open(path, "rb") as src, dst:
            for _, n, removed in plan.rows:
                remaining = n * itemsize
                if removed:
                    src.seek(remaining, 1)
                    continue
                while remaining:
                    chunk = src.read(min(remaining, COPY_CHUNK))
                    if not chunk:
                        raise OSError(f"{plan.rel_path} ended early while copying")
                    dst.write(chunk)
                    digest.update(chunk)
                    remaining -= len(chunk)
        # Asked again before the shard is replaced (shards.lock.guard): a copy is long, and a command
        # whose lock was taken meanwhile (stopped, then woken) must not put back what another removed.
        fs.mv(tmp, shard_path(output, plan.rel_path))
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise
    return "rewritten", digest.hexdigest()


def finish_removal(output: str, plan: RemovalPlan, sums: dict[str, str | None] | None = None) -> DatasetStats:
    """Manifest, checksums, audit log, stats, in that order; then the journal goes. Safe to repeat.

    ``sums`` holds the new sha256 of each rewritten file (None for a deleted one). Streamed: the
    manifest and the audit lines are written as they are read, and only one affected file's rows
    (read from the plan's directory) are held at a time, whatever the tree's size or the plan's.
    """
    rewrite_manifest(output, plan)
    rewrite_index(output)
    update_checksums(output, sums or {})
    drop_emptied(output, plan)
    append_audit_lines(output, plan)
    stats = stats_after(plan, logged_count(output))
    rewrite_description(output, stats)
    tree.write_file(output, layout.STATS_NAME, stats.to_text().encode("utf-8"))
    delete_journal(output)
    return stats


def kept_manifest_lines(rows: Iterable[tuple[str, str, int]], plan: RemovalPlan) -> Iterator[str]:
    """The manifest's lines without the plan's removed documents. A file's rows are contiguous
    (make_plan checked), so the removed ids of one affected file at a time are read from the plan's
    directory when its first row comes. Repeating it over its own output yields the same lines."""
    affected = {f.rel_path: k for k, f in enumerate(plan.files)}
    current, removed = None, frozenset()
    yield manifest.MANIFEST_HEADER + "\n"
    for rel, doc_id, n in rows:
        if rel != current:
            current = rel
            k = affected.get(rel)
            removed = frozenset() if k is None else frozenset(i for i, _, r in plan.file_plan(k).rows if r)
        if doc_id not in removed:
            yield manifest.format_row(rel, doc_id, n)


def rewrite_manifest(output: str, plan: RemovalPlan) -> None:
    """processed_spec.txt without the removed rows, streamed from the old one."""
    fs, root = storage.filesystem(output)
    with storage.open_read(fs, posixpath.join(root, layout.MANIFEST_NAME), "r", encoding="utf-8") as src:
        write_streamed(output, layout.MANIFEST_NAME, kept_manifest_lines(manifest.read_rows(src), plan), "manifest")


def update_checksums(output: str, sums: dict[str, str | None]) -> None:
    """checksums.sha256 with each rewritten file's new sum, a deleted file's line gone (when the
    tree has the file: a tree written before checksums existed gets none)."""
    table = manifest.read_checksums(output) if sums else None
    if table is None:
        return
    for rel, digest in sums.items():
        if digest is None:
            table.pop(rel, None)
        else:
            table[rel] = digest
    tree.write_file(output, layout.CHECKSUMS_NAME, manifest.format_checksums(table).encode())


def drop_emptied(output: str, plan: RemovalPlan) -> None:
    """The files the removal left empty leave the ownership record, and a bucket whose every
    document went leaves no directory behind (only an empty one is removed)."""
    emptied = [f.rel_path for f in plan.files if f.tokens_after == 0]
    record = tree.read_record(output)
    if record is not None and emptied:
        tree.record_files(output, record, drop=emptied)
    out = tree.Tree(output)
    for directory in sorted({posixpath.dirname(rel) for rel in emptied} - {""}):
        out.remove_empty_dir(directory)


def stats_after(plan: RemovalPlan, logged_ids: int) -> DatasetStats:
    """The stats before the removal less what it took out (from the files' counts alone), and
    ``removal_list_ids`` the distinct ids removals.txt lists now (``logged_ids``): every command
    leaves it equal to the ids the tree's log records as removed (docs/removal.md). The ids this
    removal added were all found, so the count not found stays (0 for a tree built without a list)."""
    stats = DatasetStats.from_text(plan.stats_before)
    stats.removal_list_ids = logged_ids
    stats.removal_ids_not_found = stats.removal_ids_not_found or 0
    for f in plan.files:
        bucket = stats.buckets[layout.parse_shard_rel_path(f.rel_path).bucket]
        bucket.documents -= f.removed
        bucket.tokens -= f.tokens_before - f.tokens_after
        if f.tokens_after == 0:
            bucket.files -= 1
    stats.drops["removed"] = stats.drops.get("removed", 0) + plan.removed_documents
    stats.drops = dict(sorted(stats.drops.items()))
    return stats


def rewrite_index(output: str) -> None:
    """The reader index built again from the rewritten manifest, when the record lists one (until
    then a reader sees the manifest's new size and parses the manifest instead). Repeatable."""
    record = tree.read_record(output)
    if record is None or reader_index.INDEX_NAME not in record.derived:
        return
    fs, root = storage.filesystem(output)
    tmp, placeholder = journal.open_partial(output, reader_index.INDEX_NAME)  # a fresh name, made here: no link
    placeholder.close()  # (on an object store the index is uploaded whole at its name; tmp is not used)
    reader_index.write_index_file(fs, root, posixpath.join(root, reader_index.INDEX_NAME), tmp)


def rewrite_description(output: str, stats: DatasetStats) -> None:
    """dataset_stats.json and the README.md card from the new stats and the provenance the old
    dataset_stats.json holds (a removal changes the counts, never what made the tree). Repeating it
    writes the same bytes. A tree written before dataset_stats.json existed gets neither."""
    try:
        doc = read_document(output)
        provenance = None if doc is None else Provenance.from_dict(doc)
    except ValueError as e:
        # Unreadable: the old description would contradict the new counts, and a removal must
        # finish, so both files go (the record lists them: they are the tool's).
        log.warning("%s; removing it and %s, which can no longer be written", e, CARD_NAME)
        tree.delete_listed(output, [STATS_JSON_NAME, CARD_NAME])
        return
    if provenance is not None:
        write_description(output, "bucketed", description_files(bucketed_document(provenance, stats)))
