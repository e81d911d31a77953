"""The export job: let other trainers read a finished tree in place, without copying a token.

    pretokenize export megatron --output DIR [--mount PATH] [--check]

``megatron`` mirrors the tree's shards under ``DIR/megatron/``: for each shard a Megatron-LM
``.idx`` (format in shards/megatron.py) and a ``.bin`` that is a relative symlink to the shard, so
Megatron reads ``DIR/megatron/1024/p00_00000`` straight from ``DIR/1024/p00_00000.npy`` (and
``DIR/megatron/train/shard_000`` from an llm.c shard, its header skipped by the byte pointers).
``DIR/megatron/data_args.txt`` lists every prefix with its token count as the blend weight, for
Megatron's ``--data-args-path`` (an llm.c tree's ``val/`` shards go to ``valid_data_args.txt``).
The prefixes there travel with the tree: relative to the tree's root (``megatron/1024/p00_00000``,
so Megatron is run from the tree's directory), or, with ``--mount PATH``, under the path the tree
will be mounted at for training (``PATH/megatron/1024/p00_00000``). Nothing in the export names the
directory it was written in, so a copied or moved tree is still current (``--check``, given the
same ``--mount`` as the export).

The export lives in its own directory so the tree's own directories stay exactly the format's
(``pretokenize verify`` checks them, and the jobs rewrite them). Every file it writes is listed in the
tree's ownership record first (shards/tree.py), so the next run of a job deletes exactly those.
Symlinks need a local filesystem. Plain Python, no Beam: the indexes come from the manifest alone
(an llm.c tree is scanned once for its EOT boundaries), about 20 bytes per document.

An index describes its shard as it was: a re-run of the bucketed job or a ``pretokenize remove``
changes shards, and the export must then be run again, which rewrites every index and removes
those of shards that are gone. ``--check`` compares the export with what the tree needs now and
exits 1 naming each index that is stale or missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import posixpath
import sys
import time
from typing import NamedTuple

import numpy as np

from pipelines.flags import add_break_lock_flag, add_setting_flags, parse_plain_settings
from pipelines.help_format import DefaultsHelpFormatter
from shards import kinds, llmc, lock, megatron, storage
from shards import tree as ownership
from shards.reading.opening import open_tree
from shards.reading.shard_tree import ShardTree
from transforms.core.settings import REQUIRED, setting

EXPORT_DIR = "megatron"
DATA_ARGS_NAME = "data_args.txt"
VALID_DATA_ARGS_NAME = "valid_data_args.txt"


@dataclasses.dataclass(frozen=True)
class ExportSettings:
    """export's settings, one typed object: its flags are generated from it."""

    target: str = setting(REQUIRED, f"megatron: a Megatron-LM .idx and a .bin link per shard, under "
                          f"DIR/{EXPORT_DIR}/", choices=("megatron",), flags=())
    output: str = setting(REQUIRED, "the finished output tree (a local directory)")
    mount: str | None = setting(None, "write the blend's prefixes under PATH, where the tree is mounted for training "
                                "(PATH/megatron/1024/p00_00000); default: relative to the tree's root, for Megatron "
                                "run from the tree's directory. With --check: the PATH the export was written for",
                                metavar="PATH")  # None: the blend's prefixes are relative to the tree's root
    check: bool = setting(False, "write nothing; exit 1 if the export is stale or missing")

    def __post_init__(self):
        object.__setattr__(self, "output", storage.normalize(self.output))
        object.__setattr__(self, "mount", check_mount(self.mount))


class ShardIndex(NamedTuple):
    """What one shard needs for Megatron: its index, under the prefix the export gives it."""

    shard: str  # rel path of the token file in the tree
    prefix: str  # rel path of the Megatron prefix in the tree (EXPORT_DIR/... without extension)
    index: bytes  # the .idx contents
    tokens: int
    sequences: int
    split: str  # "val" for an llm.c val shard, "" otherwise


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pretokenize export",
        description="Write index files so another trainer reads a finished output tree in place.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_setting_flags(p, ExportSettings)
    add_break_lock_flag(p)
    return p


def check_mount(mount: str | None) -> str | None:
    """``mount`` without its trailing slashes; ValueError when Megatron could not read it back (its
    --data-args-path file is split on whitespace, so a prefix must hold none)."""
    if mount is None:
        return None
    if not mount.strip() or any(c.isspace() for c in mount):
        raise ValueError(f"--mount {mount!r}: Megatron splits its data-args file on whitespace, so the mount "
                         "point must be a path without spaces")
    return mount.rstrip("/") or "/"


def parse_args(argv: list[str]) -> ExportSettings:
    return parse_plain_settings(make_parser(), argv, ExportSettings)


