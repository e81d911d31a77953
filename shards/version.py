"""This tool's version, in the two senses it is recorded in.

    tool_version()   "1.4.0": the installed package's version (pyproject.toml's), as
                     ``pretokenize --version``, dataset_stats.json and the tokenizer files say it
    code_version()   "1.4.0 code 3f2a...": the same and a hash of the code that makes the bytes
                     (pipelines/, transforms/, shards/): saved work is resumed only by the same code

Nothing here imports Beam.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

DISTRIBUTION = "beam-pretokenize"
# The packages whose code decides a tree's bytes, and the suffixes of their files that do.
_CODE_PACKAGES = ("pipelines", "transforms", "shards")
_CODE_SUFFIXES = (".py", ".tiktoken", ".json")


def _installed() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_version() -> str:
    """This tool's version, from the installed package's metadata (pyproject.toml's version)."""
    return _installed() or "unknown (not installed as a package)"


def code_version() -> str:
    """The package version and a hash of the code that makes the bytes (pipelines, transforms, shards)."""
    version = _installed() or "unknown"
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for package in _CODE_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and path.suffix in _CODE_SUFFIXES:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return f"{version} code {digest.hexdigest()[:16]}"
