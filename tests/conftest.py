"""Shared test fixtures and helpers, one home each: paths to the bundled sample and to the GPT-2 ranks
shipped in the package, rows in the FinePDFs schema and a module's ROWS as a JSON lines source
(``write_jsonl``), the sample's bucketed tree (``bucketed_sample``), a command run as a user runs it
(``run_cli``) and the ids a tree stores (``stored_ids``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
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
# The filter settings a bucketed tree's stats record by default (shards.conditions).
DEFAULT_FILTER = {"language": "eng_Latn", "lid_threshold": 0.9, "min_token_count": 1}


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


def jsonl_line(record: dict) -> bytes:
    """One JSON line, UTF-8."""
    return (json.dumps(record) + "\n").encode("utf-8")


def write_jsonl(path, records) -> Path:
    """``records`` at ``path`` one a line: a dict as a JSON object, bytes as they are (a line a test spoilt)."""
    path = Path(path)
    path.write_bytes(b"".join(r if isinstance(r, bytes) else jsonl_line(r) for r in records))
    return path


def bucketed_sample(out, *flags: str) -> Path:
    """The bundled sample through the bucketed job into ``out`` (on the FnApiRunner unless ``flags`` name a
    runner): the tree the tests of readers, decode, remove and verify start from."""
    from pipelines import bucketed

    runner = [] if any(f.startswith("--runner") for f in flags) else ["--runner=FnApiRunner"]
    bucketed.run(["--input", str(SAMPLE_PARQUET), "--output", str(out), *runner, *flags])
    return Path(out)


def stored_ids(tree) -> list[str]:
    """The ids a bucketed tree stores, in its manifest's order."""
    from shards import layout, manifest

    with open(os.path.join(tree, layout.MANIFEST_NAME), encoding="utf-8") as f:
        return [doc_id for _, doc_id, _ in manifest.read_rows(f)]


class TerminalStream:
    """A stream that says it is a terminal: a progress display draws its bars into ``text``."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True


@dataclasses.dataclass
class Outcome:
    """What a command did: its exit status and what it printed."""

    code: int
    out: str
    err: str

    @property
    def refusal(self) -> str:
        """The one line of a refusal: exit 2, no traceback, the message the last line of stderr
        (log lines of the launch may come before it)."""
        assert self.code == 2, f"exit {self.code}, expected a refusal (2); stderr: {self.err[-2000:]}"
        assert "Traceback" not in self.err, self.err
        lines = [line for line in self.err.splitlines() if line.strip()]
        assert lines, "a refusal says why, on stderr"
        assert lines[-1].startswith("pretokenize "), lines[-1]
        return lines[-1]


def run_cli(capture, argv: list) -> Outcome:
    """``pretokenize ARGV`` as a user runs it (cli.main), with what it printed (``capture``: capsys or capfd)."""
    from pipelines import cli

    capture.readouterr()
    code = cli.main([str(a) for a in argv])
    captured = capture.readouterr()
    return Outcome(code, captured.out, captured.err)


@pytest.fixture(scope="module")
def source(request, tmp_path_factory) -> Path:
    """The requesting module's ``ROWS`` as ``docs.jsonl``, written once per module: the input of the
    trees its fixtures build."""
    return write_jsonl(tmp_path_factory.mktemp("src") / "docs.jsonl", request.module.ROWS)


@pytest.fixture(scope="module")
def bucketed_tree(source, tmp_path_factory) -> Path:
    """A finished bucketed tree of ``source`` in 2 partitions, built once per module through the CLI
    on the FnApiRunner: a test that changes it works on a copy."""
    from pipelines import cli

    out = tmp_path_factory.mktemp("tree") / "out"
    args = ["bucketed", "--input", str(source), "--output", str(out), "--partitions", "2", "--runner=FnApiRunner"]
    assert cli.main(args) == 0
    return out


@pytest.fixture
def tree_copy(bucketed_tree, tmp_path) -> Path:
    """A copy of ``bucketed_tree`` (links kept as links) for a test to change."""
    import shutil

    return Path(shutil.copytree(bucketed_tree, tmp_path / "out", symlinks=True))


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
    """Local copies of remote trees' reader indexes (shards.index.local_copy) and the job ETA's
    figures of previous runs (pipelines.progress_prior) go to the session's temporary directory,
    not the user's ~/.cache."""
    import os

    names = {"PRETOKENIZE_INDEX_CACHE": "index-cache", "PRETOKENIZE_PROGRESS_CACHE": "progress-cache"}
    before = {name: os.environ.get(name) for name in names}
    for name, directory in names.items():
        os.environ[name] = str(tmp_path_factory.mktemp(directory))
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


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


# The kind of a test (the markers of pyproject.toml) is where it lives: tests/e2e, tests/reliability
# and tests/engines hold theirs; every other test is a unit test, in the folder that mirrors the code it
# tests (tests/transforms/..., tests/shards/). A job test in a unit module says @pytest.mark.e2e itself;
# a test with two kinds is a mistake.
KINDS = ("unit", "e2e", "reliability", "engines")
KIND_DIRECTORIES = {"e2e": "e2e", "reliability": "reliability", "engines": "engines"}


# The end-to-end tests `make test-fast` runs too (-m "unit or smoke"): the byte net of both jobs and
# each job's sample checked against an independent derivation. Named here, not marked in place,
# since tests/e2e/test_no_byte_changes.py does not change.
SMOKE = {
    "test_no_byte_changes.py::test_the_bucketed_sample_is_byte_for_byte_what_it_was",
    "test_no_byte_changes.py::test_the_scaffold_sample_is_byte_for_byte_what_it_was",
    "test_bucketed_pipeline.py::test_every_kept_document_matches_an_independent_tokenization",
    "test_scaffold_pipeline.py::test_sample_shards_match_an_independent_derivation",
}


def kind_of(path: Path) -> str:
    """The kind of the tests in ``path`` by where it lives under tests/."""
    tests = REPO / "tests"
    parts = path.resolve().relative_to(tests).parts if path.resolve().is_relative_to(tests) else (path.name,)
    if len(parts) > 1 and parts[0] in KIND_DIRECTORIES:
        return KIND_DIRECTORIES[parts[0]]
    return "unit"


def pytest_collection_modifyitems(config, items):
    """Give each test its kind and the smoke tests their marker, before -m selects (this hook runs
    ahead of pytest's own deselection)."""
    found, modules = set(), set()
    for item in items:
        kinds = [kind for kind in KINDS if item.get_closest_marker(kind)]
        if len(kinds) > 1:
            raise pytest.UsageError(f"{item.nodeid}: one kind of test, not {' and '.join(kinds)}")
        if not kinds:
            item.add_marker(kind_of(item.path))
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        modules.add(item.path.name)
        if name in SMOKE:
            item.add_marker("smoke")
            found.add(name)
    lost = sorted(name for name in SMOKE - found if name.split("::")[0] in modules)
    if lost:
        raise pytest.UsageError(f"tests/conftest.py SMOKE names tests that do not exist: {', '.join(lost)}")
