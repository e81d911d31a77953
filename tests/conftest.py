"""Shared test fixtures: paths to the bundled sample and to the GPT-2 ranks shipped in the package."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from transforms.tokenizers.ranks import gpt2_ranks_path

# Give the root logger a handler before anything imports Beam: otherwise the first warning Beam
# logs installs one on the stream pytest is capturing at that moment, and Beam's last messages
# at interpreter exit (stopping Prism) would be written to that stream after it is closed.
logging.getLogger().addHandler(logging.NullHandler())

REPO = Path(__file__).resolve().parents[1]
SAMPLE_PARQUET = REPO / "tests" / "data" / "finepdfs_sample.parquet"
# The GPT-2 ranks of --tokenizer gpt2, package data (transforms/tokenizers/data/): every clone has them.
GPT2_RANKS = Path(gpt2_ranks_path())


@pytest.fixture(scope="session")
def gpt2_spec() -> str:
    """GPT-2 by its ranks file, which `decode` reads as well (its plain `gpt2` is tiktoken's download)."""
    return f"tiktoken:{GPT2_RANKS}"


def fnapi_pipeline():
    """A TestPipeline on the in-process FnApiRunner (the default local runner would look for Prism)."""
    from apache_beam.testing.test_pipeline import TestPipeline

    return TestPipeline(runner="FnApiRunner")


def finepdfs_row(doc_id: str, text: str, **overrides) -> dict:
    """A confident-English row in the FinePDFs schema's filter columns; override any of them."""
    row = {
        "id": doc_id,
        "text": text,
        "language": "eng_Latn",
        "page_average_lid": "eng_Latn",
        "page_average_lid_score": 0.97,
        "token_count": max(1, len(text.split())) if isinstance(text, str) else 1,
    }
    row.update(overrides)
    return row


@pytest.fixture(autouse=True)
def _restore_logging():
    """cli.main reconfigures the root logger onto the stream pytest captured for that test; put
    it back afterwards, or later logging (Beam stopping a runner at exit) writes to a closed file."""
    import logging

    root = logging.getLogger()
    handlers, level, filters = root.handlers[:], root.level, root.filters[:]
    yield
    root.handlers[:], root.filters[:] = handlers, filters
    root.setLevel(level)


@pytest.fixture(autouse=True, scope="session")
def _index_cache(tmp_path_factory):
    """Local copies of remote trees' reader indexes (shards.index.local_copy) go to the session's
    temporary directory, not the user's ~/.cache."""
    import os

    before = os.environ.get("PRETOKENIZE_INDEX_CACHE")
    os.environ["PRETOKENIZE_INDEX_CACHE"] = str(tmp_path_factory.mktemp("index-cache"))
    yield
    if before is None:
        os.environ.pop("PRETOKENIZE_INDEX_CACHE", None)
    else:
        os.environ["PRETOKENIZE_INDEX_CACHE"] = before


def tree_hashes(root, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path, but the relative paths in ``skip``."""
    import hashlib
    import os

    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel not in skip:
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def import_trainer_module(name: str, reason: str):
    """Import ``name`` (a trainer's package: torch, torchdata, transformers, megatron.core, olmo_core,
    accelerate) or skip saying ``reason``; with PRETOKENIZE_REQUIRE_TRAINERS set (`.ci/run` sets it),
    a missing one fails the test instead, so CI never passes these checks by skipping them."""
    import importlib
    import os

    try:
        return importlib.import_module(name)
    except ImportError as e:
        if os.environ.get("PRETOKENIZE_REQUIRE_TRAINERS"):
            pytest.fail(f"{name} is not installed ({e}); {reason} (required by PRETOKENIZE_REQUIRE_TRAINERS)")
        pytest.skip(reason)
