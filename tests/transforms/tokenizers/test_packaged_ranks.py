"""The GPT-2 ranks ship in the package, ``--tokenizer gpt2`` reads them with no network, and nothing in
the repository reads files from outside it (a user's clone has nothing beside it)."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, finepdfs_row

from pipelines import bucketed
from shards import layout, manifest
from transforms.tokenizers.load import load_encoder
from transforms.tokenizers.ranks import gpt2_ranks_path

# sha256 of transforms/tokenizers/data/gpt2.tiktoken: whisper/assets/gpt2.tiktoken of openai-whisper 20250625.
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2 ids as tiktoken's "gpt2" encoding and Hugging Face's gpt2 tokenizer give them.
GPT2_IDS = {
    "Hello world": [15496, 995],
    "All human beings are born free and equal in dignity and rights.": [
        3237, 1692, 9791, 389, 4642, 1479, 290, 4961, 287, 16247, 290, 2489, 13
    ],
    "'Twas the night before Christmas, when all through the house": [
        6, 5080, 292, 262, 1755, 878, 6786, 11, 618, 477, 832, 262, 2156
    ],
    " <|endoftext|>": [1279, 91, 437, 1659, 5239, 91, 29],
}  # fmt: skip


def test_the_packaged_ranks_are_the_recorded_file_with_their_notice():
    path = Path(gpt2_ranks_path())
    assert path.parent == REPO / "transforms" / "tokenizers" / "data"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GPT2_RANKS_SHA256
    notice = (path.parent / "gpt2.tiktoken.LICENSE.txt").read_text(encoding="utf-8")
    assert "github.com/openai/gpt-2" in notice and "Copyright (c) 2019 OpenAI" in notice
    assert "Permission is hereby granted, free of charge" in notice


def test_pyproject_ships_the_ranks_and_their_notice():
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = data["tool"]["setuptools"]["package-data"]["transforms.tokenizers"]
    assert {"data/gpt2.tiktoken", "data/gpt2.tiktoken.LICENSE.txt"} <= set(shipped)


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Every way tiktoken (or anything else) could download fails, and nothing is cached."""

    def refuse(*args, **kwargs):
        raise OSError("network access is blocked in this test")

    import requests
    import tiktoken.load
    import tiktoken.registry

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(tiktoken.load, "read_file", refuse)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", refuse)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setattr(requests.Session, "request", refuse)
    return refuse


def test_gpt2_loads_with_the_network_blocked(no_network, monkeypatch):
    monkeypatch.setattr(socket.socket, "connect", no_network)
    encoder = load_encoder("gpt2", cache=None)  # built here, not taken from an earlier test
    assert (encoder.spec, encoder.eos_id, encoder.vocab_size, encoder.max_token_id) == ("gpt2", 50256, 50257, 50256)
    assert encoder.encode_batch(list(GPT2_IDS)) == list(GPT2_IDS.values())


def test_gpt2_is_tiktokens_gpt2_encoding():
    """tiktoken's "gpt2" is r50k's pattern and <|endoftext|> = 50256 over GPT-2's 50,256 ranks."""
    from tiktoken_ext.openai_public import r50k_pat_str

    backend = load_encoder("gpt2").backend
    assert backend._pat_str == r50k_pat_str
    assert backend._special_tokens == {"<|endoftext|>": 50256}
    assert (backend.n_vocab, backend.eot_token) == (50257, 50256)
    assert len(backend._mergeable_ranks) == 50256


def test_gpt2_and_tiktoken_over_the_packaged_file_agree():
    texts = [*GPT2_IDS, "Ωμέγα 123 ... \t\n  x", "日本語のテキスト"]
    by_name, by_path = load_encoder("gpt2"), load_encoder(f"tiktoken:{gpt2_ranks_path()}")
    assert by_name.encode_batch(texts) == by_path.encode_batch(texts)
    assert (by_name.eos_id, by_name.vocab_size) == (by_path.eos_id, by_path.vocab_size)


