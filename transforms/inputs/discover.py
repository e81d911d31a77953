"""Which files ``--input`` names: a pattern's expansion into input files.

This module imports no Beam and no Arrow, so the CLI can say that an input matches nothing before
it loads either, or the tokenizer. The rules:

1. A path that exists is taken as written, even with ``*``, ``?`` or ``[`` in its name
   (``data[1].parquet``, ``runs[2024]/``). Only a path that does not exist is a glob; in it too,
   a directory name that exists as written (``runs[2024]/*.parquet``) is not a wildcard.
2. A directory stands for every file below it with a suffix an input format reads
   (transforms.inputs.registry).
3. Below the directory, or below a glob's root (the directories before its first wildcard), a
   file is skipped when any name on its path from there starts with ``.`` or ``_``: hidden files,
   ``.crc`` checksums, Spark's and Hadoop's ``_temporary/``, ``_SUCCESS``, ``_committed_*``. A
   file named in full is read whatever its name.
"""

from __future__ import annotations

import logging
import posixpath

from shards import storage
from transforms.core.records import BadInputError
from transforms.inputs.registry import is_input_file

log = logging.getLogger(__name__)

GLOB_CHARS = "*?["


def expand_pattern(pattern: str) -> list[str]:
    """The input files a file, a directory or a glob names, sorted; a BadInputError when none.

    The rules are numbered in the module docstring: a path that exists is taken as written, and
    names starting with '.' or '_' below a directory or a glob's root are skipped.
    """
    url = storage.normalize(pattern)
    fs, path = storage.filesystem(url)
    if fs.isdir(path):
        root, found = path, [p for p in fs.find(path) if is_input_file(p)]
    elif fs.exists(path):
        return [storage.unstrip(fs, path, url)]
    else:
        root, glob = glob_root(fs, path)
        found = [p for p, info in fs.glob(glob, detail=True).items() if info.get("type") != "directory"]
    kept = [p for p in found if not _hidden_below(root, p)]
    skipped = len(found) - len(kept)
    if skipped:
        log.info("input: skipped %d files under %s whose path has a name starting with '.' or '_'", skipped, root)
    if not kept:
        why = f" ({skipped} skipped: a name on their path starts with '.' or '_')" if skipped else ""
        raise BadInputError(pattern, f"matches no input files{why}")
    return sorted(storage.unstrip(fs, p, url) for p in kept)


def glob_root(fs, path: str) -> tuple[str, str]:
    """(the directory before the first wildcard, the glob to expand), for a path that does not exist.

    A name holding glob characters that exists as written is part of the root, escaped in the glob.
    """
    parts = path.split("/")
    glob = list(parts)
    for i, part in enumerate(parts):
        if any(c in part for c in GLOB_CHARS):
            if i == len(parts) - 1 or not fs.exists("/".join(parts[: i + 1])):
                return "/".join(parts[:i]), "/".join(glob)
            glob[i] = "".join(f"[{c}]" if c in GLOB_CHARS else c for c in part)
    return posixpath.dirname(path), "/".join(glob)


def _hidden_below(root: str, path: str) -> bool:
    """Whether a name on ``path`` below ``root`` starts with '.' or '_'."""
    below = path[len(root):] if path.startswith(root) else posixpath.basename(path)
    return any(name.startswith((".", "_")) for name in below.split("/") if name)
