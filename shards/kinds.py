"""The kinds of tree the tool writes, and what each one is: the one place that tells them apart.

    kind = kinds.get("scaffold")
    kind.data_dirs            # ("train", "val"): the directories its job writes data files into
    kind.is_data_file(name)   # "train/shard_000.bin" -> True: a data file's path, in the shape its job writes
    kind.stats_type           # llmc.ScaffoldStats: what its dataset_stats.txt parses as
    kind.part("opener")       # shards.reading.opening.open_scaffold_tree: its parts, named in its entry
    kinds.told_by(stats_text, fs, root)   # a tree without an ownership record: which kind, from its stats or files

A kind owns its parts, all named in its entry here: its files, its stats type, its reader's opener,
its card's template and the check verify runs in its own process (none: the Beam verify job of
transforms/tools/verify.py). The ownership record (``shards/tree.py``), ``OutputTree``, the reader,
the card, verify, export and the dry-run plan ask the entry instead of comparing names. The parts
above this module (the opener reads through ``shards.tree``, which asks this module) are named as
``module:function`` and loaded by ``part``, so that nothing here imports them. Adding a kind is an
entry here plus its own modules; the job that writes it is declared at the pipelines layer
(``pipelines/jobs.py``), which shards never imports.

Nothing here imports Beam.
"""

from __future__ import annotations

import dataclasses
import importlib
import posixpath
from collections.abc import Callable

from shards import layout, llmc, manifest, tokenizer_files


def _is_bucketed_file(name: str) -> bool:
    try:
        layout.parse_shard_rel_path(name)
    except ValueError:
        return False
    return True


def _is_scaffold_file(name: str) -> bool:
    split, _, base = name.partition("/")
    try:
        llmc.parse_shard_name(base)
    except ValueError:
        return False
    return split in llmc.SPLITS


def _is_tokenizer_file(name: str) -> bool:
    return name in tokenizer_files.FILES


@dataclasses.dataclass(frozen=True)
class TreeKind:
    """One kind of tree: what its files are, what its stats are, and how a tree written before
    ownership records existed is told to be one."""

    name: str  # as the ownership record and the jobs name it
    is_data_file: Callable[[str], bool]  # a ``files`` entry of its record, in the shape its job writes
    data_dirs: tuple[str, ...] = ()  # where its job writes data files: checked at launch, never a link
    derives: bool = True  # whether tools derive files from it (export, stats, the description files)
    stats_type: type | None = None  # its dataset_stats.txt, parsed (``from_text``); None: it has none
    own_splits: bool = False  # its job chose the validation split (train/ and val/); else a reader picks one
    # Whether ``pretokenize remove`` takes documents out of its files in place: its manifest names
    # each document's file (a scaffold tree has none, and its documents run across shards).
    removes_in_place: bool = False
    stats_tell: Callable[[str], bool] | None = None  # whether a dataset_stats.txt is this kind's
    marker_files: tuple[str, ...] = ()  # a tree without a record holding one of these files is this kind
    marker_dirs: tuple[str, ...] = ()  # ... or one of these directories
    # The word the reader's fingerprint hashes for this kind (sampler states saved with a tree's
    # fingerprint must stay valid): the scaffold kind's trees were opened as "llmc" trees.
    fingerprint_word: str = ""
    # Its parts in modules that import this one, as "module:function" (loaded by ``part``):
    opener: str | None = None  # (OutputTree, fs, root) -> ShardTree | None: the reader's view of its tree
    card: str | None = None  # (dataset_stats.json's document) -> the card's lines (README.md)
    checks: str | None = None  # (url) -> problems: verify's check in its own process; None: the Beam job's
    checked_as: str = ""  # what verify says its checks covered

    def parse_stats(self, text: str):
        return (self.stats_type or manifest.DatasetStats).from_text(text)

    def part(self, name: str) -> Callable | None:
        """Its part ``name`` ("opener", "card", "checks"), loaded; None when it has none."""
        where = getattr(self, name)
        if where is None:
            return None
        module, _, function = where.partition(":")
        return getattr(importlib.import_module(module), function)


BUCKETED = TreeKind(
    name="bucketed", is_data_file=_is_bucketed_file, data_dirs=layout.BUCKET_NAMES,
    stats_type=manifest.DatasetStats, removes_in_place=True, marker_files=(layout.MANIFEST_NAME,),
    fingerprint_word="bucketed", opener="shards.reading.opening:open_bucketed_tree", card="shards.card:bucketed_card",
)
SCAFFOLD = TreeKind(
    name="scaffold", is_data_file=_is_scaffold_file, data_dirs=llmc.SPLITS, stats_type=llmc.ScaffoldStats,
    own_splits=True, stats_tell=llmc.is_scaffold_stats, marker_dirs=llmc.SPLITS, fingerprint_word="llmc",
    opener="shards.reading.opening:open_scaffold_tree", card="shards.card:scaffold_card",
    checks="shards.scaffold_verify:check_scaffold_tree", checked_as="scaffold llm.c shards",
)
TOKENIZER = TreeKind(name="tokenizer", is_data_file=_is_tokenizer_file, derives=False)  # train-bpe's output

REGISTRY: dict[str, TreeKind] = {k.name: k for k in (BUCKETED, SCAFFOLD, TOKENIZER)}
NAMES = tuple(REGISTRY)
# The kinds a tree without a record may be, in the order its files are asked (the bucketed manifest
# before the scaffold job's split directories, as such trees have always been told).
_LEGACY = (BUCKETED, SCAFFOLD)


def get(name: str) -> TreeKind:
    """The kind named ``name``; ValueError for a name no job writes."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown tree kind {name!r}") from None


def told_by(stats_text: str | None, fs, root: str) -> TreeKind | None:
    """The kind of a tree that has no ownership record (written before records existed): its stats
    say so first (the scaffold job's say ``format: llmc-scaffold``), else its files (the bucketed
    manifest, or train/ and val/ directories); None when neither does."""
    if stats_text is not None:
        for kind in _LEGACY:
            if kind.stats_tell is not None and kind.stats_tell(stats_text):
                return kind
    for kind in _LEGACY:
        if any(fs.exists(posixpath.join(root, name)) for name in kind.marker_files) or any(
                fs.isdir(posixpath.join(root, name)) for name in kind.marker_dirs):
            return kind
    return None