@pytest.mark.e2e  # a whole job
def test_the_bucketed_job_with_gpt2_runs_offline_and_records_gpt2(no_network, tmp_path):
    rows = [finepdfs_row(f"doc-{i}", text) for i, text in enumerate(GPT2_IDS)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    stats = bucketed.run(["--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--tokenizer", "gpt2",
                          "--dtype", "uint16", "--runner=FnApiRunner"])
    assert (stats.tokenizer, stats.eos_id, stats.vocab_size) == ("gpt2", 50256, 50257)
    assert "tokenizer: gpt2\n" in (out / layout.STATS_NAME).read_text(encoding="utf-8")
    with open(out / layout.MANIFEST_NAME, encoding="utf-8") as f:
        rows_read = list(manifest.read_rows(f))
    stored, offsets = {}, {}
    for rel, doc_id, n in rows_read:
        tokens = np.fromfile(out / rel, dtype="<u2")
        start = offsets.get(rel, 0)
        stored[doc_id] = tokens[start : start + n].tolist()
        offsets[rel] = start + n
    assert stored == {f"doc-{i}": [*ids, 50256] for i, ids in enumerate(GPT2_IDS.values())}


# --- Nothing reads outside the repository ------------------------------------------------------------------

# Paths that leave the checkout: a "shared" folder beside it (by a relative path, or from a parent directory),
# or the development machine's copy of that folder. Written so that this file does not match itself.
OUTSIDE_PATHS = re.compile(
    r"\.\.[/\\]shared\b"
    r"|/wor[k]/shared\b"
    r"|parents?\b(\[\d+\])?\s*/\s*[\"']share[d][\"']"
    r"|[\"']\.\.[\"']\s*,\s*[\"']share[d][\"']"
)
CODE_SUFFIXES = {".py", ".sh", ".bash", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json", ".mk"}
CODE_NAMES = {"Makefile", "Dockerfile", "setup.py"}


def _repository_code_files() -> list[Path]:
    """Files git tracks, or would track, that hold code or configuration: Python, Makefile, shell, toml..."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout.decode("utf-8").split("\0")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e}): the repository's file list is unknown")
    files = []
    for rel in filter(None, listed):
        path = REPO / rel
        if rel.startswith("tests/data/sample_sources/") or not path.is_file():
            continue
        with open(path, "rb") as f:
            shebang = f.read(2) == b"#!"
        if path.suffix in CODE_SUFFIXES or path.name in CODE_NAMES or path.name.endswith("Dockerfile") or shebang:
            files.append(path)
    return files


# Lines the pattern must catch ({S} is the folder's name, kept out of this file) and lines it must not.
OUTSIDE_EXAMPLES = [
    'GPT2_RANKS = REPO.parent / "{S}" / "tokenizers" / "gpt2.tiktoken"',
    "p = Path(__file__).parents[2] / '{S}' / 'x'",
    'os.path.join(here, "..", "{S}", "gpt2.tiktoken")',
    "GPT2 ?= tiktoken:../{S}/tokenizers/gpt2.tiktoken",
    "cp /work/{S}/tokenizers/gpt2.tiktoken /tmp",
]
INSIDE_EXAMPLES = ['"shared lock"', "shared_memory = True", "REPO / 'tests' / 'data'", "os.path.join(a, 'shared')"]


def test_no_code_or_test_reads_files_outside_the_repository():
    assert all(OUTSIDE_PATHS.search(line.replace("{S}", "shared")) for line in OUTSIDE_EXAMPLES)
    assert not any(OUTSIDE_PATHS.search(line) for line in INSIDE_EXAMPLES)
    files = _repository_code_files()
    assert REPO / "Makefile" in files and REPO / "tests" / "conftest.py" in files and Path(__file__) in files
    offending = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1)
        if OUTSIDE_PATHS.search(line)
    ]
    assert offending == [], "these lines read files from outside the repository:\n" + "\n".join(offending)


def test_the_token_length_tables_are_each_tokens_byte_count():
    from transforms.tokenizers.ranks import load_ranks, qwen_ranks_path, ranks_token_bytes, token_bytes

    ranks = load_ranks(qwen_ranks_path())
    table = ranks_token_bytes(ranks)
    assert table.tolist() == [len(t) for t, _ in sorted(ranks.items(), key=lambda item: item[1])]
    assert token_bytes({0: 3, 2: 5, 9: 7}, 4).tolist() == [3, 0, 5, 0]  # ids past the size are left out
    assert token_bytes({}, 2).tolist() == [0, 0]