def shard_indexes(tree: ShardTree) -> list[ShardIndex]:
    """The index of every token file of ``tree``, one sequence per document.

    An llm.c document that runs on into the next shard is one sequence in each of the two files.
    """
    vocab = tree.stats.vocab_size if tree.stats is not None else llmc.MAX_TOKEN_ID + 1
    code, _ = megatron.dtype_code(tree.dtype, vocab)
    store, docs = tree.store, tree.documents
    out = []
    for i, rel in enumerate(store.rel_paths):
        lo, hi = int(store.starts[i]), int(store.starts[i + 1])
        first = int(np.searchsorted(docs.start, lo, side="left"))
        last = int(np.searchsorted(docs.start, hi, side="left"))
        points = docs.start[first:last]
        if hi > lo and (len(points) == 0 or points[0] != lo):
            points = np.concatenate(([lo], points))  # the end of a document begun in the previous file
        lengths = np.diff(np.append(points, hi))
        out.append(
            ShardIndex(
                shard=rel,
                prefix=posixpath.join(EXPORT_DIR, megatron.prefix_of(rel)),
                index=megatron.index_bytes(lengths, code, first_pointer=store.header_bytes),
                tokens=hi - lo,
                sequences=len(lengths),
                split="val" if kinds.get(tree.kind).own_splits and rel.startswith("val/") else "",
            )
        )
    return out


def data_args(indexes: list[ShardIndex], split: str, mount: str | None = None) -> str:
    """``tokens prefix`` per shard: a blend whose weights are the shards' sizes, uniform over tokens.

    A prefix is the shard's rel path under the export (``megatron/1024/p00_00000``), relative to
    the tree's root, or under ``mount`` when given: never the directory the tree is in now.
    """
    return "".join(f"{x.tokens} {x.prefix if mount is None else posixpath.join(mount, x.prefix)}\n"
                   for x in indexes if x.split == split and x.tokens)


def _args_files(tree: ShardTree, indexes: list[ShardIndex], mount: str | None = None) -> dict[str, str]:
    files = {posixpath.join(EXPORT_DIR, DATA_ARGS_NAME): data_args(indexes, "", mount)}
    if kinds.get(tree.kind).own_splits:
        files[posixpath.join(EXPORT_DIR, VALID_DATA_ARGS_NAME)] = data_args(indexes, "val", mount)
    return files


def _link_target(x: ShardIndex) -> str:
    """The .bin link's target, relative to the link's directory."""
    return posixpath.relpath(x.shard, posixpath.dirname(x.prefix))


def _local_root(tree: ShardTree) -> str:
    if not tree.store.local:
        raise ValueError(
            f"{tree.url}: the Megatron export links each shard as its .bin, which needs a local filesystem; "
            "export a local copy or mount of the tree"
        )
    return tree.store.root


def _export_files(tree: ShardTree, indexes: list[ShardIndex]) -> set[str]:
    """Every file (rel path) the export of ``indexes`` consists of."""
    files = {x.prefix + megatron.IDX_SUFFIX for x in indexes} | {x.prefix + megatron.BIN_SUFFIX for x in indexes}
    return files | set(_args_files(tree, indexes))


def _orphans(tree: ShardTree, indexes: list[ShardIndex]) -> list[str]:
    """Files an earlier export wrote (the tree's record lists them) that this one would not: the
    indexes and links of shards that are gone. Only recorded files: never a user's."""
    record = ownership.read_record(tree.url)
    wanted = _export_files(tree, indexes)
    root = tree.store.root
    return sorted(
        rel for rel in (record.derived if record else [])
        if rel.startswith(EXPORT_DIR + "/") and rel not in wanted and os.path.lexists(os.path.join(root, rel))
    )


def export_megatron(tree: ShardTree, mount: str | None = None) -> list[ShardIndex]:
    """Write every index (atomically), the .bin links and the data-args files (prefixes as
    ``data_args`` gives them for ``mount``); remove orphans.

    The tree's ownership record lists every file before it is written, so a later run of a job
    deletes exactly these (shards/tree.py); the export never deletes a file it did not record.
    """
    _local_root(tree)
    out = ownership.Tree(tree.url)
    record = ownership.owned(tree.url)
    indexes = shard_indexes(tree)
    wanted = _export_files(tree, indexes)
    stale = [rel for rel in record.derived if rel.startswith(EXPORT_DIR + "/") and rel not in wanted]
    # Before anything is written: every name inside the tree, through no link, and none a user's file.
    out.check_ours(wanted, record, "export file")
    out.check_writable(stale, "recorded file")
    ownership.record_files(tree.url, record, add_derived=wanted)
    for x in indexes:
        out.write(x.prefix + megatron.IDX_SUFFIX, x.index)
        out.link(x.prefix + megatron.BIN_SUFFIX, _link_target(x))
    out.remove_files(stale)
    ownership.record_files(tree.url, record, drop_derived=stale)
    for rel, text in _args_files(tree, indexes, mount).items():
        out.write(rel, text.encode())
    out.remove_temp_if_empty()
    return indexes


