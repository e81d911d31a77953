"""trained:DIR: a directory ``pretokenize train-bpe`` wrote (shards/tokenizer_files.py), through tiktoken.

tokenizer.tiktoken holds the ranks, and tokenizer_info.json the pre-tokenization regex, the alphabet and
the EOS (numbered right after the ranks). Only byte-alphabet tokenizers encode every text; a chars one
is refused here. Its pattern's cuts are known for Qwen2's and GPT-2's regex; any other is encoded whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import fsspec

from shards.tokenizer_spec import TokenizerSpec
from transforms.tokenizers import tiktoken_backend
from transforms.tokenizers.cache import EncoderCache
from transforms.tokenizers.encoder import BpeVocabulary, Encoder
from transforms.tokenizers.long_text import GPT2_CUTS, NO_CUTS, QWEN2_CUTS
from transforms.tokenizers.ranks import parse_ranks
from transforms.tokenizers.vocabularies import GPT2_PATTERN, QWEN2_PATTERN

# Whole or not at all: train-bpe writes training_stats.txt last (its commit point), and
# tokenizer_info.json records the sha256 of every other file it wrote. A directory without the
# commit point (a train-bpe killed while publishing) or with a file whose bytes are not those
# recorded (half published, or edited by hand) is refused in one line, whatever files it records.
COMMIT_NAME = "training_stats.txt"
INFO_NAME = "tokenizer_info.json"
RANKS_NAME = "tokenizer.tiktoken"


def read_info(spec: TokenizerSpec) -> dict:
    """The tokenizer_info.json of a trained:DIR spec, its fields checked."""
    directory = spec.arg
    info_path = directory.rstrip("/") + "/" + INFO_NAME
    try:
        with fsspec.open(info_path, "rb") as f:
            data = f.read()
        info = json.loads(data)
        for key in ("regex", "alphabet", "eos_token"):
            if not isinstance(info[key], str):
                raise TypeError(f"{key} is not a string")
        info["eos_id"], info["ranks"] = int(info["eos_id"]), int(info["ranks"])
        recorded = info.get("sha256")
        if not isinstance(recorded, dict) or RANKS_NAME not in recorded:
            raise TypeError(f"it records no sha256 of {RANKS_NAME}")
        for name, digest in recorded.items():
            if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
                raise TypeError(f"its sha256 of {name!r} is not one")
            if not _plain_file_name(name) or name in (INFO_NAME, COMMIT_NAME):
                raise TypeError(f"it records a sha256 of {name!r}, not a file train-bpe writes beside it")
    except FileNotFoundError:
        raise FileNotFoundError(f"--tokenizer {spec}: {info_path} not found; train-bpe writes it") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--tokenizer {spec}: {info_path} is not train-bpe's tokenizer_info.json ({e})") from None
    info["path"] = info_path
    info["info_sha256"] = hashlib.sha256(data).hexdigest()
    return info


def _plain_file_name(name) -> bool:
    """A file name of the directory itself: no separator, not "." or "..", nothing hidden."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and "\0" not in name \
        and not name.startswith(".")


def _read_files(spec: TokenizerSpec, info: dict) -> dict[str, bytes]:
    """Every file tokenizer_info.json records, read and checked against its sha256, after the
    commit point is checked to be there: the directory whole, or a ValueError naming the file."""
    root = spec.arg.rstrip("/")
    fs, commit = fsspec.core.url_to_fs(f"{root}/{COMMIT_NAME}")
    if not fs.isfile(commit):
        raise ValueError(f"--tokenizer {spec}: {root}/{COMMIT_NAME} not found: train-bpe did not finish "
                         "publishing this tokenizer (it writes that file last); run it again")
    out = {}
    for name, want in sorted(info["sha256"].items()):
        path = f"{root}/{name}"
        try:
            with fsspec.open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ValueError(f"--tokenizer {spec}: {path} not found, though {INFO_NAME} records it: the "
                             "directory is not whole; train it again") from None
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise ValueError(f"--tokenizer {spec}: {path} has sha256 {got[:16]}..., {INFO_NAME} records "
                             f"{want[:16]}...: it is not the file train-bpe wrote (half published or edited); "
                             "train it again")
        out[name] = data
    return out


def load(spec: TokenizerSpec, eos_token: str | None, cache: EncoderCache | None) -> Encoder:
    """The encoder of ``trained:DIR`` through tiktoken, the directory checked whole on every load."""
    info = read_info(spec)
    info_path = info["path"]
    regex, alphabet, eos, eos_id, n_ranks = (info["regex"], info["alphabet"], info["eos_token"], info["eos_id"],
                                             info["ranks"])
    if alphabet != "bytes":
        raise ValueError(f"--tokenizer {spec}: it was trained with --alphabet {alphabet}, whose tokens cannot "
                         "encode every text; train with --alphabet bytes to use it in a job")
    if eos_token is not None and eos_token != eos:
        raise ValueError(f"--tokenizer {spec} has the EOS {eos!r} (id {eos_id}), not {eos_token!r}: "
                         "train with --eos-token to choose another")
    cuts = {QWEN2_PATTERN: QWEN2_CUTS, GPT2_PATTERN: GPT2_CUTS}.get(regex, NO_CUTS)
    # Checked on every load (the launch's and each worker's), the ranks parsed from the bytes checked.
    data = _read_files(spec, info)
    files = tuple(sorted([(INFO_NAME, info["info_sha256"])] + [(n, info["sha256"][n]) for n in data]))
    path = spec.arg.rstrip("/") + "/" + RANKS_NAME

    def build() -> Encoder:
        ranks = parse_ranks(data[RANKS_NAME], path)
        if len(ranks) != n_ranks or eos_id != n_ranks:
            raise ValueError(f"--tokenizer {spec}: {path} holds {len(ranks)} ranks, {info_path} says {n_ranks} "
                             f"with the EOS at {eos_id}: the directory is damaged, train it again")
        vocabulary = BpeVocabulary(spec.text, "trained", regex, cuts, ranks, eos_id, eos_id + 1, nfc=False)
        return dataclasses.replace(tiktoken_backend.build(vocabulary), files=files)

    return EncoderCache.through(cache, f"{spec}|{eos}|{hashlib.sha256(repr(files).encode()).hexdigest()}", path, build)
