"""Verify of a scaffold output tree: its stats, its llm.c shards split by split, their checksums.

    problems = check_scaffold_tree("out/scaffold")   # [] when the tree is right

What ``pretokenize verify`` runs on a tree whose kind is ``scaffold`` (``shards/kinds.py``); the
checks of the llm.c files themselves are ``shards/llmc.py``'s. Each split is one token stream, read
once in order, in blocks of ``block_tokens`` tokens.
Nothing here imports Beam.
"""

from __future__ import annotations

import posixpath

from shards import layout, llmc, manifest, storage, tree
from shards.llmc import CHECK_BLOCK_TOKENS


def check_scaffold_tree(url: str, block_tokens: int = CHECK_BLOCK_TOKENS) -> list[str]:
    """The problems of a finished scaffold output tree (local path or fsspec URL).

    Its dataset_stats.txt must exist (the commit point) and parse; each split's shards pass
    llmc.check_llmc_split with the stats' shard_tokens; files, tokens and documents (sequences) per
    split equal the stats'; kept + dropped documents equal the documents read; and every shard's
    sha256 equals its line in checksums.sha256, which must exist and list every shard and
    nothing else (a flipped BPE token passes every format check: only the checksum sees it).
    """
    out = tree.OutputTree.open(url)
    try:
        stats = out.stats()
    except (tree.IncompleteTreeError, tree.UnreadableStatsError) as e:
        return [e.problem]
    if not isinstance(stats, llmc.ScaffoldStats):
        return [f"{layout.STATS_NAME}: these are the stats of a {out.kind} tree, not of a scaffold tree"]
    url = out.url
    fs, root = storage.filesystem(url)
    root = root.rstrip("/") or "/"
    problems = []
    if stats.kept_documents + stats.dropped_documents != stats.raw_documents:
        problems.append(f"{layout.STATS_NAME}: {stats.raw_documents} documents read, but {stats.kept_documents} "
                        f"kept + {stats.dropped_documents} dropped")
    digests: dict[str, str] = {}
    for split in llmc.SPLITS:
        split_dir = posixpath.join(root, split)
        # Listed, not globbed: the tree's path is the user's and may hold '[' or '*'.
        listed = [p for p in fs.ls(split_dir, detail=False) if not fs.isdir(p)] if fs.isdir(split_dir) else []
        # A file the user put in the tree is not the tool's: only the recorded shards are checked.
        listed = [p for p in listed if out.owns(f"{split}/{posixpath.basename(p)}")]
        paths = llmc.sorted_shard_files(listed)
        problems += [f"{split}/{posixpath.basename(p)}: not a shard name" for p in sorted(set(listed) - set(paths))]
        names = [f"{split}/{posixpath.basename(p)}" for p in paths]
        scan = llmc.scan_llmc_split([storage.unstrip(fs, p, url) for p in paths], names=names,
                                    shard_tokens=stats.shard_tokens, block_tokens=block_tokens)
        problems += scan.problems
        digests.update(zip(names, scan.sha256, strict=True))
        expected = stats.splits.get(split, llmc.SplitStats())
        for what, found, want in [("files", scan.files, expected.files), ("tokens", scan.tokens, expected.tokens),
                                  ("documents", scan.documents, expected.sequences)]:
            if found != want:
                problems.append(f"{split}: {found} {what} on disk, the stats say {want}")
    return problems + checksum_problems(fs, root, digests)


def checksum_problems(fs, root: str, digests: dict[str, str]) -> list[str]:
    """The shards' sha256 (``digests``, by relative path) against the tree's checksums.sha256."""
    path = posixpath.join(root, layout.CHECKSUMS_NAME)
    if not fs.exists(path):
        return [f"{layout.CHECKSUMS_NAME}: missing: the shards' contents cannot be checked"]
    try:
        listed = manifest.parse_checksums(storage.read_bytes(fs, path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        return [f"{layout.CHECKSUMS_NAME}: unreadable: {e}"]
    problems = []
    for rel, digest in sorted(digests.items()):
        if rel not in listed:
            problems.append(f"{rel}: not listed in {layout.CHECKSUMS_NAME}")
        elif listed[rel] != digest:
            problems.append(f"{rel}: content differs from its sha256 in {layout.CHECKSUMS_NAME}")
    problems += [f"{layout.CHECKSUMS_NAME} names {rel}, which is not in the tree"
                 for rel in sorted(set(listed) - set(digests))]
    return problems