def check_megatron(tree: ShardTree, mount: str | None = None) -> list[str]:
    """Problems with the tree's Megatron export (written for ``mount``), one line each; empty when it is current."""
    root = _local_root(tree)
    indexes = shard_indexes(tree)
    problems = []
    for x in indexes:
        current = _read_bytes(posixpath.join(root, x.prefix + megatron.IDX_SUFFIX))
        if current is None:
            problems.append(f"{x.prefix}{megatron.IDX_SUFFIX}: missing")
        elif current != x.index:
            problems.append(f"{x.prefix}{megatron.IDX_SUFFIX}: stale (does not describe {x.shard} as it is now)")
        bin_path = posixpath.join(root, x.prefix + megatron.BIN_SUFFIX)
        if not os.path.islink(bin_path) or os.readlink(bin_path) != _link_target(x):
            problems.append(f"{x.prefix}{megatron.BIN_SUFFIX}: not a link to {x.shard}")
    problems += [f"{rel}: left from a shard that no longer exists" for rel in _orphans(tree, indexes)]
    for rel, text in _args_files(tree, indexes, mount).items():
        if _read_bytes(posixpath.join(root, rel)) != text.encode():
            said = "relative to the tree's root" if mount is None else f"under --mount {mount}"
            problems.append(f"{rel}: missing or stale (its prefixes, {said}, are not the shards' now)")
    return problems


def _read_bytes(path: str) -> bytes | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def opened(options: ExportSettings) -> ShardTree:
    """The tree ``options`` export (its lock taken) or check: FileNotFoundError or ValueError when it
    cannot be (unfinished: IncompleteTreeError; missing, damaged, not local, not this tool's)."""
    if not options.check and ownership.read_record(options.output) is not None:
        lock.take(options.output)  # one writer at a time: before the tree is read for its export
    tree = open_tree(options.output)
    _local_root(tree)
    if not options.check:
        ownership.owned(tree.url)  # only a tree this tool wrote, whose record can list the export
    return tree


def blend_files(tree: ShardTree, indexes: list[ShardIndex]) -> list[str]:
    """The URLs of the export's blends, for Megatron's --data-args-path (and the valid one's)."""
    return [storage.join(tree.url, rel) for rel in _args_files(tree, indexes)]


@lock.command("export")
def run(argv: list[str] | None = None) -> int:
    """0 when done (or, with --check, when the export is current); 1 when --check finds problems;
    2 when the tree cannot be exported (unfinished, or not local)."""
    options = parse_args(argv or [])
    start = time.monotonic()
    try:
        tree = opened(options)
    except (FileNotFoundError, ValueError) as e:  # unfinished (IncompleteTreeError), missing, damaged, remote
        print(f"pretokenize export: {e}", file=sys.stderr, flush=True)
        return 2
    if options.check:
        problems = check_megatron(tree, options.mount)
        for line in problems:
            print(f"  {line}")
        if problems:
            mount = "" if options.mount is None else f" --mount {options.mount}"
            print(f"export megatron --check: {len(problems)} problem(s); run 'pretokenize export megatron "
                  f"--output {options.output}{mount}' to bring the export up to date", flush=True)
            return 1
        print(f"export megatron --check: all {len(tree.store.rel_paths)} indexes are current", flush=True)
        return 0
    indexes = export_megatron(tree, options.mount)
    seconds = time.monotonic() - start
    print(
        f"wrote {len(indexes)} Megatron indexes ({sum(x.sequences for x in indexes):,} sequences, "
        f"{sum(len(x.index) for x in indexes):,} bytes) for {sum(x.tokens for x in indexes):,} tokens "
        f"in {seconds:.1f} s, under {storage.join(tree.url, EXPORT_DIR)}",
        flush=True,
    )
    for url in blend_files(tree, indexes):
        print(f"blend for --data-args-path: {url}", flush=True)
    if options.mount is None:
        print(f"its prefixes are relative to the tree's root: run Megatron in {tree.url}, or export with "
              "--mount PATH for a tree mounted at PATH", flush=True)
    else:
        print(f"its prefixes are under {options.mount}, where the tree is to be mounted", flush=True)
    return 0
